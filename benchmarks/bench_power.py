"""The paper's question at converged calibration, on the CPU: FlatQuant, the uniform-weight
teacher pipeline (the ablation's reference) and FAIR-Calib at config/bench_gpu.yaml's settings
(W3A3, 8 epochs over 128 windows) with as many seeds as the CPU affords (issue 48).

    snakemake --cores 2 --configfile config/bench.yaml config/bench_gpu.yaml \
        --config device=cpu workdir=runs/bench-cpu8 -- $(python benchmarks/bench_power.py --targets 15)
    PYTHONPATH=. python benchmarks/bench_power.py runs/bench-cpu8 [--methods ...]

Prints each method's mean (sd over seeds) and every pair's paired test (fair_calib/report/
paired.py, the tables' own: difference, p, minimum detectable difference at two-sided 5 % and
80 % power). Reads any run folder of the bench (runs/bench-gpu too).
"""
from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from fair_calib.report.paired import compare, item_scores

METRIC = "exact_match,strict-match"
TASK, BITS, MODEL = "synth_gen", "w3a3", "tiny-dream"
METHODS = ("flatquant", "uniform-ptq", "fair-calib")


def targets(seeds: int, methods=METHODS) -> list[str]:
    return [f"results/eval/{MODEL}/{m}@s{k}/{BITS}/{TASK}.parquet" for m in methods
            for k in range(seeds)]


def seed_scores(run: Path, method: str) -> list[list]:
    """Per seed (in seed order), the task's per-item scores: ``compare``'s ``a[s][t]``; one
    run for a method without seeds (FP's evaluation is under ``fp/fp``)."""
    ev = run / "results" / "eval" / MODEL
    paths = sorted(ev.glob(f"{method}@s*"), key=lambda p: int(p.name.rsplit("@s", 1)[1]))
    bits = "fp" if method == "fp" else BITS
    files = [p / bits / f"{TASK}.parquet" for p in paths or [ev / method]]
    return [[item_scores(f, METRIC)] for f in files if f.is_file()]


def report(run: Path, methods, reference: str | None = None) -> list[str]:
    """Each method's mean (sd over seeds), then the paired tests: against ``reference`` only,
    or every pair."""
    scores = {m: seed_scores(run, m) for m in methods}
    lines = ["| method | seeds | mean (sd) |", "|---|---|---|"]
    for m, runs in scores.items():
        acc = [100 * float(r[0].mean()) for r in runs]
        sd = (sum((x - sum(acc) / len(acc)) ** 2 for x in acc) / (len(acc) - 1)) ** 0.5 \
            if len(acc) > 1 else float("nan")
        lines.append(f"| {m} | {len(acc)} | {sum(acc) / max(len(acc), 1):.2f} ({sd:.2f}) |")
    lines += ["", "| a - b | diff | p | MDE |", "|---|---|---|---|"]
    pairs = ([(m, reference) for m in methods if m != reference] if reference
             else itertools.combinations(methods, 2))
    for a, b in pairs:
        if scores[a] and scores[b]:
            r = compare(scores[a], scores[b])
            lines.append(f"| {a} - {b} | {r.diff:+.2f} | {r.p:.3f} | {r.mde:.2f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, nargs="?", help="the run folder (runs/bench-cpu8)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--reference", help="test every method against this one only")
    ap.add_argument("--targets", type=int, metavar="SEEDS",
                    help="print the evaluations of seeds 0..SEEDS-1 of --methods as targets")
    args = ap.parse_args()
    if args.targets:
        print(" ".join(targets(args.targets, args.methods)))
    elif args.run:
        print("\n".join(report(args.run, args.methods, args.reference)))
    else:
        ap.error("give a run folder or --targets SEEDS")


if __name__ == "__main__":
    main()
