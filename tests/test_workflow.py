"""The Snakemake workflow: config validation before any job, and a whole tiny DAG run."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fair_calib.names import registry


def _workspace(repo: Path, tmp: Path) -> Path:
    for item in ("Snakefile", "workflow", "config"):
        src = repo / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp / item)
    return tmp


def _plan(ws: Path, overrides: dict | None = None, target="results/tables/main.tex"):
    cmd = ["snakemake", target, "-n", "--cores", "1"]
    if overrides is not None:
        (ws / "override.yaml").write_text(yaml.safe_dump(overrides))
        cmd += ["--configfile", "override.yaml"]
    res = subprocess.run(cmd, cwd=ws, capture_output=True, text=True)
    res.stderr = res.stdout + res.stderr  # snakemake reports config errors on stdout
    return res


@pytest.fixture
def ws(repo_root, tmp_path):
    return _workspace(repo_root, tmp_path)


def test_default_config_plans(ws):
    res = _plan(ws)
    assert res.returncode == 0, res.stderr
    for rule in ("train_tiny", "probe_shard", "prior", "calibrate", "evaluate_shard", "table"):
        assert rule in res.stdout


@pytest.mark.parametrize("overrides, key, valid", [
    ({"tables": {"main": {"models": ["tiny-lada"]}}}, "tables.main.models", "tiny-llada"),
    ({"tables": {"main": {"methods": ["fp", "gptq"]}}}, "tables.main.methods", "flatquant"),
    ({"tables": {"main": {"tasks": ["piqa"]}}}, "tables.main.tasks", "synth_mc"),
    ({"tables": {"main": {"bits": "w5a5"}}}, "tables.main.bits", "w4a4"),
    ({"methods": {"mine": {"type": "omniquant"}}}, "methods.mine.type", "fair_calib"),
    ({"models": {"tiny-llada": {"family": "gpt2"}}}, "models.tiny-llada.family", "tiny-dream"),
    ({"methods": {"fair-calib": {"prior": "nope"}}}, "methods.fair-calib.prior", "default"),
    ({"prior_ablation": {"floors": ["fair-calib-flor1"]}}, "prior_ablation.floors", "fair-calib-floor1"),
    ({"prior_ablation": {"floors": ["flatquant"]}}, "prior_ablation.floors", "weighting: prior"),
    ({"prior_ablation": {"task": "recall"}}, "prior_ablation.task", "synth_gen"),
])
def test_bad_names_fail_before_any_job(ws, overrides, key, valid):
    res = _plan(ws, overrides)
    assert res.returncode != 0
    assert key in res.stderr and valid in res.stderr, res.stderr[-2000:]


def test_calibration_seeds_plan_one_run_per_seed(ws):
    """`seeds` on a method: one calibration and one evaluation per seed (the table averages
    them); the seed reaches the calibration job's settings; other methods are unchanged."""
    res = _plan(ws, {"methods": {"flatquant-seeds": {"seeds": [3, 4]}}})
    assert res.returncode == 0, res.stderr
    shown = subprocess.run(["snakemake", "results/calib/tiny-llada/flatquant-seeds@s4/w2a4/meta.json",
                            "-n", "-p", "--cores", "1", "--configfile", "override.yaml"],
                           cwd=ws, capture_output=True, text=True).stdout
    assert '"seed": 4' in shown
    for k in (3, 4):
        assert f"results/calib/tiny-llada/flatquant-seeds@s{k}/w2a4/meta.json" in res.stdout
        assert f"results/eval/tiny-dream/flatquant-seeds@s{k}/w2a4/synth_gen.parquet" in res.stdout
    assert "results/eval/tiny-llada/flatquant-seeds@s0/w2a4/synth_gen.parquet" not in res.stdout
    for k in (0, 1, 2):  # the default's three seeds of the main table's FAIR-Calib
        assert f"results/eval/tiny-llada/fair-calib-seeds@s{k}/w2a4/synth_gen.parquet" in res.stdout
    bad = _plan(ws, {"methods": {"flatquant-seeds": {"seeds": [1, 1]}}})
    assert bad.returncode != 0 and "seeds" in bad.stderr
    # the seeds list is not part of a run's settings: adding a seed leaves the others cached
    assert '"seeds"' not in shown


def test_dllm_calibration_baselines_plan_by_path_outside_the_main_table(ws):
    """Issue 48: tmas-seeds and mcs-seeds plan one calibration + evaluation per seed when asked
    for by path, with their type reaching the job; the main table does not list them."""
    targets = ["results/eval/tiny-llada/tmas-seeds@s0/w2a4/synth_gen.parquet",
               "results/eval/tiny-dream/mcs-seeds@s2/w2a4/synth_mc.parquet"]
    res = subprocess.run(["snakemake", "-n", "-p", "--cores", "1", *targets], cwd=ws,
                         capture_output=True, text=True)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert '"type": "tmas"' in res.stdout and '"type": "mcs"' in res.stdout
    assert "results/calib/tiny-dream/mcs-seeds@s2/w2a4/meta.json" in res.stdout
    main = _plan(ws)
    assert main.returncode == 0 and "tmas" not in main.stdout and "mcs-seeds" not in main.stdout


def test_wrong_type_names_the_key(ws):
    res = _plan(ws, {"probes": {"default": {"n_samples": "many"}}})
    assert res.returncode != 0
    assert "n_samples" in res.stderr and "'many' is not of type 'integer'" in res.stderr


def test_missing_data_dir_names_path_and_remedy(ws):
    res = _plan(ws, {"data_dir": "/nonexistent/data", "calibration": {"dataset": "wikitext2"}})
    assert res.returncode != 0
    assert "/nonexistent/data" in res.stderr and "docs/data.md" in res.stderr


def test_registry_names_match_the_code():
    from fair_calib.decoding import policies
    from fair_calib.methods import REGISTRY
    from fair_calib.models.adapters import ADAPTERS

    assert set(registry.FAMILIES) == set(ADAPTERS)
    assert set(registry.METHOD_TYPES) == set(REGISTRY)
    assert set(registry.POLICIES) <= set(policies.POLICIES)


def test_paper_config_plans_the_full_grid(ws):
    res = subprocess.run(["snakemake", "-n", "--cores", "1", "--configfile", "config/paper.yaml"],
                         cwd=ws, capture_output=True, text=True)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    # 5 models x (4 quantized methods + FP) + ablations + W3A4 + QDrop; no tiny-model jobs.
    assert "train_tiny" not in out and "make_data" not in out
    for table in ("main", "components", "nprobe", "schedule", "w3a4", "qdrop", "calib_memory",
                  "deploy_memory", "dllm_calibration"):
        assert f"results/tables/{table}.tex" in out
    # the optional rows (issue 48): DLLMQuant's TMAS and Quant-dLLM's MCS on Dream-Base
    for method in ("tmas", "mcs"):
        assert f"results/calib/dream-7b-base/{method}/w4a4/meta.json" in out
    assert "resources: tmpdir=/tmp, runtime=240, gpu=1" in out      # calibrate asks for a GPU


def test_qdlm_config_plans_its_grid_in_one_table(ws):
    """config/qdlm.yaml: QDLM's weight-only GPTQ and AWQ (W4A16, W3A16), SmoothQuant and QuaRot
    at W8A8, DuQuant at W8A8 and W4A4, next to QuaRot / FlatQuant / FAIR-Calib at W4A4, on LLaDA and Dream, Base and
    Instruct, all rows of one main table (``method_bits``)."""
    res = subprocess.run(["snakemake", "-n", "--cores", "1", "results/tables/main.tex",
                          "--configfile", "config/qdlm.yaml"], cwd=ws, capture_output=True, text=True)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "train_tiny" not in out
    for model in ("llada-8b-base", "llada-8b-instruct", "dream-7b-base", "dream-7b-instruct"):
        for cell in ("gptq-w4/w4a16", "gptq-w3/w3a16", "awq-w4/w4a16", "awq-w3/w3a16",
                     "smoothquant/w8a8", "quarot-w8a8/w8a8", "duquant-w8a8/w8a8", "duquant/w4a4",
                     "quarot/w4a4", "flatquant/w4a4",
                     "fair-calib/w4a4"):
            assert f"results/calib/{model}/{cell}/meta.json" in out, (model, cell)


@pytest.mark.parametrize("over, message", [
    ({"tables": {"main": {"method_bits": {"rtn": "w4a16"}}}}, "tables.main.method_bits = 'rtn'"),
    ({"tables": {"main": {"method_bits": {"gptq-w4": "w5a16"}}}}, "tables.main.method_bits.gptq-w4"),
    ({"tables": {"main": {"method_bits": {"gptq-w4": "w4a4"}}}}, "gptq-w4 (type gptq) is weight-only"),
])
def test_method_bits_are_checked_before_any_job(over, message):
    """A row's bits must be defined and belong to the table's methods; a weight-only method
    (gptq, awq) is refused at quantized activations, naming the key."""
    from fair_calib.checks import config as C
    from fair_calib.checks.references import check_config

    def merge(a, b):
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out
    root = Path(__file__).resolve().parents[1]
    cfg = merge(C.load_yaml(root / "config/config.yaml"), C.load_yaml(root / "config/qdlm.yaml"))
    check_config(cfg)
    with pytest.raises(C.ConfigError, match=re.escape(message)):
        check_config(merge(cfg, over))


def test_gpu_model_and_node_features_reach_the_jobs(ws):
    """SLURM resource names in the config's resource table are passed to the rule's jobs."""
    (ws / "override.yaml").write_text(yaml.safe_dump({"resources": {"calibrate": {
        "gpu": 1, "gpu_model": "h100", "constraint": "hopper", "qos": "high", "runtime": 240}}}))
    res = subprocess.run(["snakemake", "-n", "--cores", "1", "--configfile", "config/paper.yaml",
                          "override.yaml"], cwd=ws, capture_output=True, text=True)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    line = next(l for l in out.splitlines() if "gpu_model=h100" in l)
    assert "constraint=hopper" in line and "qos=high" in line and "gpu=1" in line
    bad = _plan(ws, {"resources": {"calibrate": {"gpu_type": "h100"}}})
    assert bad.returncode != 0 and "gpu_type" in bad.stderr


@pytest.mark.slow
@pytest.mark.first
def test_whole_dag_on_checkpoints_in_the_released_layouts_then_rerun_scope(ws):
    """The smoke config merged with config/hub_layout.yaml, end to end (rule all): tiny models
    trained, written in the LLaDA / Dream hub layouts (config field names, key names), and read
    through the native hub loader by every stage (probe, prior, calibration for every method
    type, evaluation, export, trajectories, diagnostics, tables, figures). Then a no-op rerun
    plans nothing, and changing one method's settings reruns that method's jobs only."""
    import json
    (ws / "fast.yaml").write_text(yaml.safe_dump({"methods": {"qdrop": {"epochs": 1}}}))
    configs = ["--configfile", "config/smoke.yaml", "config/hub_layout.yaml", "fast.yaml"]
    run = subprocess.run(["snakemake", "--cores", "2"] + configs, cwd=ws, capture_output=True,
                         text=True)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    out = ws / HUB_RUN              # hub_layout.yaml's own folder (config key workdir)
    assert not (ws / "results").exists() and not (ws / "resources").exists()
    llada = out / "resources/hub/toy-llada"
    cfg = json.loads((llada / "config.json").read_text())
    assert cfg["model_type"] == "llada" and cfg["block_type"] == "llama" and "d_model" in cfg
    keys = json.loads((llada / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.transformer.ff_out.weight" in keys and "model.transformer.blocks.0.ff_out.weight" in keys
    dream = json.loads((out / "resources/hub/toy-dream/config.json").read_text())
    assert dream["model_type"] == "Dream"
    tex = (out / "results/tables/main.tex").read_text()
    assert "\\toprule" in tex
    for label in ("LLaDA layout (toy)", "Dream layout (toy)", "RTN", "QuaRot", "FlatQuant",
                  "QDrop", "FAIR-Calib"):
        assert label in tex, label
    for table in ("calib_memory", "deploy_memory"):
        assert (out / f"results/tables/{table}.tex").is_file(), table
    assert list((out / "results/figures").glob("*toy-dream*.png"))
    again = subprocess.run(["snakemake", "-n", "--cores", "2"] + configs, cwd=ws,
                           capture_output=True, text=True)
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr
    # Changing one method's settings reruns that method's jobs and what depends on them only.
    (ws / "bump.yaml").write_text(yaml.safe_dump({"methods": {"flatquant": {"lr": 1.0e-3}}}))
    plan = subprocess.run(["snakemake", "-n", "--cores", "2"] + configs + ["bump.yaml"],
                          cwd=ws, capture_output=True, text=True)
    assert plan.returncode == 0, plan.stderr
    planned = plan.stdout
    assert "calibrate" in planned
    for rule in ("train_tiny", "convert_hub", "probe_shard"):
        assert f"rule {rule}:" not in planned, rule
    outputs = "".join(l for l in planned.splitlines() if l.strip().startswith("output:"))
    assert "fair-calib" not in outputs and "flatquant" in outputs
    _display_and_environment_edits_rerun_nothing_expensive(ws, configs)
    _deleted_intermediate_is_rebuilt_as_documented(ws, configs)


HUB_RUN = "runs/hub_layout"     # config/hub_layout.yaml's workdir


def _planned_rules(ws, configs, *extra, targets=()):
    import re
    res = subprocess.run(["snakemake", "-n", "--cores", "2", *targets] + configs + list(extra),
                         cwd=ws, capture_output=True, text=True)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    jobs = set(re.findall(r"^(?:local)?rule (\w+):", res.stdout, re.M)) - {"all"}  # a target only
    return jobs, res.stdout + res.stderr


def _display_and_environment_edits_rerun_nothing_expensive(ws, configs):
    """Issue 23 on the finished DAG: a label, group or caption edit re-renders the tables and
    figures only; an environment edit (device, data_dir, data_source) plans nothing; a model's
    decoding override (diagnostics only) reruns its trajectories, never its training."""
    (ws / "labels.yaml").write_text(yaml.safe_dump({
        "models": {"toy-llada": {"label": "LLaDA (renamed)", "group": "renamed"}},
        "methods": {"fair-calib": {"label": "Ours"}},
        "tasks": {"synth_mc": {"label": "MC"}},
        "tables": {"main": {"caption": "Renamed."}}}))
    rules, _ = _planned_rules(ws, configs, "labels.yaml")
    assert rules and rules <= {"table", "diagnostic_figures", "floor_sweep"}, rules
    (ws / "env.yaml").write_text(yaml.safe_dump({"device": "cuda", "data_dir": "/elsewhere",
                                                 "data_source": "hub"}))
    rules, out = _planned_rules(ws, configs, "env.yaml")
    assert not rules and "Nothing to be done" in out, out[-3000:]
    import torch
    if not torch.cuda.is_available():   # a real run is refused before any output is deleted
        model = ws / HUB_RUN / "resources/models/tiny-llada/model.safetensors"
        before = model.stat().st_mtime_ns
        run = subprocess.run(["snakemake", "--cores", "2", "--forceall"] + configs + ["env.yaml"],
                             cwd=ws, capture_output=True, text=True)
        assert run.returncode != 0 and "device = 'cuda'" in run.stdout + run.stderr
        assert model.stat().st_mtime_ns == before
    (ws / "decoding.yaml").write_text(yaml.safe_dump({"models": {"toy-dream": {"decoding": {
        "steps": 16, "gen_length": 16, "temperature": 0.5}}}}))
    rules, out = _planned_rules(ws, configs, "decoding.yaml")
    assert rules == {"trajectories", "diagnose", "diagnostic_figures"}, rules
    assert "results/traj/toy-dream/" in out and "results/traj/toy-llada/" not in out


def _deleted_intermediate_is_rebuilt_as_documented(ws, configs):
    """results/README.md: deleting an intermediate reruns nothing while what depends on it is
    up to date; naming it with the final target rebuilds it and what depends on it."""
    evaluation = "results/eval/toy-llada/rtn/w4a4/synth_gen.parquet"
    (ws / HUB_RUN / evaluation).unlink()
    rules, out = _planned_rules(ws, configs, targets=["results/tables/main.tex"])
    assert not rules and "Nothing to be done" in out
    rules, _ = _planned_rules(ws, configs, targets=[evaluation, "results/tables/main.tex"])
    assert rules == {"gather_eval", "table"}, rules


def test_task_settings_resolve_per_family_into_the_jobs(ws):
    """paper.yaml: the authors' per-family settings reach each evaluation job's --settings."""
    import json
    import re
    import shlex

    def job_task(model, task):
        target = f"results/eval/{model}/fp/fp/{task}/shard-0.parquet"
        res = subprocess.run(["snakemake", target, "-n", "-p", "--cores", "1", "--configfile",
                              "config/paper.yaml"], cwd=ws, capture_output=True, text=True)
        assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
        line = next(l for l in res.stdout.splitlines() if "evaluate --settings" in l)
        return json.loads(shlex.split(re.search(r"--settings (.*?) --model-dir", line).group(1))[0])["task"]

    llada = job_task("llada-8b-base", "arc_challenge")        # eval_llada_lm_eval.sh
    assert (llada["cfg_scale"], llada["batch_size"], llada["num_fewshot"]) == (0.5, 8, 0)
    dream = job_task("dream-7b-base", "winogrande")           # eval_dream_mc.sh
    assert (dream["batch_size"], dream["num_fewshot"], dream["add_bos_token"]) == (32, 5, True)
    assert "by_family" not in dream and "cfg_scale" not in dream
    assert dream["exact_below"] == 2                 # one-token choices: the exact expectation


def test_components_baseline_is_fair_calib_with_uniform_weights(ws):
    """paper.yaml's components table: its baseline row is the FAIR-Calib pipeline with uniform
    position weights; the planned calibration jobs differ from FAIR-Calib's in nothing else."""
    import json
    import re
    import shlex

    from fair_calib.methods import make_method

    res = subprocess.run(["snakemake", "results/tables/components.tex", "-n", "-p", "--cores", "1",
                          "--configfile", "config/paper.yaml"], cwd=ws, capture_output=True,
                         text=True)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    jobs = {}
    for line in res.stdout.splitlines():
        if "calibrate --settings" in line:
            s = json.loads(shlex.split(re.search(r"--settings (.*?) --model-dir", line).group(1))[0])
            jobs[s["method"]["name"]] = (s, "--prior " in line)
    table = yaml.safe_load((ws / "config/paper.yaml").read_text())["tables"]["components"]
    baseline = next(m for m, label in table["rows"] if label == "baseline")
    (base, base_prior), (fc, fc_prior) = jobs[baseline], jobs["fair-calib"]
    assert base["method"]["weighting"] == "uniform" and not base_prior and fc_prior
    per_method = ("name", "label", "latex_label", "prior", "weighting")   # display, prior
    strip = lambda m: {k: v for k, v in m.items() if k not in per_method}  # noqa: E731
    assert strip(base["method"]) == strip(fc["method"])
    assert {k: v for k, v in base.items() if k != "method"} == {k: v for k, v in fc.items() if k != "method"}
    resolved = [make_method(s["method"], 4, 4) for s in (base, fc)]
    assert [m.weighting for m in resolved] == ["uniform", "prior"]
    assert resolved[0].training_settings() == resolved[1].training_settings()   # teacher, 1024 ...
    assert resolved[0].training_settings()["propagate"] == "teacher"
    assert base["calibration"]["seq_len"] == fc["calibration"]["seq_len"] == 1024


def test_offline_setting_a_task_cannot_honour_fails_the_plan(ws):
    """WinoGrande 5-shot with offline data (no `train` split): refused while planning, before
    the data files are even looked at, not in the job after the model is loaded."""
    res = subprocess.run(["snakemake", "-n", "--cores", "1", "--configfile", "config/paper.yaml",
                          "--config", "data_source=local", "data_dir=/nonexistent/data"],
                         cwd=ws, capture_output=True, text=True)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    line = next(l for l in out.splitlines() if l.startswith("Error: config:"))
    assert "tasks.winogrande.num_fewshot = 5" in line and "`train` split" in line
    assert "rule " not in out


def test_dream_humaneval_jobs_run_the_authors_stop_handling_and_postprocess(ws):
    """[DG] eval_dream_gen.sh: escape_until=true and postprocess_code.py for Dream-Base; the
    instruct model's harness (eval_instruct) applies the stop strings after its EOS split, and
    its humaneval_instruct filter is the same sanitize of prompt + first block (issue 33)."""
    import json
    import re
    import shlex

    def job_task(model):
        target = f"results/eval/{model}/fp/fp/humaneval/shard-0.parquet"
        res = subprocess.run(["snakemake", target, "-n", "-p", "--cores", "1", "--configfile",
                              "config/paper.yaml"], cwd=ws, capture_output=True, text=True)
        assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
        line = next(l for l in res.stdout.splitlines() if "evaluate --settings" in l)
        return json.loads(shlex.split(re.search(r"--settings (.*?) --model-dir", line).group(1))[0])["task"]

    base = job_task("dream-7b-base")
    assert (base["escape_until"], base["code_postprocess"]) == (True, "dream")
    inst = job_task("dream-7b-instruct")
    assert (inst["escape_until"], inst["eos_split_until"], inst["code_postprocess"]) == \
        (False, True, "dream")
    assert inst["lm_eval_task"] == "dream_humaneval_instruct" and inst["apply_chat_template"]
    assert "code_postprocess" not in job_task("llada-8b-base")


def test_prior_ablation_is_in_rule_all_only_and_off_in_merged_configs(ws):
    """The default's rule all has the prior ablation's table and floor-sweep figure over every
    seed of the swept methods (each floor a prior of its own); main.tex's DAG has none of it, and
    the configs merged over the default switch it off."""
    res = _plan(ws, target="all")
    assert res.returncode == 0, res.stderr
    assert "results/tables/prior_ablation.tex" in res.stdout
    assert "rule floor_sweep" in res.stdout
    for k in (0, 1, 2):
        assert f"results/eval/tiny-dream/fair-calib-floor0.01@s{k}/w2a4/synth_gen.parquet" in res.stdout
        assert f"results/eval/tiny-llada/fair-calib-unweighted@s{k}/w2a4/synth_gen.parquet" in res.stdout
    assert "results/prior/tiny-llada/floor1.parquet" in res.stdout
    main = _plan(ws)
    assert "floor" not in main.stdout and "unweighted" not in main.stdout
    for cfg in ("config/smoke.yaml", "config/paper.yaml", "config/hub_layout.yaml"):
        assert yaml.safe_load((ws / cfg).read_text())["prior_ablation"] == {"enabled": False}
