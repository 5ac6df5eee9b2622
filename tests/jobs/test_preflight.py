"""A target inside a model folder (a directory output Snakemake cannot target file by file)
is refused in one line naming the folder to target instead."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fair_calib.jobs.preflight import file_in_model_folder

REPO = Path(__file__).resolve().parents[2]
MODELS = {"tiny-dream": {"source": "train"}, "toy-dream": {"source": "convert"},
          "hub": {"source": "GSAI-ML/LLaDA-8B-Base"}}


@pytest.mark.parametrize("target, folder", [
    ("resources/models/tiny-dream/model.safetensors", "resources/models/tiny-dream"),
    ("./resources/hub/toy-dream/config.json", "resources/hub/toy-dream"),
])
def test_a_file_in_a_model_folder_names_the_folder(target, folder):
    line = file_in_model_folder(["--cores", "1", target], MODELS)
    assert line == (f"target {target} is a file inside the model folder {folder}, which its job "
                    f"writes whole: target the folder (snakemake ... {folder})")


def test_a_folder_of_no_such_model_names_those_there_are():
    line = file_in_model_folder(["resources/models/tiny-drem/model.safetensors"], MODELS)
    assert "no model 'tiny-drem' with source: train" in line and "['tiny-dream']" in line
    assert file_in_model_folder(["resources/models/tiny-dream", "results/tables/main.tex"],
                                MODELS) is None


def test_snakemake_says_it_in_one_line_before_planning():
    res = subprocess.run(["snakemake", "-n", "--cores", "1", "--configfile", "config/smoke.yaml",
                          "--", "resources/models/tiny-dream/model.safetensors"], cwd=REPO,
                         capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "MissingRuleException" not in out, out[-3000:]
    errors = [l for l in out.splitlines() if l.startswith("Error:")]
    assert errors == ["Error: target resources/models/tiny-dream/model.safetensors is a file "
                      "inside the model folder resources/models/tiny-dream, which its job writes "
                      "whole: target the folder (snakemake ... resources/models/tiny-dream)"], out
