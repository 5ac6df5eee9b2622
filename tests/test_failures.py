"""Failures read like the config errors (issue 32): a failed stage's log ends in one line naming
what failed and what to do (the traceback above it); the console gets that line; an interrupted
stage exits in one line; an unknown table target lists the tables there are."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fair_calib import job_lock
from fair_calib.cli import JOB_LINE
from fair_calib.failures import summary_lines

REPO = Path(__file__).resolve().parents[1]
SETTINGS = json.dumps({"seed": 0, "corpus": {"seed": 0, "n_train_docs": 300, "n_calib_docs": 8,
                                             "n_probe": 8, "n_facts": 8, "n_mc_items": 8,
                                             "n_gen_items": 8}})


def _make_data(out, **kw):
    return subprocess.Popen([sys.executable, "-m", "fair_calib.cli", "make-data", "--settings",
                             SETTINGS, "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, **kw)


def test_a_failed_stage_ends_its_log_with_what_failed_and_what_to_do(tmp_path):
    (tmp_path / "file").write_text("")
    proc = _make_data(tmp_path / "file" / "data")      # a folder under a file: cannot be made
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    # (the stage's job lines, benchmarks/gpu_dag.py's record of its wall time, aside)
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith(JOB_LINE)]
    assert lines[0] == "Traceback (most recent call last):"             # the log keeps it
    assert lines[-1].startswith("error: fair-calib make-data: FileExistsError: ")
    assert str(tmp_path / "file") in lines[-1] and lines[-1].endswith("permissions)")


@pytest.mark.parametrize("sig, name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")])
def test_an_interrupted_stage_exits_in_one_line(tmp_path, sig, name):
    out = tmp_path / "data"
    lock = job_lock.lock_path(out, "make-data")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)           # the stage waits on it: interrupted mid-run
    try:
        # Ctrl-C reaches a stage started from a terminal; a runner that starts this suite in
        # the background (bash without job control) ignores SIGINT, and children inherit that
        proc = _make_data(out, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        line = proc.stderr.readline()
        while line.startswith(JOB_LINE):               # the job's start line comes first
            line = proc.stderr.readline()
        assert "waiting" in line                       # blocked on the lock, mid-run
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        os.close(fd)
    assert proc.returncode != 0 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith(f"fair-calib make-data: interrupted ({name})")
    assert not (out / "manifest.json").exists()


def test_console_line_per_failed_job_from_snakemakes_log(tmp_path):
    job_log = tmp_path / "logs/prior/m/default.log"
    job_log.parent.mkdir(parents=True)
    job_log.write_text("Traceback (most recent call last):\n  ...\nValueError: x\n"
                       "error: fair-calib prior: ValueError: x; check the settings\n")
    other = tmp_path / "logs/gather.log"
    other.write_text("cp: cannot stat 'a': No such file or directory\n")
    smk = tmp_path / "run.snakemake.log"
    smk.write_text(
        "Error in rule prior:\n    message: None\n    jobid: 3\n"
        "    output: results/prior/m/default.parquet\n    wildcards: model=m, prior=default\n"
        f"    log: {job_log} (check log file(s) for error details)\n    shell:\n        python ...\n"
        "Error in rule gather_eval:\n    jobid: 4\n"
        f"    log: {other} (check log file(s) for error details)\n")
    assert summary_lines([str(smk)]) == [
        f"Failed: prior (model=m, prior=default): error: fair-calib prior: ValueError: x; "
        f"check the settings [log: {job_log}]",
        f"Failed: gather_eval: cp: cannot stat 'a': No such file or directory [log: {other}]"]
    assert summary_lines(None) == []


def _workspace(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    for item in ("Snakefile", "workflow", "config", "profiles"):
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / item)
    return tmp_path


def test_unknown_table_target_lists_the_tables(tmp_path):
    ws = _workspace(tmp_path)
    res = subprocess.run(["snakemake", "-n", "--cores", "1", "results/tables/mian.tex"], cwd=ws,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "Traceback" not in out, out[-3000:]
    errors = [l for l in out.splitlines() if l.startswith("Error:")]
    assert len(errors) == 1 and "no table 'mian'" in errors[0], out[-3000:]
    assert "results/tables/main.tex" in errors[0] and "results/tables/prior_ablation.tex" in errors[0]


FAILING_STAGE = '''
import errno, importlib
_import = importlib.import_module

def import_module(name, *args, **kwargs):
    module = _import(name, *args, **kwargs)
    if name == "fair_calib.models.tiny.corpus":
        def full_disk(argv):
            raise OSError(errno.ENOSPC, "No space left on device")
        module.run_cli = full_disk
    return module

importlib.import_module = import_module
'''


@pytest.mark.slow
def test_a_failed_job_is_one_line_on_the_console(tmp_path):
    """A job that fails (here: a full disk, simulated in the stage): the console shows the
    log's last line (what failed, what to do) and no traceback; the log holds the traceback."""
    ws = _workspace(tmp_path / "ws")
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FAILING_STAGE)
    res = subprocess.run(["snakemake", "resources/data/manifest.json", "--cores", "1"], cwd=ws,
                         capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{REPO}"})
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "Traceback" not in out, out[-3000:]
    failed = [l for l in out.splitlines() if l.startswith("Failed: ")]
    assert failed == ["Failed: make_data: error: fair-calib make-data: OSError: [Errno 28] No space "
                      "left on device; the disk (or quota) is full: free space where the outputs "
                      "are written, then rerun [log: logs/make_data/make_data.log]"], out[-3000:]
    assert "Traceback" in (ws / "logs/make_data/make_data.log").read_text()


def test_a_missing_calib_dir_is_named_as_missing_before_the_model_loads(tmp_path):
    from fair_calib.evaluate.lm import check_calibration_pairing

    with pytest.raises(FileNotFoundError, match="does not exist: calibrate first"):
        check_calibration_pairing(str(tmp_path / "calib/m/rtn/w4a4"), str(tmp_path / "no-model"),
                                  "tiny-llada")


def test_at_a_terminal_the_failure_is_one_line_without_traceback(monkeypatch):
    import io

    from fair_calib import cli

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    monkeypatch.delenv("FAIR_CALIB_TRACEBACK", raising=False)
    try:
        raise FileNotFoundError(2, "No such file or directory", "results/calib/x/meta.json")
    except FileNotFoundError as err:
        line = cli._failure_line("lm-eval", err)
    assert term.getvalue() == ""                     # the traceback only with FAIR_CALIB_TRACEBACK=1
    assert line.startswith("error: fair-calib lm-eval: FileNotFoundError: ")
    assert "results/calib/x/meta.json" in line and "rerun Snakemake" in line and "\n" not in line
