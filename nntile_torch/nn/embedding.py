"""nntile_torch.nn.Embedding: a drop-in for torch.nn.Embedding (default options) as tile tasks."""
import torch
from torch import nn

from .. import config
from ..functional import EmbeddingFunction
from ..runtime import ensure_init
from ..tensor import TileTensor, without_torch_function
from . import _init


def check_indices(idx, num_embeddings, what):
    """Clear errors for bad indices, before any kernel (on a GPU an out-of-range index is a device-side assert).
    Indices on the CPU are checked here (no wait); for indices elsewhere (a GPU) a host read would wait for the
    device, so the range is left to a task (functional.EmbeddingFunction's index_check) and `what` is returned:
    the error then comes at the next host wait (loss.item())."""
    if not isinstance(idx, torch.Tensor) or idx.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8,
                                                               torch.uint8):
        raise TypeError(f"{what}: indices must be an integer tensor (got "
                        f"{idx.dtype if isinstance(idx, torch.Tensor) else type(idx).__name__})")
    if idx.device.type != "cpu":
        return what
    if idx.numel():
        lo, hi = (int(v) for v in torch.aminmax(idx))  # reads two integers of the input, not tiles
        if lo < 0 or hi >= num_embeddings:
            raise IndexError(f"{what}: index {hi if hi >= num_embeddings else lo} is out of range for "
                             f"{num_embeddings} rows (token ids must be < vocab size, sequences no longer than the "
                             "model's positions)")
    return None


def check_indices_now(idx, num_embeddings, what):
    """check_indices for an embedding left as torch code: indices on a GPU are read (a host wait, counted)."""
    if check_indices(idx, num_embeddings, what) is not None and idx.numel():
        from .. import _C
        _C.count_wait()
        lo, hi = (int(v) for v in torch.aminmax(idx))
        if lo < 0 or hi >= num_embeddings:
            raise IndexError(f"{what}: index {hi if hi >= num_embeddings else lo} is out of range for "
                             f"{num_embeddings} rows")


class Embedding(nn.Module):
    """weight[ids] as tile tasks: ids (*) integer -> (*, embedding_dim); weight (num_embeddings, embedding_dim)
    in tiles (tile_size, embedding_dim) (the width must fit in one tile; the same tiling as a tied
    nntile_torch.nn.Linear LM head). torch.nn.Embedding's options beyond the defaults are not supported.
    """

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False, device=None, dtype=None, *, tile_size=None,
                 batch_tile_size=None):
        super().__init__()
        if padding_idx is not None or max_norm is not None or scale_grad_by_freq or sparse:
            raise ValueError("nntile_torch.nn.Embedding supports padding_idx=None, max_norm=None, "
                             "scale_grad_by_freq=False, sparse=False only")
        if dtype not in (None, torch.float32):
            raise TypeError(f"nntile_torch.nn.Embedding keeps float32 parameters (got dtype={dtype})")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx, self.max_norm, self.norm_type = None, None, norm_type
        self.scale_grad_by_freq, self.sparse = False, False
        self.tile_size = config.check_tile(tile_size, "tile_size") or config.DEFAULT_TILE_SIZE
        if embedding_dim > self.tile_size:
            raise ValueError(f"embedding_dim ({embedding_dim}) must fit in one tile (tile_size {self.tile_size})")
        self.batch_tile_size = config.check_tile(batch_tile_size, "batch_tile_size") or config.DEFAULT_BATCH_TILE_SIZE
        t = self.tile_size
        self.weight = nn.Parameter(TileTensor.empty((num_embeddings, embedding_dim), (t, t), device, name="weight",
                                                    persistent=True))
        self.reset_parameters()

    def reset_parameters(self):
        if _init.skipping():  # convert() writes the values
            return
        with torch.no_grad():
            self.weight.copy_(torch.randn(self.num_embeddings, self.embedding_dim))

    @without_torch_function
    def forward(self, ids):
        check = check_indices(ids, self.num_embeddings, "Embedding")
        ensure_init()
        if not isinstance(self.weight, TileTensor) or self.weight.tiles.grid[1] != 1:
            check_indices_now(ids, self.num_embeddings, "Embedding")
            return nn.functional.embedding(ids, self.weight)  # a weight tied in another tiling: torch code
        return EmbeddingFunction.apply(ids, self.weight, self.batch_tile_size, check)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}, tile_size={self.tile_size}"

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        destination[prefix + "weight"] = self.weight if keep_vars else self.weight.materialize().clone()
