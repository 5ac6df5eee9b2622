"""One job per output at a time, whatever Snakemake's own lock does.

Snakemake's directory lock (``.snakemake/locks``) is not enough: a second run with nothing to
do removes the whole folder on exit (Snakemake 9.27's ``_delete_locks``), and a third run then
plans, and starts, the jobs a first run is still computing. So every stage CLI that writes an
output (``--out`` / ``--out-dir``) holds an exclusive ``flock`` on a lock file beside that
output for its whole life: the kernel releases it when the process ends, normally or killed
(SIGKILL included), so a lock is never left behind. A second job for the same output waits for
the first to end, saying so on its stderr (the console; its log opens after the lock,
fair_calib/job_log.py), then computes the output itself (its run may have other
settings; the outputs are written atomically, so readers see one job's files or the other's).
``FAIR_CALIB_LOCK=refuse`` makes it refuse instead (exit 1, naming the output and the holder).

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

OUTPUT_OPTIONS = ("--out", "--out-dir")
_HELD: list[int] = []  # open descriptors of the locks this process holds (closed on exit)
REFUSED: list = []     # non-empty once this process refused to wait (FAIR_CALIB_LOCK=refuse)
WAITED: dict = {}      # {"holder": ..., "seconds": ...} when this process waited for the lock


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


def hold(stage: str, argv: list[str], *, mode: str | None = None) -> Path | None:
    """Take the exclusive lock on the output named in ``argv`` for this process's life.
    Waits while another job holds it (``mode='refuse'``, or FAIR_CALIB_LOCK=refuse: exits).
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
        if mode == "refuse":
            os.close(fd)
            REFUSED.append(str(path))
            sys.exit(f"error: fair-calib {stage}: {output} is being written by another job "
                     f"({holder}; lock {path}); rerun when it has finished")
        print(f"fair-calib {stage}: waiting: {output} is being written by another job "
              f"({holder}); this job starts when that one ends (lock {path})",
              file=sys.stderr, flush=True)
        start = time.time()
        fcntl.flock(fd, fcntl.LOCK_EX)
        print(f"fair-calib {stage}: the other job ended after {time.time() - start:.0f} s; "
              f"starting", file=sys.stderr, flush=True)
        WAITED.update(holder=holder, seconds=time.time() - start)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"fair-calib {stage}, pid {os.getpid()} on {socket.gethostname()}, since "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
    _HELD.append(fd)
    return path
