"""A job's log, opened by the job itself once it holds its output's lock (fair_calib/jobs/job_lock.py).

The log under the rule's ``log:`` name belongs to the job that holds the output: the one that
wrote the finished output, or is writing it. A second job for the same output (another run's)
never writes there, and never truncates or replaces it:

* A rule's ``> {log} 2>&1`` is opened by the shell before the job takes its lock, so the rules
  pass ``--log {log}`` instead and do not redirect.
* Before the lock the job writes nothing to the log. A job that waits for another (or refuses
  to, ``FAIR_CALIB_LOCK=refuse``, or ends while waiting: Ctrl-C, a signal) writes its own log
  beside it, ``<log>.<pid>.waiting`` (``<log>.<pid>.refused``), and says so on the console; the
  waiting log is removed once the job holds the output (its main log then says how long it
  waited). A job that fails before the lock (its settings refused) appends its error line to the
  log if no other job holds the output, else to its ``.waiting`` log. Meeting the holder, it puts
  the holder's log back under the log's name at once (:func:`show_holder_log`), so that log and
  its progress lines stay visible while the second job waits or refuses.
* Once it holds the lock it appends its stdout and stderr (file descriptors 1 and 2: child
  processes and C libraries too) to the log, keeping a second name for the file beside it,
  ``.<log name>.<pid>.keep``.
* Snakemake removes a job's log before starting the job, also while another run's job still
  writes it, and creates an empty log for a failed job that wrote none (a second job that
  waited, then was stopped). So on exit the job gives the log's name back to its own file if
  the name was removed or holds an empty file; a non-empty file found there (no job of the
  pipeline writes one without the lock) is kept beside it as ``<log>.<pid>.displaced``. A job
  killed before it could (SIGKILL) leaves the second name: its watcher (fair_calib/jobs/job_watch.py)
  or the next job for the output puts it back. A job whose log already holds lines (an earlier
  job's, given back) starts its own below a separator line.
"""
from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

KEEP_SUFFIX = ".keep"
JOB_LINE = "[fair-calib] job "        # a job's start / end record (fair_calib/cli/main.py: job_record)
SIDE_KINDS = ("waiting", "refused")   # the logs of a job that never held its output


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


def keep_name(path: str | os.PathLike, pid: int) -> Path:
    path = Path(path)
    return path.parent / f".{path.name}.{pid}{KEEP_SUFFIX}"


def side_log(path: str | os.PathLike, pid: int, kind: str = "waiting") -> Path:
    """The log of job ``pid`` that did not hold the output: ``<log>.<pid>.<kind>``."""
    path = Path(path)
    return path.parent / f"{path.name}.{pid}.{kind}"


def side_logs(path: str | os.PathLike) -> list[Path]:
    """Every ``<log>.<pid>.waiting`` / ``.refused`` beside ``path``, oldest first."""
    path = Path(path)
    found = [p for kind in SIDE_KINDS for p in path.parent.glob(f"{path.name}.*.{kind}")
             if p.name[len(path.name) + 1:].split(".", 1)[0].isdigit()]
    return sorted(found, key=lambda p: (_mtime(p), p.name))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def file_of(path: str | os.PathLike, pid: int) -> Path | None:
    """The log file job ``pid`` writes: its second name of the log (it held the output), else
    its waiting or refused log, else None (it wrote none)."""
    for candidate in (keep_name(path, pid), *(side_log(path, pid, k) for k in SIDE_KINDS)):
        if candidate.exists():
            return candidate
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def restore_left_logs(path: Path) -> None:
    """Put back the log of a job killed before it could (its ``.keep`` name); drop second names
    whose process is gone."""
    prefix = f".{path.name}."
    for keep in sorted(path.parent.glob(f"{prefix}*{KEEP_SUFFIX}")):
        pid = keep.name[len(prefix):-len(KEEP_SUFFIX)]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        name_back(path, keep)


def show_holder_log(path: str | os.PathLike) -> bool:
    """While another job holds the output: its log under the log's name again, now (Snakemake
    removed the name before starting this job, or left an empty file under it), so the holder's
    log, and its progress lines read from it, stay visible while this job waits or refuses.
    Returns whether the name is the holder's file now."""
    path = Path(path)
    prefix = f".{path.name}."
    keeps = [k for k in path.parent.glob(f"{prefix}*{KEEP_SUFFIX}")
             if k.name[len(prefix):-len(KEEP_SUFFIX)].isdigit()
             and _alive(int(k.name[len(prefix):-len(KEEP_SUFFIX)]))]
    for keep in sorted(keeps, key=_mtime, reverse=True):
        try:
            if path.exists():
                if os.path.samefile(path, keep):
                    return True
                if path.stat().st_size:        # lines of its own: not ours to replace
                    return False
                path.unlink()
            os.link(keep, path)
            return True
        except OSError:
            return False
    return False


def name_back(path: str | os.PathLike, keep: str | os.PathLike) -> None:
    """``path`` again on ``keep``'s file; the second name dropped. The name is taken back from
    an empty file (Snakemake's, for a failed job that wrote no log); a non-empty file under it
    that is not this log is kept beside it, ``<log>.<pid>.displaced``."""
    path, keep = Path(path), Path(keep)
    try:
        if path.exists() and not os.path.samefile(path, keep):
            if path.stat().st_size:
                os.replace(path, path.with_name(f"{path.name}.{os.getpid()}.displaced"))
            else:
                path.unlink()
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
    keep = keep_name(path, os.getpid())
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
    name_back(path, keep)


def append_line(path: str | os.PathLike | None, line: str) -> None:
    """One line at the end of a log (a job that ends before it opened its log)."""
    if not path:
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(line.rstrip("\n") + "\n")
    except OSError:
        pass
