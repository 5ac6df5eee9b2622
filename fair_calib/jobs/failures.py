"""What a run that did not finish says (the Snakefile's ``onerror``), one console line each:

* ``Failed: <rule> (<wildcards>): <what failed and what to do> [log: <path>]`` per failed job,
  read from the job's own log, whose last line the stage CLI writes as ``error: fair-calib
  <stage>: <what>; <what to do>`` after the traceback (fair_calib/cli/main.py), or its watcher as
  ``killed by signal ...`` (fair_calib/jobs/job_watch.py: for SIGKILL, the job's peak memory, here
  set beside the memory its rule declared). A job that never held its output (it waited for
  another run's job, or refused to) wrote its own log beside the rule's (fair_calib/jobs/job_log.py):
  that one is read and named. The rule, wildcards, log and declared memory of a job are read
  from Snakemake's log: its error block names the job's id, its start block the rest.
* A run stopped by SIGTERM (Snakemake lets its running jobs finish, then stops) says so, with
  what finished and what was not started, instead of a failure (:func:`stop_lines`).

The traceback stays in the log; the console gets its path. No heavy imports (runs in the
Snakemake process)."""
from __future__ import annotations

import re
import time
from pathlib import Path

_ERROR = re.compile(r"^Error in rule (\S+?):?$")
_START = re.compile(r"^(?:local)?(?:rule|checkpoint) (\S+?):$")
_FIELD = re.compile(r"^\s+(\w+): (.*)$")
_LOG_TAIL = " (check log file(s) for error details)"
_RUN_STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d{6}\.\d+)\.snakemake\.log$")


def _last_line(path: Path) -> str | None:
    try:
        lines = [l.strip() for l in path.read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return None
    errors = [l for l in lines if l.startswith("error:") or " interrupted (" in l]
    return (errors or lines or [None])[-1]


def _blocks(text: str) -> list[tuple[str, str, dict]]:
    """(kind, rule, {field: value}) of each start block ("rule x:") and error block."""
    blocks, current = [], None
    for line in text.splitlines():
        start, error = _START.match(line.strip()), _ERROR.match(line.strip())
        if start or error:
            current = ("error" if error else "start", (error or start).group(1), {})
            blocks.append(current)
        elif current is not None and _FIELD.match(line):
            key, value = _FIELD.match(line).groups()
            current[2].setdefault(key, value)
        elif current is not None and line.strip() and not line.startswith(" "):
            current = None
    return blocks


def _mem_mb(resources: str) -> str | None:
    m = re.search(r"(?:^|, )mem_mb=(\d+)", resources or "")
    return m.group(1) if m else None


def failed_jobs(snakemake_log: str | Path) -> list[dict]:
    """Each failed job of a Snakemake log: ``rule``, ``wildcards``, ``logs`` and the declared
    ``mem_mb``, from its error block and the start block of the same job id."""
    started, found = {}, []
    for kind, rule, fields in _blocks(Path(snakemake_log).read_text(errors="replace")):
        if kind == "start":
            started[fields.get("jobid")] = fields
            continue
        start = started.get(fields.get("jobid"), {})
        logs = fields.get("log") or start.get("log") or ""
        logs = logs[:-len(_LOG_TAIL)] if logs.endswith(_LOG_TAIL) else logs
        found.append({"rule": rule,
                      "wildcards": fields.get("wildcards") or start.get("wildcards") or "",
                      "logs": [p.strip() for p in logs.split(",") if p.strip()],
                      "mem_mb": _mem_mb(start.get("resources"))})
    return found


def run_start(snakemake_log: str | Path) -> float:
    """When the run began: the time in its log's name (Snakemake's), else the log's mtime."""
    m = _RUN_STAMP.search(str(snakemake_log))
    if m:
        try:
            return time.mktime(time.strptime(m.group(1).split(".")[0], "%Y-%m-%dT%H%M%S"))
        except ValueError:
            pass
    return Path(snakemake_log).stat().st_mtime


def job_logs(paths: list[str], since: float) -> list[str]:
    """The logs to read for a failed job: a waiting or refused log of this run beside a rule's
    log (the job never held its output: the rule's log is another job's), else the rule's."""
    from .job_log import side_logs

    own = []
    for path in paths:
        mine = [p for p in side_logs(path) if p.stat().st_mtime >= since - 1]
        own.append(str(mine[-1]) if mine else path)
    return own


def with_memory(line: str, rule: str, mem_mb: str | None) -> str:
    """A watcher's killed line with the rule's name and its declared memory filled in."""
    line = line.replace("resources.<rule>.mem_mb", f"resources.{rule}.mem_mb")
    if mem_mb:
        line = re.sub(r"(peak memory \d+ MB)", rf"\1 (its rule declares mem_mb={mem_mb})", line,
                      count=1)
    return line


# The exit status of each job command that failed in this process (a local run's jobs are shell
# commands Snakemake runs from its own process), by command: Snakemake 9's error block says only
# "(command exited with non-zero exit code)", and a job killed whole (its watcher too: `kill -9`
# of its processes, the out-of-memory killer of its group) leaves no line in its log.
SHELL_EXITS: dict[str, int] = {}


def record_shell_exits() -> None:
    """Keep the exit status of every failing job command in :data:`SHELL_EXITS` (Snakemake's
    ``shell`` raises CalledProcessError with it, then drops it)."""
    import subprocess
    import types

    import importlib

    module = importlib.import_module("snakemake.shell")   # the module (the package exports the class)

    if getattr(module.sp, "_fair_calib_exits", False):
        return

    class Recorded(subprocess.CalledProcessError):     # still a CalledProcessError
        def __init__(self, returncode, cmd, *args, **kwargs):
            super().__init__(returncode, cmd, *args, **kwargs)
            SHELL_EXITS[str(cmd)] = returncode

    # the shell module's `sp` (subprocess), with its CalledProcessError recording the status;
    # not a wrapper of `shell` itself, which formats the command from its caller's frame
    proxy = types.ModuleType("subprocess")
    proxy.__dict__.update(vars(subprocess))
    proxy.CalledProcessError = Recorded
    proxy._fair_calib_exits = True
    module.sp = proxy


def signal_of(returncode: int | None) -> int | None:
    """The signal that ended a command: -N (killed itself) or 128 + N (its shell reports it)."""
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    return returncode - 128 if 128 < returncode < 128 + 65 else None


def exit_of(logs: list[str], exits) -> int | None:
    """The recorded exit status of the command that wrote one of ``logs``."""
    for cmd, code in (exits or {}).items():
        if any(p and p in cmd for p in logs):
            return code
    return None


def killed_whole_line(sig: int, last: str | None, rule: str, mem_mb: str | None) -> str:
    """A job killed with its watcher (so its log says nothing about it): the signal, from the
    command's exit status."""
    from .job_watch import hint, signal_name

    mem = f" (its rule declares mem_mb={mem_mb})" if mem_mb else ""
    ends = f"; its log ends at: {last}" if last else ""
    return (f"killed by signal {sig} ({signal_name(sig)}), exit code {128 + sig}, the whole job "
            f"with its watcher{mem}{ends}; "
            + hint(sig).replace("resources.<rule>.mem_mb", f"resources.{rule}.mem_mb"))


def metadata_line(job_name: str, where: str, what: str) -> str:
    """A finished job Snakemake could not record in ``where`` (its .snakemake/; Snakemake's own
    message, "Error recording metadata ... Please ensure write permissions", names neither the
    job nor the cause), as what happened and what to do."""
    full = "No space left on device" in what or "Errno 28" in what or "quota" in what.lower()
    cause = ("the disk (or quota) holding it is full: free space" if full else
             "make it writable" if "ermission" in what else "fix that")
    return (f"Failed: {job_name}: its outputs are written, but Snakemake could not record the "
            f"job in {where} ({what}); {cause}, then rerun with --rerun-incomplete, which redoes "
            "it (safe: no other run is writing it)")


def report_metadata_errors() -> None:
    """Print :func:`metadata_line` when Snakemake fails to record a finished job (its error
    then ends the run, without the onerror handler)."""
    import sys

    import snakemake.persistence as P

    run = P.PersistenceBase.finished
    if getattr(run, "_fair_calib", False):
        return

    said = set()

    async def finished(self, job, *args, **kwargs):
        try:
            return await run(self, job, *args, **kwargs)
        except OSError as err:
            line = metadata_line(_job_name(job), str(self.path), str(err))
            if line not in said:        # Snakemake may record a job twice on its way out
                said.add(line)
                print(line, file=sys.stderr, flush=True)
            raise

    finished._fair_calib = True
    P.PersistenceBase.finished = finished


def summary_lines(snakemake_logs, exits=None) -> list[str]:
    """``Failed: <rule> (<wildcards>): <the log's error line> [log: <path>]`` per failed job;
    ``exits``: the failed commands' exit statuses (:data:`SHELL_EXITS`)."""
    if not snakemake_logs:
        return []
    if isinstance(snakemake_logs, (str, Path)):
        snakemake_logs = [snakemake_logs]
    lines = []
    for log in snakemake_logs:
        if not log or not Path(log).is_file():
            continue
        since = run_start(log)
        for job in failed_jobs(log):
            paths = job_logs(job["logs"], since)
            said = next((s for s in (_last_line(Path(p)) for p in paths) if s), None)
            sig = signal_of(exit_of(job["logs"] + paths, exits if exits is not None else SHELL_EXITS))
            if said and "killed by signal" in said:
                said = with_memory(said, job["rule"], job["mem_mb"])
            elif sig is not None and not (said and (said.startswith("error:")
                                                    or " interrupted (" in said)):
                said = killed_whole_line(sig, said, job["rule"], job["mem_mb"])
            where = f" ({job['wildcards']})" if job["wildcards"] else ""
            tail = f" [log: {', '.join(paths)}]" if paths else ""
            lines.append(f"Failed: {job['rule']}{where}: {said or 'see its log'}{tail}")
    return lines


def _job_name(job) -> str:
    wildcards = ", ".join(f"{k}={v}" for k, v in sorted(job.wildcards_dict.items()))
    return f"{job.rule.name} ({wildcards})" if wildcards else job.rule.name


def _some(names: list[str], most: int = 4) -> str:
    shown = ", ".join(names[:most])
    if len(names) > most:
        shown += f", and {len(names) - most} more"
    return f"{len(names)} job{'s' * (len(names) != 1)}" + (f": {shown}" if names else "")


def describe_stop(finished: list[str], failed: list[str], not_started: int) -> list[str]:
    """The line for a run stopped by SIGTERM (Snakemake lets its running jobs finish)."""
    said = ("Stopped by SIGTERM: Snakemake let the jobs it had started end and started no "
            "others. " + (f"Finished in this run: {_some(finished)} (their outputs are kept)"
                          if finished else "No job finished in this run"))
    if failed:
        said += f"; failed or stopped: {_some(failed)} (the Failed: lines say how)"
    if not_started:
        return [said + f"; not started: {not_started} job{'s' * (not_started != 1)}. "
                       "Rerun the same command to go on."]
    return [said + ("; none was left to start." if failed else
                    "; none was left to start: the requested outputs are complete.")]


def stop_lines(workflow) -> tuple[list[str], int | None]:
    """(the stop's line, the exit status it ends with) for a run Snakemake ended on SIGTERM
    (its scheduler's graceful stop), else ([], None): 143 (128 + SIGTERM) where jobs were left
    unstarted, 0 where every planned job finished, None where a job failed (Snakemake's own
    end, "At least one job did not complete successfully", is then true). Reads Snakemake 9's
    scheduler and DAG."""
    scheduler = getattr(workflow, "scheduler", None)
    if getattr(scheduler, "_user_kill", None) != "graceful":
        return [], None
    dag = workflow.dag
    failed = sorted(_job_name(j) for j in scheduler.failed)
    finished = sorted(_job_name(j) for j in dag.needrun_jobs(exclude_finished=False)
                      if dag.finished(j))
    left = len(scheduler.remaining_jobs)
    return describe_stop(finished, failed, left), None if failed else (143 if left else 0)
