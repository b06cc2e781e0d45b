"""Autograd Functions of the Llama family's forms (RMSNorm), submitting tile tasks without waits."""
import torch

from . import _C
from .functional import as_matrix_tiles, frees_saved, keep, kept, tiles_of
from .tensor import TileTensor, plain, without_torch_function


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
        y = _C.TileTensor([m, c], [bt, c], "float32", "rmsnorm.y")
        rstd = _C.TileTensor([m], [bt], "float32", "rmsnorm.rstd")
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
        dx = _C.TileTensor(list(xt.shape), list(xt.tile_shape), "float32", "rmsnorm.dx")
        dw = _C.TileTensor(list(wt.shape), list(wt.tile_shape), "float32", "rmsnorm.dw")
        _C.rmsnorm_backward(tiles_of(xt.shape, xt.tile_shape, dy), xt, rstd, wt, dx, dw)
        return TileTensor(dx, ctx.x_shape, ctx.x_device), TileTensor(dw, wt.shape, ctx.w_device), None, None

