"""Autograd Functions of the Llama family's forms (RMSNorm, the gated MLP's silu(g) * u), submitting tile tasks without waits."""
import torch

from . import _C
from .functional import as_matrix_tiles, frees_saved, keep, kept, tiles_of
from .tensor import TileTensor, new_tiles, plain, without_torch_function


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
        rstd = new_tiles([m], [bt], name="rmsnorm.rstd")
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
