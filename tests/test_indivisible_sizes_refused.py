"""A size every job would refuse (a group or block size that does not divide a model's widths) is
refused before any job, by `fair-calib check-config` and by Snakemake, so a settings change never
deletes a finished output whose replacement is bound to fail. (Labels a reader cannot tell apart:
tests/checks/test_label_text.py.)"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fixtures.check_config import check_config, one_error_line

REPO = Path(__file__).resolve().parents[1]
QDLM_TINY = ("config/smoke.yaml", "config/qdlm_tiny.yaml")   # tiny models of widths 64 / 128
# The two cases over the finished QDLM tiny run: each calibrate job refused them
# (`group_size 48 does not divide the 64 input columns`) after Snakemake had deleted the
# finished calibrations.
WIDTH_CASES = [
    ({"methods": {"awq": {"group_size": 48}}}, "methods.awq.group_size = 48"),
    ({"methods": {"duquant": {"block_size": 48}}}, "methods.duquant.block_size = 48"),
]


def _env():
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.mark.parametrize("over, key", WIDTH_CASES, ids=["awq-group_size", "duquant-block_size"])
def test_check_config_refuses_a_size_that_does_not_divide_the_widths(tmp_path, over, key):
    line = one_error_line(check_config(tmp_path, over, QDLM_TINY))
    # the key, the value, the model and the width it does not divide
    assert key in line and "tiny-" in line and "does not divide the 64 input columns" in line, line
    assert "models.tiny-dream.train.hidden" in line and "e.g. 32" in line, line


def test_gptq_takes_a_group_size_that_does_not_divide(tmp_path):
    """GPTQ forms a shorter last group (AutoGPTQ): its job runs, so nothing is refused."""
    res = check_config(tmp_path, {"methods": {"gptq": {"group_size": 48}}}, QDLM_TINY)
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.fixture
def finished_qdlm_tiny(tmp_path):
    """A workspace whose AWQ and DuQuant calibrations (in the smoke config's workdir) are done."""
    import torch
    from safetensors.torch import save_file

    for item in ("Snakefile", "workflow", "config"):
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / item)
    done = []
    for method, bits in (("awq", "w4a16"), ("duquant", "w4a4")):
        for model in ("tiny-llada", "tiny-dream"):
            cell = tmp_path / "runs/smoke/results/calib" / model / method / bits
            cell.mkdir(parents=True)
            (cell / "meta.json").write_text('{"finished": true}')
            save_file({"block.0.w": torch.arange(4.0)}, str(cell / "params.safetensors"))
            done += [cell / "meta.json", cell / "params.safetensors"]
    return tmp_path, done


@pytest.mark.parametrize("over, key", WIDTH_CASES, ids=["awq-group_size", "duquant-block_size"])
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_snakemake_refuses_it_before_deleting_anything(finished_qdlm_tiny, over, key, dry):
    ws, done = finished_qdlm_tiny
    before = {p: p.read_bytes() for p in done}
    (ws / "over.yaml").write_text(yaml.safe_dump(over))
    cmd = ["snakemake", "--cores", "1", *(["-n"] if dry else []),
           "--configfile", *QDLM_TINY, "over.yaml"]
    res = subprocess.run(cmd, cwd=ws, capture_output=True, text=True, env=_env())
    line = one_error_line(res)
    assert key in line and "does not divide" in line, line
    assert {p: p.read_bytes() for p in done if p.exists()} == before      # nothing deleted
    assert not (ws / "runs/smoke/resources").exists()                      # no job ran
