"""The GPU-hour projection: the census priced, job counts equal to Snakemake's plan, the
current checkout's config, one total printed and in the JSON, and every shipped config
costed with no task at 0."""
import json
import os
import shutil
import subprocess
from collections import Counter

import pytest

from fair_calib.budget import census, cost
from fair_calib.checks import plan
from fair_calib.checks.references import load_config


def no_forwards(cfg) -> census.Census:
    """A census of the plan's evaluations that run no forward (for the other rules)."""
    return census.Census([], {cell: Counter() for cell in plan.eval_cells(cfg)}, {}, {}, {})


def test_evaluation_is_the_census_priced(repo_root):
    cfg = load_config([repo_root / "config" / "paper.yaml"], repo_root / "config" / "config.yaml")
    cells = list(plan.eval_cells(cfg))
    fp = next(c for c in cells if c[0] == "llada-8b-base" and c[1] == "fp" and c[3] == "piqa")
    rtn = next(c for c in cells if c[0] == "dream-7b-base" and c[1] == "rtn" and c[3] == "mmlu")
    cen = no_forwards(cfg)
    cen.cells[fp] = Counter({("mc", 16, 100): 10, ("generate", 1, 600): 3})
    cen.cells[rtn] = Counter({("exact", 32, 700): 5})
    res = cost.project(cfg, cen)
    sec_fp = 10 * cost.census_seconds("llada", "fp", "mc", 16, 100) + \
        3 * cost.census_seconds("llada", "fp", "generate", 1, 600)
    sec_rtn = 5 * cost.census_seconds("dream", "plain", "exact", 32, 700)
    assert sec_fp == pytest.approx(10 * cost.bf16_replay_s(16, 100, "llada", "mc")
                                   + 3 * cost.bf16_replay_s(1, 600, "llada", "generate"))
    assert res["evaluate_by_task"]["piqa"] == cost.hours(sec_fp) > 0
    starts = sum(plan.task_shards(cfg, m, t) for m, _, _, t in cells) * cost.JOB_OVERHEAD_S
    assert res["job_starts_gpu_hours"] == round(starts / 3600, 1)
    assert res["rules"]["evaluate_shard"]["gpu_hours"] == round((sec_fp + sec_rtn + starts) / 3600, 1)
    assert res["evaluate_by_class"]["exact plain"] == cost.hours(sec_rtn)
    assert res["rules"]["evaluate_shard"]["longest_job_hours"] == round(
        (sec_fp / plan.task_shards(cfg, "llada-8b-base", "piqa") + cost.JOB_OVERHEAD_S) / 3600, 1)
    assert res["total_gpu_hours"] == pytest.approx(
        sum(r["gpu_hours"] for r in res["rules"].values()), abs=0.3)


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
    cfg = load_config([tmp_path / c for c in configs], tmp_path / "config" / "config.yaml")
    assert plan.job_counts(cfg) == want
    res = cost.project(cfg, no_forwards(cfg))
    assert {r: v["jobs"] for r, v in res["rules"].items()} == {
        r: want.get(r, 0) for r in res["rules"]}


def test_seeds_cost_more_and_shards_count(repo_root, tmp_path):
    paper = repo_root / "config" / "paper.yaml"
    (tmp_path / "seeds.yaml").write_text(SEEDS)
    one_cfg = load_config([paper], repo_root / "config" / "config.yaml")
    three_cfg = load_config([paper, tmp_path / "seeds.yaml"], repo_root / "config" / "config.yaml")
    one = cost.project(one_cfg, no_forwards(one_cfg))
    three = cost.project(three_cfg, no_forwards(three_cfg))
    assert three["total_gpu_hours"] > one["total_gpu_hours"]
    assert three["rules"]["calibrate"]["jobs"] > one["rules"]["calibrate"]["jobs"]
    # a task's shards hold under a by_family / by_model override that does not name them
    cfg = load_config([paper], repo_root / "config" / "config.yaml")
    assert plan.task_shards(cfg, "dream-7b-base", "piqa") == 2
    assert plan.task_shards(cfg, "llada-8b-instruct", "gsm8k_cot") == 16


def test_check_config_and_cost_read_the_current_checkout(repo_root, tmp_path, monkeypatch, capsys):
    """A second checkout sharing the environment: its own config/config.yaml is judged."""
    from fair_calib.checks import references

    shutil.copytree(repo_root / "config", tmp_path / "config")
    path = tmp_path / "config" / "config.yaml"
    path.write_text(path.read_text().replace("\nseed: 0", "\nseed: zero", 1))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as err:
        references.run_cli([])
    assert "seed" in str(err.value) and "zero" in str(err.value)
    with pytest.raises(SystemExit) as err:
        cost.run_cli(["--configfile", str(repo_root / "config" / "paper.yaml")])
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

def test_cost_prints_one_total_its_json_total(repo_root, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(repo_root)
    cost.run_cli(["--configfile", "config/smoke.yaml"])
    out = capsys.readouterr().out
    totals = [line for line in out.splitlines() if "total" in line.lower()]
    assert len(totals) == 1 and "before" not in out and "after" not in out
    cost.run_cli(["--configfile", "config/smoke.yaml", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert totals[0] == f"| **total** | | **{res['total_gpu_hours']}** |"
    assert all(h > 0 for h in res["evaluate_by_task"].values())
    with pytest.raises(SystemExit, match="data folder"):
        cost.run_cli(["--configfile", "config/paper.yaml", "--data-dir", str(tmp_path / "none")])


# Every shipped config (merged over config/config.yaml as its header says), with every lm-eval
# task cut to its first documents (the whole grid's census takes minutes: `fair-calib cost`).
SHIPPED = {"config": [], "smoke": ["smoke.yaml"], "hub_layout": ["smoke.yaml", "hub_layout.yaml"],
           "paper": ["paper.yaml"], "qdlm": ["qdlm.yaml"],
           "qdlm_tiny": ["smoke.yaml", "qdlm_tiny.yaml"], "gpu_dag": ["gpu_dag.yaml"],
           "gpu_dag_cpu": ["gpu_dag.yaml", "gpu_dag_cpu.yaml"],
           "gpu_trained": ["gpu_trained.yaml"],
           "gpu_trained_cpu": ["gpu_trained.yaml", "gpu_trained_cpu.yaml"],
           "bench": ["bench.yaml"], "bench_screen": ["bench.yaml", "bench_screen.yaml"],
           "bench_gpu": ["bench.yaml", "bench_gpu.yaml"]}
FIRST_DOCS = 2
# config/qdlm.yaml's tasks whose copies the shared data lacks (tests/test_offline_mbpp_math.py
# costs them over toy copies)
NO_OFFLINE_COPY = ("mbpp", "minerva_math")


def test_the_shipped_configs_are_all_listed(repo_root):
    named = {f for files in SHIPPED.values() for f in files} | {"config.yaml"}
    assert named == {p.name for p in (repo_root / "config").glob("*.yaml")}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_config_is_costed(name, repo_root, shared_data_dir, capsys):
    cfg = load_config([repo_root / "config" / f for f in SHIPPED[name]],
                      repo_root / "config" / "config.yaml")
    for entry in cfg["tasks"].values():
        if entry.get("kind", "lm_eval") == "lm_eval":
            entry["limit"] = FIRST_DOCS
    if name == "qdlm":      # refused by name before anything runs; the other tasks costed
        with pytest.raises(census.CensusError) as err:
            census.census(cfg, shared_data_dir)
        assert [t for t in NO_OFFLINE_COPY if f"{t} ({t}): its offline copy" in str(err.value)] == \
            list(NO_OFFLINE_COPY), err.value
        for table in cfg["tables"].values():
            table["tasks"] = [t for t in table.get("tasks", []) if t not in NO_OFFLINE_COPY]
    cen = census.census(cfg, shared_data_dir)
    res = cost.project(cfg, cen)
    tasks = {t for _, _, _, t in plan.eval_cells(cfg)}
    assert set(res["evaluate_by_task"]) == tasks
    for (model, run, bits, task), fwd in cen.cells.items():          # no evaluation at 0
        family, struct = cfg["models"][model]["family"], census.structure(cfg, run, bits)
        assert sum(n * cost.census_seconds(family, struct, *shape)
                   for shape, n in fwd.items()) > 0, (model, run, bits, task)
    assert res["total_gpu_hours"] == pytest.approx(
        sum(r["gpu_hours"] for r in res["rules"].values()), abs=0.3)
    cost.print_projection(res)
    assert f"**{res['total_gpu_hours']}**" in capsys.readouterr().out
