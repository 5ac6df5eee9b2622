"""Which split-kernel settings quantize Dream's down_proj input fastest at the grid's token
counts? (issue 30: the replayed W4A4 step's profile, docs/benchmarks.md)

``lowbit_triton.SPLIT_TUNED`` was swept at 4,096 tokens; batch-1 decoding runs 400-2,000. For
each structure's down_proj input of one Dream-7B block (random weights, the real width: FAIR-Calib
128 x 148, QuaRot 148 x 128) and each token count, every setting of the grid below is timed
(CUDA events, SwiGLU product included) and its codes and scales are checked bit for bit against
the module's current settings. One JSON line per (structure, tokens, setting); a summary line per
(structure, tokens) with the current and the fastest setting.

    PYTHONPATH=. python benchmarks/split_kernel_gpu.py [--tokens 408 856 1280 4096]
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import shapes  # noqa: E402
from benchmarks.structures import (block_groups, emit, quantize_fair_calib,  # noqa: E402
                                   quantize_quarot)
from fair_calib.quant import lowbit, lowbit_triton  # noqa: E402

GRID = {"SPLIT_BR": (64, 128), "SPLIT_WARPS": (4, 8), "SPLIT_UNROLL": (False, True),
        "SPLIT_REGS": (False, True), "SPLIT_GATED": (False, True)}


def down_input(structure: str):
    lm = shapes.build("dream-7b", layers=1, device="cuda")
    groups = block_groups(lm, "cuda")
    if structure == "fair_calib":
        quantize_fair_calib(lm, groups)
    else:
        quantize_quarot(lm, groups, 128)
    for name, m in lm.model.named_modules():
        if isinstance(m, lowbit.LowBitLinear) and "down_proj" in name:
            return m.inp
    raise RuntimeError("no low-bit down_proj")


def timed(fn, iters: int = 20) -> float:
    """Median microseconds of one call (CUDA events)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return sorted(times)[len(times) // 2]


def sweep(structure: str, tokens: list[int]) -> None:
    inp = down_input(structure)
    tile = (inp.n1, inp.n2)
    current = dict(lowbit_triton.SPLIT_TUNED.get(tile, {}))
    g = torch.Generator(device="cuda").manual_seed(0)
    for T in tokens:
        x = torch.randn(T, inp.dim, device="cuda", dtype=torch.bfloat16, generator=g)
        up = torch.randn(T, inp.dim, device="cuda", dtype=torch.bfloat16, generator=g)
        lowbit_triton.SPLIT_TUNED[tile] = current
        ref = lowbit_triton.quantize_input(inp, x, up)
        base_us = timed(lambda: lowbit_triton.quantize_input(inp, x, up))
        best = (base_us, current)
        for values in itertools.product(*GRID.values()):
            setting = dict(zip(GRID, values))
            lowbit_triton.SPLIT_TUNED[tile] = setting
            try:
                out = lowbit_triton.quantize_input(inp, x, up)
                same = all(torch.equal(a.view(torch.uint8) if a.dtype.itemsize == 1 else a, 
                                       b.view(torch.uint8) if b.dtype.itemsize == 1 else b)
                           for a, b in zip(out, ref))
                us = timed(lambda: lowbit_triton.quantize_input(inp, x, up))
            except Exception as err:      # a setting the compiler refuses: record and go on
                emit({"kind": "split_setting", "structure": structure, "tokens": T,
                      "setting": setting, "error": str(err)[:200]})
                continue
            emit({"kind": "split_setting", "structure": structure, "tokens": T,
                  "setting": setting, "us": round(us, 1), "same_codes": same})
            if same and us < best[0]:
                best = (us, setting)
        lowbit_triton.SPLIT_TUNED[tile] = current
        emit({"kind": "split_best", "structure": structure, "tile": tile, "tokens": T,
              "current_us": round(base_us, 1), "best_us": round(best[0], 1),
              "best": best[1]})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[408, 856, 1280, 4096])
    ap.add_argument("--structures", nargs="+", default=["fair_calib", "quarot"])
    args = ap.parse_args(argv)
    emit({"kind": "env", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__})
    for s in args.structures:
        sweep(s, args.tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
