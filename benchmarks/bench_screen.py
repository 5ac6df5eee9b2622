"""Fix the bench's bit-width before any method but the reference is run (issue 48).

    snakemake --cores 2 $(python benchmarks/bench_screen.py --targets rtn) \
        --configfile config/bench.yaml config/bench_screen.yaml
    snakemake --cores 2 $(python benchmarks/bench_screen.py --targets flatquant w2a4 ...) \
        --configfile config/bench.yaml config/bench_screen.yaml
    PYTHONPATH=. python benchmarks/bench_screen.py runs/bench

For each candidate bit-width and model: FP, RTN and FlatQuant (uniform weights, the reference;
five seeds) per task, FlatQuant's standard deviation over seeds, and the minimum detectable
difference (two-sided 5 %, 80 % power) that a second method with FlatQuant's own seed-to-seed
behaviour would have against it: ``2.80 * sqrt(2 s^2 / S + 2 mean_i(v_i) / (S N))``, v_i the
variance of item i's score over the seeds (report/paired.py's test for two such methods). The
bench's criteria: FP >= 60, RTN <= FP - 10, RTN < FlatQuant <= FP - 3, seed sd <= 2, MDE <= 2.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from fair_calib.report.paired import Z_ALPHA, Z_POWER, item_scores

# the bench's task: copying, scored by exact match (synth_copy); its Copy-MC items are written
# but not scored (multi-token choices: 16 Monte Carlo likelihood samples each, ~100 s a run)
METRIC = {"synth_gen": "exact_match,strict-match"}
BITS = ("w4a4", "w4a3", "w3a4", "w3a3", "w2a4")
REFERENCE = "flatquant-5"
# the reference's calibration variants (config/bench_screen.yaml), each with its five seeds
VARIANTS = ("flatquant-5", "flatquant-5-wide", "flatquant-5-id", "flatquant-5-more", "flatquant",
            "uniform-ptq", "flatquant-512", "uniform-512", "uniform-8ep")


def accuracy(path: Path, task: str) -> np.ndarray | None:
    # a gathered evaluation, or its shards' records where the gather has not run yet
    done = path.is_file() or any(path.with_suffix("").glob("shard-*.json"))
    return item_scores(path, METRIC[task]) if done else None


def screen_row(run: Path, model: str, bits: str, task: str,
               reference: str = REFERENCE) -> dict | None:
    ev = run / "results" / "eval" / model
    fp = accuracy(ev / "fp" / "fp" / f"{task}.parquet", task)
    rtn = accuracy(ev / "rtn" / bits / f"{task}.parquet", task)
    seeds = [accuracy(p / bits / f"{task}.parquet", task)
             for p in sorted(ev.glob(f"{reference}@s*"))]
    seeds = [s for s in seeds if s is not None]
    if fp is None or rtn is None:
        return None
    row = {"model": model, "bits": bits, "task": task, "variant": reference, "fp": 100 * fp.mean(),
           "rtn": 100 * rtn.mean(), "n": len(fp)}
    if len(seeds) >= 2:
        x = np.stack(seeds)
        acc = 100 * x.mean(axis=1)
        s2 = acc.var(ddof=1)
        v = x.var(axis=0, ddof=1).mean()
        se = math.sqrt(2 * s2 / len(x) + 2 * v / (len(x) * x.shape[1]) * 1e4)
        row.update(flatquant=acc.mean(), sd=math.sqrt(s2), seeds=len(x),
                   mde=(Z_ALPHA + Z_POWER) * se)
    return row


def verdict(r: dict) -> str:
    if "flatquant" not in r:
        return "no reference seeds"
    fails = [why for ok, why in (
        (r["fp"] >= 60, "FP < 60"), (r["rtn"] <= r["fp"] - 10, "RTN within 10 of FP"),
        (r["rtn"] < r["flatquant"] <= r["fp"] - 3, "FlatQuant not in (RTN, FP - 3]"),
        (r["sd"] <= 2, "seed sd > 2"), (r["mde"] <= 2, "MDE > 2")) if not ok]
    return "meets every criterion" if not fails else "; ".join(fails)


MODELS = ("tiny-dream",)


def targets(step: str, bits: list[str]) -> list[str]:
    """The screen's Snakemake targets (relative to the bench's workdir)."""
    if step == "rtn":
        return [f"results/eval/{m}/{x}/{b}/{t}.parquet" for m in MODELS for t in METRIC
                for x, b in [("fp", "fp")] + [("rtn", b) for b in BITS]]
    return [f"results/eval/{m}/{REFERENCE}@s{k}/{b}/{t}.parquet" for m in MODELS
            for b in bits for t in METRIC for k in range(5)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, nargs="?", help="the bench's workdir (runs/bench)")
    ap.add_argument("--targets", nargs="+", metavar=("STEP", "BITS"),
                    help="print step 1's (rtn) or step 2's (flatquant BITS...) targets")
    args = ap.parse_args()
    if args.targets:
        print(" ".join(targets(args.targets[0], args.targets[1:])))
        return
    models = sorted(p.name for p in (args.run / "results" / "eval").iterdir())
    print("| model | bits | task | calibration | FP | RTN | FlatQuant (sd, seeds) | projected MDE "
          "| verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model in models:
        for bits in BITS:
            for task in METRIC:
                rows = [screen_row(args.run, model, bits, task, v) for v in VARIANTS]
                rows = [r for r in rows if r is not None]
                tried = [r for r in rows if "flatquant" in r]
                for r in tried or rows[:1]:
                    fq = (f"{r['flatquant']:.1f} ({r['sd']:.1f}, {r['seeds']})"
                          if "flatquant" in r else "--")
                    mde = f"{r['mde']:.1f}" if "mde" in r else "--"
                    print(f"| {model} | {bits} | {task} | {r['variant'] if tried else '--'} "
                          f"| {r['fp']:.1f} | {r['rtn']:.1f} | {fq} | {mde} | {verdict(r)} |")


if __name__ == "__main__":
    main()
