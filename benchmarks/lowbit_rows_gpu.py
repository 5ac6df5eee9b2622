"""Does every token count run through the real low-bit path and give the emulation's result?

Each structure of ``benchmarks/shapes.py`` on one block at the real LLaDA-8B / Dream-7B
shapes (random weights); every low-bit linear on the input it gets in the block's forward at
1..64 tokens and a sample up to 4,096 (``--tokens``):
- ``codes``: the fused kernel's codes and scales against the emulation's torch arithmetic: the
  share of codes that differ (<= ``CODE_TOLERANCE``, each by one step: rounding ties, since
  torch on CUDA divides through a reciprocal; docs/fidelity.md) and the largest relative scale
  difference (two float32 ulp; one bf16 ulp of the token's max for transformed groups and
  groups with a fused RMSNorm);
- ``gemm``: the real GEMM of those codes against the emulation's exact integer product, scaled
  in float32 and rounded to bf16: the int8 Triton GEMM bit for bit, cuBLAS's FP8 GEMM
  (``FAIR_CALIB_LOWBIT_GEMM=cublas``) within ``GEMM_ULPS``;
- ``rows``: each linear at m = 1..64 rows against the same rows inside batches of 64 and 4,096,
  bit for bit (a padding row never changes another row).
Per linear, because a random block's output moves by 10-50% when 0.1% of its codes move.

    PYTHONPATH=. python benchmarks/lowbit_rows_gpu.py [--shapes llada-8b dream-7b]
        [--structures fair_calib quarot rtn] [--bits 4|8] [--tokens M ...]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import shapes  # noqa: E402
from benchmarks.shapes import STRUCTURES, emit  # noqa: E402
from fair_calib.quant import lowbit, lowbit_triton  # noqa: E402
from fair_calib.quant.blockio import call_block, capture_block_inputs  # noqa: E402

TOKENS = list(range(1, 65)) + [100, 255, 401, 403, 408, 856, 1000, 1280, 2047, 4096]
CODE_TOLERANCE = 0.01
SCALE_TOLERANCE = 2.4e-7           # two float32 ulp (the CUDA division, docs/fidelity.md)
# A transformed group's token max is a bf16 product summed in the kernel's order, and a fused
# RMSNorm sums the token's squares in its own order: either can move the max by one bf16 ulp,
# the scale by up to 2^-7 (measured on an H100: about one token in 10^5; docs/benchmarks.md).
SCALE_TOLERANCE_TRANSFORMED = 2.0 ** -7
GEMM_ULPS = 1.0     # the epilogue's float32 scaling in another order: one bf16 rounding apart


def linear_inputs(lm, shape: str, m: int, dev: str) -> dict:
    """{name: (x, up)} of every low-bit linear of block 0 in one forward of m tokens."""
    block = lm.blocks[0]
    ids = shapes.ids_for(shape, 1, m, dev)
    inputs = capture_block_inputs(lm.model, block, ids, 1, device=dev,
                                  hidden_dtype=lm.embed.weight.dtype)
    rec = {}
    hooks = [mod.register_forward_pre_hook(
        lambda _m, a, n=n: rec.__setitem__(n, (a[0], a[1] if len(a) > 1 else None)))
        for n, mod in block.named_modules() if isinstance(mod, lowbit.LowBitLinear)]
    try:
        call_block(block, inputs, 0, inputs.hidden[0])
    finally:
        for h in hooks:
            h.remove()
    return rec


def compare_linear(be, x, up) -> tuple[float, float, float]:
    """(fraction of codes differing, max relative scale difference as a fraction of its bound,
    the GEMM's largest difference from the emulation's product of the same codes in bf16
    ulps)."""
    inp = be.inp
    x2 = x.reshape(-1, inp.dim)
    u2 = None if up is None else up.reshape(-1, inp.dim)
    t = x2.shape[0]
    codes, scales = lowbit_triton.quantize_input(inp, x2, u2)
    ref_c, ref_s = inp.scales_and_codes(inp.transform(x2 if u2 is None else lowbit.silu_mul(x2, u2)))
    c, s = codes[:, :t].float(), scales[:, :t]
    k = min(be.user, inp.n_readers - 1)
    y = lowbit_triton.gemm(be, codes[k], scales[k], torch.bfloat16, t)
    y_ref = lowbit.emulate_gemm(c[k], s[k], be.weight_int(), be.w_scale, be.bias, torch.bfloat16)
    bound = (SCALE_TOLERANCE_TRANSFORMED if inp.p1 is not None or inp.norm is not None
             else SCALE_TOLERANCE)
    return (float((c != ref_c).float().mean()),
            float(((s - ref_s).abs() / ref_s).max()) / bound, bf16_ulps(y, y_ref))


def bf16_ulps(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |y - ref| in units of ref's bf16 spacing (0: bit for bit)."""
    r = ref.float()
    spacing = torch.exp2(torch.floor(torch.log2(r.abs().clamp_min(2.0 ** -126))) - 7)
    return float(((y.float() - r).abs() / spacing).max())


@torch.no_grad()
def check_codes(lm, shape: str, name: str, dev: str, tokens=TOKENS) -> bool:
    worst = {"code_diff": 0.0, "scale_of_bound": 0.0, "gemm_ulps": 0.0, "gemm_not_bitwise": 0,
             "linears": 0}
    for m in tokens:
        for lname, (x, up) in linear_inputs(lm, shape, m, dev).items():
            diff, rel, ulps = compare_linear(lm.blocks[0].get_submodule(lname), x, up)
            worst["code_diff"] = max(worst["code_diff"], diff)
            worst["scale_of_bound"] = max(worst["scale_of_bound"], rel)
            worst["gemm_ulps"] = max(worst["gemm_ulps"], ulps)
            worst["gemm_not_bitwise"] += ulps > 0
            worst["linears"] += 1
    ok = (worst["code_diff"] <= CODE_TOLERANCE and worst["scale_of_bound"] <= 1.0
          and worst["gemm_ulps"] <= GEMM_ULPS)
    emit({"kind": "rows_codes", "shape": shape, "structure": name,
          "tokens": len(tokens), **worst, "ok": ok})
    return ok


@torch.no_grad()
def check_rows(lm, shape: str, name: str, dev: str) -> bool:
    """Each linear of the block on m rows vs the same rows in batches of 64 and 4,096."""
    g = torch.Generator(device=dev).manual_seed(0)
    ok = True
    for lname, ql in lm.blocks[0].named_modules():
        be = getattr(ql, "backend", None)
        if not isinstance(be, lowbit.LowBitLinear):
            continue
        x = torch.randn(4096, be.in_features, device=dev, generator=g, dtype=torch.bfloat16)
        up = torch.randn_like(x) if lname.endswith("down_proj") else None

        def run(rows):
            return be(x[:rows]) if up is None else be(x[:rows], up[:rows])
        full, y64 = run(4096), run(64)
        bad = [m for m in range(1, 65) if not (torch.equal(run(m), y64[:m])
                                               and torch.equal(y64, full[:64]))]
        ok &= not bad
        emit({"kind": "rows_linear", "shape": shape, "structure": name, "linear": lname,
              "gated_input": up is not None, "rows_not_bitwise_equal": bad})
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["llada-8b", "dream-7b"])
    ap.add_argument("--structures", nargs="+", default=list(STRUCTURES), choices=STRUCTURES)
    ap.add_argument("--bits", type=int, default=4, choices=[4, 8])
    ap.add_argument("--tokens", type=int, nargs="+", default=TOKENS)
    args = ap.parse_args(argv)
    dev = "cuda"
    emit({"kind": "env", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
          "bits": args.bits})
    failed = []
    for shape in args.shapes:
        for name in args.structures:
            t0 = time.perf_counter()
            lm = shapes.build(shape, layers=1, device=dev)
            shapes.quantize(lm, shapes.block_groups(lm, dev), name, args.bits)
            codes_ok = check_codes(lm, shape, name, dev, args.tokens)
            rows_ok = check_rows(lm, shape, name, dev)
            if not (codes_ok and rows_ok):
                failed.append((shape, name))
            emit({"kind": "rows_done", "shape": shape, "structure": name,
                  "seconds": round(time.perf_counter() - t0, 1)})
            del lm
            torch.cuda.empty_cache()
    emit({"kind": "rows_summary", "failed": failed})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
