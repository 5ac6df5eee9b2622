"""One console line per failed job (the Snakefile's ``onerror``): what failed and what to do,
read from the job's own log, whose last line the stage CLI writes as ``error: fair-calib
<stage>: <what>; <what to do>`` after the traceback (fair_calib/cli.py). The traceback stays in
the log; the console gets its path. No heavy imports (runs in the Snakemake process)."""
from __future__ import annotations

import re
from pathlib import Path

_ERROR = re.compile(r"^Error in rule (\S+?):?$")
_LOG = re.compile(r"^\s+log: (.+?)(?: \(check log file\(s\) for error details\))?$")
_WILDCARDS = re.compile(r"^\s+wildcards: (.+)$")


def _last_line(path: Path) -> str | None:
    try:
        lines = [l.strip() for l in path.read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return None
    errors = [l for l in lines if l.startswith("error:") or " interrupted (" in l]
    return (errors or lines or [None])[-1]


def failed_jobs(snakemake_log: str | Path) -> list[tuple[str, str, list[str]]]:
    """(rule, wildcards, log files) of each ``Error in rule`` block of a Snakemake log."""
    found, current = [], None
    for line in Path(snakemake_log).read_text(errors="replace").splitlines():
        m = _ERROR.match(line.strip())
        if m:
            current = [m.group(1), "", []]
            found.append(current)
        elif current is not None and _WILDCARDS.match(line):
            current[1] = _WILDCARDS.match(line).group(1)
        elif current is not None and _LOG.match(line):
            current[2] = [p.strip() for p in _LOG.match(line).group(1).split(",")]
            current = None
    return [tuple(f) for f in found]


def summary_lines(snakemake_logs) -> list[str]:
    """``Failed: <rule> (<wildcards>): <the log's error line> [log: <path>]`` per failed job."""
    if not snakemake_logs:
        return []
    if isinstance(snakemake_logs, (str, Path)):
        snakemake_logs = [snakemake_logs]
    lines = []
    for log in snakemake_logs:
        if not log or not Path(log).is_file():
            continue
        for rule, wildcards, paths in failed_jobs(log):
            said = next((s for s in (_last_line(Path(p)) for p in paths) if s), None)
            where = f" ({wildcards})" if wildcards else ""
            tail = f" [log: {', '.join(paths)}]" if paths else ""
            lines.append(f"Failed: {rule}{where}: {said or 'see its log'}{tail}")
    return lines
