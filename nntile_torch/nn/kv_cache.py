"""Generation's key/value cache in tiles, shared by the GPT-2 and Llama-family attentions (gpt2.py, llama.py).

Hugging Face's DynamicLayer keeps keys and values (B, H, T, D) and concatenates each step's onto them (torch.cat).
Here the attention keeps instead, on the layer, the tiles its attention kernel reads (GPT-2: the qkv rows of every
position so far; Llama: k and v after the rotary embedding) in tiles of whole sequences, and sets the layer's keys
and values to views of them, so that the cache's length (get_seq_length), the masks Hugging Face builds from it, and
any torch code reading them (materialized) work unchanged. A step's new rows join the old ones by row gather tasks
(each gathered into the grown tiling, zeros elsewhere, then summed: no wait), and causal attention runs over the
whole grown sequence, because the attention kernels take queries and keys of one length; the new positions' output
rows are then gathered for the output projection. So the projections, the MLP and the norms run on the new
positions only, as with Hugging Face's cache, while attention is recomputed for every position (T^2 instead of T
per step; a kernel with fewer queries than keys would remove that)."""
import torch

from .. import _C
from ..functional import gather_rows
from ..tensor import TileTensor


def cache_uncovered(module, cache):
    """Why this cache cannot be kept in tiles for `module` (an attention with layer_idx), or None."""
    if type(cache).__name__ != "DynamicCache" or getattr(module, "layer_idx", None) is None \
            or module.layer_idx >= len(getattr(cache, "layers", ())):
        return f"key/value cache of type {type(cache).__name__}"
    layer = cache.layers[module.layer_idx]
    if type(layer).__name__ != "DynamicLayer":
        return f"key/value cache layer of type {type(layer).__name__}"
    if getattr(layer, "is_initialized", False) and layer.get_seq_length() > 0 and tile_cache(layer) is None:
        return "key/value cache holding dense tensors (filled outside nntile, or changed since: crop, beam reorder)"
    if torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters()):
        return "key/value cache with gradients"
    return None


def tile_cache(layer):
    """What an attention stored on a cache layer (its tiles), if the layer's keys and values are still the views it
    left there (nothing replaced them: a crop or a beam search's reorder makes them dense tensors)."""
    stored = getattr(layer, "_nntile_cache", None)
    if stored is None or layer.keys is not layer._nntile_kv[0] or layer.values is not layer._nntile_kv[1]:
        return None
    return stored


def store(layer, stored, keys, values):
    """Puts `stored` (tiles) on the cache layer, and keys and values (B, H, T, D), views of them, where Hugging Face's
    code reads them."""
    if not getattr(layer, "is_initialized", False):
        layer.dtype, layer.device, layer.is_initialized = keys.dtype, keys.device, True
    layer.keys, layer.values, layer._nntile_cache, layer._nntile_kv = keys, values, stored, (keys, values)


def rows_tile(b, total, batch_tile):
    """Row tiles of whole sequences of the grown length, about as many rows as the layer's activation tiles."""
    return total * max(1, min(b, batch_tile // total))


def grown(new, old, b, past, tn, row_tile, name):
    """C++ tiles (b * (past + tn), C) tiled (row_tile, C): per sequence, the `past` rows of `old` (C++ tiles
    (b * past, C), or None to leave them zero) then the tn rows of `new` (C++ tiles (b * tn, C) of whole rows)."""
    total = past + tn
    pos = torch.arange(total)
    seq = torch.arange(b).reshape(b, 1)
    out = gather_rows(new, torch.where(pos >= past, seq * tn + pos - past, -1).reshape(-1), row_tile, name=name)
    if old is not None and past:
        _C.add(1.0, gather_rows(old, torch.where(pos < past, seq * past + pos, -1).reshape(-1), row_tile,
                                name=name + ".old"), 1.0, out)
    return out


def new_positions(y, b, past, tn, row_tile):
    """The rows of the tn new positions of each sequence of y (TileTensor (b, past + tn, C)), as a TileTensor
    (b, tn, C) tiled by `row_tile` rows."""
    total, c = past + tn, y.shape[-1]
    rows = (torch.arange(b).reshape(b, 1) * total + past + torch.arange(tn)).reshape(-1)
    return TileTensor(gather_rows(y.tiles, rows, row_tile, name="kv_cache.y"), (b, tn, c), y.device)


_square_cache = [None]  # (Hugging Face's mask, its version, the square mask): one mask for all layers of a step


def square_mask(mask, total):
    """Hugging Face's mask for the new queries, (B, 1, Tn, T) (or one broadcasting to it), as the (B, 1, T, T) mask of
    every query of the grown sequence: causal rows above the new ones (their outputs are not used; causal so that no
    row is empty), Hugging Face's own rows for the new ones. None when it is not of that form."""
    cached = _square_cache[0]
    if cached is not None and cached[0] is mask and cached[1] == mask._version and cached[2].shape[-1] == total:
        return cached[2]
    if mask.dim() > 4 or isinstance(mask, TileTensor):
        return None
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    if m.shape[1] != 1 or m.shape[-1] != total or m.shape[-2] > total:
        return None
    tn = m.shape[-2]
    causal = torch.ones(total - tn, total, dtype=torch.bool, device=m.device).tril_()
    if m.dtype != torch.bool:
        causal = torch.zeros(causal.shape, dtype=m.dtype, device=m.device).masked_fill_(
            ~causal, torch.finfo(m.dtype).min)
    square = torch.cat([causal.expand(m.shape[0], 1, total - tn, total), m], dim=2)
    _square_cache[0] = (mask, mask._version, square)
    return square
