"""Tiny-model training reproduces the recorded weights bit for bit (issue 22).

The recorded sha256 values (tests/recorded_hashes.json) were computed in pinned mode
(fair_calib/jobs/numerics.py), per CPU vendor (an AMD EPYC and an Intel Xeon, both AVX-512); pinned
mode computes the same bits on any x86-64 CPU with AVX2 of one vendor (docs/benchmarks.md: the
kernels forced to those of other CPUs gave the same hashes). Training runs in a fresh process through the CLI, as in the pipeline: pinning must
happen before torch is imported, which pytest has already done here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fair_calib.jobs import numerics
from fair_calib.jobs.io import file_sha256

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / numerics.RECORD
# a few seconds per family; the default's shapes (attention, MLP, stratified masking) in small
TRAIN = {"hidden": 32, "layers": 2, "heads": 2, "intermediate": 64, "steps": 30,
         "batch_size": 16, "lr": 3e-3, "seq_len": 40, "t_power": 1.0, "loss_norm": "elbo"}
CORPUS = {"n_train_docs": 1500, "n_calib": 24, "n_probe": 16, "n_facts": 16, "n_mc": 30,
          "n_gen": 20}


def _cli(args: list[str], **env) -> str:
    res = subprocess.run([sys.executable, "-m", "fair_calib.cli", *args], capture_output=True,
                         text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **env})
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("repro-data")
    _cli(["make-data", "--settings", json.dumps({"seed": 0, "corpus": CORPUS}), "--out", str(out)])
    return out


def _train(family: str, data: Path, out: Path, threads: int = 1, **env) -> str:
    settings = {"seed": 0, "device": "cpu", "dtype": "float32",
                "model": {"name": family, "family": family, "train": TRAIN}}
    _cli(["train-tiny", "--threads", str(threads), "--no-progress", "--settings",
          json.dumps(settings), "--data", str(data), "--out", str(out)], **env)
    return file_sha256(out / "model.safetensors")


@pytest.fixture(scope="module")
def pinned(data, tmp_path_factory) -> dict[str, Path]:
    """Each family trained once in pinned mode with this machine's own CPU (model folders)."""
    out = tmp_path_factory.mktemp("pinned")
    for family in ("tiny-llada", "tiny-dream"):
        _train(family, data, out / family)
    return {f: out / f for f in ("tiny-llada", "tiny-dream")}


def _readme_torch() -> str | None:
    """The torch version the README's install command pins."""
    import re
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    found = re.search(r"pip install torch==([0-9.]+)", readme)
    return found.group(1) if found else None


@pytest.mark.parametrize("family", ["tiny-llada", "tiny-dream"])
def test_tiny_training_reproduces_the_recorded_hash(family, pinned):
    if numerics.environment_key()["machine"] not in numerics.X86:
        pytest.skip("hashes are recorded for x86-64 only (ARM: docs/benchmarks.md)")
    want = numerics.recorded_hashes(RECORD, "test")
    sha = file_sha256(pinned[family] / "model.safetensors")
    if want is None:
        # The environment the README installs must have a record: fail there (CI), skip others.
        message = (f"{RECORD.name} records no hashes for {numerics.environment_key()}; this "
                   f"run's {family}: {sha}")
        if _readme_torch() == torch.__version__.split("+")[0]:
            pytest.fail(message + " (the README's torch: record them)")
        pytest.skip(message)
    meta = json.loads((pinned[family] / "fair_calib.json").read_text())
    assert meta["model_sha256"] == sha          # the provenance carries the weights' hash
    assert meta["provenance"]["numerics"]["ATEN_CPU_CAPABILITY"] == "avx2"
    assert sha == want[family], (
        f"{family}: tiny training no longer reproduces the recorded weights ({sha} != "
        f"{want[family]}); {numerics.mismatch_hint(RECORD)}. If intended, re-record "
        f"{RECORD.name} and the default's hashes (docs/benchmarks.md)")


def test_pinned_training_ignores_the_cpu_kernels_and_threads(data, pinned, tmp_path):
    """What another CPU would run (here AVX-512 kernels; no AVX2 in ATen, MKL capped at AVX2,
    2 threads) gives the same bits in pinned mode; in native mode those kernels differ."""
    if numerics.environment_key()["machine"] not in numerics.X86:
        pytest.skip("pinned mode fixes x86-64 kernels only")
    here = file_sha256(pinned["tiny-llada"] / "model.safetensors")
    other = _train("tiny-llada", data, tmp_path / "b", threads=2, ATEN_CPU_CAPABILITY="default",
                   MKL_ENABLE_INSTRUCTIONS="AVX2")
    assert other == here
    native = _train("tiny-llada", data, tmp_path / "n", FAIR_CALIB_CPU_NUMERICS="native",
                    ATEN_CPU_CAPABILITY="default")
    assert native != here                    # the test can see kernel differences


def test_check_files_names_every_mismatch_and_an_unrecorded_environment(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"weights")
    (tmp_path / "b.tex").write_text("table")
    good = file_sha256(tmp_path / "a.bin")
    record = tmp_path / "record.json"
    env = numerics.environment_key()
    record.write_text(json.dumps({"records": [{"environment": env, "default": {
        "a.bin": good, "b.tex": "0" * 64, "c.tex": good}}]}))
    problems = numerics.check_files(record, "default", tmp_path)
    assert len(problems) == 3
    assert "b.tex: sha256" in problems[0] and "recorded 000" in problems[0]
    assert "c.tex: missing" in problems[1]
    assert "transformers" in problems[2]         # measured with no version of it: named
    record.write_text(json.dumps({"records": [{"environment": {**env, "torch": "0.0"},
                                               "default": {"a.bin": good}}]}))
    [problem] = numerics.check_files(record, "default", tmp_path)
    assert "records no 'default' hashes for this environment" in problem


def test_records_are_keyed_on_what_changes_the_bits_and_a_mismatch_names_the_package(tmp_path):
    """The key holds torch, machine, CPU vendor and numerics mode only: another version of
    transformers finds the record (so a patch release that keeps the bits passes), and where
    the bits then differ the message names the package and the versions that were measured."""
    env = numerics.environment_key()
    assert set(env) == {"torch", "machine", "cpu_vendor", "cpu_numerics"}
    here = numerics.measured_with()
    record = tmp_path / "record.json"
    (tmp_path / "a.bin").write_bytes(b"weights")
    record.write_text(json.dumps({"records": [{
        "environment": env, "measured_with": {**{k: [v] for k, v in here.items()},
                                              "transformers": ["0.0.1", "0.0.2"]},
        "default": {"a.bin": "0" * 64}}]}))
    assert numerics.recorded_hashes(record, "default") == {"a.bin": "0" * 64}
    [moved] = numerics.unmeasured_versions(record)
    assert moved == f"transformers {here['transformers']} (recorded with 0.0.1, 0.0.2)"
    problems = numerics.check_files(record, "default", tmp_path)
    assert problems[-1].endswith(moved)
    record.write_text(json.dumps({"records": [{
        "environment": env, "measured_with": {k: [v] for k, v in here.items()},
        "default": {"a.bin": "0" * 64}}]}))
    assert "the code changed the bits" in numerics.check_files(record, "default", tmp_path)[-1]


def test_the_recorded_environments_name_only_the_key_and_measured_versions():
    """Every record of the shipped file has the key's fields and lists what it was measured
    with, so an unmeasured version can be named."""
    for rec in json.loads(RECORD.read_text())["records"]:
        assert set(rec["environment"]) == {"torch", "machine", "cpu_vendor", "cpu_numerics"}
        assert set(rec["measured_with"]) <= set(numerics.MEASURED_WITH)
        assert rec["measured_with"]["transformers"]


def test_gradients_through_attention_on_a_card_use_deterministic_kernels(monkeypatch):
    """Training and calibration on a card run attention by SDPA's math kernels in pinned mode
    (the memory-efficient backward is nondeterministic: two trainings of one model on one H200
    gave different weights); the other kernels come back afterwards; the CPU is untouched."""
    cuda = torch.backends.cuda
    before = (cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled())
    with numerics.deterministic_attention("cuda"):
        assert (cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(),
                cuda.math_sdp_enabled()) == (False, False, True)
    assert (cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(),
            cuda.math_sdp_enabled()) == before
    with numerics.deterministic_attention("cpu"):
        assert cuda.mem_efficient_sdp_enabled() == before[1]
    monkeypatch.setenv(numerics.MODE_VAR, "native")
    with numerics.deterministic_attention("cuda"):
        assert cuda.mem_efficient_sdp_enabled() == before[1]
