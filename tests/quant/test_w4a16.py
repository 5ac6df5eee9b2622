"""The weight-only W4A16 backend (fair_calib.quant.w4a16) against fake quantization, on CPU
through ``aten._weight_int4pack_mm_for_cpu``: the same packing, the same [G, N, 2] scales and
zeros and the same ``(q - 8) * scale + zero`` contract as the CUDA kernel."""
import pytest
import torch
import torch.nn.functional as F

from fair_calib.calibrate import calibrate
from fair_calib.methods import load_quantized, make_method
from fair_calib.quant import w4a16
from fair_calib.quant.gptq import gptq_grouped
from fair_calib.quant.groupwise import GroupCodes, autogptq_params, awq_params, group_codes
from fair_calib.quant.qlinear import QuantLinear
from fair_calib.quant.toy import tiny_random_loaded

torch.set_num_threads(1)
CPU = torch.device("cpu")
N, K = 96, 384
PARAMS = {"awq": awq_params, "gptq_sym": lambda x, b: autogptq_params(x, b, True),
          "gptq_asym": lambda x, b: autogptq_params(x, b, False)}
# max |kernel - fake| / max |fake|: float32 differs by the fma's rounding and the sum's order
# (measured ~7e-7); bf16 by the scale's and zero's rounding to bf16 and the output's rounding
# (measured ~4.6e-3, about one bf16 ulp of the largest output): two ulp, 2^-7
TOL = {torch.float32: 1e-5, torch.bfloat16: 2.0 ** -7}


def codes(bits, name, g=128, seed=0, n=N, k=K):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    return group_codes(w, bits, g, PARAMS[name])


def rel_err(got, ref):
    return float((got.float() - ref.float()).abs().max() / ref.float().abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(PARAMS))
@pytest.mark.parametrize("bits", [4, 3])
def test_kernel_equals_fake_quant(bits, name, dtype):
    gc = codes(bits, name)
    layer = w4a16.WeightOnlyLinear(gc, None, dtype, CPU)
    x = torch.randn(7, K, generator=torch.Generator().manual_seed(1)).to(dtype)
    ref = F.linear(x, gc.dequantize().to(dtype))
    assert layer(x).dtype == dtype
    assert rel_err(layer(x), ref) <= TOL[dtype]


@pytest.mark.parametrize("bits", [4, 3])
def test_zero_points_map_exactly(bits):
    """Where the scale s and the zero term m s (|m| <= 8) are exact in the activation dtype
    (s of 5 significant bits), the kernel's weight (its product with the identity) is
    GroupCodes.dequantize() bit for bit: the fma (q - 8) s + m s is exact in float32, and in
    bf16 only the output's rounding is left, which the fake quant's cast shares. (An AWQ W4
    group's codes span 0..15, so its zero term is (8 - z) s: with 8-bit scales it rounds.)
    W3 codes and symmetric W4 codes take no zero term at all."""
    gc = codes(bits, "awq")
    e = torch.randint(-9, -3, gc.scale.shape, generator=torch.Generator().manual_seed(2))
    gc.scale = (1 + torch.randint(0, 16, gc.scale.shape).float() / 16) * 2.0 ** e.float()
    for dtype in (torch.float32, torch.bfloat16):
        layer = w4a16.WeightOnlyLinear(gc, None, dtype, CPU)
        w = layer.kernel(torch.eye(K, dtype=dtype)).T
        assert torch.equal(w, gc.dequantize().to(dtype)), dtype
    g = gc.g_idx.numel() // gc.scale.shape[1]
    _, m = w4a16.shifted_codes(gc.codes, gc.zero, g)
    if bits == 3:
        assert bool((m == 0).all())
    _, m = w4a16.shifted_codes(codes(4, "gptq_sym").codes, codes(4, "gptq_sym").zero, 128)
    assert bool((m == 0).all())


def test_general_scales_within_one_float32_rounding():
    gc = codes(4, "awq")
    layer = w4a16.WeightOnlyLinear(gc, None, torch.float32, CPU)
    w = layer.kernel(torch.eye(K)).T
    ref = gc.dequantize()
    ulp = torch.finfo(torch.float32).eps * ref.abs().clamp(min=gc.scale.min())
    assert bool(((w - ref).abs() <= 2 * ulp).all())


def test_dequantizing_path_is_fake_quant_bit_for_bit():
    """Above ``max_rows`` the forward dequantizes the stored codes with the fake quant's own
    float32 arithmetic: the same weight and the same F.linear, bias included."""
    gc = codes(4, "awq")
    bias = torch.randn(N).to(torch.bfloat16)
    layer = w4a16.WeightOnlyLinear(gc, bias, torch.bfloat16, CPU, max_rows=4)
    assert torch.equal(layer.dequantized(), gc.dequantize().to(torch.bfloat16))
    x = torch.randn(2, 5, K).to(torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, gc.dequantize().to(torch.bfloat16), bias))
    assert rel_err(layer(x[:1, :3]), F.linear(x[:1, :3], gc.dequantize().to(torch.bfloat16),
                                              bias)) <= TOL[torch.bfloat16]


def test_act_order_columns_are_permuted():
    """GPTQ's act-order groups permuted columns: the layer sorts the columns by group and
    permutes x the same way (both paths)."""
    w = torch.randn(N, K, dtype=torch.float64)
    x = torch.randn(256, K, dtype=torch.float64) * torch.linspace(0.1, 3, K, dtype=torch.float64)
    gc = gptq_grouped(w, x.T @ x, 4, group_size=128, sym=False, act_order=True)
    assert not torch.equal(gc.g_idx.long(), torch.arange(K) // 128)
    gc = GroupCodes(gc.codes, gc.scale.float(), gc.zero.float(), gc.g_idx, 4)
    layer = w4a16.WeightOnlyLinear(gc, None, torch.float32, CPU, max_rows=4)
    assert layer.perm is not None
    xs = torch.randn(6, K)
    for rows in (3, 6):
        ref = F.linear(xs[:rows], gc.dequantize())
        assert rel_err(layer(xs[:rows]), ref) <= TOL[torch.float32], rows


def test_layouts_the_kernel_cannot_take_are_refused_by_name():
    gc = codes(4, "awq", g=32, k=160)   # made group 128 over 160 columns: 128 + 32, as
    gc.g_idx = (torch.arange(160) // 128).to(torch.int32)   # GPTQ's short last group
    gc.scale, gc.zero = gc.scale[:, :2], gc.zero[:, :2]
    with pytest.raises(ValueError, match="group size 128 does not divide the 160 input columns"):
        w4a16.WeightOnlyLinear(gc, None, torch.float32, CPU)
    five = codes(4, "awq")
    five.bits = 5
    assert "5-bit codes do not fit" in w4a16.layout_problem(five, CPU)
    assert "group size 384 is not one of" in w4a16.layout_problem(codes(4, "awq", g=384), CPU)
    assert "not a multiple of 16" in w4a16.layout_problem(codes(4, "awq", n=24), CPU)


def test_setting_and_refusal(monkeypatch):
    monkeypatch.setenv(w4a16.SETTING, "bogus")
    with pytest.raises(ValueError, match="FAIR_CALIB_WEIGHT_ONLY"):
        w4a16.setting()
    monkeypatch.setenv(w4a16.SETTING, "auto")
    assert w4a16.resolve_mode(CPU, torch.bfloat16) == "fake"       # CPU: no measured gain
    assert w4a16.resolve_mode(CPU, torch.bfloat16, "kernel") == "kernel"
    assert w4a16.resolve_mode(CPU, torch.bfloat16, "fake") == "fake"
    assert "bfloat16 activations" in w4a16.kernel_problem(torch.device("cuda"), torch.float16)
    monkeypatch.setattr(w4a16, "_ops", lambda d: ("_convert_weight_to_int4pack_for_cpu",
                                                  "_no_such_int4_mm"))
    with pytest.raises(RuntimeError, match=r"FAIR_CALIB_WEIGHT_ONLY=kernel: torch .* has no "
                                           r"aten._no_such_int4_mm"):
        w4a16.resolve_mode(CPU, torch.bfloat16, "kernel")


# --------------------------------------------------------------------------- a tiny model
IDS = torch.randint(0, 60, (4, 32), generator=torch.Generator().manual_seed(0))


def make():
    # qwen2: q/k/v biases; kv_heads 4 of head_dim 32: every linear's rows a multiple of 16
    return tiny_random_loaded("qwen2", hidden=128, intermediate=256, heads=4, kv_heads=4)


@pytest.mark.parametrize("method,bits", [("gptq", 4), ("awq", 3)])
def test_tiny_weight_only_model_on_the_kernel(tmp_path, method, bits):
    calibrate(make(), make_method({"type": method, "group_size": 64}, bits, 16), IDS, tmp_path,
              batch_size=4, log=lambda s: None)
    fake = load_quantized(make(), tmp_path, weight_only="fake")
    kern = load_quantized(make(), tmp_path, weight_only="kernel")
    qls = [m for m in kern.model.modules() if isinstance(m, QuantLinear)]
    assert qls and all(isinstance(m.backend, w4a16.WeightOnlyLinear) for m in qls)
    assert all(m.linear.weight.untyped_storage().nbytes() <= 4 for m in qls)   # freed
    with torch.no_grad():
        want, got = fake.logits(IDS[:1, :8]), kern.logits(IDS[:1, :8])   # 8 rows: the kernel
        assert rel_err(got, want) < 1e-4
        # 128 rows: above KERNEL_MAX_ROWS, the dequantizing path: fake quant bit for bit
        assert torch.equal(kern.logits(IDS), fake.logits(IDS))
