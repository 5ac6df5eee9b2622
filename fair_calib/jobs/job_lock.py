"""One job per output at a time, whatever Snakemake's own lock does.

Snakemake's directory lock (``.snakemake/locks``) is not enough: a second run with nothing to
do removes the whole folder on exit (Snakemake 9.27's ``_delete_locks``), and a third run then
plans, and starts, the jobs a first run is still computing. So every stage CLI that writes an
output (``--out`` / ``--out-dir``) holds an exclusive ``flock`` on a lock file beside that
output for its whole life: the kernel releases it when the process ends, normally or killed
(SIGKILL included), so a lock is never left behind. A second job for the same output waits for
the first to end, saying so on its stderr (the console) and in its own waiting log beside
the job's log (``<log>.<pid>.waiting``, fair_calib/jobs/job_log.py: the job's log is the holder's),
then computes the output itself (its run may have other settings; the outputs are written
atomically, so readers see one job's files or the other's). ``FAIR_CALIB_LOCK=refuse`` makes
it refuse instead (exit 1, naming the output and the holder; ``<log>.<pid>.refused``).

The lock file is ``<folder>/.<name>.<stage>.lock`` beside the output ``<folder>/<name>``: beside
it, so jobs started from any directory (or on any node of a shared filesystem) meet on it; the
stage in its name, so two stages that write into one folder (``figures`` and ``floor-sweep``,
``--out-dir results/figures``) do not wait on each other.
"""
from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from pathlib import Path

from . import job_log

OUTPUT_OPTIONS = ("--out", "--out-dir")
_HELD: list[int] = []  # open descriptors of the locks this process holds (closed on exit)
REFUSED: list = []     # non-empty once this process refused to wait (FAIR_CALIB_LOCK=refuse)
WAITED: dict = {}      # {"holder": ..., "seconds": ...} when this process waited for the lock
WAITING: list = []     # the output, while this process waits for its lock


def primary_output(argv: list[str]) -> str | None:
    """The output a stage command line names first (``--out X``, ``--out-dir=X``)."""
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in OUTPUT_OPTIONS:
            if eq:
                return value
            if i + 1 < len(argv):
                return argv[i + 1]
    return None


def lock_path(output: str | os.PathLike, stage: str) -> Path:
    out = Path(os.path.abspath(output))
    return out.parent / f".{out.name}.{stage}.lock"


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "a process that has not said who it is yet"


def busy(stage: str, argv: list[str]) -> bool:
    """Whether another process holds the lock on the output ``argv`` names (now)."""
    output = primary_output(argv)
    if output is None:
        return False
    path = lock_path(output, stage)
    if not path.exists():
        return False
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _side_note(log: str | None, kind: str, line: str) -> Path | None:
    """``line`` in this job's own log beside ``log`` (the job's log is the holder's)."""
    if not log:
        return None
    side = job_log.side_log(log, os.getpid(), kind)
    job_log.append_line(side, line)
    return side


def hold(stage: str, argv: list[str], *, mode: str | None = None,
         log: str | None = None) -> Path | None:
    """Take the exclusive lock on the output named in ``argv`` for this process's life.
    Waits while another job holds it (``mode='refuse'``, or FAIR_CALIB_LOCK=refuse: exits),
    saying so on stderr and in ``<log>.<pid>.waiting`` (``.refused``), removed once it holds it.
    Returns the lock file, or None when the command names no output."""
    output = primary_output(argv)
    if output is None:
        return None
    mode = mode or os.environ.get("FAIR_CALIB_LOCK", "wait")
    path = lock_path(output, stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        if log:     # the holder's log, which Snakemake removed before this job, visible again
            job_log.show_holder_log(log)
        if mode == "refuse":
            os.close(fd)
            REFUSED.append(str(path))
            line = (f"error: fair-calib {stage}: {output} is being written by another job "
                    f"({holder}; lock {path}); rerun when it has finished")
            _side_note(log, "refused", line)
            sys.exit(line)
        WAITING.append(output)
        line = (f"fair-calib {stage}: waiting: {output} is being written by another job "
                f"({holder}); this job starts when that one ends (lock {path})")
        side = _side_note(log, "waiting", line)
        print(line, file=sys.stderr, flush=True)
        start = time.time()
        fcntl.flock(fd, fcntl.LOCK_EX)
        WAITING.clear()
        print(f"fair-calib {stage}: the other job ended after {time.time() - start:.0f} s; "
              f"starting", file=sys.stderr, flush=True)
        WAITED.update(holder=holder, seconds=time.time() - start)
        if side is not None:      # its main log says it waited (fair_calib/cli/main.py)
            side.unlink(missing_ok=True)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"fair-calib {stage}, pid {os.getpid()} on {socket.gethostname()}, since "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
    _HELD.append(fd)
    return path


def holding() -> bool:
    """Whether this process holds the lock on its output."""
    return bool(_HELD)
