"""Released LLaDA / Dream checkpoints on transformers' native classes (fair_calib.models.hub).

Hand-built folders in the hub's layout (tests/fixtures/hub_checkpoints.py) are loaded through
``load_model`` and compared with a forward the test computes from the same weights."""
import json

import pytest
import torch
import transformers

from fixtures.hub_checkpoints import (authors_llada_logits, dream_checkpoint, llada_checkpoint,
                                      llada_config, reference_logits)
from fair_calib.models.adapters import load_model
from fair_calib.models.hub import (LLADA_LAYOUT, HubConfigError, UnsupportedTransformersError,
                                   save_hub_layout)

CHECKPOINTS = {"llada": llada_checkpoint, "dream": dream_checkpoint}


def _ids(n_rows=2, n=11, seed=1):
    return torch.randint(0, 90, (n_rows, n), generator=torch.Generator().manual_seed(seed))


def _shifted(raw):
    return torch.cat([raw[:, :1], raw[:, :-1]], dim=1)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_native_forward_equals_the_authors_arithmetic(family, tmp_path):
    cfg, state = CHECKPOINTS[family](tmp_path / family)
    lm = load_model(tmp_path / family, family)
    ids = _ids()
    with torch.no_grad():
        got = lm.logits(ids)
    raw = reference_logits(family, cfg, state, ids)
    want = _shifted(raw) if family == "dream" else raw     # Dream's shift, exactly once
    assert got.shape == (2, 11, 96)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def test_llada_grouped_query_heads(tmp_path):
    cfg, state = llada_checkpoint(tmp_path / "gqa", kv_heads=2)
    lm = load_model(tmp_path / "gqa", "llada")
    ids = _ids()
    with torch.no_grad():
        got = lm.logits(ids)
    want = reference_logits("llada", cfg, state, ids)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_bf16_checkpoint_loads_in_bf16_within_bf16_noise(family, tmp_path):
    cfg, state = CHECKPOINTS[family](tmp_path / family, dtype=torch.bfloat16)
    lm = load_model(tmp_path / family, family, dtype="bfloat16")
    assert {p.dtype for p in lm.model.parameters()} == {torch.bfloat16}
    ids = _ids()
    with torch.no_grad():
        got = lm.logits(ids).float()
    raw = reference_logits(family, cfg, {k: v.bfloat16() for k, v in state.items()}, ids)
    want = _shifted(raw) if family == "dream" else raw
    # bf16 keeps 8 bits of mantissa; two blocks of bf16 matmuls stay within a few percent.
    assert (got - want).abs().max() <= 0.05 * want.abs().max()


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_left_padded_rows_equal_the_rows_alone(family, tmp_path):
    cfg, state = CHECKPOINTS[family](tmp_path / family)
    lm = load_model(tmp_path / family, family)
    rows = [_ids(1, n, seed=n)[0] for n in (11, 7, 4)]
    batch = torch.full((3, 11), lm.pad_id)
    keep = torch.zeros(3, 11, dtype=torch.long)
    for r, row in enumerate(rows):
        batch[r, 11 - len(row):] = row
        keep[r, 11 - len(row):] = 1
    with torch.no_grad():
        padded = lm.logits(batch, attention_mask=keep)
        for r, row in enumerate(rows):
            alone = lm.logits(row[None])
            assert torch.allclose(padded[r, 11 - len(row):], alone[0], atol=1e-5), (family, r)
    raw = reference_logits(family, cfg, state, batch, keep)
    want = _shifted(raw) if family == "dream" else raw.clone()
    for r, row in enumerate(rows):              # a first token reads its own logits
        want[r, 11 - len(row)] = raw[r, 11 - len(row)]
    real = keep.bool()
    assert (padded[real] - want[real]).abs().max() <= 1e-4 * want.abs().max()


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_mask_eos_and_pad_come_from_the_checkpoint(family, tmp_path):
    CHECKPOINTS[family](tmp_path / family)
    lm = load_model(tmp_path / family, family)
    assert lm.mask_id == 93
    assert lm.eos_id == (92 if family == "llada" else 90)   # <|eot_id|> / <|endoftext|>
    assert lm.pad_id == 90


def test_round_trip_of_a_native_model_through_the_hub_layout(tmp_path):
    cfg, state = llada_checkpoint(tmp_path / "a")
    lm = load_model(tmp_path / "a", "llada")
    save_hub_layout(lm.model, LLADA_LAYOUT, tmp_path / "b", max_shard_bytes=4096)
    written = json.loads((tmp_path / "b" / "model.safetensors.index.json").read_text())
    assert set(written["weight_map"]) == set(state)        # the authors' key names exactly
    hub_cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    for key in ("d_model", "n_heads", "n_kv_heads", "n_layers", "mlp_hidden_size", "rope_theta",
                "rms_norm_eps", "block_type", "activation_type", "weight_tying"):
        assert hub_cfg[key] == cfg[key], key


@pytest.mark.parametrize("field,value", [("block_type", "sequential"), ("scale_logits", True),
                                         ("include_qkv_bias", True), ("activation_type", "swiglu"),
                                         ("input_emb_norm", True)])
def test_llada_config_the_native_class_cannot_reproduce_is_refused(field, value, tmp_path):
    llada_checkpoint(tmp_path / "m")
    cfg = llada_config()
    cfg[field] = value
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HubConfigError, match=field):
        load_model(tmp_path / "m", "llada")


def test_a_missing_tensor_is_named_not_initialised(tmp_path):
    from safetensors.torch import load_file, save_file
    llada_checkpoint(tmp_path / "m")
    shard = tmp_path / "m" / "model-00002-of-00002.safetensors"
    tensors = load_file(str(shard))
    dropped = sorted(tensors)[0]
    del tensors[dropped]
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(HubConfigError, match="missing"):
        load_model(tmp_path / "m", "llada")


def test_wrong_family_names_the_model_type(tmp_path):
    dream_checkpoint(tmp_path / "d")
    with pytest.raises(HubConfigError, match="model_type='Dream'"):
        load_model(tmp_path / "d", "llada")


def test_remote_loader_is_refused_under_transformers_5_naming_the_version(tmp_path):
    llada_checkpoint(tmp_path / "m")
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("the refusal is for transformers 5")
    with pytest.raises(RuntimeError, match=transformers.__version__):
        load_model(tmp_path / "m", "llada", loader="remote")


def test_a_missing_local_folder_is_not_taken_for_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "resources").mkdir()
    with pytest.raises(FileNotFoundError, match="neither"):
        load_model("resources/llada", "llada")


def test_window_logits_of_a_padded_shifted_batch_equal_the_full_ones(tmp_path):
    dream_checkpoint(tmp_path / "d")
    lm = load_model(tmp_path / "d", "dream")
    batch = _ids(2, 9)
    keep = torch.ones_like(batch)
    keep[1, :5] = 0                             # row 1's first token sits inside the window
    with torch.no_grad():
        full = lm.logits(batch, attention_mask=keep)
        for k in (3, 4, 5, 9):
            assert torch.allclose(lm.logits(batch, attention_mask=keep, keep_last=k),
                                  full[:, -k:], atol=1e-6), k


@pytest.mark.parametrize("family,hub_id", [("llada", "GSAI-ML/LLaDA-8B-Base"),
                                           ("dream", "Dream-org/Dream-v0-Base-7B")])
def test_hub_id_loads_offline_from_a_hugging_face_cache(family, hub_id, tmp_path):
    """The cluster path: a pre-downloaded HF cache, HF_HUB_OFFLINE=1, the real hub id."""
    import os
    import subprocess
    import sys
    cache = tmp_path / "hub"
    snap = cache / f"models--{hub_id.replace('/', '--')}" / "snapshots" / ("0" * 40)
    CHECKPOINTS[family](snap)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("0" * 40)
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    code = ("from fair_calib.models.adapters import load_model; "
            f"lm = load_model({hub_id!r}, {family!r}); print(lm.mask_id, len(lm.blocks))")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split()[-2:] == ["93", "2"]


@pytest.mark.parametrize("tiny,family", [("tiny-llada", "llada"), ("tiny-dream", "dream")])
def test_a_converted_tiny_model_is_the_same_model(tiny, family, tmp_path):
    """convert-hub writes the hub layout; read back through the hub loader it is the same
    model (logits, tokens, mask id): what config/hub_layout.yaml relies on."""
    from fair_calib.models.tiny.tokenizer import train_tokenizer, wrap_fast
    from fair_calib.models.tiny.train import DEFAULT_TRAIN, build_model
    from fair_calib.models.toy_hub import convert_tiny

    text = ["Question : what colour is the plosk ? Answer : red", "the maple is a tree"]
    tok = wrap_fast(train_tokenizer(text))
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("[PAD]", "[MASK]", "[EOS]", "[BOS]")}
    train = {**DEFAULT_TRAIN, "hidden": 32, "heads": 4, "intermediate": 48, "layers": 2}
    torch.manual_seed(0)
    build_model(tiny, len(tok), train, ids).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    (tmp_path / "tiny" / "fair_calib.json").write_text(json.dumps({"family": tiny}))
    convert_tiny(tmp_path / "tiny", family, tmp_path / "hub", max_shard_bytes=16 * 1024)
    assert (tmp_path / "hub" / "model.safetensors.index.json").is_file()    # sharded
    a, b = load_model(tmp_path / "tiny", tiny), load_model(tmp_path / "hub", family)
    assert a.mask_id == b.mask_id and a.eos_id == b.eos_id and a.pad_id == b.pad_id
    assert a.tokenizer(text)["input_ids"] == b.tokenizer(text)["input_ids"]
    x = torch.tensor(a.tokenizer(text[:1])["input_ids"])
    with torch.no_grad():
        assert torch.equal(a.logits(x), b.logits(x))


@pytest.mark.parametrize("full_precision", [True, False])
def test_llada_bf16_logits_are_the_authors_bit_for_bit(full_precision, tmp_path):
    """``rope_full_precision`` (config.json): True (the released value) rotates q and k in
    float32 as the authors' RotaryEmbedding does, False in bf16; either way the bf16 logits
    equal the authors' bf16 arithmetic exactly, and the two settings differ."""
    cfg, state = llada_checkpoint(tmp_path / "m", dtype=torch.bfloat16)
    cfg = {**cfg, "rope_full_precision": full_precision}
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    lm = load_model(tmp_path / "m", "llada", dtype="bfloat16")
    sd = {k: v.bfloat16() for k, v in state.items()}
    ids = _ids()
    with torch.no_grad():
        got = lm.logits(ids)
        want = authors_llada_logits(cfg, sd, ids)
        other = authors_llada_logits({**cfg, "rope_full_precision": not full_precision}, sd, ids)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, want)
    assert not torch.equal(got, other)          # the setting changes bf16 logits here


def _pretend_transformers(monkeypatch, version: str) -> None:
    """The installed transformers reports ``version``. Loading a model can replace the module
    object in ``sys.modules`` (transformers' lazy module), so patch the current entry."""
    import sys
    monkeypatch.setattr(sys.modules["transformers"], "__version__", version)


@pytest.mark.parametrize("version", ["5.5.0", "5.24.0", "5.99.1", "5.6.0.dev0"])
def test_supported_transformers_versions_load(version, tmp_path, monkeypatch):
    llada_checkpoint(tmp_path / "m")
    _pretend_transformers(monkeypatch, version)
    assert len(load_model(tmp_path / "m", "llada").blocks) == 2


@pytest.mark.parametrize("version", ["4.57.1", "4.46.3", "5.4.2", "6.0.0", "not-a-version"])
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_unsupported_transformers_versions_are_refused_by_name(version, family, tmp_path,
                                                                monkeypatch):
    """Under 4.57.1 the native classes load but ignore the rotary setting (theta 10000):
    refused before any weight is read, naming the version and the supported range."""
    CHECKPOINTS[family](tmp_path / family)
    _pretend_transformers(monkeypatch, version)
    with pytest.raises(UnsupportedTransformersError, match=rf"{version}.*>=5\.5,<6"):
        load_model(tmp_path / family, family)


def test_llada_rotary_frequencies_follow_the_model_to_its_device(tmp_path):
    """The authors build LLaDA's sin/cos on the GPU when there is one; CUDA's ``pow`` differs
    from the CPU's in the last bit for a few frequencies, so the frequencies are recomputed
    with their formula on whatever device the buffer moved to (here: a move is simulated by
    forgetting where they were computed, after spoiling them)."""
    from fair_calib.models.hub import authors_inv_freq
    cfg, _ = llada_checkpoint(tmp_path / "m")
    lm = load_model(tmp_path / "m", "llada")
    rotary = lm.model.model.rotary_emb
    want = authors_inv_freq(cfg["rope_theta"], cfg["d_model"] // cfg["n_heads"], "cpu")
    ids = _ids()
    with torch.no_grad():
        before = lm.logits(ids)
        assert torch.equal(rotary.inv_freq, want)
        rotary.inv_freq.mul_(1.5)
        rotary._inv_freq_device = torch.device("meta")    # "computed elsewhere"
        assert torch.equal(lm.logits(ids), before)
    assert torch.equal(rotary.inv_freq, want)


@pytest.mark.parametrize("family, kv_heads, mlp_ratio", [("llada", 4, None), ("llada", 2, None),
                                                         ("llada", 4, 1.5), ("dream", None, None)])
def test_widths_read_before_any_job_are_the_loaded_models(family, kv_heads, mlp_ratio, tmp_path):
    """fair_calib.checks.model_widths reads config.json without torch for the plan-time shape checks
    (fair_calib.checks.method_shapes); its widths are the input widths of the linears the loader
    builds: LLaDA's field names (mlp_ratio x d_model without mlp_hidden_size), GQA, Dream's."""
    from fair_calib.checks.model_widths import config_json_widths

    folder = tmp_path / "ckpt"
    if family == "llada":
        llada_checkpoint(folder, kv_heads=kv_heads)
    else:
        dream_checkpoint(folder)
    if mlp_ratio is not None:              # the authors' default path: mlp_ratio x d_model
        cfg = json.loads((folder / "config.json").read_text())
        assert cfg.pop("mlp_hidden_size") == mlp_ratio * cfg["d_model"]
        (folder / "config.json").write_text(json.dumps({**cfg, "mlp_ratio": mlp_ratio}))
    w = config_json_widths("m", family, folder / "config.json")
    block = load_model(folder, family).blocks[0]
    inputs = {"q/k/v and gate/up": {block.self_attn.q_proj.in_features, block.self_attn.k_proj.in_features,
                                    block.self_attn.v_proj.in_features, block.mlp.gate_proj.in_features,
                                    block.mlp.up_proj.in_features},
              "o_proj": {block.self_attn.o_proj.in_features},
              "down_proj": {block.mlp.down_proj.in_features}}
    assert {linears: {width} for linears, width, _ in w.linear_inputs()} == inputs
    assert w.heads * w.head_dim == block.self_attn.o_proj.in_features and w.heads == 4
