"""Autograd Functions whose forward and backward submit tile tasks (no waits)."""
import functools
import math
import weakref

import torch

from . import _C, config, pending
from .param import bf16_like, param_state, to_bf16
from .tensor import (TileTensor, dtype_of, new_tiles, plain, register_tile_function, tiles_like, view_of,
                     without_torch_function)

F = torch.nn.functional
_NO_IGNORE = -(2**63)  # index_check's `ignore` when every value must be in range


_FREED = weakref.WeakSet()  # the autograd contexts whose saved tiles frees_saved() let go


def frees_saved(backward):
    """Wraps an autograd Function's backward: what its forward kept on ctx (tiles of activations, the bf16 copy
    of a weight) goes as soon as backward has used it, as torch frees save_for_backward's tensors. Kept on ctx,
    they lived as long as the graph, i.e. as long as the caller held the loss: in the usual loop (`loss =
    model(...)` each step) the last step's activations and weight copies sat beside the new ones during the next
    forward (GPT-2 small: peak tiles 13.2 -> 17.2 bytes per parameter). A second backward through the same graph
    (retain_graph=True) raises instead of reading freed tiles."""
    @functools.wraps(backward)
    def run(ctx, *grads):
        if ctx in _FREED:
            raise RuntimeError("backward through an nntile_torch op a second time: its saved tiles were freed by the "
                               "first backward (retain_graph=True is not supported by nntile_torch ops)")
        try:
            return backward(ctx, *grads)
        finally:
            for name in list(vars(ctx)):
                delattr(ctx, name)
            _FREED.add(ctx)
    return run


class _NoGradContext:
    """What a Function's forward gets for ctx when grad mode is off (apply_tiled): its attributes serve the forward
    itself; what it saves for a backward is dropped, as no backward will run."""

    def save_for_backward(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        pass


def apply_tiled(function, *args):
    """function.apply(*args) (an autograd Function of this module's kind); with grad mode off (evaluation, generation)
    its forward alone: no autograd node, nothing kept for a backward (a decoding step's submission was 10% keep())."""
    if torch.is_grad_enabled():
        return function.apply(*args)
    return function.forward(_NoGradContext(), *args)


def keep(ctx, device, *tiles):
    """save_for_backward for C++ tiles (activations a backward reads), wrapped as TileTensors: torch then frees
    them after backward, and activation checkpointing (torch.utils.checkpoint, reentrant or not) drops them after
    the forward and recomputes them in backward. Kept as ctx attributes, non-reentrant checkpointing kept them.
    Without grad mode (apply_tiled) nothing is kept."""
    if isinstance(ctx, _NoGradContext):
        return
    ctx.save_for_backward(*[TileTensor(t, tuple(t.shape), device) for t in tiles])


def kept(ctx):
    """The C++ tiles keep() saved, in order. Unpacked with TileTensor's __torch_function__ on: under non-reentrant
    checkpointing the unpacking recomputes the block's forward, here inside a backward that runs without it, and a
    block's own torch code (nanoGPT's F.layer_norm) needs it to stay in tiles."""
    with torch._C._EnableTorchFunction():
        saved = ctx.saved_tensors
    return [w.tiles for w in saved]


def tiles_of(shape, tile_shape, value, dtype=torch.float32, name="", persistent=False):
    """value (dense or TileTensor) as C++ tiles of that shape, tiling and dtype (its own tiles when they are; new
    ones get `name` and `persistent`, see TileTensor.empty)."""
    if plain(value) and list(value.tiles.shape) == list(shape) \
            and list(value.tiles.tile_shape) == list(tile_shape) and value.tiles_dtype == dtype:
        return value.tiles
    if dtype == torch.float32 and len(shape) == 2:
        gathered = gathered_rows(value, tile_shape[0], tile_shape[1])
        if gathered is not None and list(gathered.shape) == list(shape) \
                and list(gathered.tile_shape) == list(tile_shape):
            return gathered
    dense = _retiled(value, tile_shape)
    t = new_tiles(shape, tile_shape, dtype, name, persistent)
    t.from_dense(dense.detach().to(dtype).reshape(tuple(shape)))
    return t


def gather_rows(table, ids, row_tile, name="gathered_rows"):
    """C++ tiles (len(ids), C) tiled (row_tile, C): row i is row ids[i] of `table` (C++ tiles (N, C) of whole rows),
    zeros where ids[i] is outside [0, N) (-1: "not from this table"). Embedding lookup tasks, no wait; ids is a
    small host tensor of row numbers."""
    m, c = ids.numel(), table.shape[1]
    idt = new_tiles([m], [min(row_tile, m)], torch.int64, name=name + ".ids")
    idt.from_dense(ids.reshape(m).long())
    out = new_tiles([m, c], [idt.tile_shape[0], c], name=name)
    _C.embedding_forward(idt, table, out)
    return out


def gathered_rows(value, row_tile, col_tile):
    """A strided view of a TileTensor whose every row (last dimension) is a whole row of its tiles (N, C) in tiles
    of whole rows, e.g. Hugging Face's hidden_states[:, -1:, :] (the last position, what its LM head reads in
    generation), as new tiles of the matrix (rows, C) tiled (row_tile, C) by row gather tasks (embedding lookups):
    no gathering of the whole tensor. None where it is not such a view (then it is copied densely)."""
    if not isinstance(value, TileTensor) or plain(value) or value.dtype != torch.float32 or value.dim() < 2:
        return None
    t = value.tiles
    c = value.shape[-1]
    if len(t.shape) != 2 or t.shape[1] != c or t.grid[1] != 1 or col_tile < c or dtype_of(t) != torch.float32 \
            or value.stride(-1) != 1 or value.storage_offset() % c or any(s % c for s in value.stride()[:-1]):
        return None
    rows = torch.full(tuple(value.shape[:-1]), value.storage_offset() // c, dtype=torch.int64)
    for d, (n, s) in enumerate(zip(value.shape[:-1], value.stride()[:-1])):
        shape = [1] * (value.dim() - 1)
        shape[d] = n
        rows = rows + (torch.arange(n) * (s // c)).reshape(shape)
    return gather_rows(t, rows.reshape(-1), row_tile)


def _retiled(value, tile_shape):
    """The dense values of `value` for a copy into tiles of `tile_shape`: a TileTensor in another tiling (or a
    strided view) is materialized, a host wait, recorded as a dense fallback inside a converted model
    (report.note_dense)."""
    if not isinstance(value, TileTensor):
        return value
    from .report import note_dense
    note_dense("copy into other tiles", f"tiles {tuple(value.tiles.tile_shape)} of {tuple(value.tiles.shape)}"
               + ("" if plain(value) else " seen through a strided view") + f" into tiles {tuple(tile_shape)}")
    return value.materialize()


def as_matrix_tiles(x, row_tile, col_tile):
    """Tiles of x (..., K) seen as the matrix (prod(...), K) with tiles (row_tile, col_tile). Reuses x's own
    tiles when they already are that; otherwise copies x (materializing it if it is a TileTensor)."""
    k = x.shape[-1]
    m = math.prod(x.shape[:-1])
    want = [config.sequence_rows(x.shape, row_tile), min(col_tile, k)]
    if plain(x) and list(x.tiles.shape) == [m, k] and list(x.tiles.tile_shape) in (want, [min(row_tile, m), want[1]]):
        return x.tiles  # its own tiles: whole sequences, or row_tile rows as the caller asked
    gathered = gathered_rows(x, *want)
    if gathered is not None:
        return gathered
    dense = _retiled(x, want)
    t = new_tiles([m, k], want)
    t.from_dense(dense.detach().reshape(m, k))
    return t


def _pending_matrix_tiles(x, row_tile, col_tile):
    """x's own C++ tiles when as_matrix_tiles would read them as they are and their producer is pending
    (docs/fusion.md): a bf16 matmul then has the producer write its bf16 input. None otherwise."""
    if not plain(x):
        return None
    t = x.tiles_unflushed
    if not pending.pending(t) or dtype_of(t) != torch.float32:
        return None
    k = x.shape[-1]
    m = math.prod(x.shape[:-1])
    want = [config.sequence_rows(x.shape, row_tile), min(col_tile, k)]
    if list(t.shape) == [m, k] and list(t.tile_shape) in (want, [min(row_tile, m), want[1]]):
        return t
    return None


def _bf16_input(t, apart):
    """A bf16 matmul's input A as (bf16 tiles, float32 source or None). With a source, the GEMM writes the bf16 tiles
    itself, inside its first task that reads each tile (gemm's a_source): no task of its own between the producer of
    A and the GEMM, where the GPU would idle while StarPU dispatches it. apart: a convert task makes them first."""
    if dtype_of(t) == torch.bfloat16:
        return t, None
    return (to_bf16(t), None) if apart else (bf16_like(t), t)


class LinearFunction(torch.autograd.Function):
    """y = x @ weight.T + bias, with weight (N, K) tiled (t, t); or, with w_in_out (Hugging Face's Conv1D),
    y = x @ weight + bias with weight (K, N). x (..., K); bias (N,) tiled (t,); y (..., N) as tiles (rows, t)
    of the matrix (prod(...), N).

    precision "bf16": the matmuls read bf16 tiles (x, dy, and a bf16 copy of the weight kept per weight version)
    and accumulate into fp32 tiles; x is kept for backward in bf16, as autocast does. "fp32"/"tf32": fp32 tiles,
    tf32 rounding done by cuBLAS. With the fusion "bias_grad" on (config.fusion_enabled), a bf16 Linear's bias
    gradient is summed by its dW GEMM from the bf16 dy it reads (fp32 sums, as autocast sums its bf16 gradient;
    cuBLASLt's epilogue on GPUs) instead of by tasks of its own over the fp32 dy.
    """

    @staticmethod
    @without_torch_function
    def forward(ctx, x, weight, bias, batch_tile, precision, w_in_out=False):
        wt = weight.tiles
        if dtype_of(wt) != torch.float32 and precision != "bf16":
            raise TypeError(f"a bf16 master weight is read by bf16 matmuls only (precision 'bf16'; this one's is "
                            f"{precision!r})")
        k_dim, n_dim = (0, 1) if w_in_out else (1, 0)
        fused = _pending_matrix_tiles(x, batch_tile, wt.tile_shape[k_dim]) if precision == "bf16" else None
        x2 = as_matrix_tiles(x, batch_tile, wt.tile_shape[k_dim]) if fused is None else fused
        m, n = x2.shape[0], wt.shape[n_dim]
        state = param_state(weight)  # its bf16 copy policy (MemoryPlan.apply sets it)
        per_use = precision == "bf16" and state.bf16_per_use
        source, apart = None, state.cast_apart
        if fused is not None:  # x's producer writes the bf16 tiles this GEMM reads (docs/fusion.md)
            x2, wc, mode = pending.fuse_bf16(fused, lambda: bf16_like(fused)), state.weight_bf16(), "fp32"
        elif precision == "bf16":
            (x2, source), wc, mode = _bf16_input(x2, apart), state.weight_bf16(), "fp32"
        else:
            wc, mode = wt, precision
        y_tiles = [x2.tile_shape[0], wt.tile_shape[n_dim]]
        y = new_tiles([m, n], y_tiles, name="linear.y")
        bt, w_read = None if bias is None else bias.tiles, wc

        # the bias is added by the GEMM (cuBLASLt's epilogue on GPUs); never refers to y (PENDING holds it weakly)
        def submit(into, first=True, residual=None):
            into = new_tiles([m, n], y_tiles) if into is None else into  # y died before x2 was read
            _C.gemm(False, x2, not w_in_out, w_read, into, 1.0, 0.0, mode, bias=bt, a_source=source,
                    residual=residual)

        if pending.candidate(not isinstance(ctx, _NoGradContext), "residual"):
            # a residual add reading y has this GEMM write the sum instead (docs/fusion.md, pair 3); the bf16 x2
            # the GEMM casts (a_source), which backward reads, is a side output: reading it submits the GEMM
            read = tuple(t for t in (x2 if source is None else source, w_read, bt) if t is not None)
            pending.defer(submit, y, () if source is None else (x2,), read,
                          with_residual=lambda into, residual: submit(into, residual=residual))
        else:
            submit(y)
        if per_use:  # a copy made for this use: kept as an activation (checkpointing recomputes it)
            keep(ctx, x.device, x2, wc)
            wc = None
        else:
            keep(ctx, x.device, x2)  # the weight's tiles and bf16 copy live with the weight: attributes
        ctx.wt, ctx.wc, ctx.mode, ctx.has_bias, ctx.w_in_out = wt, wc, mode, bias is not None, w_in_out
        ctx.x_shape, ctx.x_device, ctx.saved_device = x.shape, x.device, weight.device
        ctx.batch_tile, ctx.precision, ctx.n_dim, ctx.cast_apart = batch_tile, precision, n_dim, apart
        return TileTensor(y, (*x.shape[:-1], n), x.device)

    @staticmethod
    @without_torch_function
    @frees_saved
    def backward(ctx, dy):
        x2, *copy = kept(ctx)
        wt, wc, mode, io = ctx.wt, copy[0] if copy else ctx.wc, ctx.mode, ctx.w_in_out
        n, n_tile = wt.shape[ctx.n_dim], wt.tile_shape[ctx.n_dim]
        want_db, bf16 = ctx.has_bias and ctx.needs_input_grad[2], ctx.precision == "bf16"
        # the dW GEMM sums the bias gradient from the bf16 dy it reads (docs/fusion.md, pair 5)
        db_in_gemm = want_db and ctx.needs_input_grad[1] and bf16 and config.fusion_enabled("bias_grad")
        fused = None
        if bf16 and (db_in_gemm or not want_db):  # nothing reads the fp32 dy
            fused = _pending_matrix_tiles(dy, ctx.batch_tile, n_tile)
        if fused is not None:  # dy's producer (GELU's backward) writes the bf16 dy the GEMMs read (docs/fusion.md)
            dy2, dyc, source = None, pending.fuse_bf16(fused, lambda: bf16_like(fused)), None
        else:
            dy2 = as_matrix_tiles(dy, ctx.batch_tile, n_tile)
            dyc, source = dy2, None
        if fused is None and bf16:  # cast by the dx GEMM, or on its own when there is none
            dyc, source = _bf16_input(dy2, ctx.cast_apart or not ctx.needs_input_grad[0])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:  # dx = dy W (N, K layout) or dy W^T (K, N layout)
            g = tiles_like(x2, name="linear.dx")
            _C.gemm(False, dyc, io, wc, g, 1.0, 0.0, mode, a_source=source)
            dx = TileTensor(g, ctx.x_shape, ctx.x_device)
        gb = new_tiles([n], [n_tile], name="linear.db") if db_in_gemm else None
        if ctx.needs_input_grad[1]:  # dW = dy^T x (N, K) or x^T dy (K, N)
            g = tiles_like(wt, name="linear.dw")
            bias_grad = dict(bias_grad=gb, bias_grad_of="b" if io else "a") if db_in_gemm else {}
            if io:
                _C.gemm(True, x2, False, dyc, g, 1.0, 0.0, mode, k_over_places=True, **bias_grad)
            else:
                _C.gemm(True, dyc, False, x2, g, 1.0, 0.0, mode, k_over_places=True, **bias_grad)
            dw = TileTensor(g, wt.shape, ctx.saved_device)
        if want_db:
            if not db_in_gemm:
                gb = new_tiles([n], [n_tile], name="linear.db")
                _C.bias_grad(dy2, gb, 0.0)
            db = TileTensor(gb, [n], ctx.saved_device)
        return dx, dw, db, None, None, None


class GeluFunction(torch.autograd.Function):
    """y = gelu(x) elementwise ("none": erf form, "tanh": GPT-2's approximation). A TileTensor x keeps its own
    tiles; a dense x (..., N) is tiled as the matrix (prod(...), N) in tiles (batch_tile, tile)."""

    @staticmethod
    @without_torch_function
    def forward(ctx, x, approximate, batch_tile, tile):
        xt = x.tiles if plain(x) else as_matrix_tiles(x, batch_tile, tile)
        y = tiles_like(xt, name="gelu.y")
        tanh = approximate == "tanh"
        if pending.candidate(not isinstance(ctx, _NoGradContext)):  # a bf16 matmul may read y in bf16 (c_proj)
            pending.defer(lambda out, first: _C.gelu_forward(xt, out, tanh), y, (), (xt,))
        else:
            _C.gelu_forward(xt, y, tanh)
        keep(ctx, x.device, xt)
        ctx.tanh, ctx.x_shape, ctx.x_device = approximate == "tanh", x.shape, x.device
        return TileTensor(y, x.shape, x.device)

    @staticmethod
    @without_torch_function
    @frees_saved
    def backward(ctx, dy):
        (xt,) = kept(ctx)
        dx = tiles_like(xt, name="gelu.dx")
        dyt, tanh = tiles_of(xt.shape, xt.tile_shape, dy), ctx.tanh
        if pending.candidate(True):  # the fc Linear's backward may read dx as its bf16 dy
            pending.defer(lambda out, first: _C.gelu_backward(dyt, xt, out, tanh), dx, (), (dyt, xt))
            pending.flush_at_backward_end()
        else:
            _C.gelu_backward(dyt, xt, dx, tanh)
        return TileTensor(dx, ctx.x_shape, ctx.x_device), None, None, None


class DropoutFunction(torch.autograd.Function):
    """y = x * keep / (1 - p), keep a function of (seed, the element's row-major index in x) computed inside the
    task: the same on CPU and GPU and for any tiling, never stored; the backward is the same op on dy. Tiling as
    GeluFunction."""

    @staticmethod
    @without_torch_function
    def forward(ctx, x, p, seed, batch_tile, tile):
        xt = x.tiles if plain(x) else as_matrix_tiles(x, batch_tile, tile)
        y = tiles_like(xt, name="dropout.y")
        _C.dropout(xt, y, p, seed)
        ctx.tiling = (list(xt.shape), list(xt.tile_shape))  # the mask is recomputed from the seed: x is not kept
        ctx.p, ctx.seed, ctx.x_shape, ctx.x_device = p, seed, x.shape, x.device
        return TileTensor(y, x.shape, x.device)

    @staticmethod
    @without_torch_function
    @frees_saved
    def backward(ctx, dy):
        shape, tile_shape = ctx.tiling
        dx = new_tiles(shape, tile_shape, name="dropout.dx")
        _C.dropout(tiles_of(shape, tile_shape, dy), dx, ctx.p, ctx.seed)
        return TileTensor(dx, ctx.x_shape, ctx.x_device), None, None, None, None


class LayerNormFunction(torch.autograd.Function):
    """LayerNorm over the last dim C of x (..., C), seen as the matrix (prod(...), C) in tiles of whole rows
    (batch_tile, C); weight and bias (C,) are one tile each. A TileTensor x already tiled that way is used as
    it is (its row tile wins); any other x is copied into such tiles. bias None: no bias (nanoGPT's bias=False)."""

    @staticmethod
    @without_torch_function
    def forward(ctx, x, weight, bias, eps, batch_tile):
        c = x.shape[-1]
        if plain(x) and len(x.tiles.shape) == 2 and x.tiles.grid[1] == 1:
            batch_tile = x.tiles.tile_shape[0]
        xt = as_matrix_tiles(x, batch_tile, c)
        m, bt = xt.shape[0], xt.tile_shape[0]
        y = new_tiles([m, c], [bt, c], name="layer_norm.y")
        mean, rstd = row_stats(ctx, m, bt, "layer_norm.mean"), row_stats(ctx, m, bt, "layer_norm.rstd")
        wt, bt_ = weight.tiles, _zeros(weight.tiles) if bias is None else bias.tiles
        if pending.candidate(not isinstance(ctx, _NoGradContext)):  # a bf16 matmul may read y in bf16

            def submit(out, first):  # pending.Producer's: out None when y died before mean or rstd were read
                stats = (mean, rstd) if first else (new_tiles([m], [bt]), new_tiles([m], [bt]))
                _C.layer_norm_forward(xt, wt, bt_, float(eps), new_tiles([m, c], [bt, c]) if out is None else out,
                                      *stats)
            pending.defer(submit, y, (mean, rstd), (xt, wt, bt_))
        else:
            _C.layer_norm_forward(xt, wt, bt_, float(eps), y, mean, rstd)
        keep(ctx, x.device, xt, mean, rstd)
        ctx.wt, ctx.has_bias = weight.tiles, bias is not None
        ctx.x_shape, ctx.x_device, ctx.w_device = x.shape, x.device, weight.device
        return TileTensor(y, x.shape, x.device)

    @staticmethod
    @without_torch_function
    @frees_saved
    def backward(ctx, dy):
        (xt, mean, rstd), wt = kept(ctx), ctx.wt
        dx = tiles_like(xt, name="layer_norm.dx")
        dw = tiles_like(wt, name="layer_norm.dw")
        db = tiles_like(wt, name="layer_norm.db")
        _C.layer_norm_backward(tiles_of(xt.shape, xt.tile_shape, dy), xt, mean, rstd, wt, dx, dw, db)
        return (TileTensor(dx, ctx.x_shape, ctx.x_device), TileTensor(dw, wt.shape, ctx.w_device),
                TileTensor(db, wt.shape, ctx.w_device) if ctx.has_bias else None, None, None)


_ROW_STATS = {}


def row_stats(ctx, m, bt, name):
    """Tiles (m,) tiled by bt for a norm's per-row statistics (mean, rstd), which only its backward reads: new ones
    in training; without grad mode (apply_tiled) scratch tiles shared by every norm of that geometry, as no backward
    will read them (a decoding step's norms made two tile tensors each that nothing read). One geometry kept per
    name: the last one."""
    if not isinstance(ctx, _NoGradContext):
        return new_tiles([m], [bt], name=name)
    kept_one = _ROW_STATS.get(name)
    if kept_one is None or kept_one[0] != (m, bt):
        kept_one = _ROW_STATS[name] = ((m, bt), new_tiles([m], [bt], name=name + ".scratch"))
    return kept_one[1]


_ZEROS = {}


def _zeros(like):
    """Zero tiles shaped like `like` (a layer norm's missing bias), made once per shape and tiling."""
    key = (tuple(like.shape), tuple(like.tile_shape))
    z = _ZEROS.get(key)
    if z is None:
        z = tiles_like(like, name="zeros")
        z.from_dense(torch.zeros(tuple(like.shape)))
        _ZEROS[key] = z
    return z


def attention_stats(ctx, qkv_tiles, seq, nheads):
    """New tiles for the softmax statistics an attention forward keeps for its backward (float32, one row of
    nheads x seq log-sum-exps per sequence, tiled by qkv's sequences), or None where no backward will run."""
    if isinstance(ctx, _NoGradContext):
        return None
    rows = qkv_tiles.shape[0] // seq
    return new_tiles([rows, nheads * seq], [qkv_tiles.tile_shape[0] // seq, nheads * seq], name="attention.stats")


class CausalAttentionFunction(torch.autograd.Function):
    """Multi-head self-attention: qkv (B, T, 3C), a TileTensor whose tiles hold whole rows and whole sequences (row
    tile a multiple of T), -> y (B, T, C) with heads side by side, tiled by the same rows. Causal, or with `mask`:
    C++ tiles (B * T, T) of an additive float mask tiled by qkv's rows (attention_mask_tiles; causality is then the
    mask's). One task per row tile; no T x T matrix is kept: the backward reads the output and each query's softmax
    log-sum-exp, which the forward keeps (attention_stats; 4 bytes per head and position). bf16: the
    kernel computes in bfloat16, as torch's attention under bf16 autocast (tiles stay float32). dropout_p > 0:
    dropout on the attention probabilities, the mask a hash of (seed, sequence, head, query, key) made inside the
    tasks (the same for any tiling, never stored; the backward draws it again from the seed)."""

    @staticmethod
    @without_torch_function
    def forward(ctx, qkv, nheads, scale, bf16=False, mask=None, dropout_p=0.0, seed=0):
        t = qkv.tiles
        b, seq, c = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
        y = new_tiles([t.shape[0], c], [t.tile_shape[0], c], name="attention.y")
        stats = attention_stats(ctx, t, seq, nheads)
        _C.attention_forward(t, y, seq, nheads, scale, bf16, mask, dropout_p, seed, stats)
        keep(ctx, qkv.device, t, y, *([stats] if stats is not None else []))
        ctx.seq, ctx.nheads, ctx.scale, ctx.bf16, ctx.mask = seq, nheads, scale, bf16, mask
        ctx.dropout_p, ctx.seed = dropout_p, seed
        ctx.shape, ctx.device = qkv.shape, qkv.device
        return TileTensor(y, (b, seq, c), qkv.device)

    @staticmethod
    @without_torch_function
    @frees_saved
    def backward(ctx, dy):
        t, y, *stats = kept(ctx)
        dqkv = tiles_like(t, name="attention.dqkv")
        _C.attention_backward(tiles_of(y.shape, y.tile_shape, dy), t, dqkv, ctx.seq, ctx.nheads, ctx.scale, ctx.bf16,
                              ctx.mask, ctx.dropout_p, ctx.seed, y if stats else None, stats[0] if stats else None)
        return TileTensor(dqkv, ctx.shape, ctx.device), None, None, None, None, None, None


class HeadsAttentionFunction(torch.autograd.Function):
    """scaled_dot_product_attention on q, k, v (B, H, T, D) that are views of one TileTensor (B * T, 3C) split into
    its thirds and heads (nanoGPT's and Hugging Face's c_attn(x).split(C, 2), .view(B, T, H, D).transpose(1, 2)):
    the attention task reads that matrix's tiles; y is a (B, H, T, D) view of (B * T, C) tiles, which
    y.transpose(1, 2).reshape(B, T, C) turns back into those tiles without a copy. The gradients of q, k, v are the
    same views of one gradient matrix, which autograd's backward of the split concatenates back into it.
    dropout_p, seed: attention dropout as CausalAttentionFunction's."""

    @staticmethod
    @without_torch_function
    def forward(ctx, q, k, v, mask, scale, bf16, dropout_p=0.0, seed=0):
        t = q.tiles
        b, h, seq, d = q.shape
        c = h * d
        y = new_tiles([t.shape[0], c], [t.tile_shape[0], c], name="attention.y")
        stats = attention_stats(ctx, t, seq, h)
        _C.attention_forward(t, y, seq, h, scale, bf16, mask, dropout_p, seed, stats)
        keep(ctx, q.device, t, y, *([stats] if stats is not None else []))
        ctx.geometry = [(tuple(z.shape), tuple(z.stride()), z.storage_offset()) for z in (q, k, v)]
        ctx.seq, ctx.h, ctx.scale, ctx.bf16, ctx.mask, ctx.device = seq, h, scale, bf16, mask, q.device
        ctx.dropout_p, ctx.seed = dropout_p, seed
        return view_of(y, (b, h, seq, d), (seq * c, d, c, 1), 0, q.device)

    @staticmethod
    @without_torch_function
    @frees_saved
    def backward(ctx, dy):
        t, y, *stats = kept(ctx)
        b, h, seq, d = dy.shape
        dy2 = dy.transpose(1, 2).reshape(b * seq, h * d)  # views of the tiles when dy is the output's geometry
        dqkv = tiles_like(t, name="attention.dqkv")
        _C.attention_backward(tiles_of(y.shape, y.tile_shape, dy2), t, dqkv, ctx.seq, ctx.h, ctx.scale, ctx.bf16,
                              ctx.mask, ctx.dropout_p, ctx.seed, y if stats else None, stats[0] if stats else None)
        grads = tuple(view_of(dqkv, shape, stride, offset, ctx.device) for shape, stride, offset in ctx.geometry)
        return (*grads, None, None, None, None, None)


def attention_tiles_ok(qkv):
    """Whether qkv (B, T, 3C) is tiled so that CausalAttentionFunction can take it without a copy."""
    return (plain(qkv) and qkv.dim() == 3 and len(qkv.tiles.shape) == 2
            and qkv.tiles.grid[1] == 1 and qkv.tiles.tile_shape[0] % qkv.shape[1] == 0)


_mask_cache = [None]  # (the mask tensor, its version, row tile, C++ tiles): one model's layers share one mask


def attention_mask_tiles(mask, b, seq, row_tile, device, keys=None):
    """C++ tiles (b * seq, keys) of an additive float mask tiled by `row_tile` rows, from a mask that broadcasts to
    (b, 1, seq, keys) (keys: seq by default; generation's cache: the new queries against every key): boolean
    (True: attend, as scaled_dot_product_attention's) or float (added to the scores, as Hugging Face's eager masks). None when it does not broadcast that way (a mask per head). The same mask tensor
    (every layer of one forward gets the one Hugging Face made) is converted once. A mask that requires grad (a
    learned bias) is not taken: the kernel gives no gradient for it."""
    if mask.dim() > 4 or mask.is_complex() or isinstance(mask, TileTensor) or mask.requires_grad:
        return None
    keys = seq if keys is None else keys
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    if m.shape[1] != 1 or any(n not in (1, want) for n, want in zip(m.shape, (b, 1, seq, keys))):
        return None
    geometry = (b, seq, keys, row_tile)
    cached = _mask_cache[0]
    if cached is not None and cached[0] is mask and cached[1] == mask._version and cached[2] == geometry:
        return cached[3]
    if m.dtype == torch.bool:
        dense = torch.zeros(m.shape, dtype=torch.float32, device=m.device).masked_fill_(~m, float("-inf"))
    else:
        dense = m.to(torch.float32)
    dense = dense.expand(b, 1, seq, keys).reshape(b * seq, keys)
    tiles = new_tiles([b * seq, keys], [row_tile, keys], name="attention.mask")
    tiles.from_dense(dense.to(device))
    _mask_cache[0] = (mask, mask._version, geometry, tiles)
    return tiles


@without_torch_function
def tiled_scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                       enable_gqa=False):
    """F.scaled_dot_product_attention as tile tasks when q, k, v are the heads of one (B * T, 3C) TileTensor's
    thirds (HeadsAttentionFunction) and the mask is causal, absent or the same for every head, dropout_p included
    (the mask nntile's hash of a seed drawn from torch's CPU generator, as tiled_dropout's); NotImplemented
    otherwise (other layouts), which then runs as torch code."""
    if not 0.0 <= dropout_p < 1.0 or enable_gqa or not all(isinstance(z, TileTensor) for z in (query, key, value)):
        return NotImplemented
    t = query.tiles
    if key.tiles is not t or value.tiles is not t or query.dim() != 4 or query.dtype != torch.float32 \
            or key.shape != query.shape or value.shape != query.shape:
        return NotImplemented
    b, h, seq, d = query.shape
    c = h * d
    if list(t.shape) != [b * seq, 3 * c] or t.grid[1] != 1 or t.tile_shape[0] % seq or dtype_of(t) != torch.float32:
        return NotImplemented
    heads = (seq * 3 * c, d, 3 * c, 1)
    for z, offset in ((query, 0), (key, c), (value, 2 * c)):
        if tuple(z.stride()) != heads or z.storage_offset() != offset:
            return NotImplemented
    mask = None
    if attn_mask is not None:
        if is_causal or not torch.is_tensor(attn_mask):
            return NotImplemented  # torch raises for both given
        mask = attention_mask_tiles(attn_mask, b, seq, t.tile_shape[0], query.device)
        if mask is None:
            return NotImplemented
    elif not is_causal:
        mask = attention_mask_tiles(torch.zeros((), device=query.device), b, seq, t.tile_shape[0], query.device)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    seed = dropout_seed() if dropout_p > 0.0 else 0
    return apply_tiled(HeadsAttentionFunction, query, key, value, mask, scale,
                       bool(getattr(query, "made_in_bf16", False)), float(dropout_p), seed)


def check_indices(idx, num_embeddings, what):
    """Clear errors for bad indices, before any kernel (on a GPU an out-of-range index is a device-side assert).
    Indices on the CPU are checked here (no wait); for indices elsewhere (a GPU) a host read would wait for the
    device, so the range is left to a task (EmbeddingFunction's index_check) and `what` is returned:
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
        _C.count_wait()
        lo, hi = (int(v) for v in torch.aminmax(idx))
        if lo < 0 or hi >= num_embeddings:
            raise IndexError(f"{what}: index {hi if hi >= num_embeddings else lo} is out of range for "
                             f"{num_embeddings} rows")


class EmbeddingFunction(torch.autograd.Function):
    """out = weight[ids]: ids (...) integer, weight (V, C) a TileTensor in tiles of whole rows (tv, C) -> out
    (..., C) tiled (batch_tile, C) over the flattened ids. One task per (id tile, vocabulary tile)."""

    @staticmethod
    @without_torch_function
    def forward(ctx, ids, weight, batch_tile, check=None):
        wt = weight.tiles
        m, c = ids.numel(), wt.shape[1]
        idt = new_tiles([m], [config.sequence_rows((*ids.shape, c), batch_tile)], torch.int64, name="embedding.ids")
        idt.from_dense(ids.detach().reshape(m).long())
        if check is not None:  # ids on a GPU: checked by a task (an error at the next wait), not by a host read
            _C.index_check(idt, 0, wt.shape[0], _NO_IGNORE, check)
        out = new_tiles([m, c], [idt.tile_shape[0], c], name="embedding.out")
        _C.embedding_forward(idt, wt, out)
        keep(ctx, ids.device, idt)
        ctx.wt, ctx.out_tiling, ctx.w_device = wt, (list(out.shape), list(out.tile_shape)), weight.device
        return TileTensor(out, (*ids.shape, c), weight.device)  # torch's: the table's device (ids may be CPU)

    @staticmethod
    @without_torch_function
    @frees_saved
    def backward(ctx, dy):
        wt = ctx.wt
        dw = tiles_like(wt, name="embedding.dweight")
        (idt,) = kept(ctx)
        _C.embedding_backward(idt, tiles_of(*ctx.out_tiling, dy), dw)
        return None, TileTensor(dw, wt.shape, ctx.w_device), None, None


_IGNORE_INDEX = -100


class CrossEntropyFunction(torch.autograd.Function):
    """Cross-entropy of logits tiles (M, V) against labels (M,), ignore_index -100, mean or sum over the counted
    rows: one task per (row tile, vocabulary tile) folds max / sum of exp / label logit into per-row stats, then
    the row tiles' losses are summed in a fixed order. The loss is a one-element TileTensor: no wait. The
    backward recomputes softmax from the stats, one task per logits tile."""

    @staticmethod
    @without_torch_function
    def forward(ctx, logits, labels, mean, check_ignore=None):
        lt = logits.tiles
        m = lt.shape[0]
        lab = new_tiles([m], [lt.tile_shape[0]], torch.int64, name="ce.labels")
        lab.from_dense(labels.detach().reshape(m).long())
        if check_ignore is not None:  # labels on a GPU: checked by a task (an error at the next wait)
            _C.index_check(lab, 0, lt.shape[1], check_ignore, "cross_entropy")
        stats = new_tiles([m, 3], [lt.tile_shape[0], 3], name="ce.stats")
        acc = new_tiles([2], [2], name="ce.acc")
        loss = new_tiles([1], [1], name="ce.loss")
        _C.cross_entropy_forward(lab, lt, stats, acc, loss, mean)
        keep(ctx, logits.device, lab, lt, stats, acc, loss)
        ctx.mean, ctx.device = mean, logits.device
        return TileTensor(loss, (), logits.device)

    @staticmethod
    @without_torch_function
    @frees_saved
    def backward(ctx, gout):
        (lab, lt, stats, acc, loss), mean, device = kept(ctx), ctx.mean, ctx.device
        dl = tiles_like(lt, name="ce.dlogits")
        _C.cross_entropy_backward(lab, lt, stats, acc, tiles_of(loss.shape, loss.tile_shape, gout), dl, mean)
        return TileTensor(dl, tuple(lt.shape), device), None, None, None


@without_torch_function
def tiled_cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                        reduction="mean", label_smoothing=0.0):
    """F.cross_entropy for tiled logits (M, V) and integer targets (M,), as tile tasks. Returns NotImplemented
    for what it does not cover (class weights, label smoothing, logits not 2-d float32 tiles of that shape),
    which then runs as torch code on the materialized logits. Any ignore_index (nanoGPT's -1 too). Targets out of
    range raise as torch's do: at once for targets on the CPU (checked there, no wait), at the next host wait for
    targets on a GPU (checked by a task: reading them here would wait for the GPU)."""
    if (weight is not None or size_average is not None or reduce is not None or label_smoothing != 0.0
            or reduction not in ("mean", "sum") or not plain(input) or input.dim() != 2
            or input.dtype != torch.float32 or list(input.tiles.shape) != list(input.shape)
            or not torch.is_tensor(target) or isinstance(target, TileTensor)):
        return NotImplemented
    if target.dtype.is_floating_point or target.dtype == torch.bool or target.is_complex():
        raise TypeError(f"cross_entropy: targets must be class indices of an integer dtype (got {target.dtype})")
    if tuple(target.shape) != (input.shape[0],):
        raise ValueError(f"cross_entropy: expected targets of shape ({input.shape[0]},) for logits of shape "
                         f"{tuple(input.shape)} (got {tuple(target.shape)})")
    v = input.shape[1]
    check = None
    if target.device.type == "cpu":
        bad = (target != ignore_index) & ((target < 0) | (target >= v))
        if bool(bad.any()):  # torch raises here too (on a GPU as a device-side assert that ends the process)
            raise IndexError(f"cross_entropy: target {int(target[bad][0])} is out of bounds for {v} classes")
    else:
        check = _IGNORE_INDEX  # the task checks the targets as the kernels read them, after the mapping below
    if ignore_index != _IGNORE_INDEX:  # the kernels skip -100; other ignored targets become it (no wait), and a
        # target that was -100 itself becomes v, which is out of range as it was (the GPU check then names v)
        target = torch.where(target == ignore_index, torch.full_like(target, _IGNORE_INDEX),
                             torch.where(target == _IGNORE_INDEX, torch.full_like(target, v), target))
    return apply_tiled(CrossEntropyFunction, input, target, reduction == "mean", check)


@without_torch_function
def tiled_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """F.layer_norm over the last dimension with tiled weight (and bias, or none) as tile tasks (a custom LayerNorm
    module calling F.layer_norm, e.g. nanoGPT's, once convert() has tiled its parameters)."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not (plain(weight) and (bias is None or plain(bias)) and len(shape) == 1 and torch.is_tensor(input)
            and input.dtype == torch.float32 and input.dim() >= 1 and input.shape[-1] == shape[0]
            and tuple(weight.shape) == shape and list(weight.tiles.grid) == [1]
            and (bias is None or (tuple(bias.shape) == shape and list(bias.tiles.grid) == [1]))):
        return NotImplemented
    if isinstance(input, TileTensor) and not plain(input):
        return NotImplemented
    from .config import DEFAULT_BATCH_TILE_SIZE
    return apply_tiled(LayerNormFunction, input, weight, bias, eps, DEFAULT_BATCH_TILE_SIZE)


@without_torch_function
def tiled_gelu(input, approximate="none"):
    """F.gelu on a TileTensor, its own tiles kept (erf form or tanh approximation)."""
    if not plain(input) or input.dtype != torch.float32 or approximate not in ("none", "tanh"):
        return NotImplemented
    return apply_tiled(GeluFunction, input, approximate, None, None)


@without_torch_function
def tiled_dropout(input, p=0.5, training=True, inplace=False):
    """F.dropout on a TileTensor as tile tasks (the mask a hash of a seed from torch's CPU generator, as
    nntile_torch.nn.Dropout); the identity when not training or p = 0."""
    if not isinstance(input, TileTensor) or not 0.0 <= p <= 1.0:
        return NotImplemented
    if not training or p == 0.0:
        return input
    if inplace or not plain(input) or input.dtype != torch.float32 or p == 1.0:
        return NotImplemented
    return apply_tiled(DropoutFunction, input, float(p), dropout_seed(), None, None)


def dropout_seed():
    """A seed for a dropout mask, from torch's CPU generator (so torch.manual_seed makes masks repeat; no wait)."""
    return int(torch.randint(0, 2**62, (1,)).item())


@without_torch_function
def tiled_embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                    sparse=False):
    """F.embedding with a tiled table of whole rows, default options, as tile tasks."""
    if not plain(weight) or weight.dim() != 2 or weight.tiles.grid[1] != 1 or padding_idx is not None \
            or max_norm is not None or scale_grad_by_freq or sparse or isinstance(input, TileTensor):
        return NotImplemented
    from .config import DEFAULT_BATCH_TILE_SIZE
    check = check_indices(input, weight.shape[0], "embedding")
    return apply_tiled(EmbeddingFunction, input, weight, DEFAULT_BATCH_TILE_SIZE, check)


@without_torch_function
def tiled_last_positions(input, index):
    """x[:, [p], :] (nanoGPT's generation: the hidden state of the last position only) on a TileTensor (B, T, C) in
    tiles of whole rows: rows b * T + p gathered into (B, 1, C) tiles by embedding lookup tasks (x seen as a (B * T,
    C) table), without gathering x; its backward scatters the gradient back as the lookup's. Any other index:
    NotImplemented (torch's own indexing, on materialized tiles)."""
    if not isinstance(index, tuple) or len(index) not in (2, 3) or index[0] != slice(None) \
            or (len(index) == 3 and index[2] != slice(None)):
        return NotImplemented
    pos = index[1]
    if not (isinstance(pos, list) and len(pos) == 1 and type(pos[0]) is int) or not plain(input) \
            or input.dim() != 3 or input.dtype != torch.float32 or len(input.tiles.shape) != 2 \
            or input.tiles.grid[1] != 1:
        return NotImplemented
    b, t, c = input.shape
    p = pos[0] + t if pos[0] < 0 else pos[0]
    if not 0 <= p < t:
        return NotImplemented  # torch raises its own IndexError
    from .config import DEFAULT_BATCH_TILE_SIZE
    ids = (torch.arange(b) * t + p).reshape(b, 1)
    return apply_tiled(EmbeddingFunction, ids, input.reshape(b * t, c), DEFAULT_BATCH_TILE_SIZE, None)


for _func, _impl in ((torch.Tensor.__getitem__, tiled_last_positions), (F.cross_entropy, tiled_cross_entropy),
                     (F.layer_norm, tiled_layer_norm), (torch.layer_norm, tiled_layer_norm), (F.gelu, tiled_gelu),
                     (F.dropout, tiled_dropout),
                     (F.scaled_dot_product_attention, tiled_scaled_dot_product_attention),
                     (F.embedding, tiled_embedding)):
    register_tile_function(_func, _impl)
