# Which fused attention kernels take dropout, how fast, and whether a backward given a hand-made (seed, offset)
# replays the forward's mask (what nntile's kept statistics need).
import time
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
aten = torch.ops.aten
B, H, T, D = 8, 25, 1024, 64
q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                 ("flash", SDPBackend.FLASH_ATTENTION)):
    for p in (0.0, 0.1):
        try:
            with sdpa_kernel(be):
                for i in range(13):
                    if i == 3: torch.cuda.synchronize(); t = time.perf_counter()
                    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
                    y.sum().backward()
                torch.cuda.synchronize(); print(name, p, "fwd+bwd ms", round((time.perf_counter() - t) / 10 * 1e3, 3))
                for i in range(13):
                    if i == 3: torch.cuda.synchronize(); t = time.perf_counter()
                    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
                torch.cuda.synchronize(); print(name, p, "fwd ms", round((time.perf_counter() - t) / 10 * 1e3, 3))
        except Exception as e:
            print(name, p, "refused:", str(e).splitlines()[0][:200])
gen = torch.cuda.default_generators[0]
def desc(t):
    return (tuple(t.shape), str(t.dtype), str(t.device), t.tolist() if t.numel() <= 2 else "...") if isinstance(t, torch.Tensor) else t
b, h, t_, d = 2, 3, 256, 64
qs, ks, vs = (torch.randn(b, h, t_, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
dy = torch.randn(b, h, t_, d, device="cuda", dtype=torch.bfloat16)
S, O = 0x1234567, 4096
p = 0.5
def adj(y, dv):
    a = (dy.float() * y.float()).sum().item(); c = (dv.float() * vs.float()).sum().item()
    return round(abs(a - c) / max(abs(a), 1e-9), 4)
for name in ("cudnn", "flash", "efficient"):
    try:
        gen.manual_seed(S); gen.set_offset(O)
        if name == "cudnn":
            out = aten._scaled_dot_product_cudnn_attention(qs, ks, vs, None, True, p, True, False)
            y, lse, cq, ck, mq, mk, seed, off = out[:8]
        elif name == "flash":
            out = aten._scaled_dot_product_flash_attention(qs, ks, vs, p, True, False)
            y, lse, cq, ck, mq, mk, seed, off = out[:8]
        else:
            y, lse, seed, off = aten._scaled_dot_product_efficient_attention(qs, ks, vs, None, True, p, True)
        print(name, "offset after", gen.get_offset(), "lse", desc(lse), "seed", desc(seed), "offset", desc(off))
        def bwd(sd, of):
            if name == "cudnn":
                return aten._scaled_dot_product_cudnn_attention_backward(dy, qs, ks, vs, y, lse, sd, of, None, cq, ck, mq, mk, p, True)
            if name == "flash":
                return aten._scaled_dot_product_flash_attention_backward(dy, qs, ks, vs, y, lse, cq, ck, mq, mk, p, True, sd, of)
            return aten._scaled_dot_product_efficient_attention_backward(dy, qs, ks, vs, None, y, lse, sd, of, p, [True, True, True, False], True)
        g1 = bwd(seed, off)
        print(name, "adjoint rel err, returned rng:", adj(y, g1[2]))
        if isinstance(seed, torch.Tensor) and seed.numel() == 2:
            hs = torch.tensor([S, O], dtype=seed.dtype, device=seed.device); ho = off
        else:
            hs = torch.full(seed.shape, S, dtype=seed.dtype, device=seed.device)
            ho = torch.full(off.shape, O, dtype=off.dtype, device=off.device)
        g2 = bwd(hs, ho)
        print(name, "hand-made rng: dv equal", torch.equal(g1[2], g2[2]), "adjoint", adj(y, g2[2]))
        g3 = bwd(torch.full_like(hs, S + 1) if hs.numel() == 1 else torch.tensor([S + 1, O], dtype=hs.dtype, device=hs.device), ho)
        print(name, "wrong seed: adjoint", adj(y, g3[2]))
        gen.manual_seed(S); gen.set_offset(O)
        y2 = (aten._scaled_dot_product_cudnn_attention(qs, ks, vs, None, True, p, True, False)[0] if name == "cudnn" else
              aten._scaled_dot_product_flash_attention(qs, ks, vs, p, True, False)[0] if name == "flash" else
              aten._scaled_dot_product_efficient_attention(qs, ks, vs, None, True, p, True)[0])
        print(name, "same (seed, offset) same output", torch.equal(y, y2))
        ones = torch.ones_like(vs)
        gen.manual_seed(S + 7); gen.set_offset(0)
        qz = torch.zeros_like(qs)
        yo = (aten._scaled_dot_product_cudnn_attention(qz, ks, ones, None, True, p, True, False)[0] if name == "cudnn" else
              aten._scaled_dot_product_flash_attention(qz, ks, ones, p, True, False)[0] if name == "flash" else
              aten._scaled_dot_product_efficient_attention(qz, ks, ones, None, True, p, True)[0])
        # uniform probabilities over j <= i: y_i = (kept among i+1) / ((i+1)(1-p)); mean over rows ~ 1
        print(name, "uniform rows: mean", round(yo[..., 0].float().mean().item(), 4))
    except Exception as e:
        print(name, "failed:", str(e).splitlines()[0][:300])
# the identity readout at the op level: the mask read with V = I (hd = T), applied to random V at the same seed
b, h, t_, d = 2, 2, 64, 64
qs, ks, vs = (torch.randn(b, h, t_, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
eye = torch.eye(t_, device="cuda", dtype=torch.bfloat16).expand(b, h, t_, t_).contiguous()
def run(name, vv):
    gen.manual_seed(S); gen.set_offset(O)
    if name == "cudnn":
        return aten._scaled_dot_product_cudnn_attention(qs, ks, vv, None, True, p, True, False)[0]
    if name == "flash":
        return aten._scaled_dot_product_flash_attention(qs, ks, vv, p, True, False)[0]
    return aten._scaled_dot_product_efficient_attention(qs, ks, vv, None, True, p, True)[0]
sc = (qs.float() @ ks.float().transpose(2, 3)) * d ** -0.5
sc = sc.masked_fill(torch.ones(t_, t_, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
P = torch.softmax(sc, -1)
for name in ("cudnn", "flash", "efficient"):
    try:
        M = run(name, eye) != 0
        y = run(name, vs).float()
        ref = (P * M / (1 - p)) @ vs.float()
        ref_t = (P * M.transpose(2, 3) / (1 - p)) @ vs.float()
        nodrop = P @ vs.float()
        e = lambda r: round(((y - r).abs().max() / r.abs().max()).item(), 4)
        print(name, "readout: kept share", round(M.float().sum().item() / (b * h * t_ * (t_ + 1) / 2), 4),
              "err vs masked ref", e(ref), "vs transposed mask", e(ref_t), "vs no dropout", e(nodrop))
    except Exception as ex:
        print(name, "readout failed:", str(ex).splitlines()[0][:200])
