"""A stage run as a job says how it ended, also when a signal ended it.

A process killed with SIGKILL (the kernel's or a cluster's out-of-memory killer, ``kill -9``)
writes nothing: its log just stops, and Snakemake's error names no exit status. So a stage run
as a job forks before its work starts (:func:`watch`): the child runs the stage; the parent, a
small process that imports nothing heavy, waits for it and, if a signal ended it, writes to the
child's log the signal's name and number, the exit code, the wall time and the child's peak
resident memory (``getrusage`` of the child, which the kernel keeps also for a killed process),
then exits with the shell's code for it (128 + the signal's number). The child's own exits
(success, a failure line, an interrupt) pass through unchanged.

The parent forwards SIGINT and SIGTERM to the child (Ctrl-C at a terminal reaches both; the
stage ends once on the first, fair_calib/cli/main.py), and the child is sent SIGTERM if the parent
dies, so no stage outlives its job. ``pid`` in the output's lock file (fair_calib/jobs/job_lock.py)
is the child's, the process that computes.
"""
from __future__ import annotations

import os
import signal
import sys
import time

MB = 1e6      # Snakemake's mem_mb is in megabytes


def watch(stage: str, argv: list[str], log: str | None) -> None:
    """Fork: returns in the child (which runs the stage); the parent waits for it, reports a
    death by signal, and exits with the child's status."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    parent = os.getpid()
    start = time.time()
    child = os.fork()
    if child == 0:
        _die_with_parent(parent)
        return
    _forward_signals(child)
    _, status, usage = os.wait4(child, 0)     # retried after a forwarded signal (PEP 475)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        report(stage, argv, log, child, sig, time.time() - start, usage.ru_maxrss * 1024 / MB)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


def _die_with_parent(parent: int) -> None:
    """SIGTERM to this process when its parent (the watcher) dies (Linux prctl)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):   # not Linux: the child may outlive a killed watcher
        return
    if os.getppid() != parent:          # the watcher died before the prctl
        os.kill(os.getpid(), signal.SIGTERM)


def _forward_signals(child: int) -> None:
    def forward(signum, frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:   # an ignored Ctrl-C stays ignored
            signal.signal(sig, forward)


def hint(sig: int) -> str:
    if sig == signal.SIGKILL:
        return ("SIGKILL is most often the out-of-memory killer (the kernel's, or the "
                "cluster's at the job's memory limit): give the job more memory "
                "(resources.<rule>.mem_mb in the config; on one machine, fewer jobs at once) "
                "or lower its sizes")
    if sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGABRT, signal.SIGFPE):
        return ("a crash in native code (torch, a GPU driver, a C extension): the lines above "
                "say how far it got; please report it with this log")
    if sig == signal.SIGINT:
        return "Ctrl-C (or a process that sent SIGINT) stopped it; rerun to go on"
    return ("another process sent it (a person, the cluster's scheduler at the job's time "
            "limit); rerun when that is dealt with")


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:                  # a real-time signal Python has no name for
        return f"signal {sig}"


def killed_line(stage: str, sig: int, wall_s: float, peak_mb: float) -> str:
    name = signal_name(sig)
    return (f"error: fair-calib {stage}: killed by signal {sig} ({name}), exit code {128 + sig}, "
            f"after {wall_s:.0f} s; peak memory {peak_mb:.0f} MB; {hint(sig)}")


def report(stage: str, argv: list[str], log: str | None, child: int, sig: int,
           wall_s: float, peak_mb: float) -> None:
    """The job line and the killed line, in the child's log (its own file, fair_calib/jobs/job_log.py)
    or on stderr without one."""
    import json

    from . import job_lock, job_log

    rec = {"stage": stage, "status": "killed", "signal": signal_name(sig),
           "exit_code": 128 + sig, "wall_s": round(wall_s, 3), "peak_rss_mb": round(peak_mb)}
    text = job_log.JOB_LINE + json.dumps(rec) + "\n" + killed_line(stage, sig, wall_s, peak_mb)
    if not log:
        print(text, file=sys.stderr, flush=True)
        return
    target = job_log.file_of(log, child)
    if target is None:     # it ended before the lock: the log is the holder's, if there is one
        target = job_log.side_log(log, child) if job_lock.busy(stage, argv) else log
    job_log.append_line(target, text)
    if target == job_log.keep_name(log, child):
        job_log.name_back(log, target)
