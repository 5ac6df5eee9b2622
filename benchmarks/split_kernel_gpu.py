"""Which split-kernel setting quantizes a down_proj input fastest at a decode's token counts?
(issue 30: Dream's 128 x 148 tile took 2.1 of a 12.3 ms step at prompt 152)

``lowbit_triton.SPLIT_TUNED`` was measured at 4,096 tokens. A batch-1 decode runs 408-1,280
tokens, where one token per program makes three to ten waves of the multiprocessors, not 31.
For FAIR-Calib's down_proj input group (LLaDA-8B's 96 x 128, Dream-7B's 128 x 148 Kronecker
factors at their initialisation, the SwiGLU product fused) on one block at the real shapes,
each setting in ``VARIANTS`` at each token count: the GPU time of
:func:`lowbit_triton.quantize_input` (median CUDA-graph replay of 16 calls, SwiGLU product
included where the setting forms it in the kernel, the one-pass product kernel's time
included where not) and whether its codes and scales equal the current setting's bit for bit.

    PYTHONPATH=. python benchmarks/split_kernel_gpu.py [--shapes llada-8b dream-7b]
        [--tokens 408 856 1280 4096]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.lowbit_gemm_gpu import graph_time_us  # noqa: E402
from benchmarks.lowbit_rows_gpu import linear_inputs, structure  # noqa: E402
from benchmarks.structures import emit  # noqa: E402
from fair_calib.quant import lowbit_triton  # noqa: E402

VARIANTS = {
    "br128_w8_regs_gated": dict(SPLIT_BR=128, SPLIT_WARPS=8, SPLIT_UNROLL=False, SPLIT_REGS=True,
                                SPLIT_GATED=True),
    "br128_w8_regs": dict(SPLIT_BR=128, SPLIT_WARPS=8, SPLIT_UNROLL=False, SPLIT_REGS=True,
                          SPLIT_GATED=False),
    "br128_w8_unroll": dict(SPLIT_BR=128, SPLIT_WARPS=8, SPLIT_UNROLL=True, SPLIT_REGS=False,
                            SPLIT_GATED=False),
    "br128_w8_unroll_gated": dict(SPLIT_BR=128, SPLIT_WARPS=8, SPLIT_UNROLL=True,
                                  SPLIT_REGS=False, SPLIT_GATED=True),
    "br64_w4_gated": dict(SPLIT_BR=64, SPLIT_WARPS=4, SPLIT_UNROLL=True, SPLIT_REGS=False,
                          SPLIT_GATED=True),
    "br64_w4": dict(SPLIT_BR=64, SPLIT_WARPS=4, SPLIT_UNROLL=True, SPLIT_REGS=False,
                    SPLIT_GATED=False),
    "br64_w8_gated": dict(SPLIT_BR=64, SPLIT_WARPS=8, SPLIT_UNROLL=True, SPLIT_REGS=False,
                          SPLIT_GATED=True),
}
TOKENS = (408, 856, 1280, 4096)
CALLS = 16


@torch.no_grad()
def sweep(shape: str, tokens, dev: str = "cuda") -> None:
    lm = structure(shape, "fair_calib", dev)
    for m in tokens:
        (name, (x, up)), = [(n, v) for n, v in linear_inputs(lm, shape, m, dev).items()
                            if "down_proj" in n]
        inp = lm.blocks[0].get_submodule(name).inp
        x2, u2 = x.reshape(-1, inp.dim), up.reshape(-1, inp.dim)
        key = (inp.n1, inp.n2)
        current = dict(lowbit_triton.SPLIT_TUNED.get(key, {}))
        full = lowbit_triton.split_settings(*key)
        ref = lowbit_triton.quantize_input(inp, x2, u2)
        try:
            for label, setting in VARIANTS.items():
                lowbit_triton.SPLIT_TUNED[key] = {**current, **setting}
                codes, scales = lowbit_triton.quantize_input(inp, x2, u2)
                same = bool(torch.equal(codes, ref[0]) and torch.equal(scales, ref[1]))
                us = graph_time_us([lambda: lowbit_triton.quantize_input(inp, x2, u2)] * CALLS)
                emit({"kind": "split_kernel", "shape": shape, "tile": list(key), "tokens": m,
                      "variant": label, "current": all(full[k] == v for k, v in setting.items()),
                      "us": round(us, 2), "codes_equal_current": same})
        finally:
            lowbit_triton.SPLIT_TUNED[key] = current


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["llada-8b", "dream-7b"])
    ap.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    args = ap.parse_args()
    emit({"kind": "env", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
          "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
    for shape in args.shapes:
        sweep(shape, args.tokens)


if __name__ == "__main__":
    main()
