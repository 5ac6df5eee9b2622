"""Configs never overwrite each other's work (issue 32): a config with its own `workdir`
(smoke.yaml: runs/smoke) writes its resources/, results/ and logs/ there, never over the
embedded default's, whose paths stay where they were."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from fair_calib.checks import config as C

REPO = Path(__file__).resolve().parents[1]


def test_relative_paths_keep_naming_the_same_place(tmp_path):
    (tmp_path / "models/mine").mkdir(parents=True)
    cfg = {"data_dir": "../shared/data", "synthetic_dir": "resources/data",
           "models": {"a": {"source": "./models/mine"}, "b": {"source": "GSAI-ML/LLaDA-8B-Base"},
                      "c": {"source": "train"}, "d": {"source": "/abs/folder"}}}
    C.rebase_relative_paths(cfg, "runs/smoke", start=str(tmp_path))
    assert cfg["data_dir"] == "../../../shared/data"
    assert os.path.normpath(tmp_path / "runs/smoke" / cfg["data_dir"]) == os.path.normpath(
        tmp_path / "../shared/data")
    assert cfg["synthetic_dir"] == "resources/data"            # the config's own corpus
    assert cfg["models"]["a"]["source"] == "../../models/mine"
    assert [cfg["models"][k]["source"] for k in "bcd"] == ["GSAI-ML/LLaDA-8B-Base", "train",
                                                           "/abs/folder"]


def test_shipped_configs_name_their_own_folders():
    assert C.load_yaml(REPO / "config/smoke.yaml")["workdir"] == "runs/smoke"
    assert C.load_yaml(REPO / "config/hub_layout.yaml")["workdir"] == "runs/hub_layout"
    assert "workdir" not in C.load_yaml(REPO / "config/config.yaml")


def test_smoke_next_to_the_default_writes_nothing_over_it(tmp_path):
    """The issue's case: `--configfile config/smoke.yaml` where the default has run. Here its
    first job (make_data) runs for real; the default's files (stand-ins, at the default's
    paths) are left as they were, and smoke's land under runs/smoke/."""
    for item in ("Snakefile", "workflow", "config"):
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / item)
    default = {p: f"the default's {p}\n" for p in ("resources/data/manifest.json",
                                                    "resources/models/tiny-llada/config.json",
                                                    "results/tables/main.tex")}
    for rel, text in default.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    plan = subprocess.run(["snakemake", "-n", "--cores", "1", "--configfile", "config/smoke.yaml"],
                          cwd=tmp_path, capture_output=True, text=True, env=env)
    assert plan.returncode == 0, (plan.stdout + plan.stderr)[-3000:]
    assert "train_tiny" in plan.stdout          # smoke's own models: a job of its own
    run = subprocess.run(["snakemake", "--cores", "1", "--configfile", "config/smoke.yaml", "--",
                          "resources/data/manifest.json"], cwd=tmp_path, capture_output=True,
                         text=True, env=env)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    for rel, text in default.items():
        assert (tmp_path / rel).read_text() == text, rel
    assert (tmp_path / "runs/smoke/resources/data/manifest.json").is_file()
    assert (tmp_path / "runs/smoke/logs/make_data/make_data.log").is_file()
    assert not (tmp_path / "logs").exists()
