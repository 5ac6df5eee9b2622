"""Activation outliers by a function-preserving channel rescaling (fair_calib/models/outliers.py):
the same logits, the named input channels of every quantized linear exactly ``scale`` times
larger and every other channel untouched, per-token activation quantization worse."""
import copy
import json

import pytest
import torch

from fair_calib.checks.config import ConfigError
from fair_calib.models.outliers import SITES, inject_outliers
from fair_calib.quant.quantizers import ActQuantizer


def _model(arch: str, kv_heads: int = 4):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=kv_heads, use_cache=False)
    torch.manual_seed(0)
    model = (LlamaForCausalLM(LlamaConfig(**common)) if arch == "llama"
             else Qwen2ForCausalLM(Qwen2Config(**common)))
    with torch.no_grad():      # norms and biases away from their initial 1 and 0
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.3)
    return model.double().eval()


def _linear_inputs(model, ids) -> dict[str, torch.Tensor]:
    seen, hooks = {}, []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".layers." in name:
            hooks.append(mod.register_forward_pre_hook(
                lambda m, inp, name=name: seen.__setitem__(name, inp[0].detach().clone())))
    with torch.no_grad():
        logits = model(ids).logits
    for h in hooks:
        h.remove()
    return {"logits": logits, **seen}


@pytest.mark.parametrize("arch,kv_heads", [("llama", 4), ("qwen2", 2)])
def test_outliers_keep_the_function_and_scale_only_their_channels(arch, kv_heads):
    base = _model(arch, kv_heads)
    out = copy.deepcopy(base)
    rec = inject_outliers(out, channels=3, scale=25.0, seed=1)
    ids = torch.randint(0, 50, (2, 12))
    a, b = _linear_inputs(base, ids), _linear_inputs(out, ids)
    torch.testing.assert_close(b["logits"], a["logits"], rtol=0, atol=1e-10)
    head_dim = 32 // 4
    for entry in rec["layers"]:
        i = entry["layer"]
        sites = {"self_attn.q_proj": entry["qkv_in"], "self_attn.v_proj": entry["qkv_in"],
                 "mlp.up_proj": entry["gate_up_in"], "self_attn.o_proj": entry["o_in"],
                 "mlp.down_proj": entry["down_in"]}
        for linear, cols in sites.items():
            name = f"model.layers.{i}.{linear}"
            ratio = torch.ones(a[name].shape[-1], dtype=torch.float64)
            ratio[cols] = 25.0
            torch.testing.assert_close(b[name], a[name] * ratio, rtol=1e-9, atol=1e-12)
        # o_proj: each drawn v row feeds every query head of its kv group
        assert len(entry["o_in"]) == 3 * (4 // kv_heads)
        assert {c % head_dim for c in entry["o_in"]} <= set(range(head_dim))


def test_outliers_make_per_token_activation_quantization_lose_the_rest():
    """What the linear computes from 4-bit per-token activations moves much further from its
    full-precision output once its input has outlier channels (the same output either way)."""
    base = _model("llama")
    out = copy.deepcopy(base)
    inject_outliers(out, channels=2, scale=30.0)
    ids = torch.randint(0, 50, (2, 12))
    a, b = _linear_inputs(base, ids), _linear_inputs(out, ids)
    q = ActQuantizer(4)

    @torch.no_grad()
    def output_error(model, x, name):
        linear = model.get_submodule(name).float()
        want = linear(x.float())
        return float((linear(q(x.float())) - want).norm() / want.norm())
    for name in ("model.layers.1.self_attn.q_proj", "model.layers.1.mlp.down_proj"):
        assert output_error(out, b[name], name) > 2 * output_error(base, a[name], name)


def test_a_site_list_keeps_the_other_sites_channels():
    full, part = _model("llama"), _model("llama")
    rec_full = inject_outliers(full, 2, 10.0, seed=3)
    rec_part = inject_outliers(part, 2, 10.0, seed=3, sites=("up_down",))
    assert [e["down_in"] for e in rec_part["layers"]] == [e["down_in"] for e in rec_full["layers"]]
    assert "qkv_in" not in rec_part["layers"][0]
    base = _model("llama")
    assert torch.equal(part.model.layers[0].input_layernorm.weight,
                       base.model.layers[0].input_layernorm.weight)


@pytest.mark.parametrize("kwargs,match", [({"channels": 2, "scale": 1.0}, "scale 1.0 must be > 1"),
                                          ({"channels": 0, "scale": 4.0}, "channels 0"),
                                          ({"channels": 40, "scale": 4.0}, "exceeds the widths"),
                                          ({"channels": 2, "scale": 4.0, "sites": ("qk",)},
                                           "unknown")])
def test_bad_outlier_settings_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        inject_outliers(_model("llama"), **kwargs)
    assert SITES == ("norm", "v_o", "up_down")


def test_outliers_are_read_only_on_a_converted_model():
    from fair_calib.checks.config import merged_config
    from fair_calib.checks.references import check_config
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    cfg = merged_config([repo / "config/gpu_trained.yaml"], base=repo / "config/config.yaml")
    check_config(cfg)
    cfg["models"]["wide-llada-native"]["outliers"] = {"channels": 2, "scale": 4.0}
    with pytest.raises(ConfigError, match="models.wide-llada-native.outliers is only read"):
        check_config(cfg)


def test_convert_hub_writes_the_outliers_it_gave(tmp_path):
    """convert-hub with outliers: the hub-layout model's logits are the trained model's (within
    float32 rounding) and outliers.json says which channels were scaled."""
    from fair_calib.models.adapters import load_model
    from fair_calib.models.tiny.tokenizer import train_tokenizer, wrap_fast
    from fair_calib.models.tiny.train import DEFAULT_TRAIN, build_model
    from fair_calib.models.toy_hub import run_cli

    text = ["Question : what colour is the plosk ? Answer : red", "the maple is a tree"]
    tok = wrap_fast(train_tokenizer(text))
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("[PAD]", "[MASK]", "[EOS]", "[BOS]")}
    train = {**DEFAULT_TRAIN, "hidden": 32, "heads": 4, "intermediate": 48, "layers": 2}
    torch.manual_seed(0)
    build_model("tiny-dream", len(tok), train, ids).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    (tmp_path / "tiny" / "fair_calib.json").write_text(json.dumps({"family": "tiny-dream"}))
    run_cli(["--src", str(tmp_path / "tiny"), "--family", "dream", "--out", str(tmp_path / "hub"),
             "--outliers", json.dumps({"channels": 2, "scale": 30.0, "seed": 0})])
    rec = json.loads((tmp_path / "hub" / "outliers.json").read_text())
    assert rec["scale"] == 30.0 and len(rec["layers"]) == 2 and len(rec["layers"][0]["down_in"]) == 2
    a, b = load_model(tmp_path / "tiny", "tiny-dream"), load_model(tmp_path / "hub", "dream")
    x = torch.tensor(a.tokenizer(text[:1])["input_ids"])
    with torch.no_grad():
        la, lb = a.logits(x), b.logits(x)
    torch.testing.assert_close(lb, la, rtol=1e-4, atol=1e-4)
    assert not torch.equal(a.blocks[0].mlp.up_proj.weight, b.blocks[0].mlp.up_proj.weight)
