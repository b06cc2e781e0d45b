"""Generation's key/value cache in tiles, shared by the GPT-2 and Llama-family attentions (gpt2.py, llama.py).

Hugging Face's DynamicLayer keeps keys and values (B, H, T, D) and concatenates each step's onto them (torch.cat).
Here the attention keeps instead, on the layer, the tiles its attention kernel reads (GPT-2: the qkv rows of every
position so far; Llama: k and v after the rotary embedding) in tiles of whole sequences, and sets the layer's keys
and values to views of them, so that the cache's length (get_seq_length), the masks Hugging Face builds from it, and
any torch code reading them (materialized) work unchanged. The tiles have room for more positions than they hold
(`room`: a quarter more than the length, at least 64 positions more): a step's new rows are written in place, one
scatter task per tile (an accumulating embedding backward into the zero rows past the length); when the room runs
out, new tiles with new room take the old rows and the new by row gather tasks (no wait either way). The new
positions' queries attend over the cached keys with the cached attention kernel (_C.cached_attention_forward:
q_len queries over kv_len keys per sequence, kv_rows rows apart, Hugging Face's mask rows for the new queries, or
causal ones), so each step's attention costs T per new position, as Hugging Face's cache does, and the
projections, the MLP and the norms run on the new positions only."""
import torch

from .. import _C, config
from ..functional import attention_mask_tiles, gather_rows
from ..owners import cache_layer_record
from ..tensor import TileTensor, new_tiles, view_of


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
    """What an attention stored on a cache layer, (its tiles, the positions they hold), if the layer's keys and values
    are still the views it left there (nothing replaced them: a crop or a beam search's reorder makes them dense
    tensors); else None."""
    record = cache_layer_record(layer, create=False)
    stored = None if record is None else record.tiles
    if stored is None or layer.keys is not record.views[0] or layer.values is not record.views[1]:
        return None
    return stored, record.length


def store(layer, stored, length, keys, values):
    """Keeps `stored` (TileTensors (B, room, C)) and the positions they hold in the cache layer's record (owners.py),
    and puts keys and values (B, H, T, D), views of them, on the layer, where Hugging Face's code reads them."""
    if not getattr(layer, "is_initialized", False):
        layer.dtype, layer.device, layer.is_initialized = keys.dtype, keys.device, True
    layer.keys, layer.values = keys, values
    record = cache_layer_record(layer)
    record.tiles, record.views, record.length = stored, (keys, values), length


def heads_view(stored, total, heads, hd, col):
    """The (B, heads, total, hd) keys or values Hugging Face's cache layer holds, as one view of `stored` (a TileTensor
    (B, room, C): heads side by side from column col): what a slice, a split, a reshape and a transpose would give,
    made at once (a decoding step makes two per layer; the chain of view ops cost a fifth of its submission time)."""
    b, room, c = stored.shape
    return view_of(stored.tiles, (b, heads, total, hd), (room * c, hd, c, 1), col, stored.device)


def rows_tile(b, room, batch_tile):
    """Row tiles of whole sequences of `room` rows, about as many rows as the layer's activation tiles."""
    return room * max(1, min(b, batch_tile // room))


def room_for(total):
    """Positions per sequence to make room for when the cache grows to `total`: a quarter more, at least 64 more, in
    steps of 64 (a 1024-token prompt gets room for 1280: 25% more memory than the cache holds, and 256 tokens
    generated in place before the cache moves; between moves every step writes in place)."""
    return -(-(total + max(64, total // 4)) // 64) * 64


_rows = [None]  # (key, C++ tiles): the scatter's row numbers, the same for every layer of a step


def _scatter_rows(b, tn, room, past, row_tile):
    """C++ int64 tiles (b * tn) tiled by row_tile: where each new row goes in a cache of `room` rows per sequence
    holding `past` (made once per step, read by every layer's scatter)."""
    key = (b, tn, room, past, row_tile)
    if _rows[0] is None or _rows[0][0] != key:
        ids = new_tiles([b * tn], [row_tile], torch.int64, name="kv_cache.rows")
        ids.from_dense((torch.arange(b).reshape(b, 1) * room + past + torch.arange(tn)).reshape(-1))
        _rows[0] = (key, ids)
    return _rows[0][1]


def append(layer, news, b, tn, batch_tile, device, names):
    """The layer's cache tiles with the new positions' rows added: news, C++ tiles (b * tn, C) of whole rows, one per
    stored tensor (GPT-2: the qkv rows; Llama: k and v). Returns (TileTensors (b, room, C), positions so far, room),
    the first `positions` rows of each sequence valid, the rest zeros. In place while the room lasts; else new tiles
    of room_for(positions) rows per sequence, the old rows and the new gathered into them."""
    old = tile_cache(layer)
    past = 0 if old is None else old[1]
    total = past + tn
    if old is not None and old[0][0].shape[1] >= total:
        stored = old[0]
        room = stored[0].shape[1]
        for new, st in zip(news, stored):
            _C.embedding_backward(_scatter_rows(b, tn, room, past, new.tile_shape[0]), new, st.tiles, accumulate=True)
        return stored, total, room
    room = room_for(total)
    row_tile = rows_tile(b, room, batch_tile)
    seq = torch.arange(b).reshape(b, 1)
    pos = torch.arange(room)
    from_new = torch.where((pos >= past) & (pos < total), seq * tn + pos - past, -1).reshape(-1)
    stored = []
    for i, (new, name) in enumerate(zip(news, names)):
        out = gather_rows(new, from_new, row_tile, name=f"kv_cache.{name}")
        if old is not None and past:
            old_room = old[0][i].shape[1]
            from_old = torch.where(pos < past, seq * old_room + pos, -1).reshape(-1)
            _C.add(1.0, gather_rows(old[0][i].tiles, from_old, row_tile, name=f"kv_cache.{name}.old"), 1.0, out)
        stored.append(TileTensor(out, (b, room, new.shape[1]), device))
    return stored, total, room


def attend(q, q_col, k, k_col, v, v_col, attention_mask, b, tn, total, room, nheads, kv_heads, hd, scale, bf16,
           device, out_tile):
    """The tn new queries of each sequence (C++ tiles q (b * tn, .), heads from column q_col) over its `total` keys (C++
    tiles k, v (b * room, .) tiled by rows_tile, the first `total` rows of each sequence's room the keys, heads from
    k_col, v_col; v None: in k's rows), under Hugging Face's
    attention_mask for the new queries (or causal without one) -> TileTensor (b, tn, nheads x hd) tiled by out_tile
    rows; or why not (a string: the caller falls back)."""
    per_tile = k.tile_shape[0] // room  # sequences per tile of the cache
    rows = per_tile * tn
    mask = query_mask(attention_mask, b, tn, total, rows, device)
    if mask is None:
        return "key/value cache with an attention mask that differs per head"
    if q.tile_shape[0] != rows:  # the queries in the cache's sequences per tile
        q = gather_rows(q, torch.arange(b * tn), rows, name="kv_cache.q")
    y = new_tiles([b * tn, nheads * hd], [rows, nheads * hd], name="kv_cache.attention")
    _C.cached_attention_forward(q, k, v, mask, y, tn, total, nheads, kv_heads, hd, q_col, k_col, v_col, scale, bf16,
                                kv_rows=room)
    out_rows = config.sequence_rows((b, tn, nheads * hd), out_tile)  # as the layer's other activation tiles
    if rows != out_rows:
        y = gather_rows(y, torch.arange(b * tn), out_rows, name="kv_cache.y")
    return TileTensor(y, (b, tn, nheads * hd), device)


_causal = [None]  # ((tn, total), the boolean causal mask of the new queries): one tensor for every layer of a step


def query_mask(mask, b, tn, total, row_tile, device):
    """C++ tiles (b * tn, total) of the additive float mask of each sequence's tn new queries against its total keys,
    tiled by row_tile rows (functional.attention_mask_tiles): Hugging Face's mask for the new queries (broadcasting to
    (b, 1, tn, total)), or without one causal (new query i sees the keys up to total - tn + i). None for a mask that
    differs per head."""
    if mask is None:
        if _causal[0] is None or _causal[0][0] != (tn, total):
            _causal[0] = ((tn, total), torch.ones(tn, total, dtype=torch.bool).tril_(total - tn))
        mask = _causal[0][1]
    return attention_mask_tiles(mask, b, tn, row_tile, device, keys=total)
