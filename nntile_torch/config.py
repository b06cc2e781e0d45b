"""Project-wide defaults."""

# Tile edge in elements for weight dimensions: 1024 x 1024 fp32 is a 4 MiB tile, the size from which the H200
# box's PCIe runs near full speed.
DEFAULT_TILE_SIZE = 1024
# Rows (batch x sequence positions) per activation tile.
DEFAULT_BATCH_TILE_SIZE = 1024
PRECISIONS = ("fp32", "tf32", "bf16")


def check_precision(precision):
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS} (got {precision!r})")
    return precision


def check_tile(value, name):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int (got {value!r})")
    return value
