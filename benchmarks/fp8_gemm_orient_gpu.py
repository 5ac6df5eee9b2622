"""Does the FP8 GEMM of the low-bit path run faster at the grid's token counts with the tokens
on the GEMM's N side? (issue 30: the replayed W4A4 step is GPU-bound and its FP8 GEMMs reach
about 45 % of the FP8 peak at 408 tokens, 67 % at 856: docs/benchmarks.md)

cuBLASLt's row-wise scaled FP8 GEMM (``torch._scaled_mm``) runs one 128 x 128 tile kernel at
every shape the census measured; with the weight as the left operand (out^T = W X^T) the token
count sits on N, where other tiles may fit. For each linear shape of LLaDA-8B and Dream-7B and
each token count: both orientations timed (CUDA events, median of 30; the transposed result
made contiguous, as the next kernel needs it), and whether the results are bit-identical.
Random 4-bit codes as FP8, random positive scales.

    PYTHONPATH=. python benchmarks/fp8_gemm_orient_gpu.py
"""
from __future__ import annotations

import json
import sys

import torch

LINEARS = {"llada-8b": {"qkvo": (4096, 4096), "gate_up": (12288, 4096), "down": (4096, 12288)},
           "dream-7b": {"q_o": (3584, 3584), "kv": (512, 3584), "gate_up": (18944, 3584),
                        "down": (3584, 18944)}}
TOKENS = (416, 576, 640, 704, 864, 1024, 1280, 1984)


def timed(fn, iters: int = 30) -> float:
    for _ in range(3):
        fn()
    out = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return sorted(out)[iters // 2]


def codes(rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(-8, 8, (rows, cols), device="cuda", generator=g).to(torch.float8_e4m3fn)


def main() -> int:
    print(json.dumps({"kind": "env", "gpu": torch.cuda.get_device_name(),
                      "torch": torch.__version__}), flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    for model, lins in LINEARS.items():
        for name, (n, k) in lins.items():
            w = codes(n, k, g)
            ws = torch.rand(n, device="cuda", generator=g) + 0.5
            for t in TOKENS:
                x = codes(t, k, g)
                xs = torch.rand(t, device="cuda", generator=g) + 0.5

                def tokens_m():
                    return torch._scaled_mm(x, w.t(), scale_a=xs.reshape(-1, 1),
                                            scale_b=ws.reshape(1, -1), out_dtype=torch.bfloat16)

                def tokens_n():
                    return torch._scaled_mm(w, x.t(), scale_a=ws.reshape(-1, 1),
                                            scale_b=xs.reshape(1, -1),
                                            out_dtype=torch.bfloat16).t().contiguous()

                def tokens_n_view():
                    return torch._scaled_mm(w, x.t(), scale_a=ws.reshape(-1, 1),
                                            scale_b=xs.reshape(1, -1), out_dtype=torch.bfloat16)
                same = torch.equal(tokens_m(), tokens_n())
                m_us, n_us, nv_us = timed(tokens_m), timed(tokens_n), timed(tokens_n_view)
                print(json.dumps({"kind": "fp8_gemm", "model": model, "linear": name, "n": n,
                                  "k": k, "tokens": t, "tokens_m_us": round(m_us, 1),
                                  "tokens_n_us": round(n_us, 1),
                                  "tokens_n_no_copy_us": round(nv_us, 1),
                                  "tflops_m": round(2 * n * k * t / m_us / 1e6, 0),
                                  "bit_identical": same}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
