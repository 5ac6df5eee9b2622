"""The execution profiles load and mean what docs/cluster.md says (no cluster needed)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "profiles"
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

TOY = """
rule all:
    input: "b.txt"
rule a:
    output: "a.txt"
    resources: mem_mb=lambda wc, attempt: 1000 * attempt
    shell: "echo a > {output}"
rule b:
    input: "a.txt"
    output: "b.txt"
    shell: "cat {input} > {output}"
"""


def load(name):
    return yaml.safe_load((PROFILES / name / "profile.yaml").read_text())


def dry_run(tmp_path, profile, env_extra=None, *args):
    (tmp_path / "Snakefile").write_text(TOY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIR_CALIB_SLURM_")}
    env.update(env_extra or {})
    out = subprocess.run([SNAKEMAKE, "-n", "--profile", str(PROFILES / profile), *args],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


@pytest.mark.parametrize("name", ["slurm", "local"])
def test_no_scalar_names_a_path_in_the_profile_folder(name):
    # Snakemake rewrites such a value to the path inside the profile folder.
    for key, value in load(name).items():
        if not isinstance(value, (dict, list)) and value is not None:
            assert not (PROFILES / name / str(value)).exists(), (key, value)


def test_slurm_profile_contents():
    p = load("slurm")
    assert p["executor"] == "slurm"
    assert p["retries"] >= 1 and p["rerun-incomplete"] is True
    for key in ("jobs", "latency-wait", "slurm-logdir", "default-resources"):
        assert key in p, key
    assert {"mem_mb", "runtime", "slurm_partition"} <= set(p["default-resources"])
    # the executor plugin accepts every slurm-* key of the profile
    from snakemake_executor_plugin_slurm import ExecutorSettings

    fields = set(ExecutorSettings.__dataclass_fields__)
    for key in p:
        if key.startswith("slurm-"):
            assert key[len("slurm-"):].replace("-", "_") in fields, key


def test_local_profile_contents():
    p = load("local")
    assert "executor" not in p
    assert p["rerun-incomplete"] is True and p["keep-going"] is False
    assert p["resources"]["gpu"] >= 1


def test_slurm_profile_dry_run_partition_from_env(tmp_path):
    out = dry_run(tmp_path, "slurm", {"FAIR_CALIB_SLURM_PARTITION": "gpu-test"})
    assert "Using profile" in out
    assert re.search(r"slurm_partition=gpu-test\b", out), out[-2000:]
    assert "mem_mb=1000" in out  # the rule's callable (attempt 1) wins over the default


def test_slurm_profile_dry_run_default_partition_is_empty(tmp_path):
    out = dry_run(tmp_path, "slurm")
    # empty: the plugin then submits without -p and SLURM uses its default partition
    assert re.search(r"slurm_partition=(,|\s|$)", out), out[-2000:]
    assert "slurm_account=" in out


def test_local_profile_dry_run(tmp_path):
    out = dry_run(tmp_path, "local")
    assert "Using profile" in out and "rule a:" in out.replace("localrule", "rule")
