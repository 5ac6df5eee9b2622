"""The GPU-hour projection: per-request arithmetic, the paper grid end to end, job counts equal
to Snakemake's plan, the current checkout's config, and the census-based pricing."""
import os
import shutil
import subprocess

import pytest

from fair_calib import cost, plan

SHAPE = dict(docs=10, choices=4, ctx=100, shot=50, target=1)
LLADA = {"estimator": "llada", "mc_num": 128, "batch_size": 8}


def test_mc_and_exact_costs_follow_the_forwards():
    task = {"num_fewshot": 2, "mc_num": 128, "batch_size": 8}
    mc = cost.mc_task_seconds(task, SHAPE, "llada", False, LLADA)
    # 10 docs x 4 choices x 16 forwards of 8 rows x (100 + 2 x 50 + 1) tokens
    assert mc == pytest.approx(10 * 4 * 16 * (cost.FWD_FIXED_S + 8 * 201 * cost.FWD_TOKEN_S))
    exact = cost.mc_task_seconds({**task, "exact_below": 2}, SHAPE, "llada", False, LLADA)
    assert exact == pytest.approx(10 * (cost.FWD_FIXED_S + 201 * cost.FWD_TOKEN_S))  # shared
    guided = cost.mc_task_seconds({**task, "cfg_scale": 0.5}, SHAPE, "llada", True, LLADA,
                                  "fair_calib")
    assert guided == pytest.approx(10 * 4 * 16 * (cost.FWD_FIXED_S + 16 * 201 * cost.FWD_TOKEN_S)
                                   * cost.REAL_QUANT_SCALE["llada"]["transform"])
    # the "before" projection prices W8A8 as fake quantization, as auto ran it then
    assert cost.quant_scale("dream", "w8a8", "fair_calib") == cost.QUANT_SCALE
    assert cost.quant_scale("dream", "w3a4", "rtn") == cost.REAL_QUANT_SCALE["dream"]["plain"]
    assert cost.quant_scale("dream", "w4a4", "quarot") == cost.REAL_QUANT_SCALE["dream"]["hadamard"]
    # a type without a measured structure: the family's slowest
    assert cost.quant_scale("llada", True, "qdrop") == max(cost.REAL_QUANT_SCALE["llada"].values())


def test_paper_grid_projection(repo_root):
    cfg = cost.load_config([repo_root / "config" / "paper.yaml"], repo_root / "config" / "config.yaml")
    res = cost.project(cfg)
    assert set(res["rules"]) == {"probe_shard", "calibrate", "evaluate_shard", "trajectories"}
    assert all(r["gpu_hours"] > 0 and r["jobs"] > 0 for r in res["rules"].values())
    assert res["total_gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in res["rules"].values()),
                                                   abs=0.3)
    assert set(res["evaluate_by_task"]) == set(cfg["tables"]["main"]["tasks"])


# ----------------------------------------------------------------------------- cost is the plan
SEEDS = "methods:\n  fair-calib: {seeds: [0, 1, 2]}\n  flatquant: {seeds: [0, 1, 2]}\n"


def _snakemake_counts(repo_root, tmp_path, configs):
    for item in ("Snakefile", "workflow", "config"):
        src = repo_root / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / item)
    (tmp_path / "seeds.yaml").write_text(SEEDS)
    env = {**os.environ, "PYTHONPATH": str(repo_root)}
    res = subprocess.run(["snakemake", "-n", "--cores", "1", "--configfile", *configs],
                         cwd=tmp_path, capture_output=True, text=True, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    table = out[out.index("Job stats:"):].split("\n\n")[0].splitlines()[3:]
    return {rule: int(n) for rule, n in (line.split() for line in table) if rule != "total"}


@pytest.mark.parametrize("extra", [[], ["seeds.yaml"]], ids=["one-seed", "seeds-on-two-methods"])
def test_job_counts_are_snakemakes_plan(repo_root, tmp_path, extra):
    configs = ["config/paper.yaml", *extra]
    want = _snakemake_counts(repo_root, tmp_path, configs)
    cfg = cost.load_config([tmp_path / c for c in configs], tmp_path / "config" / "config.yaml")
    assert plan.job_counts(cfg) == want
    res = cost.project(cfg)
    assert {r: v["jobs"] for r, v in res["rules"].items()} == {
        r: want.get(r, 0) for r in res["rules"]}


def test_seeds_cost_more_and_shards_count(repo_root, tmp_path):
    paper = repo_root / "config" / "paper.yaml"
    (tmp_path / "seeds.yaml").write_text(SEEDS)
    one = cost.project(cost.load_config([paper], repo_root / "config" / "config.yaml"))
    three = cost.project(cost.load_config([paper, tmp_path / "seeds.yaml"],
                                          repo_root / "config" / "config.yaml"))
    assert three["total_gpu_hours"] > one["total_gpu_hours"]
    assert three["rules"]["calibrate"]["jobs"] > one["rules"]["calibrate"]["jobs"]
    # a task's shards hold under a by_family / by_model override that does not name them
    cfg = cost.load_config([paper], repo_root / "config" / "config.yaml")
    assert plan.task_shards(cfg, "dream-7b-base", "piqa") == 2
    assert plan.task_shards(cfg, "llada-8b-instruct", "gsm8k_cot") == 16


def test_check_config_and_cost_read_the_current_checkout(repo_root, tmp_path, monkeypatch, capsys):
    """A second checkout sharing the environment: its own config/config.yaml is judged."""
    from fair_calib import references

    shutil.copytree(repo_root / "config", tmp_path / "config")
    path = tmp_path / "config" / "config.yaml"
    path.write_text(path.read_text().replace("\nseed: 0", "\nseed: zero", 1))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as err:
        references.run_cli([])
    assert "seed" in str(err.value) and "zero" in str(err.value)
    with pytest.raises(SystemExit) as err:
        cost.run_cli(["--configfile", str(repo_root / "config" / "paper.yaml"), "--no-census"])
    assert "seed" in str(err.value)
    monkeypatch.chdir(tmp_path / "config")               # no config/config.yaml here
    with pytest.raises(SystemExit) as err:
        references.run_cli([])
    assert "config/config.yaml: not found" in str(err.value) and "--base" in str(err.value)


def test_quant_ratios_price_each_request_in_its_mode():
    # generation: the nearest batch-1 decode entry; MC: the nearest forward entry
    assert cost.quant_ratio("llada", "transform", "generate", 1, 1984)[0] == 0.651
    assert cost.quant_ratio("llada", "transform", "generate", 1, 900)[1][:3] == ("decode", 1, 960)
    assert cost.quant_ratio("llada", "transform", "generate", 1, 780)[1][:3] == ("decode", 1, 768)
    assert cost.quant_ratio("llada", "transform", "mc", 16, 192)[0] == 0.632
    assert cost.quant_ratio("llada", "transform", "mc", 32, 100)[1][1:3] == (32, 104)
    assert cost.quant_ratio("dream", "plain", "exact", 8, 600)[1][1:3] == (8, 512)
    assert cost.quant_ratio("dream", "fp", "mc", 32, 128) == (1.0, None)
    assert cost.quant_ratio("dream", "fake", "mc", 32, 128) == (cost.QUANT_SCALE, None)
    # a type without a measured structure: the slowest structure at that shape
    assert cost.quant_ratio("dream", "unmeasured", "generate", 1, 1024)[0] == 0.759
    # the issue-20 entries are REAL_QUANT_SCALE (the old model's constants)
    for (fam, struct), items in cost.QUANT_RATIOS.items():
        assert all(e[3] == cost.REAL_QUANT_SCALE[fam][struct] for e in items if e[4] == "i20")
        assert all(e[4] in cost.RATIO_SOURCES for e in items)
    # census shapes are priced at bf16 replay speed times the ratio; generation steps add the
    # sampler's own work
    sec = cost.census_seconds("llada", "transform", "mc", 16, 128)
    assert sec == pytest.approx(cost.bf16_replay_s(16, 128, "llada", "mc") * 0.632)
    assert cost.bf16_replay_s(1, 1000, "dream", "generate") == pytest.approx(
        (cost.REPLAY_FIXED_S + 1000 * cost.REPLAY_TOKEN_S) * 0.9 + 0.001)

def test_cost_prints_before_and_after(repo_root, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(repo_root)
    cost.run_cli(["--configfile", "config/paper.yaml", "--no-census"])
    out = capsys.readouterr().out
    assert "before (one ratio per structure" in out and "after (census" in out
    assert "not computed (--no-census)" in out
    cost.run_cli(["--configfile", "config/paper.yaml", "--data-dir", str(tmp_path / "none")])
    assert "not computed (census: data folder" in capsys.readouterr().out
