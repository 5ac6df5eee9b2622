"""The fault table (issue 16): bad config, corrupt or partial intermediates, rerun scope.

Every row is a fault a user can make or a machine can cause; each must be refused before any job
with the key or file named, or detected and redone, never silently taken. The fast rows call
``fair_calib.checks.config`` / the stage CLIs directly; a few plan the workflow (``snakemake -n``) to
show the Snakefile applies the same checks.
"""
from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fair_calib.checks import config as C
from fair_calib.names import registry

REPO = Path(__file__).resolve().parents[1]


def _default():
    return C.load_yaml(REPO / "config/config.yaml")


def _merge(base, over):
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out.get(k, {}), v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# ------------------------------------------------------------------ config cases (schema level)
CONFIG_FAULTS = [
    # (override, text the one-line error must contain)
    ({"corpus": {"n_train_docs": -1}}, "corpus.n_train_docs = -1"),
    ({"corpus": {"n_trian_docs": 10}}, "unknown key corpus.n_trian_docs"),
    ({"corpus": {"mix": {"colur": 0.3}}}, "unknown key corpus.mix.colur"),
    ({"corpus": {"instruction_frac": 1.5}}, "corpus.instruction_frac = 1.5"),
    ({"models": {"tiny-llada": {"train": {"stepz": 3}}}}, "unknown key models.tiny-llada.train.stepz"),
    ({"models": {"tiny-llada": {"train": {"steps": 0}}}}, "models.tiny-llada.train.steps = 0"),
    ({"models": {"tiny-llada": {"train": {"loss_norm": "mean"}}}}, "choose one of ['elbo', 'masked_mean']"),
    ({"methods": {"flatquant": {"epoch": 1}}}, "unknown key methods.flatquant.epoch"),
    ({"methods": {"rtn": {"epochs": 3}}}, "unknown key methods.rtn.epochs"),
    ({"methods": {"flatquant": {"calibration": {"seqlen": 8}}}}, "unknown key methods.flatquant.calibration.seqlen"),
    ({"methods": {"flatquant": {"calibration_by_family": {"lama": {"seq_len": 8}}}}},
     "methods.flatquant.calibration_by_family.lama"),
    ({"tasks": {"synth_mc": {"shardz": 2}}}, "unknown key tasks.synth_mc.shardz"),
    ({"bits": {"w4a4": {"w_bits": 0}}}, "bits.w4a4.w_bits = 0"),
    ({"bogus": 1}, "unknown key bogus"),
    # issue 23: every numeric setting's range, before any job
    ({"priors": {"default": {"floor": 5.0}}}, "priors.default.floor = 5.0"),
    ({"priors": {"default": {"floor": 0}}}, "priors.default.floor = 0"),
    ({"methods": {"flatquant": {"alpha": -3}}}, "methods.flatquant.alpha = -3"),
    ({"tasks": {"synth_gen": {"decoding": {"temperature": "hot"}}}},
     "tasks.synth_gen.decoding.temperature = 'hot'"),
    ({"tasks": {"synth_gen": {"by_family": {"tiny-dream": {"decoding": {"top_p": 2}}}}}},
     "tasks.synth_gen.by_family.tiny-dream.decoding.top_p = 2"),
    ({"tasks": {"synth_gen": {"decoding": {"polcy": "entropy"}}}}, "unknown key tasks.synth_gen.decoding.polcy"),
    ({"methods": {"flatquant": {"calibration": {"seq_len": -5}}}}, "methods.flatquant.calibration.seq_len = -5"),
    ({"methods": {"flatquant": {"calibration_by_family": {"tiny-llada": {"n_samples": 0}}}}},
     "methods.flatquant.calibration_by_family.tiny-llada.n_samples = 0"),
    ({"methods": {"q": {"type": "qdrop", "drop_prob": 1.5}}}, "methods.q.drop_prob = 1.5"),
    ({"methods": {"flatquant": {"eta_min_ratio": 2}}}, "methods.flatquant.eta_min_ratio = 2"),
    ({"probes": {"default": {"policy": "greedy"}}}, "probes.default.policy = 'greedy'"),
]


@pytest.mark.parametrize("override, needle", CONFIG_FAULTS, ids=[n for _, n in CONFIG_FAULTS])
def test_config_fault_is_refused_naming_the_key(override, needle):
    with pytest.raises(C.ConfigError) as err:
        C.validate_config(_merge(_default(), override))
    msg = str(err.value)
    assert needle in msg, msg
    assert "\n" not in msg
    if "unknown key" in needle:
        assert "allowed" in msg      # and says what is allowed


def test_unknown_key_lists_the_allowed_ones_not_a_schema_dump():
    with pytest.raises(C.ConfigError) as err:
        C.validate_config(_merge(_default(), {"methods": {"fair-calib": {"epoch": 1}}}))
    msg = str(err.value)
    assert "'epochs'" in msg and "'lr'" in msg and len(msg) < 600


def test_shipped_configs_pass():
    base = _default()
    for extra in ([], ["smoke.yaml"], ["paper.yaml"], ["smoke.yaml", "hub_layout.yaml"],
                  ["bench.yaml"], ["bench.yaml", "bench_screen.yaml"]):
        cfg = copy.deepcopy(base)
        for f in extra:
            cfg = _merge(cfg, C.load_yaml(REPO / "config" / f))
        C.validate_config(cfg)


def test_every_method_type_declares_its_settings():
    assert set(registry.METHOD_SETTINGS) == set(registry.METHOD_TYPES)
    for mtype in registry.METHOD_TYPES:
        assert "type" in registry.method_setting_names(mtype)


def test_arithmetic_is_one_setting_of_the_four_qdlm_baselines():
    """``arithmetic`` (authors | precise): declared for gptq/awq/smoothquant/duquant only, the
    schema's enum the registry's names; another value is refused naming the key."""
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    prop = schema["properties"]["methods"]["additionalProperties"]["properties"]["arithmetic"]
    assert tuple(prop["enum"]) == registry.ARITHMETICS
    assert {t for t in registry.METHOD_TYPES if "arithmetic" in registry.method_setting_names(t)} \
        == {"gptq", "awq", "smoothquant", "duquant"}
    qdlm = C.load_yaml(REPO / "config/qdlm.yaml")
    ok = _merge(_default(), {"methods": {"gptq-w4": dict(qdlm["methods"]["gptq-w4"], arithmetic="precise")}})
    C.validate_config(ok)
    bad = _merge(_default(), {"methods": {"gptq-w4": dict(qdlm["methods"]["gptq-w4"], arithmetic="float64")}})
    with pytest.raises(C.ConfigError, match="arithmetic"):
        C.validate_config(bad)


def test_method_settings_declaration_covers_what_the_methods_read():
    """Every `self.cfg.get("key")` in a method module is declared for some type (a setting a
    method reads but the config may not hold could never be set)."""
    declared = {k for t in registry.METHOD_TYPES for k in registry.method_setting_names(t)}
    read = set()
    for path in (REPO / "fair_calib/methods").glob("*.py"):
        read |= set(re.findall(r"cfg\.get\(\"([a-z_0-9]+)\"", path.read_text()))
    assert read - {"name"} <= declared, sorted(read - {"name"} - declared)


def test_yaml_syntax_error_names_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: 0\nmodels:\n  a: [1,\n  b: 2\n")
    with pytest.raises(C.ConfigError) as err:
        C.load_yaml(bad)
    assert re.search(rf"{re.escape(str(bad))}:\d+:\d+: YAML syntax error", str(err.value)), err.value


# ------------------------------------------------------------------ stage CLIs check --settings
def _cli(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "fair_calib.cli", *args], capture_output=True,
                          text=True, env=env, cwd=cwd)


MODEL = {"name": "m", "family": "tiny-llada", "source": "train"}
CALIB = {"dataset": "synthetic", "n_samples": 2, "seq_len": 8}


@pytest.mark.parametrize("args, needle", [
    (["calibrate", "--settings", "{not json", "--model-dir", "x", "--out-dir", "OUT"], "is not valid JSON"),
    (["calibrate", "--settings", "{}", "--model-dir", "x", "--out-dir", "OUT"], "lacks 'model', 'method', 'calibration'"),
    (["calibrate", "--settings", json.dumps({"model": MODEL, "method": {"name": "r", "type": "rtn"},
                                             "bits": {"name": "w0a4", "w_bits": 0, "a_bits": 4},
                                             "calibration": CALIB}),
      "--model-dir", "x", "--out-dir", "OUT"], "bits.w0a4.w_bits = 0"),
    (["calibrate", "--settings", json.dumps({"model": MODEL, "calibration": CALIB,
                                             "method": {"name": "f", "type": "flatquant", "epoch": 1}}),
      "--model-dir", "x", "--out-dir", "OUT"], "unknown key methods.f.epoch"),
    (["make-data", "--settings", json.dumps({"corpus": {"n_train_docs": -1}}), "--out", "OUT"],
     "corpus.n_train_docs = -1"),
    (["train-tiny", "--settings", json.dumps({"model": {**MODEL, "train": {"stepz": 1}}}),
      "--data", "x", "--out", "OUT"], "unknown key models.m.train.stepz"),
    (["probe", "--settings", "{}", "--model-dir", "x", "--out", "OUT"], "lacks 'seed', 'model', 'probe'"),
])
def test_stage_cli_refuses_what_the_schema_refuses(tmp_path, args, needle):
    out = tmp_path / "out"
    res = _cli(*[str(out) if a == "OUT" else a for a in args], cwd=tmp_path)
    assert res.returncode != 0
    assert needle in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert not out.exists()         # nothing written


# ------------------------------------------------------------------ workflow: before any job
def _workspace(tmp: Path) -> Path:
    for item in ("Snakefile", "workflow", "config"):
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp / item)
    return tmp


def _plan(ws: Path, overrides: dict | None = None, *extra: str, target="results/tables/main.tex"):
    cmd = ["snakemake", *([target] if target else []), "-n", "-p", "--cores", "1", *extra]
    if overrides is not None:
        (ws / "override.yaml").write_text(yaml.safe_dump(overrides))
        cmd += ["--configfile", "override.yaml"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run(cmd, cwd=ws, capture_output=True, text=True, env=env)
    res.out = res.stdout + res.stderr
    return res


@pytest.fixture
def ws(tmp_path):
    return _workspace(tmp_path)


def test_workflow_refuses_bad_config_in_one_line(ws):
    res = _plan(ws, {"corpus": {"n_train_docs": -1}, "methods": {"flatquant": {"epoch": 1}}})
    assert res.returncode != 0
    assert "Error: config:" in res.out and ("n_train_docs" in res.out or "epoch" in res.out)
    assert "Traceback" not in res.out and "$schema" not in res.out and len(res.out) < 3000
    assert not (ws / "resources").exists() and not (ws / "results").exists()


def test_default_config_yaml_syntax_error_names_line(ws):
    cfg = ws / "config/config.yaml"
    cfg.write_text(cfg.read_text().replace("seed: 0\n", "seed: [0\n", 1))
    res = _plan(ws)
    assert res.returncode != 0
    assert re.search(r"config/config\.yaml:\d+:\d+: YAML syntax error", res.out), res.out[-2000:]


def _settings_of(plan_out: str, stage: str) -> list[dict]:
    """The --settings JSON of every planned `fair-calib <stage>` command."""
    found = []
    for line in plan_out.splitlines():
        if f"fair_calib.cli {stage} " in line:
            command = line[line.index(f"fair_calib.cli {stage} "):].split(" > ")[0]
            words = shlex.split(command)
            if "--settings" in words:
                found.append(json.loads(words[words.index("--settings") + 1]))
    return sorted(found, key=lambda d: json.dumps(d, sort_keys=True))


def test_rerun_scope_data_dir_and_threads_do_not_touch_training(ws):
    """A job's settings hold exactly what changes its output: data_dir is not in the settings
    of jobs that do not read it, and train.threads (how fast, not what) is in none."""
    base = _plan(ws)
    assert base.returncode == 0, base.out[-2000:]
    other = _plan(ws, {"data_dir": str(ws), "models": {"tiny-llada": {"train": {"threads": 2}},
                                                       "tiny-dream": {"train": {"threads": 2}}}})
    assert other.returncode == 0, other.out[-2000:]
    for stage in ("make-data", "train-tiny", "probe", "calibrate", "evaluate"):
        a, b = _settings_of(base.out, stage), _settings_of(other.out, stage)
        assert a and a == b, stage
        assert all("data_dir" not in s for s in a), stage
    assert "train-tiny --threads 1" in other.out   # capped by --cores 1


def test_fp_method_under_another_name_reaches_tables_and_diagnostics(ws):
    over = {"methods": {"full": {"type": "fp", "label": "Full"}},
            "tables": {"main": {"methods": ["full", "rtn", "flatquant", "fair-calib"]}}}
    # drop the default's `fp` entry: the merged config keeps it otherwise
    cfg = ws / "config/config.yaml"
    text = cfg.read_text()
    text = re.sub(r"\n  fp: \{[^}]*\}", "", text)
    cfg.write_text(text)
    res = _plan(ws, over, "--forceall", target=None)     # the tables and the figures
    assert res.returncode == 0, res.out[-3000:]
    table = _settings_of(res.out, "report")
    assert table and table[0]["fp_method"] == "full"
    assert "results/traj/tiny-llada/full/fp.parquet" in res.out
    assert "results/traj/tiny-llada/fp/" not in res.out


def test_no_fp_method_with_diagnostics_is_a_config_error(ws):
    cfg = ws / "config/config.yaml"
    text = re.sub(r"\n  fp: \{[^}]*\}", "", cfg.read_text())
    text = text.replace("methods: [fp, ", "methods: [")
    cfg.write_text(text)
    res = _plan(ws)
    assert res.returncode != 0
    assert "diagnostics need an FP method" in res.out and "StopIteration" not in res.out


def test_missing_data_subfolder_fails_before_any_job(ws, tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    (data / "gsm8k").mkdir()            # gsm8k present, wikitext2 absent
    (data / "gsm8k" / "train.jsonl").write_text("")
    res = _plan(ws, {"data_dir": str(data), "calibration": {"dataset": "wikitext2"}})
    assert res.returncode != 0
    assert "wikitext2/wiki.test.raw" in res.out and "calibration.dataset" in res.out
    assert "docs/data.md" in res.out


# ------------------------------------------------------------------ corrupt / partial files
def _garbage(path: Path, n=64):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\xff" * n)


def test_truncated_parquet_names_file_and_command(tmp_path):
    import pandas as pd
    import pyarrow as pa

    from fair_calib.jobs import io
    path = tmp_path / "results/prior/m/default.parquet"
    io.write_parquet(pd.DataFrame({"x": list(range(100))}), path, pa.schema([("x", pa.int64())]))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(io.CorruptFileError) as err:
        io.read_parquet(path)
    assert str(path) in str(err.value) and "rm -r" in str(err.value) and "snakemake" in str(err.value)


@pytest.mark.parametrize("reader, name", [("load_tensors", "params.safetensors"),
                                           ("read_json", "meta.json"),
                                           ("read_parquet", "shard-0.parquet")])
def test_garbage_intermediate_names_the_path(tmp_path, reader, name):
    from fair_calib.jobs import io
    path = tmp_path / name
    _garbage(path)
    with pytest.raises(io.CorruptFileError) as err:
        getattr(io, reader)(path)
    assert str(path) in str(err.value)


def test_corrupt_jsonl_line_names_file_and_line(tmp_path):
    from fair_calib import data
    path = tmp_path / "calib.jsonl"
    path.write_text('{"text": "a"}\n{"text": "b"}\n{"text": "c\n')
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:3: corrupt JSON line"):
        data.read_jsonl(path)


def _flatquant_run(layers):
    """run(out, log): a one-epoch FlatQuant calibration of a tiny random Llama into ``out``
    (the same model, ids and seed every call)."""
    import torch

    from fair_calib.calibrate import calibrate
    from fair_calib.methods import make_method
    from fair_calib.quant.toy import tiny_random_loaded

    ids = torch.randint(0, 60, (4, 16), generator=torch.Generator().manual_seed(0))

    def run(out, log=lambda s: None):
        method = make_method({"type": "flatquant", "epochs": 1, "lr": 5e-3}, 4, 4, seed=0)
        return calibrate(tiny_random_loaded("llama", layers=layers), method, ids, out,
                         batch_size=4, log=log)
    return run


def test_garbage_block_file_is_discarded_and_recomputed(tmp_path):
    """A garbage blocks/{i}.safetensors (full disk, bad copy) never stops a resume: the block
    and those after it are recomputed, with a warning, and the result equals a fresh run."""
    import torch

    from fair_calib.jobs import io

    run = _flatquant_run(layers=2)
    run(tmp_path / "a")
    run(tmp_path / "b")
    (tmp_path / "b/meta.json").unlink()                # as if killed before the end
    _garbage(tmp_path / "b/blocks/0.safetensors")
    lines: list[str] = []
    with pytest.warns(UserWarning, match="0.safetensors"):
        run(tmp_path / "b", lines.append)
    assert any("unreadable" in line and "0.safetensors" in line for line in lines)
    pa_, _ = io.load_tensors(tmp_path / "a/params.safetensors")
    pb_, _ = io.load_tensors(tmp_path / "b/params.safetensors")
    assert pa_.keys() == pb_.keys() and all(torch.equal(pa_[k], pb_[k]) for k in pa_)


def test_block_file_without_stats_is_not_resumed_from(tmp_path):
    """A readable blocks/{i}.safetensors that lacks the block stats calibrate saves with a
    finished block (another writer, a run killed mid-save) is discarded like a garbage one:
    that block and every later one are recomputed, and the result equals a fresh run."""
    import torch

    from fair_calib.jobs import io

    run = _flatquant_run(layers=3)
    run(tmp_path / "a")
    run(tmp_path / "b")
    (tmp_path / "b/meta.json").unlink()
    prov1 = io.load_tensors(tmp_path / "b/blocks/1.safetensors")[1]
    io.save_tensors({"x": torch.zeros(2)}, tmp_path / "b/blocks/1.safetensors",
                    provenance={"resume_key": prov1["resume_key"]})
    lines: list[str] = []
    with pytest.warns(UserWarning, match="1.safetensors"):
        run(tmp_path / "b", lines.append)
    assert [line.split(":")[0] for line in lines if "resumed" in line] == ["block 0"]
    assert any("no block stats" in line and "1.safetensors" in line for line in lines)
    pa_, _ = io.load_tensors(tmp_path / "a/params.safetensors")
    pb_, _ = io.load_tensors(tmp_path / "b/params.safetensors")
    assert pa_.keys() == pb_.keys() and all(torch.equal(pa_[k], pb_[k]) for k in pa_)


def _parquet(path: Path, n=100):
    import pandas as pd
    import pyarrow as pa

    from fair_calib.jobs import io
    io.write_parquet(pd.DataFrame({"x": list(range(n))}), path, pa.schema([("x", pa.int64())]))


def _truncate(path: Path) -> bytes:
    data = path.read_bytes()[: path.stat().st_size // 2]
    path.write_bytes(data)
    return data


def test_preflight_moves_aside_exactly_the_corrupt_intermediates(tmp_path):
    """Truncated Parquet and safetensors files and a garbage meta.json are renamed to
    <name>.corrupt (a second one to .corrupt-2); intact files, a job's hidden temporary file and
    calibration's blocks/ (which calibrate checks itself) are left alone."""
    import torch

    from fair_calib.jobs import io, preflight
    root = tmp_path / "results"
    good_pq, bad_pq = root / "prior/m/a.parquet", root / "prior/m/b.parquet"
    _parquet(good_pq), _parquet(bad_pq)
    cell = root / "calib/m/x/w4a4"
    io.save_tensors({"w": torch.ones(64, 64)}, cell / "params.safetensors")
    io.write_json(cell / "meta.json", {"ok": 1})
    _garbage(cell / "blocks/0.safetensors")
    _garbage(cell / ".params.safetensors.abc.tmp.parquet")
    (bad_pq.with_name("b.parquet.corrupt")).write_bytes(b"an earlier one")
    _truncate(bad_pq)
    _truncate(cell / "params.safetensors")
    (cell / "meta.json").write_text('{"ok": ')
    moved = preflight.move_aside_corrupt(root)
    assert sorted((p.relative_to(root).as_posix(), t.name) for p, t, _ in moved) == [
        ("calib/m/x/w4a4/meta.json", "meta.json.corrupt"),
        ("calib/m/x/w4a4/params.safetensors", "params.safetensors.corrupt"),
        ("prior/m/b.parquet", "b.parquet.corrupt-2")]
    assert all(why for _, _, why in moved)
    assert good_pq.is_file() and (cell / "blocks/0.safetensors").is_file()
    assert (root / "prior/m/b.parquet.corrupt").read_bytes() == b"an earlier one"
    assert preflight.move_aside_corrupt(root) == []          # nothing left to move
    line = preflight.report_line(*moved[0])
    assert "meta.json" in line and "moved it aside" in line and "\n" not in line


@pytest.mark.slow
def test_truncated_prior_and_params_are_moved_aside_and_only_their_jobs_redone(ws):
    """A truncated prior Parquet and a truncated calibration params.safetensors under an
    otherwise finished DAG: a dry run says what a run would move and moves nothing (issue 42);
    the run keeps each broken file as .corrupt (the cell's completion marker as
    meta.json.incomplete), reruns the prior job and the calibration named by its meta.json
    alone (the probe shards and the model are intact) and writes the same files again."""
    import pandas as pd

    from fair_calib.jobs import io
    (ws / "tiny.yaml").write_text(yaml.safe_dump({
        "corpus": {"n_train_docs": 200, "n_calib_docs": 8, "n_probe": 4, "n_facts": 4,
                   "n_mc_items": 4, "n_gen_items": 4},
        "models": {"tiny-llada": {"train": {"hidden": 32, "layers": 1, "heads": 2,
                                            "intermediate": 64, "steps": 2, "batch_size": 4,
                                            "seq_len": 32}}},
        "probes": {"default": {"n_samples": 4, "steps": 4, "gen_length": 4, "shards": 2,
                               "batch_size": 2}},
        # the cross-corpus probes' 16 samples are more than these 4 prompts (refused)
        "diagnostics": {"cross_corpus": []}}))
    target = "results/prior/tiny-llada/default.parquet"
    cell = "results/calib/tiny-llada/rtn/w4a4"
    configs = ["--cores", "2", "--configfile", "config/smoke.yaml", "tiny.yaml"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def snakemake(*extra):
        res = subprocess.run(["snakemake", target, f"{cell}/meta.json", *configs, *extra],
                             cwd=ws, capture_output=True, text=True, env=env)
        res.out = res.stdout + res.stderr
        return res

    first = snakemake()
    assert first.returncode == 0, first.out[-3000:]
    run_dir = ws / "runs/smoke"      # smoke.yaml's own folder (config key workdir)
    prior, params = run_dir / target, run_dir / cell / "params.safetensors"
    before, _ = io.read_parquet(prior)
    params_before = params.read_bytes()
    broken, broken_params = _truncate(prior), _truncate(params)
    plan = snakemake("-n")
    assert plan.returncode == 0, plan.out[-3000:]
    notes = [l for l in plan.out.splitlines() if l.startswith("Note: ") and "moves it aside" in l]
    assert [n.split()[1] for n in notes] == [f"{cell}/params.safetensors", f"{cell}/meta.json",
                                             target], plan.out[-3000:]
    assert "meta.json.incomplete" in notes[1] and "default.parquet.corrupt" in notes[2]
    assert all("moved nothing" in n for n in notes)
    assert prior.read_bytes() == broken and params.read_bytes() == broken_params
    assert not list((run_dir / "results").rglob("*.corrupt*"))     # a dry run moves nothing
    rerun = snakemake()
    assert rerun.returncode == 0, rerun.out[-3000:]
    jobs = re.findall(r"^(?:local)?rule (\w+):", rerun.out, re.M)
    assert sorted(jobs) == ["calibrate", "prior"], rerun.out[-3000:]
    after, _ = io.read_parquet(prior)
    pd.testing.assert_frame_equal(before, after)
    assert params.read_bytes() == params_before
    assert (run_dir / (target + ".corrupt")).read_bytes() == broken
    assert (run_dir / cell / "params.safetensors.corrupt").read_bytes() == broken_params
    assert sorted(p.name for p in (run_dir / "results").rglob("*.corrupt*")) == [
        "default.parquet.corrupt", "params.safetensors.corrupt"]
    assert (run_dir / cell / "meta.json.incomplete").is_file()


def test_concurrent_run_is_named_as_such(ws):
    """A lock left by another run: the message says another run holds it (and how to clear a
    stale one), before Snakemake's own advice about incomplete files."""
    (ws / ".snakemake/locks").mkdir(parents=True)
    (ws / ".snakemake/locks/0.input.lock").write_text("results/x\n")
    res = _plan(ws)
    assert "another Snakemake run holds the lock on this directory (.snakemake/locks/)" in res.out
    assert "`snakemake --unlock` removes it" in res.out
    (ws / ".snakemake/locks/0.input.lock").unlink()
    assert "holds the lock" not in _plan(ws).out


def test_unlock_advice_names_the_workdirs_lock_and_clears_it(ws):
    """A config with its own `workdir` (smoke.yaml: runs/smoke) keeps its lock there: the Note
    names that folder and gives the unlock command with the run's --configfile, which clears it
    (a plain `snakemake --unlock` unlocks the default's folder instead; issue 42)."""
    locks = ws / "runs/smoke/.snakemake/locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text("results/x\n")
    res = _plan(ws, None, "--configfile", "config/smoke.yaml")
    note = next(l for l in res.out.splitlines() if "holds the lock" in l)
    assert "(runs/smoke/.snakemake/locks/)" in note, note
    command = note.split("`")[1]
    assert command == "snakemake --unlock --configfile config/smoke.yaml", note
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(shlex.split(command), cwd=ws, env=env, capture_output=True, check=True)
    assert not locks.exists() or not list(locks.iterdir())


def test_a_corrupt_calibration_output_takes_its_cells_marker_aside(tmp_path):
    """meta.json is the calibration's completion marker (evaluation depends on it alone): with
    a corrupt params.safetensors of its cell it goes aside too, so naming it, or evaluating the
    cell, recalibrates. A dry run (and --summary, --dag, ...) lists and moves nothing."""
    import torch

    from fair_calib.jobs import io, preflight
    cell = tmp_path / "results/calib/m/rtn/w4a4"
    io.save_tensors({"w": torch.ones(64, 64)}, cell / "params.safetensors")
    io.write_json(cell / "meta.json", {"ok": 1})
    _parquet(cell / "stats.parquet")
    _truncate(cell / "params.safetensors")
    _truncate(cell / "stats.parquet")
    listed = preflight.corrupt_intermediates(tmp_path / "results")
    assert [(p.name, t.name) for p, t, _ in listed] == [
        ("params.safetensors", "params.safetensors.corrupt"),
        ("meta.json", "meta.json.incomplete"),
        ("stats.parquet", "stats.parquet.corrupt")]
    assert (cell / "meta.json").is_file() and not list(cell.glob("*.corrupt"))
    dry = preflight.report_line(*listed[1], dry_run=True)
    assert "moves it aside to meta.json.incomplete" in dry and "moved nothing" in dry
    assert preflight.move_aside_corrupt(tmp_path / "results") == listed
    assert sorted(p.name for p in cell.iterdir()) == [
        "meta.json.incomplete", "params.safetensors.corrupt", "stats.parquet.corrupt"]
    line = preflight.report_line(*listed[1])
    assert line.startswith(f"Note: {cell / 'meta.json'} is the completion marker of its cell, "
                           "whose params.safetensors is corrupt; moved it aside")
    assert "naming this meta.json does" in line and "\n" not in line
    # a cell left by an earlier round's Note: params aside, its marker kept (issue 42's case)
    (cell / "meta.json.incomplete").rename(cell / "meta.json")
    _parquet(cell / "stats.parquet")
    (moved,) = preflight.move_aside_corrupt(tmp_path / "results")
    assert moved[0] == cell / "meta.json" and moved[1].name == "meta.json.incomplete"
    assert moved[2] == "the completion marker of its cell, whose params.safetensors is missing"
    assert preflight.inspecting(["results/x", "--summary"], False)
    assert preflight.inspecting(["--cores", "2"], True)          # -n, also inside -np
    assert not preflight.inspecting(["--cores", "2", "results/x"], False)


def test_a_dry_run_moves_nothing_aside(ws):
    _parquet(ws / "results/prior/tiny-llada/default.parquet")
    broken = _truncate(ws / "results/prior/tiny-llada/default.parquet")
    res = _plan(ws)
    assert res.returncode == 0, res.out[-3000:]
    note = next(l for l in res.out.splitlines() if l.startswith("Note: results/prior/"))
    assert "a run (without -n) moves it aside to default.parquet.corrupt" in note
    assert (ws / "results/prior/tiny-llada/default.parquet").read_bytes() == broken
    assert not list((ws / "results").rglob("*.corrupt*"))


@pytest.mark.parametrize("source, needle", [("/nonexistent/llada-8b", "does not exist"),
                                            ("./models/mine", "does not exist"),
                                            ("results/models/x", "does not exist")])
def test_missing_local_model_folder_is_not_taken_for_a_hub_id(source, needle):
    assert needle in C.missing_model_folder(source)


def test_hub_ids_and_existing_folders_pass(tmp_path):
    assert C.missing_model_folder("GSAI-ML/LLaDA-8B-Base") is None
    assert C.missing_model_folder("gpt2") is None          # a legacy hub id
    assert C.missing_model_folder(str(tmp_path)) is None
    assert C.missing_model_folder("train") is None


def test_stage_cli_names_a_missing_model_folder(tmp_path):
    res = _cli("probe", "--settings", "{}", "--model-dir", "/nonexistent/model", "--out", "x")
    assert res.returncode != 0 and "model folder '/nonexistent/model' does not exist" in res.stderr


def test_check_config_names_line_of_a_configfile_syntax_error(ws):
    """Snakemake parses --configfile files before the Snakefile runs, and its message for a YAML
    error names neither the file nor a line (so no code of ours can); `fair-calib check-config
    FILE`, which the README's troubleshooting gives, names both, and where an unclosed bracket
    was opened."""
    bad = ws / "mine.yaml"
    bad.write_text("methods:\n  flatquant: {epochs: 2\nseed: 1\n")
    res = _plan(ws, None, "--configfile", "mine.yaml")
    assert res.returncode != 0 and "Config file is not valid JSON or YAML" in res.out
    assert "mine.yaml" not in res.out and "YAML syntax error" not in res.out   # never reached us
    res = _cli("check-config", str(bad), cwd=ws)
    assert res.returncode != 0
    assert res.stderr.startswith(f"error: {bad}:3:5: YAML syntax error: while parsing a flow "
                                 "mapping started at line 2, column 14, expected ',' or '}', "
                                 "but got ':'. "), res.stderr
    good = ws / "ok.yaml"
    good.write_text("methods:\n  flatquant: {epoch: 2}\n")
    res = _cli("check-config", str(good))
    assert res.returncode != 0 and "methods.flatquant.epoch" in res.stderr
    assert _cli("check-config", str(REPO / "config/smoke.yaml")).returncode == 0


def test_check_config_names_a_target_read_as_a_config_file(tmp_path):
    """`--configfile` takes every word up to the next option, so `fair-calib check-config
    config/smoke.yaml results/tables/main.tex` gets the table as a config: the error says so and
    how to write the command, instead of asking to fix the table's YAML."""
    table = tmp_path / "main.tex"
    table.write_text("\\begin{tabular}{ll}\nA & B: C\\\\\n\\end{tabular}\n")
    for target in (table, tmp_path / "absent.tex"):
        with pytest.raises(C.ConfigError) as err:
            C.merged_config([REPO / "config/smoke.yaml", target], REPO / "config/config.yaml")
        msg = str(err.value)
        assert msg.startswith(f"{target}: not a YAML config file; a target given after "
                              "--configfile"), msg
        assert "YAML syntax error" not in msg and "-- TARGET" in msg
    bad = tmp_path / "bad.yaml"                 # a config by its name: the syntax error stays
    bad.write_text("a: [1,\n")
    with pytest.raises(C.ConfigError, match=r"bad\.yaml:\d+:\d+: YAML syntax error"):
        C.merged_config([bad], REPO / "config/config.yaml")


def test_calibration_corpus_tokenization_does_not_warn_about_length():
    """The whole calibration corpus is tokenized at once (then cut into windows): the
    tokenizer's "Token indices sequence length is longer than ..." warning must not appear."""
    import logging

    from transformers.utils import logging as hf_logging

    from fair_calib import data
    from fair_calib.models.tiny.tokenizer import train_tokenizer, wrap_fast

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("transformers")
    handler, level = Keep(), hf_logging.get_verbosity()
    logger.addHandler(handler)
    hf_logging.set_verbosity_warning()
    try:
        texts = [f"the plosk is red and the maple is a tree {i}" for i in range(50)]
        tok = wrap_fast(train_tokenizer(texts))
        tok.model_max_length = 32
        ids = data.calibration_batch(tok, texts, n_samples=3, seq_len=16, seed=0)
        assert tuple(ids.shape) == (3, 16) and tok.model_max_length == 32
        assert not any("Token indices sequence length" in r for r in records), records
        tok2 = wrap_fast(train_tokenizer(texts))
        tok2.model_max_length = 32
        tok2(" ".join(texts))                  # the control: a plain call does warn
        assert any("Token indices sequence length" in r for r in records)
    finally:
        logger.removeHandler(handler)
        hf_logging.set_verbosity(level)


def test_long_jobs_print_prefixed_progress_and_keep_their_exit_status(ws, tmp_path):
    """train_tiny's shell prints `[train_tiny <model>] <last log line>` on the console while
    the job runs (the log keeps everything), and a failing job still fails."""
    res = _plan(ws, None, target="resources/models/tiny-llada")
    line = next(l for l in res.out.splitlines() if "fair_calib.cli train-tiny" in l)
    prefix = line[line.index("( while"): line.index("OMP_NUM_THREADS")]
    assert "[train_tiny tiny-llada]" in prefix
    log = ws / "logs/train_tiny/tiny-llada.log"
    log.parent.mkdir(parents=True)
    fake = "(for i in 1 2 3 4 5; do printf 'step %s\\r' $i; sleep 1; done; exit 3)"
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", f"{prefix}{fake} > {log} 2>&1"],
                         cwd=ws, capture_output=True, text=True,
                         env={**os.environ, "FAIR_CALIB_PROGRESS_SECONDS": "0.5"})
    assert run.returncode == 3
    shown = [l for l in run.stdout.splitlines() if l]
    assert shown and all(l.startswith("[train_tiny tiny-llada] step ") for l in shown), run.stdout
    assert "step 5" in log.read_text()


# ------------------------------------------------------------------ issue 23: first contact
def _planned_settings(res) -> dict[str, list[dict]]:
    return {stage: _settings_of(res.out, stage)
            for stage in ("make-data", "train-tiny", "probe", "prior", "calibrate", "evaluate",
                          "trajectories", "report", "figures")}


DISPLAY_EDIT = {"models": {"tiny-llada": {"label": "Tiny-L (new)", "group": "Other"}},
                "methods": {"fair-calib": {"label": "Ours", "latex_label": "\\textbf{Ours}"},
                            "rtn": {"label": "Round"}},
                "tasks": {"synth_mc": {"label": "MC (new)"}},
                "tables": {"main": {"caption": "Another caption."}}}
ENV_EDIT = {"device": "cuda", "data_dir": "/elsewhere/data", "data_source": "hub"}


def test_display_environment_and_decoding_keys_leave_the_jobs_settings(ws):
    """Labels, groups and captions reach only the table and figures jobs; device, data_dir and
    data_source reach no job's settings (the rerun trigger); a model's decoding override only
    the diagnostics' trajectories. So editing them reruns no training, calibration or
    evaluation. (The finished-DAG version: tests/test_workflow.py's whole-DAG test.)"""
    base = _plan(ws, None, "--forceall", target=None)
    assert base.returncode == 0, base.out[-2000:]
    expensive = ("make-data", "train-tiny", "probe", "prior", "calibrate", "evaluate")
    before = _planned_settings(base)
    assert all(before[s] for s in expensive + ("trajectories",)), before.keys()
    for key in ('"device"', '"data_dir"', '"data_source"', '"synthetic_dir"', '"label"',
                '"latex_label"', '"group"'):
        assert key not in json.dumps({s: before[s] for s in expensive}), key
    assert "--runtime '{\"data_dir\"" in base.out      # the environment reaches the stages
    env = _planned_settings(_plan(ws, ENV_EDIT, "--forceall", target=None))
    assert env == before
    shown = _plan(ws, _merge(DISPLAY_EDIT, {"models": {"tiny-llada": {"decoding": {
        "temperature": 0.5}}}}), "--forceall", target=None)
    assert shown.returncode == 0, shown.out[-2000:]
    after = _planned_settings(shown)
    for stage in expensive:
        assert after[stage] == before[stage], stage
    assert after["trajectories"] != before["trajectories"]     # the one stage reading decoding
    assert after["report"] != before["report"] and "Ours" in json.dumps(after["report"])


needs_no_cuda = pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="this machine has CUDA")


@needs_no_cuda
def test_cuda_without_cuda_is_refused_before_any_job(ws):
    """`device: cuda` where torch has no CUDA: refused at parse time in one line naming the
    key, before Snakemake deletes any output (a dry run only says so)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(["snakemake", "--cores", "1", "--config", "device=cuda", "--",
                          "resources/data/manifest.json"], cwd=ws, capture_output=True,
                         text=True, env=env)
    out = run.stdout + run.stderr
    assert run.returncode != 0
    line = next(l for l in out.splitlines() if l.startswith("Error:"))
    assert "device = 'cuda'" in line and "CUDA is not available" in line, out[-2000:]
    assert "Traceback" not in out and not (ws / "resources").exists()
    dry = _plan(ws, {"device": "cuda"})
    assert dry.returncode == 0 and "Note: config: device = 'cuda'" in dry.out


@needs_no_cuda
def test_stage_cli_refuses_cuda_without_cuda_before_writing(tmp_path):
    out = tmp_path / "data"
    res = _cli("make-data", "--settings", json.dumps({"corpus": {"n_train_docs": 10}}),
               "--runtime", json.dumps({"device": "cuda"}), "--out", str(out))
    assert res.returncode != 0 and "device = 'cuda'" in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and not out.exists()
    bad = _cli("make-data", "--settings", "{}", "--runtime", json.dumps({"seed": 1}),
               "--out", str(out))
    assert bad.returncode != 0 and "--runtime" in bad.stderr and "seed" in bad.stderr


@pytest.mark.parametrize("over, keys", [
    ({"methods": {"rtn": {"label": "FAIR-Calib"}}}, ("methods.rtn.label", "methods.fair-calib-seeds.label")),
    ({"models": {"tiny-dream": {"label": "Tiny-LLaDA"}}}, ("models.tiny-llada.label", "models.tiny-dream.label")),
    ({"tasks": {"synth_gen": {"label": "synth_mc"}, "synth_mc": {"label": None}}},
     ("tasks.synth_mc.label", "tasks.synth_gen.label")),
])
def test_two_entries_with_one_label_are_refused_naming_both(over, keys):
    from fair_calib.checks.references import check_config

    cfg = _merge(_default(), over)
    if cfg["tasks"]["synth_mc"].get("label", 0) is None:
        del cfg["tasks"]["synth_mc"]["label"]            # its label is then its name
    C.validate_config(cfg)
    with pytest.raises(C.ConfigError) as err:
        check_config(cfg)
    msg = str(err.value)
    assert all(k in msg for k in keys) and "\n" not in msg, msg


def test_duplicate_label_fails_the_workflow_before_any_job(ws):
    res = _plan(ws, {"methods": {"rtn": {"label": "FAIR-Calib"}}})
    assert res.returncode != 0
    assert "methods.rtn.label and methods.fair-calib-seeds.label" in res.out, res.out[-2000:]


@pytest.mark.parametrize("over, needle", [
    ({"models": {"tiny-llada": {"train": {"heads": 3}}}}, "models.tiny-llada.train.heads = 3 does not divide hidden = 128"),
    ({"tasks": {"synth_gen": {"block_length": 5}}}, "tasks.synth_gen.block_length = 5 does not divide gen_length = 16"),
    ({"tasks": {"synth_gen": {"by_family": {"tiny-dream": {"steps": 3}}}}},
     "tasks.synth_gen.by_family.tiny-dream.steps = 3 do not divide among the 2 blocks"),
])
def test_numbers_that_must_fit_together_are_checked_before_any_job(over, needle):
    from fair_calib.checks.references import check_config

    cfg = C.validate_config(_merge(_default(), over))
    with pytest.raises(C.ConfigError) as err:
        check_config(cfg)
    assert needle in str(err.value), err.value


def test_bits_name_must_say_its_widths():
    from fair_calib.checks.references import check_config

    cfg = C.validate_config(_merge(_default(), {"bits": {"w4a4": {"w_bits": 3}}}))
    with pytest.raises(C.ConfigError, match=r"bits\.w4a4 holds w_bits: 3, a_bits: 4; .* w3a4"):
        check_config(cfg)


# ------------------------------------------------------------------ CLIs: one line, no traceback
def _one_line_error(res, *needles):
    assert res.returncode != 0
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    lines = [l for l in res.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and all(n in lines[0] for n in needles), res.stderr[-3000:]


def test_cost_validates_the_config_as_the_snakefile_does(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks: {synth_mc: {mc_num: -128}}\n")
    _one_line_error(_cli("cost", "--configfile", str(bad)), "tasks.synth_mc.mc_num = -128")
    typo = tmp_path / "typo.yaml"
    typo.write_text("tables: {main: {tasks: [synth_mcc]}}\n")
    _one_line_error(_cli("cost", "--configfile", str(typo)), "tables.main.tasks", "synth_mcc")
    dup = tmp_path / "dup.yaml"
    dup.write_text("methods: {rtn: {label: FAIR-Calib}}\n")
    _one_line_error(_cli("cost", "--configfile", str(dup)), "methods.rtn.label")
    _one_line_error(_cli("check-config", str(dup)), "methods.rtn.label")


def test_cost_file_errors_are_one_line_and_it_reads_the_current_checkout(tmp_path):
    _one_line_error(_cli("cost", "--configfile", "missing.yaml", cwd=tmp_path),
                    "missing.yaml: file not found", str(tmp_path))
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)))
    _one_line_error(_cli("cost", "--configfile", str(binary)), str(binary),
                    "not a YAML config file")
    scalar = tmp_path / "note.yaml"
    scalar.write_text("just a sentence\n")
    _one_line_error(_cli("cost", "--configfile", str(scalar)), str(scalar), "keys at the top level")
    # another directory: the base config is ./config/config.yaml of the checkout it runs in
    # (issue 32), so a folder without one is refused by name, and --base names one
    _one_line_error(_cli("cost", "--configfile", str(REPO / "config/paper.yaml"), cwd=tmp_path),
                    "config/config.yaml: not found", "--base")
    ok = _cli("cost", "--configfile", str(REPO / "config/smoke.yaml"), "--base",
              str(REPO / "config/config.yaml"), "--json", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads(ok.stdout)["total_gpu_hours"] > 0


def test_diagnose_file_errors_are_one_line(tmp_path):
    _one_line_error(_cli("diagnose", "--inputs", "nope.parquet", "--out", "x.parquet", cwd=tmp_path),
                    "nope.parquet: no such file", str(tmp_path))
    yml = tmp_path / "config.yaml"
    yml.write_text("seed: 0\n")
    _one_line_error(_cli("diagnose", "--inputs", str(yml), "--out", str(tmp_path / "x.parquet")),
                    str(yml), "corrupt or truncated Parquet")
    assert not (tmp_path / "x.parquet").exists()


def test_lm_eval_unknown_task_is_one_line(monkeypatch, capsys):
    """lm-eval answers an unknown task with a 21-line traceback ending in this ValueError."""
    import lm_eval.__main__

    from fair_calib.cli import lm_eval_cli

    def unknown_task():
        raise ValueError("Tasks not found: piqaa")

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", unknown_task)
    with pytest.raises(SystemExit) as err:
        lm_eval_cli.forward_to_lm_eval(["--model", "fair_calib_dlm", "--tasks", "piqaa"])
    msg = str(err.value.code)
    assert msg.startswith("error: fair-calib lm-eval: --tasks: piqaa not found") and "\n" not in msg


def _fake_model(folder: Path, family: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "fair_calib.json").write_text(json.dumps({"family": family}))
    return folder


def _fake_calibration(cell: Path, model_name: str, family: str, model_dir: str) -> Path:
    from fair_calib.jobs import io
    io.write_json(cell / "meta.json", {"provenance": {"config": {
        "model_dir": model_dir,
        "settings": {"model": {"name": model_name, "family": family, "source": "train"}}}}})
    return cell


def test_lm_eval_refuses_a_calibration_of_another_model(tmp_path):
    """The issue's case: tiny-dream's calib_dir on tiny-llada ran and reported 0.125."""
    from fair_calib.evaluate.lm import CalibrationMismatchError, check_calibration_pairing

    llada = _fake_model(tmp_path / "resources/models/tiny-llada", "tiny-llada")
    dream = _fake_model(tmp_path / "resources/models/tiny-dream", "tiny-dream")
    cell = _fake_calibration(tmp_path / "calib/tiny-dream/rtn/w2a4", "tiny-dream", "tiny-dream",
                             str(dream))
    with pytest.raises(CalibrationMismatchError) as err:
        check_calibration_pairing(str(cell), str(llada), "tiny-llada")
    msg = str(err.value)
    assert "tiny-dream" in msg and str(llada) in msg and "tiny-llada" in msg and "\n" not in msg
    check_calibration_pairing(str(cell), str(dream), "tiny-dream")          # its own model
    # same family, another checkpoint (LLaDA-Base's calibration on LLaDA-Instruct)
    base = _fake_calibration(tmp_path / "calib/base", "llada-8b-base", "llada", "GSAI-ML/LLaDA-8B-Base")
    with pytest.raises(CalibrationMismatchError, match="llada-8b-base"):
        check_calibration_pairing(str(base), "GSAI-ML/LLaDA-8B-Instruct", "llada")
    check_calibration_pairing(str(base), "GSAI-ML/LLaDA-8B-Base", "llada")


def test_lm_eval_refuses_a_calibration_of_weights_changed_in_place(tmp_path):
    """Issue 42: model.safetensors changed in place (not by the pipeline: same size, its mtime
    set back), fair_calib.json untouched: `fair-calib lm-eval` recomputes the weights' hash
    and refuses the old calib_dir in one line, before loading the model."""
    import hashlib

    from safetensors.torch import save_file

    from fair_calib.evaluate import offline_data
    from fair_calib.evaluate.lm import check_calibration_pairing
    from fair_calib.cli.lm_eval_cli import render_tasks

    model = _fake_model(tmp_path / "resources/models/tiny-llada", "tiny-llada")
    weights = model / "model.safetensors"
    save_file({"w": __import__("torch").zeros(8)}, str(weights))
    made = hashlib.sha256(weights.read_bytes()).hexdigest()
    (model / "fair_calib.json").write_text(json.dumps({"family": "tiny-llada", "model_sha256": made}))
    cell = _fake_calibration(tmp_path / "calib/tiny-llada/rtn/w4a4", "tiny-llada", "tiny-llada",
                             str(model))
    meta = json.loads((cell / "meta.json").read_text())
    meta["provenance"]["config"]["model_content"] = f"sha256:{made}"
    (cell / "meta.json").write_text(json.dumps(meta))
    check_calibration_pairing(str(cell), str(model), "tiny-llada")       # its own weights
    st = weights.stat()
    with open(weights, "r+b") as f:                                      # one byte, in place
        f.seek(st.st_size - 1)
        f.write(b"\x01")
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = hashlib.sha256(weights.read_bytes()).hexdigest()
    synth = tmp_path / "data"
    synth.mkdir()
    for name in offline_data.SYNTHETIC_TASKS.values():
        (synth / name).write_text("")
    include = render_tasks(tmp_path / "tasks", ["synth_mc"], synthetic_dir=str(synth))
    res = _cli("lm-eval", "--model", "fair_calib_dlm", "--model_args",
               f"pretrained={model},family=tiny-llada,calib_dir={cell}", "--tasks", "synth_mc",
               "--include_path", str(include), "--limit", "1", cwd=tmp_path)
    _one_line_error(res, "fair-calib lm-eval", f"sha256:{made}", f"sha256:{now}", str(cell))


def test_lm_eval_family_comes_from_the_checkpoint_config(tmp_path, monkeypatch):
    """`family=` need not be passed where the checkpoint's config.json says it: a local
    folder's, or a hub id's outside the adapters' list (a fine-tune), from the hub cache."""
    import huggingface_hub

    from fair_calib.evaluate.lm import infer_family

    for model_type, family in (("llada", "llada"), ("Dream", "dream")):
        folder = tmp_path / model_type
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
        assert infer_family(str(folder)) == family
    fetched = []

    def cached_config(repo_id, filename, **kw):
        fetched.append((repo_id, filename))
        return str(tmp_path / "Dream" / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", cached_config)
    assert infer_family("someone/Dream-7B-finetune") == "dream"
    assert fetched == [("someone/Dream-7B-finetune", "config.json")]


def test_render_tasks_with_synthetic_dir_alone_writes_the_synthetic_tasks(tmp_path):
    from fair_calib.evaluate import offline_data
    from fair_calib.cli.lm_eval_cli import render_tasks

    synth = tmp_path / "data"
    synth.mkdir()
    for name in offline_data.SYNTHETIC_TASKS.values():
        (synth / name).write_text("")
    out = render_tasks(tmp_path / "tasks", None, synthetic_dir=str(synth))
    written = {p.stem for p in out.rglob("*.yaml")}
    assert set(offline_data.SYNTHETIC_TASKS) <= written, written


def test_outputs_get_the_permissions_of_the_users_umask(tmp_path):
    from fair_calib.jobs import io

    old = os.umask(0o022)
    try:
        io.write_json(tmp_path / "a/meta.json", {"x": 1})
        with io.atomic_dir(tmp_path / "model") as tmp:
            (tmp / "config.json").write_text("{}")
        os.umask(0o002)
        io.write_text(tmp_path / "b.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "a/meta.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "model").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "b.txt").stat().st_mode & 0o777 == 0o664


@pytest.mark.parametrize("name", ["tokenizer.json", "model.safetensors"])
def test_truncated_model_file_is_named_with_the_rm_to_run(tmp_path, name):
    import torch

    from fair_calib.jobs import io
    from fair_calib.models.adapters import load_model

    folder = _fake_model(tmp_path / "resources/models/tiny-llada", "tiny-llada")
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    io.save_tensors({"w": torch.ones(64, 64)}, folder / "model.safetensors")
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"vocab": {
        f"w{i}": i for i in range(400)}}}))
    _truncate(folder / name)
    with pytest.raises(io.CorruptFileError) as err:
        load_model(str(folder), "tiny-llada")
    msg = str(err.value)
    assert str(folder / name) in msg and f"rm -r '{folder}'" in msg, msg
