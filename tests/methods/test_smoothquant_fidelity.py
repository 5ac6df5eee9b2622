"""``smoothquant`` against QDLM's SmoothQuant (DuQuant's code base with ``--smooth --alpha 0.5
--epochs 0``), written here from its code: ``generate_act_scale_shift.get_act_scales`` (max |x|
per input channel over the calibration set), the scales of ``duquant.py`` (the weight maximum
of q_proj / o_proj / up_proj / down_proj only), ``truncate_number``, ``smooth_and_let_inplace``
(``smooth_fc_inplace`` for a GQA o_proj), the asymmetric per-channel weight and per-token
activation quantizers of ``UniformAffineQuantizer``."""
import pytest
import torch

from fair_calib.calibrate import calibrate
from fair_calib.methods import load_quantized, make_method
from fair_calib.quant.discovery import get_submodule
from fair_calib.quant.toy import tiny_random_loaded
from fixtures.duquant_smoothing import act_scales_of, smooth_layer, truncate_number

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


@pytest.mark.parametrize("arch", ["llama", "qwen2-gqa"])
@pytest.mark.parametrize("bits", [(8, 8), (4, 8)])
def test_smoothquant_equals_duquants(tmp_path, arch, bits):
    make = ((lambda: tiny_random_loaded("llama", layers=2)) if arch == "llama" else
            (lambda: tiny_random_loaded("qwen2", layers=2, kv_heads=2)))
    lm, ref = make(), make()
    for model in (lm, ref):      # near-silent channels: scales below 1e-2 (truncate_number)
        with torch.no_grad():
            model.blocks[0].input_layernorm.weight[3:6] = 1e-7
    m = make_method({"type": "smoothquant", "alpha": 0.5}, *bits)
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
