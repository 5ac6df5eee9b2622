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


# ----------------------------------------------------------------------------- issue 23
class _Resources(dict):
    """A job's resources as the executor plugin reads them (attribute and .get access)."""
    __getattr__ = dict.__getitem__


class _Job:
    def __init__(self, resources, threads=1):
        self.resources = _Resources(resources)
        self.threads = threads
        self.name = "calibrate"
        self.is_group = lambda: False


def sbatch(table, rule, attempt):
    """The sbatch line the SLURM executor plugin writes for ``rule`` at ``attempt``."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    from fair_calib.jobs.job_resources import at_attempt, rule_resources

    job = _Job(at_attempt(rule_resources(table, rule), attempt))
    params = {"run_uuid": "u", "slurm_logfile": "log", "comment_str": "c", "account": "",
              "partition": "", "workdir": ""}
    return get_submit_command(job, params) + set_gres_string(job)


PAPER_LIKE = {"default": {"mem_mb": 4000, "runtime": 30},
              "calibrate": {"gpu": 1, "cpus_per_gpu": 8, "mem_mb": 96000,
                            "mem_mb_per_attempt": 32000, "runtime": 240,
                            "gpu_model": ["a100", "h100"]},
              "evaluate_shard": {"gpu": 1, "constraint": ["gpu40g", "gpu80g"], "runtime": 360},
              "probe_shard": {"gres": ["gpu:a100:1", "gpu:a100_80g:1"]},
              "trajectories": {"gpu": 1, "slurm_extra": ["--gpus-per-task=1",
                                                         "--gpus-per-task=1 --exclusive"]}}


def test_gpu_type_per_rule_and_retries_move_to_a_bigger_gpu():
    """Issue 23: GPU requests named no type or memory and retries raised only host RAM."""
    first, second, third = (sbatch(PAPER_LIKE, "calibrate", a) for a in (1, 2, 3))
    assert "--gpus=a100:1" in first and "--mem 96000" in first and "-t 240" in first
    assert "--cpus-per-gpu=8" in first.replace("--cpus-per-gpu ", "--cpus-per-gpu=")
    assert "--gpus=h100:1" in second and "--mem 128000" in second
    assert "--gpus=h100:1" in third and "--mem 160000" in third       # the last one repeats
    assert "-C gpu40g" in sbatch(PAPER_LIKE, "evaluate_shard", 1)
    assert "-C gpu80g" in sbatch(PAPER_LIKE, "evaluate_shard", 2)
    assert "--gres=gpu:a100:1" in sbatch(PAPER_LIKE, "probe_shard", 1)
    assert "--gres=gpu:a100_80g:1" in sbatch(PAPER_LIKE, "probe_shard", 2)
    assert sbatch(PAPER_LIKE, "trajectories", 2).endswith("--gpus-per-task=1 --exclusive --gpus=1")
    # a CPU rule: no GPU option, the default's memory
    cpu = sbatch(PAPER_LIKE, "figures", 3)
    assert "--gpus" not in cpu and "--gres" not in cpu and "--mem 4000" in cpu


def test_per_attempt_lists_pass_the_config_schema():
    from fair_calib.checks.config import validate_config

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["resources"] = PAPER_LIKE
    validate_config(cfg, str(REPO / "workflow/schemas/config.schema.yaml"))
    cfg["resources"] = {"calibrate": {"gpu_model": []}}
    with pytest.raises(Exception, match="gpu_model"):
        validate_config(cfg, str(REPO / "workflow/schemas/config.schema.yaml"))


def test_workflow_dry_run_resolves_per_attempt_resources(tmp_path):
    """The real workflow plans with a per-attempt list (attempt 1 shown in the dry run)."""
    extra = tmp_path / "res.yaml"
    extra.write_text(yaml.safe_dump({"resources": {"default": {"mem_mb": 2000},
                                                   "figures": {"gpu": 1, "gpu_model": ["a100", "h100"],
                                                               "constraint": ["gpu40g", "gpu80g"]}}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIR_CALIB_SLURM_")}
    out = subprocess.run([SNAKEMAKE, "-n", "--forceall", "--cores", "1", "--configfile", str(extra),
                          "--", "figures"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    block = text[text.index("rule diagnostic_figures:"):]
    assert "gpu_model=a100" in block and "constraint=gpu40g" in block, block[:1500]
