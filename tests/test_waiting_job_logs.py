"""The waiting-job log case: a job's log belongs to the job that
wrote the output. Run A computes an output; a second run's job for the same output waits on
A's output lock and is stopped with Ctrl-C, and a third is refused (FAIR_CALIB_LOCK=refuse).
A's log must then hold A's own run, whole; each second job's lines are in its own log beside
it (``<log>.<pid>.waiting`` / ``.refused``), which its run's ``Failed:`` line names.

The second runs pass ``--nolock``: they stand for the runs that plan a job another run is
computing once Snakemake's directory lock is gone (issue 32's three-run scenario), without the
third run that scenario needs to remove it. The smoke config's fastest job (make_data, on a
small corpus) is the output; a sitecustomize holds A's computation until the test lets it go.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from fixtures.held_stage import held_stage_hook

REPO = Path(__file__).resolve().parents[1]
CORPUS = {"seed": 0, "n_train_docs": 300, "n_calib_docs": 8, "n_probe": 128, "n_facts": 128,
          "n_mc_items": 200, "n_gen_items": 200}
LOG = "logs/make_data/make_data.log"
TARGET = "resources/data/manifest.json"

# make-data's computation waits for the file FAIR_CALIB_TEST_HOLD names (run A only)
HOLD_HOOK = held_stage_hook('held until the test lets go')


def _default_sigint():
    # Ctrl-C reaches what a terminal started; a runner without job control ignores SIGINT
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _snakemake(ws, env, out, *extra):
    return subprocess.Popen(["snakemake", TARGET, "--cores", "1", "--configfile", "small.yaml",
                             *extra], cwd=ws, env=env, stdout=out, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, preexec_fn=_default_sigint)


def _until(check, proc, what, timeout=120):
    deadline = time.time() + timeout
    while not check():
        assert proc.poll() is None, f"ended before {what}"
        assert time.time() < deadline, f"no {what}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fc4")
    ws = tmp / "ws"
    ws.mkdir()
    for item in ("Snakefile", "workflow", "config"):
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, ws / item)
    (ws / "small.yaml").write_text(yaml.safe_dump({"corpus": CORPUS}))
    (tmp / "hook").mkdir()
    (tmp / "hook" / "sitecustomize.py").write_text(HOLD_HOOK)
    env = {**os.environ, "PYTHONPATH": f"{tmp / 'hook'}{os.pathsep}{REPO}"}
    release, log = tmp / "release", ws / LOG
    outs = {k: open(tmp / f"{k}.out", "w+") for k in ("a", "waiting", "refused")}
    a = _snakemake(ws, {**env, "FAIR_CALIB_TEST_HOLD": str(release)}, outs["a"])
    try:
        _until(lambda: log.exists() and "held until" in log.read_text(), a, "run A's job")
        refused = _snakemake(ws, {**env, "FAIR_CALIB_LOCK": "refuse"}, outs["refused"],
                             "--nolock")
        refused.wait(timeout=120)
        waiting = _snakemake(ws, env, outs["waiting"], "--nolock")
        text = lambda: Path(outs["waiting"].name).read_text()
        _until(lambda: "waiting:" in text(), waiting, "waiting job")
        os.killpg(waiting.pid, signal.SIGINT)             # Ctrl-C at its terminal
        waiting.wait(timeout=120)
        log_while_a_runs = log.read_text() if log.exists() else None
        release.write_text("")
        a.wait(timeout=180)
    finally:
        release.write_text("")
        for proc in (a,):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    said = {k: Path(f.name).read_text() for k, f in outs.items()}
    return {"ws": ws, "log": log, "said": said, "during": log_while_a_runs,
            "codes": {"a": a.returncode, "waiting": waiting.returncode,
                      "refused": refused.returncode}}


def _side_logs(scenario, kind):
    return sorted(scenario["log"].parent.glob(f"make_data.log.*.{kind}"))


def test_the_finished_outputs_log_holds_its_own_run(scenario):
    codes, text = scenario["codes"], scenario["log"].read_text()
    assert codes["a"] == 0, scenario["said"]["a"][-3000:]
    assert codes["waiting"] != 0 and codes["refused"] != 0
    assert (scenario["ws"] / TARGET).is_file()
    # A's lines, whole, and nothing of the jobs that never held the output
    assert text.count('"status": "start"') == 1 and text.count('"status": "ok"') == 1, text
    assert "held until the test lets go" in text and '"counts"' in text
    assert "interrupted" not in text and "being written by another job" not in text, text
    assert "a new job for this output" not in text
    # while A ran, neither second job put its lines under A's log's name
    assert not scenario["during"] or "interrupted" not in scenario["during"]


def test_the_interrupted_waiting_job_wrote_its_own_log(scenario):
    (own,) = _side_logs(scenario, "waiting")
    lines = own.read_text().splitlines()
    assert "waiting: resources/data is being written by another job" in lines[0], lines
    assert lines[-1].startswith("fair-calib make-data: interrupted (Ctrl-C) while waiting"), lines
    failed = [l for l in scenario["said"]["waiting"].splitlines() if l.startswith("Failed: ")]
    assert failed == [f"Failed: make_data: {lines[-1]} [log: {LOG}.{own.name.split('.')[2]}"
                      ".waiting]"], scenario["said"]["waiting"][-3000:]


def test_the_refused_job_wrote_its_own_log_and_the_failed_line_names_it(scenario):
    (own,) = _side_logs(scenario, "refused")
    (line,) = own.read_text().splitlines()
    assert re.match(r"error: fair-calib make-data: resources/data is being written by another "
                    r"job \(fair-calib make-data, pid \d+ on ", line), line
    failed = [l for l in scenario["said"]["refused"].splitlines() if l.startswith("Failed: ")]
    assert failed == [f"Failed: make_data: {line} [log: {LOG}.{own.name.split('.')[2]}"
                      ".refused]"], scenario["said"]["refused"][-3000:]
    assert "see its log" not in scenario["said"]["refused"]


def test_the_first_jobs_log_stays_visible_while_the_others_wait_or_refuse(scenario):
    """Snakemake removed the log's name before each second run's job; the job put the holder's
    log back, so it was there, with A's lines, the whole time A ran (issue 49, item 6)."""
    assert scenario["during"] is not None and "held until the test lets go" in scenario["during"]
