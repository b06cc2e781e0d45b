"""Autograd Functions of the Llama family's forms (RMSNorm, the gated MLP's silu(g) * u, rotary position embeddings,
grouped-query attention), submitting tile tasks without waits."""
import torch

from . import _C
from .functional import as_matrix_tiles, attention_stats, frees_saved, keep, kept, row_stats, tiles_of
from .tensor import TileTensor, new_tiles, plain, tiles_like, without_torch_function


class RMSNormFunction(torch.autograd.Function):
    """RMSNorm over the last dim C of x (..., C) as Hugging Face's LlamaRMSNorm computes it (fp32 mean of squares,
    y = weight * (x * rsqrt(mean(x^2) + eps))), x seen as the matrix (prod(...), C) in tiles of whole rows
    (batch_tile, C); weight (C,) one tile. A TileTensor x already tiled that way is used as it is; any other x is
    copied into such tiles. The backward keeps x and rstd (prod(...),)."""

    @staticmethod
    @without_torch_function
    def forward(ctx, x, weight, eps, batch_tile):
        c = x.shape[-1]
        if plain(x) and len(x.tiles.shape) == 2 and x.tiles.grid[1] == 1:
            batch_tile = x.tiles.tile_shape[0]
        xt = as_matrix_tiles(x, batch_tile, c)
        m, bt = xt.shape[0], xt.tile_shape[0]
        y = new_tiles([m, c], [bt, c], name="rmsnorm.y")
        rstd = row_stats(ctx, m, bt, "rmsnorm.rstd")
        _C.rmsnorm_forward(xt, weight.tiles, float(eps), y, rstd)
        keep(ctx, x.device, xt, rstd)
        ctx.wt = weight.tiles
        ctx.x_shape, ctx.x_device, ctx.w_device = x.shape, x.device, weight.device
        return TileTensor(y, x.shape, x.device)

    @staticmethod
    @without_torch_function
    @frees_saved
    def backward(ctx, dy):
        (xt, rstd), wt = kept(ctx), ctx.wt
        dx = new_tiles(xt.shape, xt.tile_shape, name="rmsnorm.dx")
        dw = new_tiles(wt.shape, wt.tile_shape, name="rmsnorm.dw")
        _C.rmsnorm_backward(tiles_of(xt.shape, xt.tile_shape, dy), xt, rstd, wt, dx, dw)
        return TileTensor(dx, ctx.x_shape, ctx.x_device), TileTensor(dw, wt.shape, ctx.w_device), None, None


class SiluMulFunction(torch.autograd.Function):
    """y = silu(g) * u elementwise (the gated MLP's step between its gate/up and down projections), one tile task
    per tile. g and u (..., N) as TileTensors of the same tiling keep their tiles (a Linear's outputs); otherwise
    both are tiled as the matrix (prod(...), N) in tiles (batch_tile, tile). The backward keeps g and u."""

    @staticmethod
    @without_torch_function
    def forward(ctx, g, u, batch_tile, tile):
        if g.shape != u.shape:
            raise ValueError(f"silu_mul: gate and up must have one shape (got {tuple(g.shape)} and "
                             f"{tuple(u.shape)})")
        if plain(g) and plain(u) and list(g.tiles.shape) == list(u.tiles.shape) \
                and list(g.tiles.tile_shape) == list(u.tiles.tile_shape):
            gt, ut = g.tiles, u.tiles
        else:
            gt = g.tiles if plain(g) and len(g.tiles.shape) == 2 else as_matrix_tiles(g, batch_tile, tile)
            ut = tiles_of(gt.shape, gt.tile_shape, u)
        y = new_tiles(gt.shape, gt.tile_shape, name="silu_mul.y")
        _C.silu_mul_forward(gt, ut, y)
        keep(ctx, g.device, gt, ut)
        ctx.shape, ctx.device = g.shape, g.device
        return TileTensor(y, g.shape, g.device)

    @staticmethod
    @without_torch_function
    @frees_saved
    def backward(ctx, dy):
        gt, ut = kept(ctx)
        dg = new_tiles(gt.shape, gt.tile_shape, name="silu_mul.dg")
        du = new_tiles(gt.shape, gt.tile_shape, name="silu_mul.du")
        _C.silu_mul_backward(tiles_of(gt.shape, gt.tile_shape, dy), gt, ut, dg, du)
        return TileTensor(dg, ctx.shape, ctx.device), TileTensor(du, ctx.shape, ctx.device), None, None


_rope_cache = {}  # "cos" / "sin" -> (the tensor, its version, (rows, row tile), C++ tiles): shared by the layers


def rope_tiles(angles, role, b, seq, row_tile):
    """C++ tiles (b * seq, head_dim) of Hugging Face's cos or sin (as its rotary module hands them to every layer:
    (1 or b, seq, head_dim), float32), tiled by `row_tile` rows: row s * seq + i holds position i's of sequence s.
    The model's rotary module computes them once per forward and every layer gets the same tensors, so they are
    copied into tiles once per forward (fresh tiles: no wait). None when they do not broadcast that way."""
    if isinstance(angles, TileTensor) or angles.requires_grad or angles.dtype != torch.float32 \
            or angles.dim() not in (2, 3) or angles.shape[-2] != seq:
        return None
    a = angles if angles.dim() == 3 else angles.unsqueeze(0)
    if a.shape[0] not in (1, b):
        return None
    key = (b * seq, row_tile)
    cached = _rope_cache.get(role)
    if cached is not None and cached[0] is angles and cached[1] == angles._version and cached[2] == key:
        return cached[3]
    hd = a.shape[-1]
    tiles = new_tiles([b * seq, hd], [row_tile, hd], name=f"rope.{role}")
    tiles.from_dense(a.expand(b, seq, hd).reshape(b * seq, hd))
    _rope_cache[role] = (angles, angles._version, key, tiles)
    return tiles


class RopeFunction(torch.autograd.Function):
    """Rotary position embeddings as Hugging Face's apply_rotary_pos_emb: y = x * cos + rotate_half(x) * sin per
    head of head_dim values. x (B, T, heads x head_dim), a TileTensor in tiles of whole heads (a q or k projection's
    output); cos and sin C++ tiles (B * T, head_dim) tiled by x's rows (rope_tiles). y is tiled like x. The backward
    is the transpose (rope with -sin): nothing is kept but the angles' tiles."""

    @staticmethod
    @without_torch_function
    def forward(ctx, x, cos, sin, head_dim):
        xt = x.tiles
        y = tiles_like(xt, name="rope.y")
        _C.rope(xt, cos, sin, y, head_dim, False)
        ctx.angles, ctx.head_dim = (cos, sin), head_dim
        ctx.tiling, ctx.shape, ctx.device = (list(xt.shape), list(xt.tile_shape)), x.shape, x.device
        return TileTensor(y, x.shape, x.device)

    @staticmethod
    @without_torch_function
    @frees_saved
    def backward(ctx, dy):
        shape, tile_shape = ctx.tiling
        dx = new_tiles(shape, tile_shape, name="rope.dx")
        _C.rope(tiles_of(shape, tile_shape, dy), *ctx.angles, dx, ctx.head_dim, True)
        return TileTensor(dx, ctx.shape, ctx.device), None, None, None


class GQAttentionFunction(torch.autograd.Function):
    """Causal grouped-query self-attention (or with `mask`, C++ tiles (B * T, T) of an additive float mask tiled by
    q's rows: attention_mask_tiles): q (B, T, nheads x hd), k and v (B, T, kv_heads x hd), TileTensors in tiles of
    whole rows with one row tiling holding whole sequences -> y (B, T, nheads x hd), heads side by side, tiled like
    q. Query head h reads k/v head h / (nheads / kv_heads) (Hugging Face's repeat_kv, inside the task: no repeated
    k or v in tiles); the backward reads the output and each query head's softmax log-sum-exp, which the forward
    keeps (attention_stats, as CausalAttentionFunction's), and sums each k/v head's gradient over its group. bf16:
    the kernel computes in bfloat16 (tiles stay float32). dropout_p > 0: dropout on the attention probabilities, the
    keep mask nntile's hash of (seed, sequence, query head, query, key), as CausalAttentionFunction's (on CPUs explicit
    math on the scores, recomputed by the backward). Keeps q, k, v, y and the statistics."""

    @staticmethod
    @without_torch_function
    def forward(ctx, q, k, v, nheads, kv_heads, scale, bf16=False, mask=None, dropout_p=0.0, seed=0):
        qt, kt, vt = q.tiles, k.tiles, v.tiles
        seq = q.shape[1]
        y = tiles_like(qt, name="gqa_attention.y")
        stats = attention_stats(ctx, qt, seq, nheads)
        _C.gqa_attention_forward(qt, kt, vt, y, seq, nheads, kv_heads, scale, bf16, mask, dropout_p, seed, stats)
        keep(ctx, q.device, qt, kt, vt, y, *([stats] if stats is not None else []))
        ctx.args = (seq, nheads, kv_heads, scale, bf16, mask, dropout_p, seed)
        ctx.shapes, ctx.device = (q.shape, k.shape, v.shape), q.device
        return TileTensor(y, q.shape, q.device)

    @staticmethod
    @without_torch_function
    @frees_saved
    def backward(ctx, dy):
        qt, kt, vt, y, *stats = kept(ctx)
        dq, dk, dv = (tiles_like(t, name=f"gqa_attention.d{n}") for t, n in ((qt, "q"), (kt, "k"), (vt, "v")))
        _C.gqa_attention_backward(tiles_of(qt.shape, qt.tile_shape, dy), qt, kt, vt, dq, dk, dv, *ctx.args,
                                  y if stats else None, stats[0] if stats else None)
        return (*(TileTensor(g, shape, ctx.device) for g, shape in zip((dq, dk, dv), ctx.shapes)),
                None, None, None, None, None, None, None)
