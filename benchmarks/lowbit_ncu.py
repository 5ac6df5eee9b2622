"""Nsight Compute's view of the activation kernels of one W4A4 FAIR-Calib block (issue 20).

Quantizes each input group of one block of a real-shaped model (random weights, 4096 tokens)
twice, the down_proj group from gate's and up's outputs as the model calls it; the first call
compiles, and only the second pass is inside the profiler's range::

    ncu --profile-from-start off -k regex:act_quant --section SpeedOfLight \\
        --section Occupancy --section WarpStateStats \\
        python benchmarks/lowbit_ncu.py --shape dream-7b [--no-fast] [--no-regs] [--no-gated]

``--[no-]fast``, ``--[no-]regs``, ``--[no-]gated``, ``--warps``, ``--maxnreg``,
``--tile-maxnreg``: settings under test over the module's (``lowbit_triton.FAST_DIV``,
TILE_MAXNREG; the split kernel's SPLIT_REGS, SPLIT_GATED, SPLIT_WARPS, SPLIT_MAXNREG for the
tiles in ``SPLIT_TUNED``); unset, the module's own. Timings are not taken here: ncu
serializes and replays each kernel.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import shapes  # noqa: E402
from benchmarks.structures import block_groups, quantize_fair_calib  # noqa: E402
from fair_calib.quant import lowbit_triton as lt  # noqa: E402


@torch.no_grad()
def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="dream-7b")
    ap.add_argument("--tokens", type=int, default=4096)
    flag = argparse.BooleanOptionalAction
    ap.add_argument("--fast", action=flag, default=None)
    ap.add_argument("--regs", action=flag, default=None)
    ap.add_argument("--gated", action=flag, default=None)
    ap.add_argument("--warps", type=int, default=None)
    ap.add_argument("--maxnreg", type=int, default=None, help="the split kernel's register cap")
    ap.add_argument("--tile-maxnreg", type=int, default=None)
    args = ap.parse_args(argv)
    over = {k: v for k, v in (("FAST_DIV", args.fast), ("SPLIT_REGS", args.regs),
                              ("SPLIT_GATED", args.gated), ("SPLIT_WARPS", args.warps),
                              ("SPLIT_MAXNREG", args.maxnreg)) if v is not None}
    if args.fast is not None:
        lt.FAST_DIV = args.fast
    if args.tile_maxnreg is not None:
        lt.TILE_MAXNREG = args.tile_maxnreg
    lt.SPLIT_TUNED = {k: {**v, **over} for k, v in lt.SPLIT_TUNED.items()}
    lm = shapes.build(args.shape, layers=1, device="cuda")
    groups = block_groups(lm, "cuda")
    quantize_fair_calib(lm, groups)
    inputs = []
    for g in groups:
        inp = lm.blocks[0].get_submodule(g.names[0]).backend.inp
        x = torch.randn(args.tokens, g.in_features, device="cuda", dtype=torch.bfloat16)
        up = torch.randn_like(x) if g.names[0].endswith("down_proj") else None
        inputs.append((g.names[0], inp, x, up))
    for rep in range(2):
        if rep:
            torch.cuda.profiler.start()
        for _, inp, x, up in inputs:
            inp.quantize(x, up)
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("groups:", [name for name, *_ in inputs])


if __name__ == "__main__":
    main()
