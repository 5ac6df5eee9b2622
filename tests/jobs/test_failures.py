"""Failures read like the config errors (issue 32): a failed stage's log ends in one line naming
what failed and what to do (the traceback above it); the console gets that line; an interrupted
stage exits in one line; an unknown table target lists the tables there are."""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fair_calib.jobs import job_lock
from fair_calib.cli.main import JOB_LINE
from fair_calib.jobs.failures import summary_lines
from fixtures.held_stage import held_stage_hook

REPO = Path(__file__).resolve().parents[2]
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
    # (the stage's job lines, benchmarks/gpu_trained.py's record of its wall time, aside)
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

    from fair_calib.cli import main as cli

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


# ------------------------------------------------------------ issue 42: failures say what happened
SNAKEMAKE_9_LOG = """[Sat Nov 28 12:43:36 2026]
rule calibrate:
    input: resources/models/tiny-llada
    output: results/calib/tiny-llada/rtn/w4a4/params.safetensors
    log: {log}
    jobid: 7
    benchmark: results/benchmarks/calibrate/tiny-llada/rtn/w4a4.tsv
    reason: Missing output files: results/calib/tiny-llada/rtn/w4a4/meta.json
    wildcards: model=tiny-llada, method=rtn, bits=w4a4
    resources: tmpdir=/tmp, mem_mb=3000, mem_mib=2862, runtime=30
[Sat Nov 28 12:44:01 2026]
Error in rule calibrate:
    message: None
    jobid: 7
    output: results/calib/tiny-llada/rtn/w4a4/params.safetensors
    log: {log} (check log file(s) for error details)
    shell:
        python -m fair_calib.cli calibrate ...
        (command exited with non-zero exit code)
"""


def test_failed_line_has_the_wildcards_and_the_declared_memory_of_a_killed_job(tmp_path):
    """Snakemake 9's error block names neither wildcards nor resources: they are read from the
    start block of the same job id. A job killed by SIGKILL (its watcher's line) gets its
    rule's declared mem_mb beside its peak memory, and the config key to raise."""
    from fair_calib.jobs.job_watch import killed_line

    log = tmp_path / "logs/calibrate/tiny-llada/rtn/w4a4.log"
    log.parent.mkdir(parents=True)
    line = killed_line("calibrate", signal.SIGKILL, 41.0, 3210.4)
    log.write_text("[calibrate] block 0 ...\n" + line + "\n")
    smk = tmp_path / "2026-11-28T124335.000001.snakemake.log"
    smk.write_text(SNAKEMAKE_9_LOG.format(log=log))
    assert line.startswith("error: fair-calib calibrate: killed by signal 9 (SIGKILL), exit code "
                           "137, after 41 s; peak memory 3210 MB; SIGKILL is most often the "
                           "out-of-memory killer")
    assert summary_lines(smk) == [
        f"Failed: calibrate (model=tiny-llada, method=rtn, bits=w4a4): error: fair-calib "
        f"calibrate: killed by signal 9 (SIGKILL), exit code 137, after 41 s; peak memory "
        f"3210 MB (its rule declares mem_mb=3000); SIGKILL is most often the out-of-memory "
        f"killer (the kernel's, or the cluster's at the job's memory limit): give the job more "
        f"memory (resources.calibrate.mem_mb in the config; on one machine, fewer jobs at once) "
        f"or lower its sizes [log: {log}]"]


def test_failed_line_reads_a_second_jobs_own_log_of_this_run(tmp_path):
    """A job that never held its output wrote <log>.<pid>.waiting (the rule's log is the
    holder's): that one of this run is read and named; one of an earlier run is not."""
    log = tmp_path / "w4a4.log"
    log.write_text("the holder's progress line\n")
    older = tmp_path / "w4a4.log.11.waiting"
    older.write_text("fair-calib calibrate: interrupted (Ctrl-C) while waiting ...\n")
    os.utime(older, (time.time() - 3600, time.time() - 3600))
    smk = tmp_path / (time.strftime("%Y-%m-%dT%H%M%S", time.localtime(time.time() - 60))
                      + ".123456.snakemake.log")
    smk.write_text(SNAKEMAKE_9_LOG.format(log=log))
    assert summary_lines(smk)[0].endswith(f"the holder's progress line [log: {log}]")
    mine = tmp_path / "w4a4.log.12.refused"
    mine.write_text("error: fair-calib calibrate: x is being written by another job (...)\n")
    assert summary_lines(smk)[0].endswith(
        f": error: fair-calib calibrate: x is being written by another job (...) [log: {mine}]")


HELD_STAGE = held_stage_hook('computing')


def test_a_stage_killed_by_sigkill_says_so_in_its_log(tmp_path):
    """The computing process of a stage is killed with SIGKILL (as the out-of-memory killer
    does): its watcher writes the signal, exit code and peak memory as the log's last line
    and exits 137, as a shell would report it."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HELD_STAGE)
    out, log = tmp_path / "data", tmp_path / "make_data.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fair_calib.cli", "make-data", "--settings", SETTINGS, "--out",
         str(out), "--log", str(log)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{REPO}",
             "FAIR_CALIB_TEST_HOLD": str(tmp_path / "never")})
    deadline = time.time() + 60
    while not (log.exists() and "computing" in log.read_text()):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    lock = job_lock.lock_path(out, "make-data").read_text()
    computing = int(lock.split("pid ")[1].split()[0])          # the holder: the stage itself
    assert computing != proc.pid                               # (proc is its watcher)
    os.kill(computing, signal.SIGKILL)
    assert proc.wait(timeout=60) == 137
    lines = log.read_text().splitlines()
    record = json.loads(lines[-2][len(JOB_LINE):])
    assert record["status"] == "killed" and record["signal"] == "SIGKILL"
    assert record["exit_code"] == 137 and record["peak_rss_mb"] > 0
    assert lines[-1].startswith("error: fair-calib make-data: killed by signal 9 (SIGKILL), exit "
                                f"code 137, after ") and "peak memory " in lines[-1]
    assert "out-of-memory killer" in lines[-1]
    assert not list(tmp_path.glob(".make_data.log.*"))         # the log's second name dropped


def test_a_stop_by_sigterm_is_described_as_what_happened():
    from fair_calib.jobs.failures import describe_stop

    (line,) = describe_stop(["make_data"], [], 1)
    assert line.startswith("Stopped by SIGTERM: Snakemake let the jobs it had started end")
    assert "Finished in this run: 1 job: make_data" in line and "not started: 1 job." in line
    (done,) = describe_stop(["a", "b", "c", "d", "e"], [], 0)
    assert "5 jobs: a, b, c, d, and 1 more" in done and "requested outputs are complete" in done
    (failed,) = describe_stop([], ["prior (model=m)"], 2)
    assert "No job finished in this run; failed or stopped: 1 job: prior (model=m)" in failed
    assert "not started: 2 jobs" in failed


@pytest.mark.slow
def test_sigterm_to_snakemake_ends_as_what_happened(tmp_path):
    """SIGTERM to Snakemake while a job runs: Snakemake lets the job finish and starts no
    other; the run then says that (not "At least one job did not complete successfully") and
    exits 143 (128 + SIGTERM)."""
    ws = _workspace(tmp_path / "ws")
    # the default's prompt and item counts (the config check compares the probes with them)
    (ws / "small.yaml").write_text(json.dumps({"corpus": {
        "seed": 0, "n_train_docs": 300, "n_calib_docs": 8, "n_probe": 128, "n_facts": 128,
        "n_mc_items": 200, "n_gen_items": 200}}))
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HELD_STAGE)
    release = tmp_path / "release"
    proc = subprocess.Popen(
        ["snakemake", "resources/models/tiny-llada", "--cores", "1", "--configfile", "small.yaml"],
        cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{REPO}",
             "FAIR_CALIB_TEST_HOLD": str(release)})
    log = ws / "logs/make_data/make_data.log"
    deadline = time.time() + 120
    while not (log.exists() and "computing" in log.read_text()):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)          # to Snakemake alone
    time.sleep(1)
    release.write_text("")                    # the job ends well
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-3000:]
    stopped = [l for l in out.splitlines() if l.startswith("Stopped by SIGTERM")]
    assert stopped and "Finished in this run: 1 job: make_data" in stopped[0], out[-3000:]
    assert "not started: 1 job" in stopped[0]
    assert "did not complete successfully" not in out and "Failed:" not in out
    assert re.search(r"^Complete log\(s\): \S+\.snakemake\.log$", out, re.M), out[-3000:]
    assert not (ws / ".snakemake/locks").exists() or not any((ws / ".snakemake/locks").iterdir())


# ------------------------------------------------- a job killed whole (its watcher too)
def test_a_job_killed_whole_names_the_signal_not_its_last_progress_line(tmp_path):
    """`kill -9` of a job's processes (or the OOM killer of its group) kills the watcher too:
    its log ends at a progress line; the command's exit status names the signal."""
    log = tmp_path / "logs/calibrate/tiny-llada/rtn/w4a4.log"
    log.parent.mkdir(parents=True)
    log.write_text("[calibrate] block 1/2 epoch 3/15 loss 0.41\n")
    smk = tmp_path / "2026-11-28T124335.000001.snakemake.log"
    smk.write_text(SNAKEMAKE_9_LOG.format(log=log))
    for code in (-9, 137):          # the shell killed too, or the shell reporting its child
        [line] = summary_lines(smk, exits={f"python -m fair_calib.cli calibrate --log {log}": code})
        assert ": killed by signal 9 (SIGKILL), exit code 137, the whole job with its watcher " \
               "(its rule declares mem_mb=3000); its log ends at: [calibrate] block 1/2" in line, line
        assert "resources.calibrate.mem_mb" in line and "\n" not in line
    # a failure the stage said itself keeps its own line
    log.write_text("error: fair-calib calibrate: ValueError: x; fix y\n")
    [line] = summary_lines(smk, exits={f"... --log {log}": 1})
    assert line.startswith("Failed: calibrate (model=tiny-llada, method=rtn, bits=w4a4): error:")


def test_failing_job_commands_keep_their_exit_status():
    import subprocess

    from snakemake.shell import shell

    from fair_calib.jobs.failures import SHELL_EXITS, record_shell_exits

    record_shell_exits()
    record_shell_exits()              # once only
    with pytest.raises(subprocess.CalledProcessError):
        shell("kill -9 $$ # --log logs/x.log")
    assert signal.Signals(-SHELL_EXITS[next(c for c in SHELL_EXITS if "logs/x.log" in c)]) \
        == signal.SIGKILL
