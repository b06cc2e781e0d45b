"""Shared fixtures: devices (CUDA ones marked and skipped without a GPU) and the error-ratio check."""
import pytest
import torch

import nntile_torch

HAS_CUDA = torch.cuda.is_available() and nntile_torch._C.built_with_cuda

DEVICES = [
    pytest.param("cpu", id="device=cpu"),
    pytest.param("cuda", id="device=cuda", marks=[
        pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="requires CUDA (a GPU and a CUDA build)")]),
]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def max_err(a, ref):
    return (a.detach().to(torch.float64).cpu() - ref.detach().to(torch.float64).cpu()).abs().max().item()


def assert_close_as_torch(ours, torch_same_precision, ref64, factor=2.0, what=""):
    """ours must be no further from the float64 reference than `factor` times torch in the same precision
    (plus a few float32 ulps of the reference's scale, for results torch happens to get exact)."""
    scale = ref64.detach().abs().max().item() or 1.0
    e_ours = max_err(ours, ref64)
    e_torch = max_err(torch_same_precision, ref64)
    bound = factor * e_torch + 4 * torch.finfo(torch.float32).eps * scale
    assert e_ours <= bound, f"{what}: error {e_ours:.3e} exceeds {bound:.3e} (torch's own error {e_torch:.3e})"
