"""Can the paper grid's projection reach 400 GPU-hours at any quantized speed? (issue 30's
cost bar)

``fair-calib cost`` prices every quantized request of the census at its measured ratio to
bf16 (``fair_calib.cost.QUANT_RATIOS``). The projection is linear in those ratios, so pricing
every quantized request (every structure but FP) at one ratio ``r`` gives
``total(r) = fixed + r * quantized``: ``fixed`` the FP rows, job starts, probing, calibration
and trajectories, ``quantized`` what the quantized requests would cost at bf16 speed. This
prints ``fixed`` and ``quantized``, the projection at the measured ratios and at each ``--ratio``,
and the one ratio ``r*`` at which the total is ``--target``. For comparison, the share of a
quantized decode step that is not GEMM time (measured by ``benchmarks/decode_profile_gpu.py`` on
a lent H100, docs/benchmarks.md: 0.30-0.40 of the bf16 step) is the ratio the grid would run at
if its quantized GEMMs took no time at all.

    PYTHONPATH=. python benchmarks/cost_floor.py --configfile config/paper.yaml
        [--ratio 0.30 0.32 0.36 0.40] [--target 400] [--data-dir ...]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fair_calib import cost  # noqa: E402
from fair_calib import census as census_mod  # noqa: E402


def projection_at(cfg, data_dir, ratio: float | None) -> float:
    """Total GPU-hours of the census projection, every quantized request at ``ratio`` (None:
    at its measured ratio)."""
    measured = cost.quant_ratio

    def uniform(family, structure, request_class, rows, tokens):
        r, entry = measured(family, structure, request_class, rows, tokens)
        return (r, entry) if structure == "fp" else (ratio, entry)
    cost.quant_ratio = measured if ratio is None else uniform
    try:
        per_cell: dict = {}
        records = census_mod.census(cfg, data_dir, per_cell=per_cell)
        return cost.project(cfg, records, per_cell)["census"]["total_gpu_hours"]
    finally:
        cost.quant_ratio = measured


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configfile", nargs="+", default=["config/paper.yaml"])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--ratio", type=float, nargs="+", default=[0.30, 0.32, 0.36, 0.40])
    ap.add_argument("--target", type=float, default=400.0)
    args = ap.parse_args(argv)
    cfg = cost.load_config(args.configfile)
    fixed = projection_at(cfg, args.data_dir, 0.0)
    quantized = projection_at(cfg, args.data_dir, 1.0) - fixed
    print(f"fixed (FP rows, job starts, probing, calibration, trajectories): {fixed:.1f} GPU-h")
    print(f"quantized requests at bf16 speed: {quantized:.1f} GPU-h")
    print(f"at the measured ratios (QUANT_RATIOS): {projection_at(cfg, args.data_dir, None):.1f}")
    for r in args.ratio:
        print(f"every quantized request at {r:.2f}x bf16: {projection_at(cfg, args.data_dir, r):.1f}")
    print(f"ratio at which the total is {args.target:g}: "
          f"{(args.target - fixed) / quantized:.3f}x bf16")
    return 0


if __name__ == "__main__":
    sys.exit(main())
