"""Which GEMM runs the low-bit linears fastest at the grid's shapes, and exactly? (issue 30:
"a faster FP8 GEMM at 400-900 tokens")

For every linear of LLaDA-8B and Dream-7B (out x in) at the rows the grid's forwards have
(batch-1 decodes of 416 / 864 / 1,936 rows, the heaviest MC batches, a few small ones), each
GEMM's GPU time: bf16 ``torch.mm`` (the FP model's), cuBLASLt's row-wise scaled FP8 GEMM
(``torch._scaled_mm``, the backend's GEMM until now) and :mod:`fair_calib.quant.lowbit_gemm`
at each tile setting in ``CONFIGS``. Every Triton output is checked
bit for bit against :func:`lowbit.emulate_gemm` on the same codes, in bfloat16 and in float32
(which shows any accumulator error: codes spanning the 4-bit range, and rows whose sums are
the largest possible, 64 K, with their low bits set). Times are CUDA-graph replays of 16 calls over
rotating weight copies (more bytes than L2 holds, as in a forward), so neither the host nor a
warm L2 flatters them. One JSON line per shape; then, per model and rows, a step's GEMM time
(every linear of every layer) with each GEMM, against the FLOP floor at the measured peaks.

    PYTHONPATH=. python benchmarks/lowbit_gemm_gpu.py [--smoke]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import structures  # noqa: E402
from benchmarks.structures import emit  # noqa: E402
from fair_calib.quant import lowbit_gemm as lg  # noqa: E402
from fair_calib.quant.lowbit import emulate_gemm  # noqa: E402

# model -> (layers, [(name, out, in, per layer)])
MODELS = {
    "llada-8b": (32, [("qkvo", 4096, 4096, 4), ("gate_up", 12288, 4096, 2),
                      ("down", 4096, 12288, 1)]),
    "dream-7b": (28, [("q_o", 3584, 3584, 2), ("k_v", 512, 3584, 2),
                      ("gate_up", 18944, 3584, 2), ("down", 3584, 18944, 1)]),
}
ROWS = (16, 64, 416, 864, 1936, 3072, 4096, 6144)
SMOKE_ROWS = (416,)
# (BM, BN, BK, GROUP_M, STAGES, warps)
CONFIGS = [
    (128, 128, 128, 8, 4, 8), (128, 128, 128, 8, 3, 4), (128, 256, 128, 8, 3, 8),
    (64, 128, 128, 8, 4, 4), (64, 256, 128, 8, 4, 8), (128, 64, 128, 8, 4, 4),
    (64, 64, 128, 8, 5, 4), (128, 128, 64, 8, 5, 8), (256, 128, 128, 8, 3, 8),
    (64, 128, 128, 8, 3, 4), (64, 128, 128, 8, 5, 4), (64, 128, 256, 8, 3, 4),
    (64, 256, 128, 8, 3, 4), (64, 64, 256, 8, 4, 4), (128, 128, 128, 8, 4, 4),
    (128, 128, 128, 4, 3, 4), (128, 128, 256, 8, 2, 4), (64, 128, 128, 4, 4, 4),
]
CALLS = 16
L2_BYTES = 200 * 2 ** 20


def graph_time_us(fns, reps: int = 5) -> float:
    """GPU time of one call: the median replay of a graph of len(fns) calls, divided."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns[:2]:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(fns))
    del g
    return sorted(times)[len(times) // 2]


def operands(rows, n, k, gen):
    copies = max(1, min(CALLS, L2_BYTES // (n * k)))
    xc = torch.randint(-8, 8, (rows, k), generator=gen, dtype=torch.int8)
    ws = [torch.randint(-8, 8, (n, k), generator=gen, dtype=torch.int8) for _ in range(copies)]
    # the largest sums, with their lowest bits set: 64 (k - 1) - 8 and 64 k
    xc[0], xc[-1], ws[0][0] = -8, -8, -8
    xc[0, 0] = 1
    xs = torch.rand(rows, generator=gen) * 0.01 + 1e-3
    wsc = torch.rand(n, generator=gen) * 0.01 + 1e-3
    bias = torch.randn(n, generator=gen).to(torch.bfloat16)
    return [t.cuda() for t in (xc, xs, wsc, bias)] + [[w.cuda() for w in ws]]


def measure_shape(model, name, rows, n, k, gen, configs):
    xc, xs, wsc, bias, wcs = operands(rows, n, k, gen)
    ref = emulate_gemm(xc, xs, wcs[0], wsc, bias, torch.bfloat16)
    ref32 = emulate_gemm(xc, xs, wcs[0], wsc, bias, torch.float32)
    rec = {"model": model, "linear": name, "rows": rows, "out": n, "in": k}
    xb = (xc.float() * 0.01).to(torch.bfloat16)
    wbs = [(w.float() * 0.01).to(torch.bfloat16) for w in wcs]
    rec["bf16_us"] = graph_time_us([lambda w=wbs[i % len(wbs)]: torch.mm(xb, w.t())
                                    for i in range(CALLS)])
    del wbs
    x8 = xc.to(torch.float8_e4m3fn)
    w8s = [w.to(torch.float8_e4m3fn) for w in wcs]

    def cublas(w):
        return torch._scaled_mm(x8, w.t(), scale_a=xs.reshape(-1, 1), scale_b=wsc.reshape(1, -1),
                                bias=bias, out_dtype=torch.bfloat16, use_fast_accum=False)
    y = cublas(w8s[0])
    rec["cublas_fp8_max_ulp_diff"] = float((y.float() - ref.float()).abs().max())
    rec["cublas_fp8_us"] = graph_time_us([lambda w=w8s[i % len(w8s)]: cublas(w)
                                          for i in range(CALLS)])
    for cfg in configs:
        key = f"int8_{'x'.join(map(str, cfg))}"
        try:
            y = lg.gemm(xc, wcs[0], xs, wsc, bias, torch.bfloat16, config=cfg)
            y32 = lg.gemm(xc, wcs[0], xs, wsc, bias, torch.float32, config=cfg)
            rec[key + "_exact"] = bool(torch.equal(y, ref)) and bool(torch.equal(y32, ref32))
            rec[key + "_us"] = graph_time_us([
                lambda w=wcs[i % len(wcs)]: lg.gemm(xc, w, xs, wsc, bias, torch.bfloat16,
                                                    config=cfg) for i in range(CALLS)])
        except Exception as e:                           # a tile that does not fit: say so
            rec[key + "_error"] = f"{type(e).__name__}: {str(e)[:120]}"
    rec["best_int8"], _ = best(rec)
    return rec


def best(rec):
    """(tile setting, us) of the fastest exact int8 setting of a shape; (None, None) if none."""
    keys = [k for k in rec if k.startswith("int8_") and k.endswith("_us")
            and rec.get(k[:-3] + "_exact")]
    if not keys:
        return None, None
    k = min(keys, key=rec.get)
    return k[len("int8_"):-3], rec[k]


def peak_tflops(dtype) -> float:
    n = 8192
    a = torch.randint(-8, 8, (n, n), device="cuda", dtype=torch.int8)
    b = torch.randint(-8, 8, (n, n), device="cuda", dtype=torch.int8)
    one = torch.ones(1, device="cuda")
    if dtype == "fp8":
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        fn = lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one,  # noqa: E731
                                      out_dtype=torch.bfloat16)
    elif dtype == "int8":
        fn = lambda: torch._int_mm(a, b.t())  # noqa: E731
    else:
        ab, bb = a.to(torch.bfloat16), b.to(torch.bfloat16)
        fn = lambda: torch.mm(ab, bb.t())  # noqa: E731
    us = graph_time_us([fn] * 8)
    return 2 * n ** 3 / us / 1e6


def step_summary(recs):
    out = []
    for model, (layers, lins) in MODELS.items():
        for rows in sorted({r["rows"] for r in recs if r["model"] == model}):
            rs = {r["linear"]: r for r in recs if r["model"] == model and r["rows"] == rows}
            if len(rs) != len(lins):
                continue
            tot = {"bf16": 0.0, "cublas_fp8": 0.0, "int8": 0.0}
            flops = 0.0
            for name, n, k, per in lins:
                r = rs[name]
                cnt = per * layers
                flops += 2 * rows * n * k * cnt
                tot["bf16"] += r["bf16_us"] * cnt
                tot["cublas_fp8"] += r["cublas_fp8_us"] * cnt
                t = best(r)[1]
                tot["int8"] = None if t is None or tot["int8"] is None else tot["int8"] + t * cnt
            out.append({"model": model, "rows": rows, "gflop": round(flops / 1e9, 1),
                        **{f"{k}_ms": None if v is None else round(v / 1e3, 3)
                           for k, v in tot.items()}})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="one row count, two tile settings")
    ap.add_argument("--rows", type=int, nargs="+", default=None, help=f"default {ROWS}")
    ap.add_argument("--configs", nargs="+", default=None, metavar="BMxBNxBKxGROUPxSTAGESxWARPS",
                    help="tile settings to time (default: CONFIGS)")
    ap.add_argument("--out", default=None, help="also append the JSON lines to this file")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    rows_list = args.rows or (SMOKE_ROWS if args.smoke else ROWS)
    configs = CONFIGS[:2] if args.smoke else CONFIGS
    if args.configs:
        configs = [tuple(int(v) for v in c.split("x")) for c in args.configs]
    structures.OUT = args.out
    emit({"card": torch.cuda.get_device_name(), "torch": torch.__version__,
          "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          **{f"peak_{d}_tflops": round(peak_tflops(d), 1) for d in ("bf16", "fp8", "int8")}})
    recs = []
    for model, (_, lins) in MODELS.items():
        for rows in rows_list:
            for name, n, k, _ in lins:
                rec = measure_shape(model, name, rows, n, k, gen, configs)
                recs.append(rec)
                emit(rec)
    for s in step_summary(recs):
        emit({"step": True, **s})


if __name__ == "__main__":
    main()
