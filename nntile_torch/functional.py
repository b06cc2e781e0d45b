"""Autograd Functions whose forward and backward submit tile tasks (no waits)."""
import math

import torch

from . import _C
from .tensor import TileTensor


def as_matrix_tiles(x, row_tile, col_tile):
    """Tiles of x (..., K) seen as the matrix (prod(...), K) with tiles (row_tile, col_tile). Reuses x's own
    tiles when they already are that; otherwise copies x (materializing it if it is a TileTensor)."""
    k = x.shape[-1]
    m = math.prod(x.shape[:-1])
    want = [min(row_tile, m), min(col_tile, k)]
    if isinstance(x, TileTensor) and list(x.tiles.shape) == [m, k] and list(x.tiles.tile_shape) == want:
        return x.tiles
    dense = x.materialize() if isinstance(x, TileTensor) else x
    t = _C.TileTensor([m, k], want, "float32", "")
    t.from_dense(dense.detach().reshape(m, k))
    return t


class LinearFunction(torch.autograd.Function):
    """y = x @ weight.T + bias with x (..., K), weight (N, K) tiled (t, t), bias (N,) tiled (t,); y (..., N) as
    tiles (rows, t) of the matrix (prod(...), N)."""

    @staticmethod
    def forward(ctx, x, weight, bias, batch_tile, precision):
        wt = weight.tiles
        tile = wt.tile_shape[1]
        x2 = as_matrix_tiles(x, batch_tile, tile)
        m, n = x2.shape[0], wt.shape[0]
        y = _C.TileTensor([m, n], [x2.tile_shape[0], wt.tile_shape[0]], "float32", "linear.y")
        _C.gemm(False, x2, True, wt, y, 1.0, 0.0, precision)
        if bias is not None:
            _C.bias_add(bias.tiles, y)
        ctx.x2, ctx.wt, ctx.has_bias = x2, wt, bias is not None
        ctx.x_shape, ctx.x_device, ctx.saved_device = x.shape, x.device, weight.device
        ctx.batch_tile, ctx.precision = batch_tile, precision
        return TileTensor(y, (*x.shape[:-1], n), x.device)

    @staticmethod
    def backward(ctx, dy):
        x2, wt, p = ctx.x2, ctx.wt, ctx.precision
        dy2 = as_matrix_tiles(dy, ctx.batch_tile, wt.tile_shape[0])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            g = _C.TileTensor(list(x2.shape), list(x2.tile_shape), "float32", "linear.dx")
            _C.gemm(False, dy2, False, wt, g, 1.0, 0.0, p)
            dx = TileTensor(g, ctx.x_shape, ctx.x_device)
        if ctx.needs_input_grad[1]:
            g = _C.TileTensor(list(wt.shape), list(wt.tile_shape), "float32", "linear.dw")
            _C.gemm(True, dy2, False, x2, g, 1.0, 0.0, p)
            dw = TileTensor(g, wt.shape, ctx.saved_device)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            g = _C.TileTensor([wt.shape[0]], [wt.tile_shape[0]], "float32", "linear.db")
            _C.bias_grad(dy2, g, 0.0)
            db = TileTensor(g, [wt.shape[0]], ctx.saved_device)
        return dx, dw, db, None, None
