"""HumanEval programs run as the authors' scorers run them (``fair_calib.evaluate.code_exec``).

``reference_check`` below is this test's own transcription of human-eval's
``check_correctness`` (open-compass/human-eval, which OpenCompass 0.4.2's
``HumanEvalEvaluator`` calls with ``timeout=3.0``; HF evaluate's ``code_eval/execute.py`` is the
same code over a whole program, called by the Dream fork's ``pass_at_k`` with its default
``timeout=3.0``): a forked ``multiprocessing.Process`` that makes a temporary directory its
working directory, applies ``reliability_guard()``, swallows the standard streams, arms a
``setitimer`` alarm and ``exec``s the program in ``{}``, its result appended to a manager list;
``join(timeout + 1)``, then ``kill``. The project's results must equal it, string for string.
"""
import contextlib
import faulthandler
import importlib.util
import io
import multiprocessing
import os
import platform
import signal
import tempfile

import pytest

from fair_calib.evaluate import code_exec
from fair_calib.evaluate import offline_data as od


# ---------------------------------------------------------------- the reference, transcribed
class _RefTimeout(Exception):
    pass


class _RefWriteOnly(io.StringIO):
    def read(self, *args, **kwargs):
        raise IOError

    def readline(self, *args, **kwargs):
        raise IOError

    def readlines(self, *args, **kwargs):
        raise IOError

    def readable(self, *args, **kwargs):
        return False


class _RefStdin(contextlib._RedirectStream):
    _stream = "stdin"


@contextlib.contextmanager
def _ref_time_limit(seconds):
    def handler(signum, frame):
        raise _RefTimeout("Timed out!")
    signal.setitimer(signal.ITIMER_REAL, seconds)
    signal.signal(signal.SIGALRM, handler)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


@contextlib.contextmanager
def _ref_swallow_io():
    stream = _RefWriteOnly()
    with contextlib.redirect_stdout(stream):
        with contextlib.redirect_stderr(stream):
            with _RefStdin(stream):
                yield


def _ref_guard():
    faulthandler.disable()
    import builtins
    builtins.exit = None
    builtins.quit = None
    os.environ["OMP_NUM_THREADS"] = "1"
    os.kill = None
    os.system = None
    os.putenv = None
    os.remove = None
    os.removedirs = None
    os.rmdir = None
    os.fchdir = None
    os.setuid = None
    os.fork = None
    os.forkpty = None
    os.killpg = None
    os.rename = None
    os.renames = None
    os.truncate = None
    os.replace = None
    os.unlink = None
    os.fchmod = None
    os.fchown = None
    os.chmod = None
    os.chown = None
    os.chroot = None
    os.fchdir = None
    os.lchflags = None
    os.lchmod = None
    os.lchown = None
    os.getcwd = None
    os.chdir = None
    import shutil
    shutil.rmtree = None
    shutil.move = None
    shutil.chown = None
    import subprocess
    subprocess.Popen = None
    builtins.help = None          # the reference's __builtins__['help'] (a dict in its module)
    import sys
    sys.modules["ipdb"] = None
    sys.modules["joblib"] = None
    sys.modules["resource"] = None
    sys.modules["psutil"] = None
    sys.modules["tkinter"] = None


def reference_check(problem, completion, timeout):
    """human-eval's ``check_correctness(problem, completion, timeout)['result']``."""
    def unsafe_execute():
        with tempfile.TemporaryDirectory() as dirname:
            cwd = os.getcwd()
            os.chdir(dirname)
            import shutil
            rmtree, rmdir, chdir = shutil.rmtree, os.rmdir, os.chdir
            _ref_guard()
            check_program = (problem["prompt"] + completion + "\n" + problem["test"] + "\n"
                             + f"check({problem['entry_point']})")
            try:
                exec_globals = {}
                with _ref_swallow_io():
                    with _ref_time_limit(timeout):
                        exec(check_program, exec_globals)
                result.append("passed")
            except _RefTimeout:
                result.append("timed out")
            except BaseException as e:
                result.append(f"failed: {e}")
            shutil.rmtree, os.rmdir, os.chdir = rmtree, rmdir, chdir
            os.chdir(cwd)

    ctx = multiprocessing.get_context("fork")      # Linux's default under their Python
    manager = ctx.Manager()
    result = manager.list()
    p = ctx.Process(target=unsafe_execute)
    p.start()
    p.join(timeout=timeout + 1)
    if p.is_alive():
        p.kill()
    if not result:
        result.append("timed out")
    out = result[0]
    manager.shutdown()
    return out


# ---------------------------------------------------------------- fixed programs
PROBLEM = {"prompt": "def add(a, b):\n    \"\"\"a + b\"\"\"\n", "entry_point": "add",
           "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n"}
BODY = "    return a + b\n"
COMPLETIONS = {
    "correct": BODY,
    "wrong": "    return a - b\n",
    "main block with a failing assertion": BODY + "\nif __name__ == \"__main__\":\n    assert False\n",
    "main block that exits": BODY + "\nif __name__ == '__main__':\n    raise SystemExit(1)\n",
    "__name__ is builtins": BODY + "\nassert __name__ == 'builtins'\n",
    "sys.exit(0)": BODY + "\nimport sys\nsys.exit(0)\n",
    "exit()": BODY + "\nexit()\n",
    "reads stdin": BODY + "\nx = input()\n",
    "prints": BODY + "\nprint('chatter')\nimport sys\nsys.stderr.write('more')\n",
    "import resource": BODY + "\nimport resource\n",
    "os.remove": BODY + "\nimport os\nos.remove('nothing')\n",
    "subprocess": BODY + "\nimport subprocess\nsubprocess.run(['true'])\n",
    "os.getcwd": BODY + "\nimport os\nos.getcwd()\n",
    "writes a file": BODY + "\nopen('scratch.txt', 'w').write('x')\n",
    "numpy": BODY + "\nimport numpy as np\nassert int(np.add(2, 3)) == 5\n",
    "multiprocessing": BODY + "\nimport multiprocessing\n",
    "syntax error": "    return a +\n",
    "recursion": BODY + "\ndef f(n):\n    return f(n + 1)\nf(0)\n",
    "too slow": BODY + "\nimport time\ntime.sleep(1.5)\n",
    "swallows the alarm": BODY + "\nimport time\ntry:\n    time.sleep(1.5)\nexcept Exception:\n"
                                 "    pass\n",
    "spins past the alarm": BODY + "\nwhile True:\n    try:\n        pass\n    except BaseException:\n"
                                   "        pass\n",
}
TIMEOUT = 0.5      # scaled down from 3 s: the same rules, seconds of test time fewer


@pytest.mark.skipif(platform.system() != "Linux", reason="the authors' scorers fork (Linux)")
@pytest.mark.parametrize("name", sorted(COMPLETIONS))
def test_results_equal_human_evals_check_correctness(name):
    completion = COMPLETIONS[name]
    program = PROBLEM["prompt"] + completion + "\n" + PROBLEM["test"] + "\n" + "check(add)"
    assert code_exec.run_program(program, TIMEOUT) == reference_check(PROBLEM, completion, TIMEOUT)


def test_results_of_note():
    """The rows of issue 41: what the authors' scorers give that ``python prog.py`` does not."""
    prog = lambda c: PROBLEM["prompt"] + c + "\n" + PROBLEM["test"] + "\ncheck(add)"  # noqa: E731
    assert code_exec.run_program(prog(COMPLETIONS["main block with a failing assertion"])) == "passed"
    assert code_exec.run_program(prog(COMPLETIONS["sys.exit(0)"])) == "failed: 0"
    assert code_exec.run_program(prog(COMPLETIONS["exit()"])) == \
        "failed: 'NoneType' object is not callable"
    assert code_exec.run_program(prog(COMPLETIONS["too slow"]), TIMEOUT) == "timed out"


@pytest.fixture
def fc_utils(monkeypatch):
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    spec = importlib.util.spec_from_file_location("fc_task_utils", od.TEMPLATE_DIR / "fc_task_utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    return utils


def _metric_kwargs(template: str) -> dict:
    import yaml

    class Loader(yaml.SafeLoader):
        pass
    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    text = od._render((od.TEMPLATE_DIR / template).read_text(),
                      {**od._local_json("x"), "HUMANEVAL": "x"} if template == "humaneval.yaml"
                      else od._local_json("x"))
    (entry,) = yaml.load(text, Loader)["metric_list"]
    return {k: v for k, v in entry.items() if k not in ("metric", "aggregation", "higher_is_better")}


@pytest.mark.parametrize("template", ["dream_humaneval_instruct.yaml", "oc_humaneval_gen.yaml",
                                      "humaneval.yaml"])
def test_every_humaneval_task_runs_with_the_authors_3_seconds(template):
    """code_eval's default (Dream's fork passes none) and OpenCompass's ``timeout=3.0``."""
    kwargs = _metric_kwargs(template)
    assert kwargs == {"k": [1], "timeout": 3.0}


def test_a_4_second_solution_fails_under_dreams_3_seconds(fc_utils):
    """Dream-Instruct's metric as its task YAML calls it: 4 s of work fails (3 s limit),
    0.2 s passes."""
    kwargs = _metric_kwargs("dream_humaneval_instruct.yaml")
    ref = PROBLEM["test"] + "\ncheck(add)"

    def slow(seconds):
        return PROBLEM["prompt"] + f"    import time\n    time.sleep({seconds})\n" + BODY

    assert fc_utils.pass_at_k([ref], [[slow(4)]], **kwargs) == {"pass@1": 0.0}
    assert fc_utils.pass_at_k([ref], [[slow(0.2)]], **kwargs) == {"pass@1": 1.0}


def test_pass_at_k_runs_the_scorers_program(fc_utils, monkeypatch):
    """``prediction + "\\n" + reference``: code_eval's ``candidate + "\\n" + test_case``, and with
    the OpenCompass task's prediction (prompt + completion) and reference (test + "\\ncheck(ep)")
    human-eval's ``prompt + completion + "\\n" + test + "\\n" + "check(ep)"``."""
    seen = []
    monkeypatch.setattr(code_exec, "run_program", lambda p, t: seen.append((p, t)) or "passed")
    doc = dict(PROBLEM)
    completion = "```python\n" + PROBLEM["prompt"] + BODY + "```\nDone."
    (pred,), = fc_utils.oc_humaneval_predictions([[completion]], [doc])
    ref = doc["test"] + f"\ncheck({doc['entry_point']})"
    assert fc_utils.pass_at_k([ref], [[pred]], k=[1], timeout=3.0) == {"pass@1": 1.0}
    done = fc_utils.humaneval_postprocess_v2(completion)
    assert seen == [(doc["prompt"] + done + "\n" + doc["test"] + "\n"
                     + f"check({doc['entry_point']})", 3.0)]


def test_the_program_cannot_import_the_projects_modules():
    """The child runs this file by path: its folder (lm.py, run.py, ...) is not importable."""
    assert code_exec.run_program("import lm") == "failed: No module named 'lm'"
    assert code_exec.run_program("import code_exec") == "failed: No module named 'code_exec'"
