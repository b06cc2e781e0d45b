"""Several places (the devices tile rows are spread over) exercised with CPU workers standing in for GPUs:
results depend on the number of places only, never on the number of workers, and match one place to float32
rounding (the weight gradients are then summed per place first: another order of additions)."""

import pytest
import torch

import nntile_torch as nt

transformers = pytest.importorskip("transformers")
HAS_CUDA = torch.cuda.is_available() and nt._C.built_with_cuda


def dense(t):
    return (t.materialize() if isinstance(t, nt.TileTensor) else t).clone()


def train(ncpus, places, steps=3, precision="fp32", offload=None, inspect=None, **init):
    nt.shutdown()
    nt.init(ncpus=ncpus, **({"ncuda": 0, "places": places} | init))
    try:
        assert len(nt.info()["places"]) == (places if places > 1 else 0)
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(n_layer=2, n_embd=48, n_head=4, vocab_size=300, n_positions=32,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        dev = "cpu" if init.get("ncuda", 0) == 0 else "cuda"
        model = nt.convert(transformers.GPT2LMHeadModel(cfg).to(dev), precision, tile_size=160, batch_tile_size=16)
        opt = nt.optim.AdamW(model.parameters(), lr=3e-3, offload=offload)
        g = torch.Generator().manual_seed(1)
        losses, grads = [], None
        for _ in range(steps):
            ids = torch.randint(0, 300, (5, 16), generator=g).to(dev)  # 5 row tiles of one sequence
            opt.zero_grad()
            loss = model(ids, labels=ids).loss
            loss.backward()
            if grads is None:
                grads = {n: dense(p.grad) for n, p in model.named_parameters()}
            opt.step()
            losses.append(loss.item())
        if inspect is not None:
            inspect(model, opt)
        return losses, grads, {k: v.clone() for k, v in model.state_dict().items()}
    finally:
        nt.shutdown()


def test_results_do_not_depend_on_the_worker_count():
    l1, g1, s1 = train(ncpus=1, places=3)
    l3, g3, s3 = train(ncpus=3, places=3)
    assert l1 == l3
    for k in g1:
        assert torch.equal(g1[k], g3[k]), k
    for k in s1:
        assert torch.equal(s1[k], s3[k]), k


def test_places_match_one_place_to_float32_rounding():
    l1, g1, _ = train(ncpus=2, places=1)
    l3, g3, _ = train(ncpus=2, places=3)
    assert l1[0] == l3[0]  # the forward does not depend on places; gradients differ in summation order only
    assert max(abs(a - b) for a, b in zip(l1, l3)) < 1e-5, (l1, l3)
    for k in g1:  # (AdamW turns near-zero gradients into steps of size lr, so weights are not compared)
        scale = g1[k].abs().max().item()
        assert (g3[k] - g1[k]).abs().max().item() <= 1e-5 * scale + 1e-7, k
    assert any(not torch.equal(g1[k], g3[k]) for k in g1)  # the per-place partial sums did run
    assert l1[-1] < l1[0]


@pytest.mark.parametrize("rows", [37, 13], ids=["K over 5 row tiles", "K over 2 row tiles (fewer than places)"])
def test_fused_bias_grad_is_split_over_places_as_the_weight_grad(rows):
    # A bf16 Linear's dW GEMM with its bias gradient (nn.Linear's layout, dy = A, and Conv1D's, dy = B) over 3
    # places: each place sums its row tiles into partial tiles, added in place order, bias gradient included. On
    # data whose sums are exact in float32 the results equal the float64 reference, whatever the order.
    nt.shutdown()
    nt.init(ncpus=2, ncuda=0, places=3)
    try:
        torch.manual_seed(2)
        dy = (torch.randint(-255, 256, (rows, 53)).float() / 64).bfloat16()
        x = (torch.randint(-7, 8, (rows, 29)).float() / 64).bfloat16()
        dyt, xt = nt.TileTensor.from_dense(dy, (8, 16)), nt.TileTensor.from_dense(x, (8, 16))
        for of in ("a", "b"):
            db = nt._C.TileTensor([53], [16], "float32", "db")
            shape = [53, 29] if of == "a" else [29, 53]
            dw = nt._C.TileTensor(shape, [16, 16], "float32", "dw")
            a, b = (dyt, xt) if of == "a" else (xt, dyt)
            nt._C.gemm(True, a.tiles, False, b.tiles, dw, 1.0, 0.0, "fp32", k_over_places=True, bias_grad=db,
                       bias_grad_of=of)
            ref = dy.double().t() @ x.double() if of == "a" else x.double().t() @ dy.double()
            assert torch.equal(dw.to_dense(), ref.float()), of
            assert torch.equal(db.to_dense(), dy.double().sum(0).float()), of
    finally:
        nt.shutdown()


def test_default_rows_per_tile_and_number_of_places():
    from nntile_torch.config import rows_per_tile
    assert rows_per_tile(8, 1024, cuda=True, places=1) == 8192  # the whole batch in one tile on one GPU
    assert rows_per_tile(8, 1024, cuda=True, places=3) == 3072  # whole sequences, the batch split once per place
    assert rows_per_tile(16, 37, cuda=True, places=2) == 8 * 37
    assert rows_per_tile(8, 1024, cuda=False, places=3) == 1024  # one sequence per tile on CPUs
    nt.shutdown()
    nt.init(ncpus=2, ncuda=0, places=3)
    assert nt.runtime.num_places() == 3 and len(nt.info()["places"]) == 3
    nt.shutdown()
    nt.init(ncpus=2, ncuda=0)
    assert nt.runtime.num_places() == 1
    nt.shutdown()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="requires CUDA (a GPU and a CUDA build)")
def test_offloaded_parameters_update_on_cpu_workers_when_places_are_gpu_workers():
    """Places are the CUDA workers when there are two or more (two streams per GPU here, two GPUs alike); the
    updates and bf16 copies of AdamW(offload=...)'s parameters run on CPU workers all the same (a place naming a
    CUDA worker left such a task no worker: ENODEV at submission), their states stay in host RAM, and the losses
    are those without offload (each after the updates before it; CPU and GPU AdamW kernels round differently,
    and AdamW turns near-zero gradients into steps of size lr, so weights are not compared)."""
    nodes = []

    def host_state_nodes(model, opt):
        nt.synchronize()
        nodes.extend(n for p in model.parameters() if nt.param_state(p).on_host
                     for n in opt.state[p]["exp_avg"].tiles.valid_nodes())

    kw = dict(ncuda=None, streams_per_gpu=2, precision="bf16")  # places=2: the GPU's two CUDA workers
    l_gpu, _, _ = train(ncpus=2, places=2, **kw)
    l_host, _, _ = train(ncpus=2, places=2, offload=0.5, inspect=host_state_nodes, **kw)
    assert l_host == pytest.approx(l_gpu, rel=1e-4), (l_host, l_gpu)
    assert nodes and all(n == [0] for n in nodes), nodes
