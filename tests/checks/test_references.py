"""Every limit the plan can know is checked before any job (issue 32): a job that fails on a size
the config asked for has already cost its finished outputs (Snakemake deletes them first)."""
from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fair_calib.checks import config as C
from fair_calib.checks.references import (calibration_floor_mb, check_config, config_notes,
                                          mc_num_notes, shard_notes)

REPO = Path(__file__).resolve().parents[2]


def _merge(base, over):
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out.get(k, {}), v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _config(*overs):
    cfg = C.load_yaml(REPO / "config/config.yaml")
    for over in overs:
        cfg = _merge(cfg, C.load_yaml(REPO / "config" / over) if isinstance(over, str) else over)
    return C.validate_config(cfg)


@pytest.mark.parametrize("extra", [[], ["smoke.yaml"], ["paper.yaml"], ["smoke.yaml", "hub_layout.yaml"],
                                   ["bench.yaml"], ["bench.yaml", "bench_screen.yaml"]])
def test_shipped_configs_are_within_their_limits(extra):
    cfg = _config(*extra)
    check_config(cfg)
    assert config_notes(cfg) == []


LIMITS = [
    ({"priors": {"default": {"n_probe": 1000}}},
     "priors.default.n_probe = 1000 is more than the 64 samples of its probe (probes.default.n_samples)"),
    ({"diagnostics": {"n_samples": 1000}},
     "diagnostics.n_samples = 1000 is more than the 128 prompts of the probe's dataset (synthetic: corpus.n_probe)"),
    ({"probes": {"cc-facts": {"n_samples": 129}}, "corpus": {"n_facts": 128}},
     "probes.cc-facts.n_samples = 129 is more than the 128 prompts of its dataset (facts: corpus.n_facts)"),
    ({"calibration": {"n_samples": 100000}},
     "calibration.n_samples = 100000 x seq_len 40 on tiny-dream (hidden 128) stores at least 3,906 MB"),
]


@pytest.mark.parametrize("over, needle", LIMITS, ids=[n.split(" ")[0] for _, n in LIMITS])
def test_a_size_beyond_its_source_is_a_config_error(over, needle):
    with pytest.raises(C.ConfigError) as err:
        check_config(_config(over))
    assert needle in str(err.value) and "\n" not in str(err.value), err.value


def test_limits_hold_for_what_the_run_uses_only():
    # an unused prior may ask for more than its probe holds: no job reads it
    check_config(_config({"priors": {"spare": {"probe": "default", "n_probe": 1000}}}))
    # within the declared memory: 100000 windows fit in 4,000 MB
    check_config(_config({"calibration": {"n_samples": 100000}},
                         {"resources": {"calibrate": {"mem_mb": 4000}}}))
    # on a GPU the activations are not in the host memory the job declares
    check_config(_config({"calibration": {"n_samples": 100000}, "device": "cuda"}))


def test_calibration_floor_is_inputs_and_targets_of_every_window():
    assert calibration_floor_mb(100000, 40, 128) == 2 * 100000 * 40 * 128 * 4 / 2**20


def test_shards_beyond_the_items_are_named():
    notes = shard_notes(_config({"tasks": {"synth_mc": {"shards": 500}}}))
    assert notes == ["Note: config: tasks.synth_mc.shards = 500 splits 200 items; 300 of its "
                     "shards per model and method evaluate nothing (each still a job)"]
    notes = shard_notes(_config({"tasks": {"synth_gen": {"limit": 10, "shards": 12}},
                                 "probes": {"default": {"shards": 9}}}))
    assert len(notes) == 2 and "tasks.synth_gen.shards = 12 splits 10 items" in notes[0]
    assert "probes.default.shards = 9 splits 2 batches of 32 samples" in notes[1]


@pytest.mark.parametrize("over, key", [({"priors": {"default": {"n_probe": 1000}}}, "priors.default.n_probe"),
                                       ({"diagnostics": {"n_samples": 1000}}, "diagnostics.n_samples")])
def test_snakemake_refuses_them_before_any_job(tmp_path, over, key):
    for item in ("Snakefile", "workflow", "config"):
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / item)
    (tmp_path / "over.yaml").write_text(yaml.safe_dump(over))
    res = subprocess.run(["snakemake", "-n", "--cores", "1", "--configfile", "over.yaml"],
                         cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    out = res.stdout + res.stderr
    assert res.returncode != 0
    errors = [l for l in out.splitlines() if l.startswith("Error:")]
    assert len(errors) == 1 and key in errors[0] and "Traceback" not in out, out[-2000:]
    assert not (tmp_path / "results").exists() and not (tmp_path / "resources").exists()


def test_mc_num_on_one_token_answers_is_named():
    # Synth-MC's answers are one word, one token of the tiny tokenizer, which both tiny
    # families score exactly (exact_below 2): mc_num draws nothing there
    notes = mc_num_notes(_config({"tasks": {"synth_mc": {"mc_num": 8}}}))
    assert notes == ["Note: config: tasks.synth_mc.mc_num = 8 has no effect: every answer of "
                     "Synth-MC (synth_mc) is one token, which tiny-dream and tiny-llada score "
                     "exactly (exact_below 2), drawing no Monte-Carlo samples; the key can go"]
    assert config_notes(_config({"tasks": {"synth_mc": {"mc_num": 8}}})) == notes
    over = {"tasks": {"synth_mc": {"by_family": {"tiny-dream": {"mc_num": 4}}}}}
    assert "tasks.synth_mc.by_family.tiny-dream.mc_num = 4 has no effect" in mc_num_notes(_config(over))[0]
    # sampled after all: exact scoring switched off, or a generation task
    assert mc_num_notes(_config({"tasks": {"synth_mc": {"mc_num": 8, "exact_below": 0}}})) == []
    assert mc_num_notes(_config({"tasks": {"synth_mc": {"mc_num": 8, "by_model": {
        "tiny-llada": {"exact_below": 1}}}}})) == []
    assert mc_num_notes(_config({"tasks": {"synth_gen": {"mc_num": 8}}})) == []


def test_the_one_token_families_are_the_adapters():
    from fair_calib.names import registry
    from fair_calib.models.adapters import get_adapter
    from fair_calib.models.tiny.corpus import build_corpus
    from fair_calib.models.tiny.tokenizer import build_tokenizer

    for family, below in registry.EXACT_BELOW.items():
        assert get_adapter(family).likelihood["exact_below"] == below, family
    assert set(registry.EXACT_BELOW) == set(registry.FAMILIES)
    # every synthetic multiple-choice answer is one token of the tiny tokenizer
    data = build_corpus({"seed": 0, "corpus": {"n_train_docs": 2000, "n_mc_items": 50}})
    words = {c for item in data["synth_mc"] for c in item["choices"]}
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "train.txt").write_text("\n".join(data["train"]) + "\n")
        tok = build_tokenizer(Path(tmp) / "train.txt")
    assert all(len(tok(w, add_special_tokens=False)["input_ids"]) == 1 for w in words), words


# ------------------------------------------------------------------ issue 42: method shapes
# The released checkpoints' config.json fields that fix their widths (docs: shared/REFERENCE.md)
LLADA_8B = {"model_type": "llada", "d_model": 4096, "n_heads": 32, "n_kv_heads": 32,
            "mlp_hidden_size": 12288}
DREAM_7B = {"model_type": "Dream", "hidden_size": 3584, "num_attention_heads": 28,
            "num_key_value_heads": 4, "intermediate_size": 18944}
QDLM_IDS = {"GSAI-ML/LLaDA-8B-Base": LLADA_8B, "GSAI-ML/LLaDA-8B-Instruct": LLADA_8B,
            "Dream-org/Dream-v0-Base-7B": DREAM_7B, "Dream-org/Dream-v0-Instruct-7B": DREAM_7B}


@pytest.fixture
def cached_configs(tmp_path, monkeypatch):
    """The qdlm grid's hub ids with their config.json in a (stand-in) local Hugging Face cache."""
    import huggingface_hub

    paths = {}
    for hub_id, fields in QDLM_IDS.items():
        folder = tmp_path / hub_id.replace("/", "--")
        folder.mkdir()
        (folder / "config.json").write_text(__import__("json").dumps(fields))
        paths[hub_id] = str(folder / "config.json")
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache",
                        lambda repo, name, **kw: paths.get(repo) if name == "config.json" else None)
    return paths


def test_qdlm_grid_fits_the_released_widths(cached_configs):
    """QDLM's group 128 and DuQuant blocks of 128 divide LLaDA-8B's 4096 / 12288 and Dream-7B's
    3584 / 18944; QuaRot has Hadamard matrices for 32 and 28 heads and 12288 = 12 x 1024,
    18944 = 148 x 128."""
    check_config(_config("qdlm.yaml"))


def test_a_hub_checkpoints_width_is_named_by_its_config_json(cached_configs):
    cfg = _config("qdlm.yaml", {"methods": {"awq-w4": {"group_size": 96}}})
    with pytest.raises(C.ConfigError) as err:
        check_config(cfg)
    msg = str(err.value)
    assert msg.startswith("config: methods.awq-w4.group_size = 96 does not divide the 3584 input "
                          "columns of dream-7b-base's q/k/v and gate/up linears ("), msg
    assert f"{cached_configs['Dream-org/Dream-v0-Base-7B']}: hidden_size" in msg and "\n" not in msg


def test_widths_unknown_before_the_job_are_left_to_it(monkeypatch):
    """A hub id not in the local cache: its widths come with its download, in the job."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **kw: None)
    check_config(_config("qdlm.yaml", {"methods": {"awq-w4": {"group_size": 96}}}))


SHAPE_LIMITS = [
    # a method's default against the smoke models' 64 columns, said to be the default
    (["smoke.yaml", "qdlm_tiny.yaml", {"methods": {"duquant": {"block_size": None}}}],
     "methods.duquant.block_size = 128 (the default) does not divide the 64 input columns"),
    # a tiny model's width left to the trainer's default (hidden 128, intermediate 384)
    (["qdlm_tiny.yaml", {"models": {"tiny-dream": {"train": None}}},
      {"methods": {"awq": {"group_size": 96}}}],
     "methods.awq.group_size = 96 does not divide the 128 input columns of tiny-dream's q/k/v "
     "and gate/up linears (models.tiny-dream.train.hidden (default 128))"),
    # QuaRot: 6 heads have no Hadamard matrix for the online rotation across heads
    ([{"models": {"tiny-llada": {"train": {"hidden": 96, "heads": 6}}},
       "methods": {"quarot": {"type": "quarot", "label": "QuaRot"}},
       "tables": {"main": {"methods": ["fp", "rtn", "quarot"]}}}],
     "methods.quarot.online_hadamard (true) on tiny-llada: no Hadamard matrix of order 6 "
     "(heads: models.tiny-llada.train.heads)"),
    ([{"models": {"tiny-llada": {"train": {"intermediate": 208}}},
       "methods": {"quarot": {"type": "quarot", "label": "QuaRot"}},
       "tables": {"main": {"methods": ["fp", "rtn", "quarot"]}}}],
     "methods.quarot (type quarot) on tiny-llada: the online down_proj rotation (intermediate: "
     "models.tiny-llada.train.intermediate): width 208 = 52 x 4"),
]


def _without_nones(d):
    return {k: _without_nones(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}


@pytest.mark.parametrize("overs, needle", SHAPE_LIMITS, ids=["default", "tiny-default", "heads", "intermediate"])
def test_a_shape_its_job_would_refuse_is_a_config_error(overs, needle):
    cfg = C.load_yaml(REPO / "config/config.yaml")
    for over in overs:
        cfg = _merge(cfg, C.load_yaml(REPO / "config" / over) if isinstance(over, str) else over)
    cfg = C.validate_config(_without_nones(cfg))
    with pytest.raises(C.ConfigError) as err:
        check_config(cfg)
    assert needle in str(err.value) and "\n" not in str(err.value), err.value


def test_shapes_are_checked_for_the_calibrations_the_run_plans_only():
    # an AWQ entry no table uses: no job would meet it
    check_config(_config("smoke.yaml", "qdlm_tiny.yaml",
                         {"methods": {"awq-spare": {"type": "awq", "group_size": 48}}}))
    # QuaRot without the online rotations needs no Hadamard of order 6
    check_config(_config({"models": {"tiny-llada": {"train": {"hidden": 96, "heads": 6}}},
                          "methods": {"quarot": {"type": "quarot", "label": "QuaRot",
                                                 "online_hadamard": False}},
                          "tables": {"main": {"methods": ["fp", "rtn", "quarot"]}}}))
