"""``awq`` against llm-awq's arithmetic (QDLM's copy: ``awq/quantize/auto_scale.py``,
``auto_clip.py``, ``quantizer.py``), written here from its code for a Llama-layout block (the
layout the project loads LLaDA onto; Dream's Qwen2 layout differs by its q/k/v biases and GQA):
``_search_module_scale`` over 20 ratios with ``module2inspect`` (self_attn with the block's
kwargs, mlp, the linear itself), ``apply_scale`` (norm / s, v rows / s, up rows / s), the
features divided by s, ``auto_clip_layer`` (10 shrink steps, every (n // 512)-th token) except
q/k, and ``pseudo_quantize_tensor`` with zero points. The default (``arithmetic: authors``)
equals it bit for bit (float32 block: every chosen ratio, scale, clip bound, weight);
``arithmetic: precise`` (mean |x| accumulated in float64, the loss summed in float64) equals
it up to rounding."""
import pytest
import torch

from fair_calib.calibrate import calibrate
from fair_calib.methods import load_quantized, make_method
from fair_calib.methods.awq import lca_name
from fair_calib.quant.blockio import call_block, capture_block_inputs
from fair_calib.quant.discovery import discover_groups, get_submodule
from fair_calib.quant.toy import tiny_random_loaded
from fixtures.llada_like import make_loaded as llada_like_loaded

torch.set_num_threads(1)
GS = 32


# ------------------------------------------------------------------ the reference, transcribed
def ref_pseudo_quantize(w, n_bit, q_group_size):
    org = w.shape
    w = w.reshape(-1, q_group_size)
    max_val = w.amax(dim=1, keepdim=True)
    min_val = w.amin(dim=1, keepdim=True)
    max_int, min_int = 2 ** n_bit - 1, 0
    scales = (max_val - min_val).clamp(min=1e-5) / max_int
    zeros = (-torch.round(min_val / scales)).clamp_(min_int, max_int)
    w = (torch.clamp(torch.round(w / scales) + zeros, min_int, max_int) - zeros) * scales
    return w.reshape(org)


def ref_search_scale(block, linears2scale, x, n_bit, kwargs={}, precise=False):
    """_search_module_scale; ``precise``: x_max accumulated in float64 and the loss summed in
    float64 (the project's ``arithmetic: precise``)."""
    org_out = block(x, **kwargs)
    org_out = org_out[0] if isinstance(org_out, tuple) else org_out
    if precise:
        x_max = (x.abs().double().reshape(-1, x.shape[-1]).sum(0) / x.reshape(-1, x.shape[-1]).shape[0]).float()
    else:
        x_max = x.abs().view(-1, x.shape[-1]).mean(0)        # get_act_scale
    best_error, best_ratio, best_scales = float("inf"), -1, None
    org_sd = {k: v.clone() for k, v in block.state_dict().items()}
    for ratio in range(20):
        ratio = ratio * 1 / 20
        scales = x_max.pow(ratio).clamp(min=1e-4).view(-1)
        scales = scales / (scales.max() * scales.min()).sqrt()
        for fc in linears2scale:
            fc.weight.mul_(scales.view(1, -1))
            fc.weight.data = ref_pseudo_quantize(fc.weight.data, n_bit, GS) / scales.view(1, -1)
        out = block(x, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        if precise:
            loss = float((org_out - out).double().pow(2).sum()) / org_out.numel()
        else:
            loss = (org_out - out).float().pow(2).mean().item()
        if loss < best_error:
            best_error, best_ratio, best_scales = loss, ratio, scales
        block.load_state_dict(org_sd)
    return best_scales.view(-1), best_ratio


def ref_auto_clip(w, input_feat, n_bit, n_grid=20, max_shrink=0.5, n_sample_token=512):
    input_feat = input_feat.view(-1, input_feat.shape[-1])
    input_feat = input_feat.reshape(1, input_feat.shape[0], -1, GS)
    # the reference's stride n // 512 is 0 (an error) below 512 tokens: 1 there
    input_feat = input_feat[:, 0::max(1, input_feat.shape[1] // n_sample_token)]
    w = w.reshape(w.shape[0], 1, -1, GS)
    oc_batch_size = 256 if w.shape[0] % 256 == 0 else 64
    w_all, best_max_val_all = w, []
    for i_b in range(-(-w.shape[0] // oc_batch_size)):     # llm-awq asserts divisibility
        w = w_all[i_b * oc_batch_size:(i_b + 1) * oc_batch_size]
        org_max_val = w.abs().amax(dim=-1, keepdim=True)
        best_max_val = org_max_val.clone()
        min_errs = torch.ones_like(org_max_val) * 1e9
        org_out = (input_feat * w).sum(dim=-1)
        for i_s in range(int(max_shrink * n_grid)):
            max_val = org_max_val * (1 - i_s / n_grid)
            min_val = -max_val
            cur_w = torch.clamp(w, min_val, max_val)
            q_w = ref_pseudo_quantize(cur_w, n_bit, GS)
            cur_out = (input_feat * q_w).sum(dim=-1)
            err = (cur_out - org_out).pow(2).mean(dim=1).view(min_errs.shape)
            cur_best_idx = err < min_errs
            min_errs[cur_best_idx] = err[cur_best_idx]
            best_max_val[cur_best_idx] = max_val[cur_best_idx]
        best_max_val_all.append(best_max_val)
    return torch.cat(best_max_val_all, dim=0).squeeze(1)


@torch.no_grad()
def ref_awq_block(layer, x_in, kwargs, n_bit, precise=False):
    """run_awq for one LlamaDecoderLayer (auto_scale_block's Llama branch, apply_scale,
    auto_clip_block, apply_clip, pseudo_quantize_model_weight)."""
    named = {n: m for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}
    feats = {n: [] for n in named}
    hs = [m.register_forward_hook(lambda m, a, o, n=n: feats[n].append(a[0].detach()))
          for n, m in named.items()]
    attn_kwargs = {}
    hs.append(layer.self_attn.register_forward_pre_hook(
        lambda m, a, k: attn_kwargs.update(k), with_kwargs=True))
    layer(x_in, **kwargs)
    for h in hs:
        h.remove()
    feats = {n: torch.cat(v) for n, v in feats.items()}
    a, mlp = layer.self_attn, layer.mlp
    attn_kwargs.pop("hidden_states", None)
    p = precise
    s_qkv, r1 = ref_search_scale(a, [a.q_proj, a.k_proj, a.v_proj], feats["self_attn.q_proj"], n_bit, attn_kwargs, p)
    s_o, r2 = ref_search_scale(a.o_proj, [a.o_proj], feats["self_attn.o_proj"], n_bit, {}, p)
    s_fc1, r3 = ref_search_scale(mlp, [mlp.gate_proj, mlp.up_proj], feats["mlp.gate_proj"], n_bit, {}, p)
    s_fc2, r4 = ref_search_scale(mlp.down_proj, [mlp.down_proj], feats["mlp.down_proj"], n_bit, {}, p)
    # apply_scale: scale_ln_fcs / scale_fc_fc, and the input features divided
    layer.input_layernorm.weight.div_(s_qkv)
    for fc in (a.q_proj, a.k_proj, a.v_proj):
        fc.weight.mul_(s_qkv.view(1, -1))
    a.v_proj.weight.div_(s_o.view(-1, 1))
    a.o_proj.weight.mul_(s_o.view(1, -1))
    layer.post_attention_layernorm.weight.div_(s_fc1)
    for fc in (mlp.gate_proj, mlp.up_proj):
        fc.weight.mul_(s_fc1.view(1, -1))
    mlp.up_proj.weight.div_(s_fc2.view(-1, 1))
    mlp.down_proj.weight.mul_(s_fc2.view(1, -1))
    for names, s in ((["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], s_qkv),
                     (["self_attn.o_proj"], s_o), (["mlp.gate_proj", "mlp.up_proj"], s_fc1),
                     (["mlp.down_proj"], s_fc2)):
        for n in names:
            feats[n].div_(s.view(1, -1))
    clips = {}
    for n, m in named.items():
        if any(k in n for k in ["q_", "k_", "query", "key", "Wqkv"]):
            continue
        mx = ref_auto_clip(m.weight, feats[n], n_bit)
        clips[n] = mx
        org = m.weight.shape
        mx = mx.to(m.weight.dtype)
        m.weight.data = torch.clamp(m.weight.data.reshape(*mx.shape[:2], -1), -mx, mx).reshape(org)
    for n, m in named.items():
        m.weight.data = ref_pseudo_quantize(m.weight.data, n_bit, GS)
    return {"scales": [s_qkv, s_o, s_fc1, s_fc2], "ratios": [r1, r2, r3, r4], "clips": clips}


def _edge_cases(block):
    """Inputs that reach the reference's guards: near-silent input channels (the 1e-4 floor
    of the scales) and all-positive / all-negative weight groups (the zero-point clamp)."""
    with torch.no_grad():
        block.input_layernorm.weight[5] = 1e-9
        block.post_attention_layernorm.weight[:8] = 1e-9
        block.self_attn.o_proj.weight[:4] = block.self_attn.o_proj.weight[:4].abs() + 0.05
        block.mlp.down_proj.weight[:4] = -block.mlp.down_proj.weight[:4].abs() - 0.05


# ------------------------------------------------------------------ comparisons
@pytest.mark.parametrize("arithmetic", ["authors", "precise"])
@pytest.mark.parametrize("bits", [4, 3])
def test_awq_block_equals_llm_awq(bits, arithmetic):
    ids = torch.randint(0, 60, (16, 64), generator=torch.Generator().manual_seed(3))  # 1024 tokens: stride 2
    lm = tiny_random_loaded("llama", layers=1)
    ref = tiny_random_loaded("llama", layers=1)
    for model in (lm, ref):
        _edge_cases(model.blocks[0])
    m = make_method({"type": "awq", "group_size": GS, "arithmetic": arithmetic}, bits, 16)
    m.prepare_model(lm)
    block, rblock = lm.blocks[0], ref.blocks[0]
    inputs = capture_block_inputs(lm.model, block, ids, 16)           # one micro-batch
    groups = discover_groups(block, lambda: call_block(block, inputs, 0))
    m.quantize_block(block, groups, [None] * len(groups), 0)
    m.fit_block(block, groups, inputs, 0, lambda b: call_block(block, inputs, b))

    rin = capture_block_inputs(ref.model, rblock, ids, 16)
    assert rin.hidden_key == 0 and not rin.args[0]
    precise = arithmetic == "precise"
    want = ref_awq_block(rblock, rin.hidden[0], dict(rin.kwargs[0]), bits, precise)
    got = m.search[0]
    assert [got["ratios"][j] for j in sorted(got["ratios"])] == want["ratios"]
    same = ((lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-6)) if precise else torch.equal)
    for j, s in zip(sorted(got["scales"]), want["scales"]):
        assert same(got["scales"][j], s), j
    assert set(got["clips"]) == set(want["clips"])
    for n, mx in want["clips"].items():
        assert same(got["clips"][n], mx), n
    for n, lin in rblock.named_modules():
        if isinstance(lin, torch.nn.Linear):
            w = get_submodule(block, n)._groups.dequantize()
            assert same(w, lin.weight), n
    for n in ("input_layernorm", "post_attention_layernorm"):
        assert same(get_submodule(block, n).weight, get_submodule(rblock, n).weight)
    # not vacuous: the search moved away from ratio 0 somewhere and clipped somewhere
    assert any(r > 0 for r in want["ratios"])
    assert any((mx < get_submodule(ref.blocks[0], n).weight.abs().amax()).any() for n, mx in want["clips"].items())


def test_the_two_arithmetics_differ_on_the_statistic():
    """Not vacuous: the float32 mean of llm-awq and the float64 accumulation differ in the
    last bit on real-size inputs (the setting reaches the statistic)."""
    from fair_calib.methods.awq import _llm_awq_mean_abs

    x = torch.randn(8, 512, 256, generator=torch.Generator().manual_seed(0)) * 3
    authors = _llm_awq_mean_abs([x[:4], x[4:]], "cpu")
    precise = (x.abs().double().reshape(-1, 256).sum(0) / (8 * 512)).float()
    assert torch.equal(authors, x.abs().view(-1, 256).mean(0))
    assert not torch.equal(authors, precise)


def test_the_comparison_sees_each_step():
    """A reference step changed (a finer clip grid, no zero point in the search) changes the
    chosen values."""
    torch.manual_seed(0)
    w = torch.randn(16, 64)
    x = torch.randn(600, 64) * torch.linspace(0.1, 4, 64)
    a = ref_auto_clip(w, x, 3)
    assert not torch.equal(a, ref_auto_clip(w, x, 3, n_grid=40))
    assert not torch.equal(ref_pseudo_quantize(w, 3, GS), ref_pseudo_quantize(w, 4, GS))


def test_gqa_skips_the_o_scale_and_flat_blocks_inspect_the_block(tmp_path):
    """Dream's layout (GQA): v_proj has fewer rows than o_proj has inputs, so o is not scaled
    (llm-awq PR 67); a block with no attention/MLP submodules (LLaDA's own tree) inspects the
    whole block for q/k/v and gate/up."""
    lm = tiny_random_loaded("qwen2", layers=1, kv_heads=2)
    m = make_method({"type": "awq", "group_size": GS}, 4, 16)
    ids = torch.randint(0, 60, (4, 16), generator=torch.Generator().manual_seed(0))
    calibrate(lm, m, ids, tmp_path / "q", batch_size=4, log=lambda s: None)
    prev = m.search[0]["prev"]
    assert [k for k, _ in prev.values()] == ["norm", "norm", "linear"]     # qkv, gate/up, down
    assert "self_attn.q_proj" not in m.search[0]["clips"] and "self_attn.v_proj" in m.search[0]["clips"]
    assert lca_name(["q_proj", "k_proj", "v_proj"]) == ""
    assert lca_name(["self_attn.q_proj", "self_attn.k_proj"]) == "self_attn"
    assert lca_name(["mlp.down_proj"]) == "mlp.down_proj"
    ll = llada_like_loaded()
    m2 = make_method({"type": "awq", "group_size": 16}, 4, 16)
    calibrate(ll, m2, ids % 40, tmp_path / "l", batch_size=4, log=lambda s: None)
    kinds = sorted(k for k, _ in m2.search[0]["prev"].values())
    assert kinds == ["linear", "linear", "norm", "norm"]


def test_awq_round_trips_and_refuses_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="weight-only"):
        make_method({"type": "awq"}, 4, 4)
    make = lambda: tiny_random_loaded("llama", layers=2)   # noqa: E731
    ids = torch.randint(0, 60, (8, 16), generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="group_size 48"):
        calibrate(make(), make_method({"type": "awq", "group_size": 48}, 4, 16), ids,
                  tmp_path / "bad", batch_size=4, log=lambda s: None)
    lm = make()
    calibrate(lm, make_method({"type": "awq", "group_size": GS}, 4, 16), ids, tmp_path / "ok",
              batch_size=4, log=lambda s: None)
    with torch.no_grad():
        want = lm.logits(ids)
        got = load_quantized(make(), tmp_path / "ok").logits(ids)
        fp = make().logits(ids)
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, fp, atol=1e-3)
