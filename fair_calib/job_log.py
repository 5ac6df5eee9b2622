"""A job's log, opened by the job itself once it holds its output's lock (fair_calib/job_lock.py).

A rule's ``> {log} 2>&1`` is opened by the shell before the job takes its lock, and Snakemake
itself removes a job's log before starting the job: a second run that plans a job another run
is still computing took the running job's log away, and its waiting job wrote over the name. So the rules pass ``--log {log}`` instead and do not redirect:

* before the lock the job writes nothing to its log (a job waiting for another says so on the
  console); a job that fails before it (its settings refused) appends its error line;
* once it holds the lock it appends its stdout and stderr (file descriptors 1 and 2: child
  processes and C libraries too) to the log, keeping a second name for the file beside it,
  ``.<log name>.<pid>.keep``;
* on exit, if the log's name was removed meanwhile (another run's Snakemake preparing the same
  job), it gives the name back to its file, so the log is whole. A job killed with SIGKILL
  leaves the second name, and the next job for the output puts it back first. A job whose log
  already holds lines (an earlier job's, given back) starts its own below a separator line.
"""
from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

KEEP_SUFFIX = ".keep"


def pop_log(argv: list[str]) -> str | None:
    """Remove ``--log PATH`` (or ``--log=PATH``) from ``argv``; return PATH."""
    for i, arg in enumerate(argv):
        if arg == "--log":
            if i + 1 >= len(argv):
                sys.exit("error: fair-calib: --log needs a file name")
            path = argv[i + 1]
            del argv[i:i + 2]
            return path
        if arg.startswith("--log="):
            del argv[i]
            return arg.split("=", 1)[1]
    return None


def _keep_name(path: Path, pid: int) -> Path:
    return path.parent / f".{path.name}.{pid}{KEEP_SUFFIX}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def restore_left_logs(path: Path) -> None:
    """Put back the log of a job killed before it could (its ``.keep`` name), if the log's own
    name is free; drop second names whose process is gone."""
    prefix = f".{path.name}."
    for keep in sorted(path.parent.glob(f"{prefix}*{KEEP_SUFFIX}")):
        pid = keep.name[len(prefix):-len(KEEP_SUFFIX)]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        _name_back(path, keep)


def _name_back(path: Path, keep: Path) -> None:
    """``path`` again on ``keep``'s file where that name is free; the second name dropped."""
    try:
        if not path.exists():
            os.link(keep, path)
        keep.unlink()
    except OSError:
        pass


def open_log(path: str | os.PathLike, header: str | None = None) -> Path:
    """Send this process's stdout and stderr to the end of ``path`` for the rest of its life
    (see the module's docstring); ``header`` separates it from an earlier job's lines."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    restore_left_logs(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    keep = _keep_name(path, os.getpid())
    try:
        keep.unlink(missing_ok=True)
        os.link(path, keep)
    except OSError:               # a filesystem without hard links: no second name
        keep = None
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    if os.fstat(fd).st_size and header:
        os.write(fd, f"{header}\n".encode())
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if keep is not None:
        atexit.register(_give_name_back, path, keep)
    return path


def _give_name_back(path: Path, keep: Path) -> None:
    """At exit: the log's name again on this job's file if another run removed it."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    _name_back(path, keep)


def append_line(path: str | os.PathLike | None, line: str) -> None:
    """One line at the end of the log (a job that ends before it opened its log)."""
    if not path:
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(line.rstrip("\n") + "\n")
    except OSError:
        pass
