"""``smoothquant`` against QDLM's SmoothQuant (DuQuant's code base with ``--smooth --alpha 0.5
--epochs 0``), written here from its code: ``generate_act_scale_shift.get_act_scales`` (max |x|
per input channel over the calibration set), the scales of ``duquant.py`` (the weight maximum
of q_proj / o_proj / up_proj / down_proj only), ``truncate_number``, ``smooth_and_let_inplace``
(``smooth_fc_inplace`` for a GQA o_proj), the asymmetric per-channel weight and per-token
activation quantizers of ``UniformAffineQuantizer``. The default (``arithmetic: authors``) is
compared bit for bit with DuQuant's float16 layer (``qlayer.half()``) and its attention-matmul
quantizers (``qkt_matmul``/``pv_matmul``), run on the same model code; ``arithmetic: precise``
(float32) with the same steps in float32, up to rounding."""
import pytest
import torch

from fair_calib.calibrate import calibrate
from fair_calib.methods import load_quantized, make_method
from fair_calib.quant.discovery import get_submodule
from fair_calib.quant.half import QKVQuant
from fair_calib.quant.toy import tiny_random_loaded
from fixtures import duquant_layers
from fixtures.duquant_smoothing import (act_scales_of, ref_uaq_half, smooth_layer,
                                        smooth_layer_half, truncate_number)

torch.set_num_threads(1)
IDS = torch.randint(0, 60, (8, 16), generator=torch.Generator().manual_seed(2))


def ref_uaq(x, n_bits):
    """UniformAffineQuantizer(symmetric=False), per_token_dynamic_calibration over dim -1."""
    xmin = x.amin([-1], keepdim=True)
    xmax = x.amax([-1], keepdim=True)
    scale = ((xmax - xmin) / (2 ** n_bits - 1)).clamp(min=1e-5, max=1e4)
    zp = (-xmin / scale).clamp(min=-1e4, max=1e4).round()
    x_int = torch.round(x / scale) + zp
    x_int = x_int.clamp(0, 2 ** n_bits - 1)
    return (x_int - zp) * scale


@torch.no_grad()
def ref_smoothquant_half(lm, alpha, w_bits, a_bits, style="llada", rope32=False):
    """``duquant()`` without ``--quant_method`` (SmoothQuant) on every layer, in place:
    scales from the float16 act scales and the weight in its dtype, ``qlayer.half()``,
    ``truncate_number``, ``smooth_and_let_inplace`` (qkv, fc1, down, then out or, under GQA,
    ``smooth_fc_inplace``), ``quant_inplace``; activations and Q, K, V quantized; each layer
    computing as DuQuant's ``style`` layer class (``tests/fixtures/duquant_layers.py``). Returns
    the per-block float16 scales by pair name."""
    model = lm.model
    act_scales = act_scales_of(model, IDS)
    q = lambda x: ref_uaq_half(x, a_bits)      # noqa: E731
    out = []
    for i, layer in enumerate(model.model.layers):
        a = layer.self_attn
        sc, online = smooth_layer_half(layer, i, act_scales, alpha)
        duquant_layers.use_layer(layer, model.config, style, duquant_layers.Quant(q, q, q), rope32)
        for m in layer.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.data = ref_uaq_half(m.weight.data, w_bits)      # quant_inplace

                def pre(mod, args, sm=(online if m is a.o_proj else None)):
                    x = args[0]
                    if sm is not None:
                        x /= sm
                    return (ref_uaq_half(x, a_bits),)
                m.register_forward_pre_hook(pre)
        out.append(sc)
    return out


@torch.no_grad()
def ref_smoothquant(lm, alpha, w_bits, a_bits):
    """DuQuant's smoothing and quantization of every block of a Llama/Qwen2-layout model,
    in place; returns the per-block scales by DuQuant pair name."""
    model = lm.model
    act_scales = act_scales_of(model, IDS)
    out = []
    for i, layer in enumerate(model.model.layers):
        a = layer.self_attn
        sc, online = smooth_layer(layer, i, act_scales, alpha)
        for m in layer.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.data = ref_uaq(m.weight.data, w_bits)     # quant_inplace, per channel

                def pre(mod, args, sm=(online if m is a.o_proj else None)):
                    x = args[0]
                    if sm is not None:
                        x = x / sm
                    return (ref_uaq(x, a_bits),)
                m.register_forward_pre_hook(pre)
        out.append(sc)
    return out


def _maker(arch):
    return ((lambda: tiny_random_loaded("llama", layers=2)) if arch == "llama" else
            (lambda: tiny_random_loaded("qwen2", layers=2, kv_heads=2)))


def _silent_channels(*models):
    for model in models:      # near-silent channels: scales below 1e-2 (truncate_number)
        with torch.no_grad():
            model.blocks[0].input_layernorm.weight[3:6] = 1e-7


@pytest.mark.parametrize("layout,bits", [("llada", (8, 8)), ("llada", (4, 8)),
                                         ("llada-rope32", (8, 8)), ("dream", (8, 8)),
                                         ("dream", (4, 8)), ("llama", (8, 8))])
def test_smoothquant_equals_duquants_layers_bit_for_bit(tmp_path, layout, bits):
    """The default against DuQuant's float16 layer classes (``int_llada_layer`` /
    ``int_dream_layer`` / ``int_llama_layer``): every activation statistic (its scale), folded
    norm, quantized weight, each quantized block's output and the logits equal."""
    from fair_calib.quant.blockio import BlockInputs, call_block, capture_block_inputs

    make, rope32 = duquant_layers.LAYOUTS[layout]
    style = layout.split("-")[0]
    lm, ref = make(), make()
    _silent_channels(lm, ref)
    m = make_method({"type": "smoothquant", "alpha": 0.5}, *bits)
    calibrate(lm, m, IDS, tmp_path, batch_size=4, log=lambda s: None)
    assert lm.blocks[0]._duquant_layer == style
    want_scales = ref_smoothquant_half(ref, 0.5, *bits, style=style, rope32=rope32)
    for i, sc in enumerate(want_scales):
        for j, key in enumerate(["qkv", "out", "fc1", "down"]):
            assert torch.equal(m.scales[i][j], sc[key]), (i, key)
        for n, lin in ref.blocks[i].named_modules():
            if isinstance(lin, torch.nn.Linear):
                assert torch.equal(get_submodule(lm.blocks[i], n).w_quant, lin.weight), (i, n)
        for n in ("input_layernorm", "post_attention_layernorm"):
            assert torch.equal(get_submodule(lm.blocks[i], n).weight,
                               get_submodule(ref.blocks[i], n).weight), (i, n)
    with torch.no_grad():
        inputs = capture_block_inputs(lm.model, lm.blocks[0], IDS[:4], 4)
        h = inputs.hidden[0]
        for i in range(len(want_scales)):
            out = call_block(lm.blocks[i], inputs, 0, h)
            assert torch.equal(out, call_block(ref.blocks[i], inputs, 0, h)), i
            h = out
        if style != "llada":       # a padded batch: the mask as Llama's / Dream's layer adds it
            pad = torch.ones(IDS[:4].shape, dtype=torch.long)
            pad[0, :5] = pad[2, :3] = 0
            inputs = capture_block_inputs(lm.model, lm.blocks[0], IDS[:4], 4, attention_mask=pad)
            mask = inputs.kwargs[0]["attention_mask"]
            assert mask.dtype == torch.bool and not mask.all()
            additive = torch.zeros(mask.shape, dtype=torch.float16).masked_fill(
                ~mask, torch.finfo(torch.float16).min)
            with_mask = lambda m: BlockInputs(inputs.hidden, inputs.args,       # noqa: E731
                                              [{**inputs.kwargs[0], "attention_mask": m}])
            out = call_block(lm.blocks[0], inputs, 0)
            assert torch.equal(out, call_block(ref.blocks[0], with_mask(additive), 0))
            assert not torch.equal(out, call_block(lm.blocks[0], with_mask(None), 0))
        want = ref.logits(IDS)
        got = load_quantized(make(), tmp_path).logits(IDS)
        fp = make().logits(IDS)
    assert torch.equal(got, want)
    assert not torch.allclose(got, fp, atol=1e-4)
    assert (want_scales[0]["qkv"] == torch.tensor(1e-2, dtype=torch.float16)).any()


def test_the_attention_matmuls_are_quantized_by_default(tmp_path):
    """Not vacuous: the same calibration without the Q/K/V quantizers (the reference's
    attention left in full precision) gives other logits."""
    make = _maker("llama")
    lm = make()
    calibrate(lm, make_method({"type": "smoothquant"}, 8, 4), IDS, tmp_path, batch_size=4,
              log=lambda s: None)
    with torch.no_grad():
        got = lm.logits(IDS)
        for blk in lm.blocks:
            blk.self_attn.qdlm_qkv = QKVQuant(16)      # the float16 cast only
        plain = lm.logits(IDS)
    assert not torch.allclose(got, plain, atol=1e-3)
    with pytest.raises(ValueError, match="arithmetic must be one of"):
        make_method({"type": "smoothquant", "arithmetic": "fp16"}, 8, 8)


@pytest.mark.parametrize("arch", ["llama", "qwen2-gqa"])
@pytest.mark.parametrize("bits", [(8, 8), (4, 8)])
def test_smoothquant_precise_equals_duquants_steps_in_float32(tmp_path, arch, bits):
    make = _maker(arch)
    lm, ref = make(), make()
    _silent_channels(lm, ref)
    m = make_method({"type": "smoothquant", "alpha": 0.5, "arithmetic": "precise"}, *bits)
    calibrate(lm, m, IDS, tmp_path, batch_size=4, log=lambda s: None)
    want_scales = ref_smoothquant(ref, 0.5, *bits)
    for i, sc in enumerate(want_scales):
        got = m.scales[i]
        # groups in execution order: q/k/v, o, gate/up, down
        for j, key in enumerate(["qkv", "out", "fc1", "down"]):
            assert torch.allclose(got[j], sc[key], rtol=1e-6), (i, key)
        for n, lin in ref.blocks[i].named_modules():
            if isinstance(lin, torch.nn.Linear):
                w = get_submodule(lm.blocks[i], n)._groups.dequantize()
                assert torch.allclose(w, lin.weight, rtol=1e-5, atol=1e-6), (i, n)
        for n in ("input_layernorm", "post_attention_layernorm"):
            assert torch.allclose(get_submodule(lm.blocks[i], n).weight,
                                  get_submodule(ref.blocks[i], n).weight, rtol=1e-6)
    with torch.no_grad():
        want = ref.logits(IDS)
        got = load_quantized(make(), tmp_path).logits(IDS)
        fp = make().logits(IDS)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(got, fp, atol=1e-4)
    # not vacuous: the scales are far from 1 and the truncation lifted some
    assert any((s["qkv"] - 1).abs().max() > 0.5 for s in want_scales)
    assert (want_scales[0]["qkv"] == 1e-2).any()


def test_the_comparison_sees_each_step():
    torch.manual_seed(0)
    act = torch.rand(64) * 10
    w = torch.randn(32, 64) * 0.01
    s = truncate_number((act.clamp(min=1e-5).pow(0.5) / w.abs().max(0)[0].pow(0.5)).clamp(min=1e-5))
    assert not torch.allclose(s, (act.pow(0.6) / w.abs().max(0)[0].pow(0.4)))
    x = torch.randn(5, 64)
    assert not torch.equal(ref_uaq(x, 8), ref_uaq(x, 4))


@pytest.mark.parametrize("cfg,bits", [({"type": "smoothquant"}, (8, 8)),
                                      ({"type": "awq", "group_size": 32}, (4, 16))])
def test_a_scaled_v_bias_is_saved_and_reloaded(tmp_path, cfg, bits):
    """MHA with q/k/v biases (Qwen2's layout without GQA): o_proj's scale divides v_proj's
    bias too; the reloaded model is the calibrated one."""
    def make():
        lm = tiny_random_loaded("qwen2", layers=2)
        with torch.no_grad():
            g = torch.Generator().manual_seed(7)
            for n, p in lm.model.named_parameters():
                if n.endswith("bias"):
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        return lm
    lm = make()
    calibrate(lm, make_method(cfg, *bits), IDS, tmp_path, batch_size=4, log=lambda s: None)
    assert not torch.equal(lm.blocks[0].self_attn.v_proj.bias, make().blocks[0].self_attn.v_proj.bias)
    with torch.no_grad():
        assert torch.equal(load_quantized(make(), tmp_path).logits(IDS), lm.logits(IDS))
