"""Why did one 8-bit RTN scale miss its bound (issue 30, third session)? How often does a group
with a fused RMSNorm move its token's max by one bf16 ulp?

Dream-7B's RTN groups at 8 bits (one block, random weights): 262,144 random tokens through the
fused-norm groups (q/k/v, gate/up), the plain o_proj group and (65,536) the SwiGLU down_proj
group; for each token whose kernel scale is off the emulation's by more than two float32 ulp,
the relative difference and its distance in bf16 ulps of the token's max.

    PYTHONPATH=. python benchmarks/fused_norm_ulps_gpu.py
"""
import sys

import torch

sys.path.insert(0, ".")
from benchmarks import shapes
from benchmarks.structures import block_groups, quantize_method
from fair_calib.quant import lowbit, lowbit_triton

torch.manual_seed(0)
lm = shapes.build("dream-7b", layers=1, device="cuda")
groups = block_groups(lm, "cuda")
quantize_method(lm, groups, "rtn", "real", 8)
b = lm.blocks[0]
g = torch.Generator(device="cuda").manual_seed(1)

def ulps(a, ref):
    sp = torch.exp2(torch.floor(torch.log2(ref.abs().clamp_min(2.0 ** -126))) - 7)
    return (a - ref).abs() / sp

@torch.no_grad()
def run(name, gated, chunks=16, T=16384):
    inp = b.get_submodule(name).backend.inp
    ev = []
    n = 0
    for c in range(chunks):
        x = (torch.randn(T, inp.dim, device="cuda", generator=g) * 2).to(torch.bfloat16)
        up = (torch.randn(T, inp.dim, device="cuda", generator=g)).to(torch.bfloat16) if gated else None
        codes, s = lowbit_triton.quantize_input(inp, x, up)
        xin = x if up is None else lowbit.silu_mul(x, up)
        rc, rs = inp.scales_and_codes(inp.transform(xin))
        s = s[:, :T]
        rel = (s - rs).abs() / rs
        bad = (rel > 2.4e-7).nonzero()
        q = 2 ** (inp.bits - 1) - 1
        for k, t in bad.tolist():
            ev.append((float(rel[k, t]), float(ulps(s[k, t] * q, rs[k, t] * q))))
        n += T
    print(name, "fused_norm", inp.norm is not None, "gated", gated, "tokens", n, "events", len(ev),
          "worst rel %.3g" % max([e[0] for e in ev], default=0), "bf16 ulps of max:", sorted({round(e[1], 2) for e in ev})[:8], flush=True)

run("self_attn.q_proj", False)
run("mlp.gate_proj", False)
run("self_attn.o_proj", False)
run("mlp.down_proj", True, chunks=4)
