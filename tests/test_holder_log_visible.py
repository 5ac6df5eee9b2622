"""While a second run's job waits for (or refuses) the job writing its output, the first job's
log stays under its name, whole, with its progress lines: the waiting job puts back the name
Snakemake removed before starting it (or the empty file it left)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fair_calib.jobs import job_log

REPO = Path(__file__).resolve().parents[1]
HOLDER = """
import os, sys, time
from fair_calib.jobs import job_lock, job_log
job_lock.hold("make-data", ["--out", sys.argv[2]], log=sys.argv[1])
job_log.open_log(sys.argv[1])
print("[make-data] progress 1", flush=True)
open(sys.argv[3], "w").close()
while not os.path.exists(sys.argv[4]):
    time.sleep(0.05)
print("[make-data] progress 2", flush=True)
"""
WAITER = """
import sys
from fair_calib.jobs import job_lock
job_lock.hold("make-data", ["--out", sys.argv[2]], log=sys.argv[1])
"""


def _env(**extra):
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def _wait_for(path, proc):
    deadline = time.time() + 60
    while not path.exists():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)


@pytest.mark.parametrize("mode, snakemake_left", [("wait", "nothing"), ("refuse", "empty"),
                                                  ("wait", "empty")])
def test_the_holders_log_stays_visible_while_a_second_job_waits_or_refuses(tmp_path, mode,
                                                                           snakemake_left):
    log, out = tmp_path / "logs/make_data.log", tmp_path / "data"
    ready, go = tmp_path / "ready", tmp_path / "go"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(log), str(out), str(ready),
                               str(go)], env=_env())
    try:
        _wait_for(ready, holder)
        log.unlink()                          # a second run's Snakemake preparing its job
        if snakemake_left == "empty":
            log.write_text("")
        second = subprocess.Popen([sys.executable, "-c", WAITER, str(log), str(out)],
                                  env=_env(FAIR_CALIB_LOCK=mode), stderr=subprocess.PIPE,
                                  text=True)
        assert "waiting" in second.stderr.readline() or mode == "refuse"
        deadline = time.time() + 30
        while not (log.exists() and log.stat().st_size) and time.time() < deadline:
            time.sleep(0.05)
        # visible at once, and what the holder writes next lands under the name too
        assert log.read_text() == "[make-data] progress 1\n"
        if mode == "refuse":
            assert second.wait(timeout=60) == 1
            assert log.read_text() == "[make-data] progress 1\n"
    finally:
        go.write_text("")
    assert holder.wait(timeout=60) == 0
    assert log.read_text().startswith("[make-data] progress 1\n[make-data] progress 2\n")
    if mode == "wait":
        assert second.wait(timeout=60) == 0


def test_a_log_with_lines_of_its_own_is_left_alone(tmp_path):
    log = tmp_path / "job.log"
    keep = job_log.keep_name(log, os.getpid())
    keep.write_text("holder\n")
    log.write_text("someone else's\n")
    assert job_log.show_holder_log(log) is False and log.read_text() == "someone else's\n"
    log.unlink()
    assert job_log.show_holder_log(log) is True and os.path.samefile(log, keep)
