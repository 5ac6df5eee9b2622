"""A run's jobs, read off their logs: ``fair-calib jobs RUN`` (RUN: where Snakemake ran, the
folder holding ``logs/``) prints how many ran, how long each took, on which card, how many at
once, the time by stage and each evaluation's wall time against FP's.

Every stage writes a job line to its log when it starts and ends (``fair_calib.jobs.job_log.JOB_LINE``:
wall time, card, peak GPU memory); Snakemake's ``benchmark:`` files add the process seconds.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

METHOD_ORDER = ("fp", "rtn", "quarot", "flatquant", "fair-calib")   # evaluation columns first
COPY_JOBS = ("gather_eval",)     # one shard: `cp`, no stage process, so no job line


def job_records(run: Path) -> list[dict]:
    """One record per log of ``run/logs``: rule, wildcards, the job lines' fields, and the
    process seconds of its Snakemake benchmark file where there is one."""
    from fair_calib.jobs.job_log import JOB_LINE

    records = []
    for path in sorted((run / "logs").rglob("*.log")):
        rel = path.relative_to(run / "logs").with_suffix("")
        rec = {"job": rel.parts[0], "wildcards": "/".join(rel.parts[1:]), "status": "no job line"}
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(JOB_LINE):
                rec.update(json.loads(line[len(JOB_LINE):]))
        if rec["status"] == "start":
            rec["status"] = "started, never ended (killed?)"
        bench = run / "results" / "benchmarks" / rel.with_suffix(".tsv")
        if bench.is_file():
            rec["process_s"] = float(bench.read_text().splitlines()[1].split("\t")[0])
        records.append(rec)
    return sorted(records, key=lambda r: (r.get("start", float("inf")), r["job"], r["wildcards"]))


def max_overlap(records: list[dict], gpu_only: bool) -> int:
    """The most jobs (GPU jobs: ``gpu_only``) that ran at one time."""
    events = sorted((t, d) for r in records
                    if "wall_s" in r and not (gpu_only and r["card"] == "cpu")
                    for t, d in ((r["start"], 1), (r["start"] + r["wall_s"], -1)))
    most = now = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


def _fmt(x, digits=1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _copy_only(r: dict) -> bool:
    return r["job"] in COPY_JOBS and r["status"] == "no job line"


def methods_table(records: list[dict]) -> list[str]:
    """Evaluation wall seconds per (model, task) and method, FP first, and each / FP."""
    cells: dict[tuple[str, str], dict[str, float]] = {}
    for r in records:
        if r["job"] == "evaluate" and "wall_s" in r:
            model, method, _bits, task = r["wildcards"].split("/")[:4]
            cells.setdefault((model, task), {})[method] = r["wall_s"]
    order = {m: i for i, m in enumerate(METHOD_ORDER)}
    methods = sorted({m for row in cells.values() for m in row},
                     key=lambda m: (order.get(m, len(order)), m))
    out = ["| model | task | " + " | ".join(f"{m} s" for m in methods) + " |",
           "|---|---|" + "---:|" * len(methods)]
    for (model, task), row in sorted(cells.items()):
        fp = row.get("fp")
        out.append(f"| {model} | {task} | " + " | ".join(
            _fmt(row.get(m)) + (f" ({row[m] / fp:.2f}x)" if fp and m in row and m != "fp" else "")
            for m in methods) + " |")
    return out if cells else []


def summary_lines(name: str, records: list[dict]) -> list[str]:
    """A run's jobs: counts, span, jobs at once, time by stage; the jobs table; evaluation
    wall seconds per method next to FP's."""
    timed = [r for r in records if "wall_s" in r]
    span = (max(r["start"] + r["wall_s"] for r in timed) - min(r["start"] for r in timed)
            if timed else 0.0)
    cards = sorted({r["card"] for r in timed if r["card"] != "cpu"})
    failed = [r for r in records if r["status"] != "ok" and not _copy_only(r)]
    stages: dict[str, list[float]] = {}
    for r in timed:
        stages.setdefault(r.get("stage", r["job"]), []).append(r["wall_s"])
    t0 = min((r["start"] for r in records if "start" in r), default=0.0)
    lines = [f"{name} jobs with a job line: {len(timed)}; not ok: {len(failed)}; cards: "
             f"{', '.join(cards) or 'none (CPU)'}; span first start -> last end: {span:.1f} s; "
             f"sum of job wall times: {sum(r['wall_s'] for r in timed):.1f} s; most jobs at "
             f"once: {max_overlap(records, False)} (GPU jobs: {max_overlap(records, True)}); "
             "by stage: " + ", ".join(f"{k} {len(v)} jobs {sum(v):.0f} s (max {max(v):.0f})"
                                      for k, v in sorted(stages.items())), "",
             "wall s: the stage's job line (imports included); process s: Snakemake's benchmark "
             "file (the whole command); start s: after the first job's start; "
             f"{sum(map(_copy_only, records))} gather_eval jobs of one shard (a copy) not listed.",
             "",
             "| job | wildcards | status | wall s | process s | card | peak GPU GB | start s |",
             "|---|---|---|---:|---:|---|---:|---:|"]
    for r in (r for r in records if not _copy_only(r)):
        start = r["start"] - t0 if "start" in r else None
        lines.append(f"| {r['job']} | {r['wildcards']} | {r['status']} | {_fmt(r.get('wall_s'))} "
                     f"| {_fmt(r.get('process_s'))} | {r.get('card', '-')} "
                     f"| {_fmt(r.get('peak_gpu_gb'), 2)} | {_fmt(start)} |")
    methods = methods_table(records)
    return lines + ([""] + [f"{name} evaluation wall s per method (x: over FP):"] + methods
                    if methods else [])


def run_cli(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="fair-calib jobs", description=(
        "A run's jobs, read off their logs: how many ran, how long each took, on which card, "
        "how many at once, the time by stage and each evaluation's wall time against FP's."))
    ap.add_argument("run", help="the folder Snakemake ran in (it holds logs/)")
    args = ap.parse_args(argv)
    run = Path(args.run)
    if not (run / "logs").is_dir():
        raise SystemExit(f"error: fair-calib jobs: {run / 'logs'} does not exist: name the folder "
                         "Snakemake ran in (a config's workdir, e.g. runs/smoke)")
    print("\n".join(summary_lines(str(run), job_records(run))))
