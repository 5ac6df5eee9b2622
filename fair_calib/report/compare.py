"""Two runs' evaluations, cell by cell: ``fair-calib compare-runs RUN_A RUN_B`` prints, per
(model, method, bits, task) both runs hold, each run's accuracy and arithmetic (fake
quantization, integer codes: the evaluation's record), how many generations are identical and
the largest difference of a choice's log-likelihood. How far a table moves with the arithmetic
alone (the real kernels against fake quantization, one device against another) is read here.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def eval_records(run_dir: Path) -> dict[tuple[str, str, str, str], dict]:
    """``(model, method, bits, task) -> per_doc`` of every gathered evaluation under
    ``run_dir/results/eval``: its gathered raw JSON, or the one shard's it was copied from."""
    from fair_calib.evaluate.run import run_per_docs

    out = {}
    for path in sorted((run_dir / "results" / "eval").glob("*/*/*/*.parquet")):
        per_docs = run_per_docs(path)
        if len(per_docs) != 1:
            raise ValueError(f"{path}: {len(per_docs)} shard records and no gathered JSON")
        out[(*path.parts[-4:-1], path.stem)] = per_docs[0]
    return out


def accuracy(per_doc: dict) -> float | None:
    """The mean of the run's first accuracy-like metric (acc / exact_match), in %."""
    for key in sorted(per_doc.get("metrics", {})):
        if key.split(",")[0] in ("acc", "exact_match", "acc_norm"):
            vals = [v for docs in per_doc["metrics"][key].values() for v in docs.values()]
            return 100.0 * sum(vals) / len(vals) if vals else None
    return None


def response_diff(a: dict, b: dict) -> dict:
    """Identical generations (text answers) and the largest log-likelihood difference
    (choices' scores) between two runs' responses of the same documents."""
    same = total = 0
    max_dll = 0.0
    for task, by_filter in (a.get("responses") or {}).items():
        for filt, docs in by_filter.items():
            other = ((b.get("responses") or {}).get(task) or {}).get(filt) or {}
            for doc in docs.keys() & other.keys():
                lls_a, lls_b = _lls(docs[doc]), _lls(other[doc])
                if lls_a is not None and lls_b is not None and len(lls_a) == len(lls_b):
                    max_dll = max([max_dll] + [abs(x - y) for x, y in zip(lls_a, lls_b)])
                else:
                    total += 1
                    same += docs[doc] == other[doc]
    return {"identical": same, "generations": total, "max_dll": max_dll}


def _lls(resp) -> list[float] | None:
    """Log-likelihoods of a loglikelihood request's choices (``[[ll, greedy], ...]``)."""
    if isinstance(resp, list) and resp and all(isinstance(r, list) and len(r) == 2
                                               and isinstance(r[0], (int, float)) for r in resp):
        return [float(r[0]) for r in resp]
    return None


DESCRIPTION = ("Two runs' evaluations, cell by cell: for every (model, method, bits, task) both "
               "runs hold, each run's accuracy and arithmetic, how many generations are "
               "identical and the largest difference of a choice's log-likelihood.")


def no_common_cells(run_a: Path, run_b: Path) -> str:
    """The error for two runs without a cell in common, with a cell of each."""
    def some(run):
        keys = sorted(eval_records(run))
        return (f"{len(keys)} cell{'s' * (len(keys) != 1)}"
                + (f", e.g. {'/'.join(keys[0])}" if keys else ""))

    return (f"error: fair-calib compare-runs: {run_a} ({some(run_a)}) and {run_b} "
            f"({some(run_b)}) hold no evaluation of the same model, method, bits and task; "
            "compare two runs of one config")


def compare_runs(run_a: Path, run_b: Path, names=("A", "B")) -> list[dict]:
    from fair_calib.evaluate.run import arithmetic_of

    ra, rb = eval_records(run_a), eval_records(run_b)
    return [{"model": key[0], "method": key[1], "bits": key[2], "task": key[3],
             f"acc_{names[0]}": accuracy(ra[key]), f"acc_{names[1]}": accuracy(rb[key]),
             f"arith_{names[0]}": arithmetic_of(ra[key]),
             f"arith_{names[1]}": arithmetic_of(rb[key]), **response_diff(ra[key], rb[key])}
            for key in sorted(ra.keys() & rb.keys())]


def format_rows(rows: list[dict], names=("A", "B")) -> str:
    a, b = names
    lines = [f"| model | method | bits | task | {a} | {b} | acc {a} | acc {b} | identical "
             "generations | max dLL |", "|" + "---|" * 10]
    for r in rows:
        acc = ["--" if r[f"acc_{n}"] is None else f"{r[f'acc_{n}']:.1f}" for n in names]
        gens = f"{r['identical']} of {r['generations']}" if r["generations"] else "--"
        lines.append(f"| {r['model']} | {r['method']} | {r['bits']} | {r['task']} | "
                     f"{r['arith_' + a]} | {r['arith_' + b]} | {acc[0]} | {acc[1]} | {gens} | "
                     f"{r['max_dll']:.3g} |")
    return "\n".join(lines)


def run_cli(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="fair-calib compare-runs", description=DESCRIPTION)
    ap.add_argument("run_a", help="a folder Snakemake ran in (holding results/eval)")
    ap.add_argument("run_b")
    ap.add_argument("--names", nargs=2, default=["A", "B"], help="the two runs' column names")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)
    for run in (args.run_a, args.run_b):
        if not (Path(run) / "results" / "eval").is_dir():
            raise SystemExit(f"error: fair-calib compare-runs: {run}/results/eval does not exist")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise SystemExit(f"error: fair-calib compare-runs: --json {args.json}: the folder "
                         f"{Path(args.json).parent} does not exist; create it or name another file")
    rows = compare_runs(Path(args.run_a), Path(args.run_b), tuple(args.names))
    if not rows:
        raise SystemExit(no_common_cells(Path(args.run_a), Path(args.run_b)))
    print(format_rows(rows, tuple(args.names)))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
