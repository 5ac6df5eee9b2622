"""Two runs never compute one output at once (issue 32): every stage CLI holds an exclusive lock
on its output for its whole life (fair_calib/jobs/job_lock.py), whatever Snakemake's lock does."""
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
import yaml

from fair_calib.jobs import job_lock

REPO = Path(__file__).resolve().parents[2]
# the default's prompt and item counts (the config check compares the probes with them)
CORPUS = {"seed": 0, "n_train_docs": 300, "n_calib_docs": 8, "n_probe": 128, "n_facts": 128,
          "n_mc_items": 200, "n_gen_items": 200}


def _env(**extra):
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def _make_data(out: Path, **env) -> subprocess.Popen:
    settings = json.dumps({"seed": 0, "corpus": CORPUS})
    return subprocess.Popen([sys.executable, "-m", "fair_calib.cli", "make-data", "--settings",
                             settings, "--out", str(out)], env=_env(**env), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _held_elsewhere(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _holders(path: str) -> list[int]:
    """Processes that have ``path`` open (Linux /proc)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and any(os.readlink(fd) == path for fd in (proc / "fd").iterdir()):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_primary_output_and_lock_path():
    assert job_lock.primary_output(["--settings", "{}", "--out", "a/b.parquet"]) == "a/b.parquet"
    assert job_lock.primary_output(["--out-dir=results/calib/m/x/w4a4"]) == "results/calib/m/x/w4a4"
    assert job_lock.primary_output(["--inputs", "a"]) is None
    path = job_lock.lock_path("results/figures", "floor-sweep")
    assert path == Path.cwd() / "results/.figures.floor-sweep.lock"


def test_second_job_for_one_output_waits_or_refuses_by_name(tmp_path):
    out = tmp_path / "data"
    lock = job_lock.lock_path(out, "make-data")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)          # "another job" holds the output
    os.pwrite(fd, b"fair-calib make-data, pid 4242 on node7\n", 0)
    try:
        refused = _make_data(out, FAIR_CALIB_LOCK="refuse")
        _, err = refused.communicate(timeout=60)
        assert refused.returncode == 1 and not out.exists()
        assert str(out) in err and "pid 4242 on node7" in err and "Traceback" not in err, err
        waiting = _make_data(out)
        time.sleep(3)
        assert waiting.poll() is None and not out.exists()   # waits, computes nothing
    finally:
        os.close(fd)                        # the other job ends
    _, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    assert "waiting" in err and "pid 4242 on node7" in err
    assert (out / "manifest.json").exists()


def test_a_killed_holder_leaves_no_lock(tmp_path):
    out = tmp_path / "x.parquet"
    code = ("import sys, time; from fair_calib.jobs import job_lock; "
            f"job_lock.hold('prior', ['--out', {str(out)!r}]); print('held', flush=True); "
            "time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "held"
    assert _held_elsewhere(job_lock.lock_path(out, "prior"))
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    assert not _held_elsewhere(job_lock.lock_path(out, "prior"))


# A sitecustomize for the jobs of the scenario below: it records when the make-data stage
# computes (after the CLI's checks and lock, around the stage's own run_cli) and holds run A's
# computation until the test releases it (once run C's job has started).
TIMING_HOOK = '''
import importlib, os, time
_import = importlib.import_module

def import_module(name, *args, **kwargs):
    module = _import(name, *args, **kwargs)
    if name == "fair_calib.models.tiny.corpus" and not hasattr(module, "_timed"):
        run = module.run_cli

        def timed(argv):
            log = os.environ["FAIR_CALIB_TEST_TIMES"]
            with open(log, "a") as f:
                f.write(f"start {os.getpid()} {time.time()}\\n")
            release = os.environ.get("FAIR_CALIB_TEST_RELEASE")
            deadline = time.time() + 120
            while release and not os.path.exists(release) and time.time() < deadline:
                time.sleep(0.1)
            try:
                return run(argv)
            finally:
                with open(log, "a") as f:
                    f.write(f"end {os.getpid()} {time.time()}\\n")

        module.run_cli, module._timed = timed, True
    return module

importlib.import_module = import_module
'''


@pytest.mark.slow
def test_three_runs_never_compute_one_output_at_once(tmp_path):
    """The issue's scenario: run A computes an output; run B, with nothing to do, removes
    .snakemake/locks on exit; run C, A's command again, then plans the same job. C's job must
    not compute while A's does: it waits for A's, then runs."""
    ws = tmp_path / "ws"
    ws.mkdir()
    for item in ("Snakefile", "workflow", "config"):
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, ws / item)
    (ws / "small.yaml").write_text(yaml.safe_dump({"corpus": CORPUS}))
    (ws / "done.yaml").write_text(yaml.safe_dump({"corpus": CORPUS, "synthetic_dir": "done"}))
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(TIMING_HOOK)
    times = tmp_path / "times.txt"
    env = {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{REPO}",
           "FAIR_CALIB_TEST_TIMES": str(times)}
    cmd = ["snakemake", "resources/data/manifest.json", "--cores", "1", "--configfile", "small.yaml"]
    done = ["snakemake", "done/manifest.json", "--cores", "1", "--configfile", "done.yaml"]
    first = subprocess.run(done, cwd=ws, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stdout + first.stderr
    times.unlink()

    release = tmp_path / "release"
    run_a = subprocess.Popen(cmd, cwd=ws, env={**env, "FAIR_CALIB_TEST_RELEASE": str(release)},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not (times.exists() and "start" in times.read_text()):
        assert run_a.poll() is None and time.time() < deadline, run_a.stdout.read()
        time.sleep(0.2)
    # B: nothing to do (a finished target); on exit, Snakemake removes .snakemake/locks
    run_b = subprocess.run(done, cwd=ws, env=env, capture_output=True, text=True)
    assert run_b.returncode == 0 and "Nothing to be done" in run_b.stdout + run_b.stderr, (
        run_b.stdout + run_b.stderr)
    run_c = subprocess.Popen(cmd, cwd=ws, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    # A computes until C's job has started: C's job waits on the output's lock (two processes
    # hold the lock file open), or, were there no lock, computes too (a second start)
    lock = str(job_lock.lock_path(ws / "resources/data", "make-data"))
    while len(_holders(lock)) < 2 and times.read_text().count("start") < 2:
        assert run_c.poll() is None and time.time() < deadline, run_c.stdout.read()
        time.sleep(0.2)
    release.write_text("")
    out_c, _ = run_c.communicate(timeout=180)
    out_a, _ = run_a.communicate(timeout=180)
    assert run_a.returncode == 0, out_a
    assert run_c.returncode == 0, out_c
    spans = {}
    for line in times.read_text().splitlines():
        event, pid, t = line.split()
        spans.setdefault(pid, {})[event] = float(t)
    assert len(spans) == 2, spans           # C did plan and run the job (the scenario holds)
    (a, c) = sorted(spans.values(), key=lambda s: s["start"])
    assert c["start"] >= a["end"], f"run C computed while run A did: {spans}"
    assert (ws / "resources/data/manifest.json").exists()
    # C's Snakemake removed the log while A's job wrote it: A's job gave the name back, whole,
    # and C's job, which waited for it, wrote below (fair_calib/jobs/job_log.py)
    log = (ws / "logs/make_data/make_data.log").read_text()
    assert log.count('"status": "ok"') == 2, log
    first, second = log.split("a new job for this output", 1)
    assert '"status": "start"' in first and '"status": "ok"' in first, log
    assert "waited for" in second.splitlines()[0] and '"status": "ok"' in second, log


# ------------------------------------------------------------------ the job's own log (issue 32)
OPENER = """
import os, sys, time
from fair_calib.jobs import job_log
job_log.open_log(sys.argv[1], header="---- a new job ----")
print(sys.argv[2] + " first", flush=True)
open(sys.argv[3], "w").close()
while not os.path.exists(sys.argv[4]):
    time.sleep(0.05)
print(sys.argv[2] + " last", flush=True)
"""


def _opener(log, name, ready, release):
    return subprocess.Popen([sys.executable, "-c", OPENER, str(log), name, str(ready),
                             str(release)], env=_env())


def _wait_for(path, proc):
    deadline = time.time() + 60
    while not path.exists():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)


def test_a_running_jobs_log_survives_a_second_run(tmp_path):
    """Snakemake removes a job's log before starting it, also while another run's job still
    writes it: the running job gives the name back to its file on exit, whole, and the job that
    waited for it writes below."""
    log = tmp_path / "logs" / "job.log"
    a = _opener(log, "A", tmp_path / "a.ready", tmp_path / "a.go")
    _wait_for(tmp_path / "a.ready", a)
    log.unlink()                              # a second run's Snakemake preparing the job
    (tmp_path / "a.go").write_text("")
    assert a.wait(timeout=60) == 0
    assert log.read_text() == "A first\nA last\n"
    assert not list(log.parent.glob(".job.log.*"))     # the second name is gone
    b = _opener(log, "B", tmp_path / "b.ready", tmp_path / "b.go")
    _wait_for(tmp_path / "b.ready", b)
    (tmp_path / "b.go").write_text("")
    assert b.wait(timeout=60) == 0
    assert log.read_text() == "A first\nA last\n---- a new job ----\nB first\nB last\n"


def test_a_killed_jobs_log_is_put_back_by_the_next_job(tmp_path):
    log = tmp_path / "job.log"
    a = _opener(log, "A", tmp_path / "a.ready", tmp_path / "never")
    _wait_for(tmp_path / "a.ready", a)
    log.unlink()
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=30)
    assert not log.exists() and len(list(tmp_path.glob(".job.log.*.keep"))) == 1
    b = _opener(log, "B", tmp_path / "b.ready", tmp_path / "b.go")
    _wait_for(tmp_path / "b.ready", b)
    (tmp_path / "b.go").write_text("")
    assert b.wait(timeout=60) == 0
    assert log.read_text() == "A first\n---- a new job ----\nB first\nB last\n"
    assert not list(tmp_path.glob(".job.log.*"))


def test_stage_cli_writes_its_log_after_the_lock(tmp_path):
    """`--log`: the stage's lines (its job records) in the log; a job refused before the lock
    (bad settings) appends its error line there too; one that waited says so in its log."""
    log = tmp_path / "make_data.log"
    settings = json.dumps({"seed": 0, "corpus": CORPUS})
    run = subprocess.run([sys.executable, "-m", "fair_calib.cli", "make-data", "--settings",
                          settings, "--out", str(tmp_path / "data"), "--log", str(log)],
                         env=_env(), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    text = log.read_text()
    assert '"status": "start"' in text and '"status": "ok"' in text and "counts" in text
    assert run.stdout == "" and run.stderr == ""
    bad = subprocess.run([sys.executable, "-m", "fair_calib.cli", "make-data", "--settings",
                          "{not json", "--out", str(tmp_path / "data"), "--log", str(log)],
                         env=_env(), capture_output=True, text=True)
    assert bad.returncode != 0
    assert log.read_text().splitlines()[-1].startswith("error: fair-calib make-data --settings")


# ------------------------------------------------------------ a second job's own log (issue 42)
def test_the_log_name_is_taken_back_from_snakemakes_empty_file(tmp_path):
    """Snakemake creates an empty log for a failed job that wrote none (a second job that waited,
    then was stopped): the running job's exit takes the name back, so its log is whole."""
    log = tmp_path / "job.log"
    a = _opener(log, "A", tmp_path / "a.ready", tmp_path / "a.go")
    _wait_for(tmp_path / "a.ready", a)
    log.unlink()                              # a second run's Snakemake preparing the job ...
    log.write_text("")                        # ... and creating an empty log when it failed
    (tmp_path / "a.go").write_text("")
    assert a.wait(timeout=60) == 0
    assert log.read_text() == "A first\nA last\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.go", "a.ready", "job.log"]


def test_a_foreign_file_under_the_logs_name_is_kept_beside_it(tmp_path):
    log = tmp_path / "job.log"
    a = _opener(log, "A", tmp_path / "a.ready", tmp_path / "a.go")
    _wait_for(tmp_path / "a.ready", a)
    log.unlink()
    log.write_text("someone else's line\n")
    (tmp_path / "a.go").write_text("")
    assert a.wait(timeout=60) == 0
    assert log.read_text() == "A first\nA last\n"
    (other,) = tmp_path.glob("job.log.*.displaced")
    assert other.read_text() == "someone else's line\n"


def _cli_make_data(out: Path, log: Path, **env) -> subprocess.Popen:
    settings = json.dumps({"seed": 0, "corpus": CORPUS})
    return subprocess.Popen([sys.executable, "-m", "fair_calib.cli", "make-data", "--settings",
                             settings, "--out", str(out), "--log", str(log)], env=_env(**env),
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_second_jobs_write_their_own_logs_and_leave_the_holders_alone(tmp_path):
    """With ``--log``: a refused job writes ``<log>.<pid>.refused``, a job refused for its
    settings while another holds the output ``<log>.<pid>.waiting``; a waiting job writes
    ``<log>.<pid>.waiting`` while it waits, then, holding the output, its main log (saying it
    waited) and no waiting log. The holder's log is never written by them."""
    out, log = tmp_path / "data", tmp_path / "logs" / "make_data.log"
    log.parent.mkdir()
    log.write_text("the holder's line\n")
    lock = job_lock.lock_path(out, "make-data")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, b"fair-calib make-data, pid 4242 on node7\n", 0)
    try:
        refused = _cli_make_data(out, log, FAIR_CALIB_LOCK="refuse")
        refused.communicate(timeout=60)
        (own,) = log.parent.glob("make_data.log.*.refused")
        assert "pid 4242 on node7" in own.read_text() and refused.returncode == 1
        bad = subprocess.run([sys.executable, "-m", "fair_calib.cli", "make-data", "--settings",
                              "{not json", "--out", str(out), "--log", str(log)], env=_env(),
                             capture_output=True, text=True)
        assert bad.returncode != 0
        (own_bad,) = log.parent.glob("make_data.log.*.waiting")
        assert "--settings" in own_bad.read_text()
        own_bad.unlink()
        waiting = _cli_make_data(out, log)
        assert "waiting" in waiting.stderr.readline()
        (own_wait,) = log.parent.glob("make_data.log.*.waiting")
        assert "pid 4242 on node7" in own_wait.read_text()
        assert log.read_text() == "the holder's line\n"
    finally:
        os.close(fd)                          # the holder ends
    _, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    assert not list(log.parent.glob("make_data.log.*.waiting"))
    first, second = log.read_text().split("a new job for this output", 1)
    assert first.startswith("the holder's line\n---- fair-calib make-data, pid ")
    assert "pid 4242 on node7, waited for" in second and '"status": "ok"' in second
