"""GPU slots on one machine (fair_calib/jobs/gpu_slots.py), with simulated cards: jobs are
processes, cards are entries of CUDA_VISIBLE_DEVICES, nothing touches a GPU."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


from fair_calib.cli import main as cli
from fair_calib.jobs import gpu_slots

REPO = Path(__file__).resolve().parents[2]
HOLDER = ("import sys; from fair_calib.jobs import gpu_slots; gpu_slots.assign_card(); "
          "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], flush=True); sys.stdin.read()")


def _job(lock_dir: Path, cards: str) -> subprocess.Popen:
    """A process that takes a slot, prints its card and holds it until its stdin closes."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": cards, gpu_slots.LOCK_DIR_ENV: str(lock_dir),
           "PYTHONPATH": str(REPO)}
    env.pop("SLURM_JOB_ID", None)
    env.pop(gpu_slots.SWITCH_ENV, None)
    return subprocess.Popen([sys.executable, "-c", HOLDER], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _card(proc: subprocess.Popen) -> str:
    return proc.stdout.readline().strip()


def test_jobs_at_once_get_different_cards_and_a_killed_holders_card_is_free(tmp_path):
    first, second = _job(tmp_path, "0,1"), _job(tmp_path, "0,1")
    third = None
    try:
        c1, c2 = _card(first), _card(second)
        assert {c1, c2} == {"0", "1"}
        third = _job(tmp_path, "0,1")          # every card taken: it waits, and says so
        line = third.stderr.readline()
        assert "all 2 cards (0,1) are taken" in line and "waiting" in line
        time.sleep(0.5)
        assert third.poll() is None
        os.kill(first.pid, signal.SIGKILL)       # the kernel releases the killed job's lock
        first.wait()
        assert _card(third) == c1
    finally:
        for proc in (first, second, third):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_users_cards_are_the_slots(tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": "GPU-aa, 3", gpu_slots.LOCK_DIR_ENV: str(tmp_path)}
    log = io.StringIO()
    assert gpu_slots.assign_card(env, log) == "GPU-aa"
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-aa" and "CUDA_DEVICE_ORDER" not in env
    assert "card GPU-aa" in log.getvalue() and "slots over GPU-aa,3 from CUDA_VISIBLE_DEVICES" \
        in log.getvalue()
    env2 = {"CUDA_VISIBLE_DEVICES": "GPU-aa,3", gpu_slots.LOCK_DIR_ENV: str(tmp_path)}
    assert gpu_slots.assign_card(env2, io.StringIO()) == "3"    # this process holds GPU-aa
    assert gpu_slots.user_cards({"CUDA_VISIBLE_DEVICES": "0,-1,2"}) == ["0"]
    assert gpu_slots.user_cards({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert gpu_slots.assign_card({"CUDA_VISIBLE_DEVICES": ""}, io.StringIO()) is None


def test_no_slot_under_slurm_or_when_turned_off(tmp_path):
    for extra in ({"SLURM_JOB_ID": "17"}, {gpu_slots.SWITCH_ENV: "0"}):
        env = {"CUDA_VISIBLE_DEVICES": "0,1", gpu_slots.LOCK_DIR_ENV: str(tmp_path), **extra}
        assert gpu_slots.assign_card(env, io.StringIO()) is None
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_machine_cards_in_pci_order(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_slots, "machine_cards", lambda: ["0", "1", "2"])
    env = {gpu_slots.LOCK_DIR_ENV: str(tmp_path)}
    assert gpu_slots.assign_card(env, io.StringIO()) in {"0", "1", "2"}
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_a_cuda_stage_takes_a_slot_before_its_module_loads(tmp_path, monkeypatch):
    taken = []
    monkeypatch.setattr(gpu_slots, "assign_card", lambda: taken.append(True))
    cli._take_gpu_slot(["--settings", json.dumps({"device": "cpu"}), "--out", "x"])
    assert taken == []
    cli._take_gpu_slot(["--settings", json.dumps({"device": "cuda"}), "--out", "x"])
    assert taken == [True]


def test_jobs_per_card_share_a_card_before_any_waits(tmp_path):
    """FAIR_CALIB_GPU_JOBS_PER_CARD=2 over cards 0,1: four jobs get 0, 1, 0, 1 (every card's
    first slot before a second), the fifth has none."""
    env = {"CUDA_VISIBLE_DEVICES": "0,1", gpu_slots.LOCK_DIR_ENV: str(tmp_path),
           gpu_slots.PER_CARD_ENV: "2"}
    folder = gpu_slots.lock_dir(env)
    held_before = len(gpu_slots._HELD)
    try:
        got = [gpu_slots.try_cards(["0", "1"], folder, 2) for _ in range(5)]
        assert got == ["0", "1", "0", "1", None]
        assert sorted(p.name for p in folder.iterdir()) == [
            "card-0.1.lock", "card-0.lock", "card-1.1.lock", "card-1.lock"]
    finally:
        for handle in gpu_slots._HELD[held_before:]:
            handle.close()
        del gpu_slots._HELD[held_before:]
    assert gpu_slots.jobs_per_card(env) == 2
    assert gpu_slots.jobs_per_card({}) == 1
    import pytest

    with pytest.raises(SystemExit, match="FAIR_CALIB_GPU_JOBS_PER_CARD='0'.*gpu_jobs_per_card"):
        gpu_slots.jobs_per_card({gpu_slots.PER_CARD_ENV: "0"})
