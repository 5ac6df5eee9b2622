"""The low-bit backend's arithmetic (integer codes, exact integer dot product, per-token x
per-channel scales) against fake quantization, on CPU through its plain-torch emulation."""
import pytest
import torch

from fair_calib.calibrate import calibrate
from fair_calib.methods import load_quantized, make_method
from fair_calib.quant import lowbit
from fair_calib.quant.qlinear import QuantLinear
from fair_calib.quant.quantizers import qmax
from fair_calib.quant.toy import tiny_random_loaded

torch.set_num_threads(1)
IDS = torch.randint(0, 60, (4, 16), generator=torch.Generator().manual_seed(0))
QUIET = dict(log=lambda s: None)
METHODS = {"rtn": {"type": "rtn"}, "quarot": {"type": "quarot"},
           "flatquant": {"type": "flatquant", "epochs": 1},
           "fair_calib": {"type": "fair_calib", "epochs": 1},
           "qdrop": {"type": "qdrop", "epochs": 1}}


def make():
    return tiny_random_loaded("qwen2", layers=2, kv_heads=2)   # biases, GQA, head transform


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """One calibration per (method, bits), shared by the tests below."""
    cache = {}

    def get(name, w_bits, a_bits):
        key = (name, w_bits, a_bits)
        if key not in cache:
            d = tmp_path_factory.mktemp(f"{name}{w_bits}{a_bits}")
            calibrate(make(), make_method(METHODS[name], w_bits, a_bits), IDS, d, batch_size=4,
                      **QUIET)
            cache[key] = d
        return cache[key]
    return get


def layer_io(loaded, ids):
    """Every QuantLinear's (input, output) on one forward."""
    rec = {}
    hooks = [m.register_forward_hook(lambda m, a, y, n=n: rec.__setitem__(n, (a[0], y)))
             for n, m in loaded.model.named_modules() if isinstance(m, QuantLinear)]
    with torch.no_grad():
        logits = loaded.logits(ids)
    for h in hooks:
        h.remove()
    return rec, logits


@pytest.mark.parametrize("bits", [(4, 4), (3, 4), (8, 8)])
@pytest.mark.parametrize("name", list(METHODS))
def test_emulated_layers_equal_fake_quant(calibrated, name, bits):
    d = calibrated(name, *bits)
    fake = load_quantized(make(), d, lowbit="fake")
    emu = load_quantized(make(), d, lowbit="emulate")
    kind = lowbit.gemm_kind(*bits)
    names = [n for n, m in emu.model.named_modules() if isinstance(m, QuantLinear)]
    assert all(emu.model.get_submodule(n).backend.kind == kind for n in names)
    rec, logits_fake = layer_io(fake, IDS)
    lowbit.set_norm_fusion(emu.model, False)    # each layer fed the normalized input
    for n in names:
        x, y = rec[n]
        with torch.no_grad():
            y_emu = emu.model.get_submodule(n)(x)
        err = float((y_emu - y).abs().max() / y.abs().max())
        assert err < 2e-5, (n, err)
    lowbit.set_norm_fusion(emu.model, True)
    with torch.no_grad():
        logits_emu = emu.logits(IDS)
    assert torch.allclose(logits_emu, logits_fake, rtol=1e-4, atol=1e-4)


def test_codes_and_storage(calibrated, capsys):
    """4-bit weights are stored packed (half a byte each), their codes times the row scales are
    the folded fake-quant weight, and the FP weights are freed; the log says how the linears
    execute."""
    d = calibrated("flatquant", 4, 4)
    capsys.readouterr()
    fake = load_quantized(make(), d, lowbit="fake")
    assert ("low-bit execution: 0 of 14 quantized linears on integer codes "
            "(FAIR_CALIB_LOWBIT=fake); the others on fake quantization"
            in capsys.readouterr().err)
    load_quantized(make(), d, lowbit="auto")
    assert "(FAIR_CALIB_LOWBIT=auto: device cpu is not CUDA)" in capsys.readouterr().err
    emu = load_quantized(make(), d, lowbit="emulate")
    # all on codes: the line ends without "the others" clause
    assert ("low-bit execution: 14 of 14 quantized linears on integer codes (emulated in torch)\n"
            in capsys.readouterr().err)
    ql_f = fake.blocks[0].self_attn.v_proj
    ql_e = emu.blocks[0].self_attn.v_proj
    be = ql_e.backend
    assert be.packed and be.qweight.dtype == torch.uint8
    assert be.qweight.shape == (ql_f.out_features, ql_f.in_features // 2)
    codes = be.weight_int()
    assert codes.abs().max() <= qmax(4) + 1
    assert torch.allclose(codes.float() * be.w_scale.unsqueeze(1), ql_f.w_folded, rtol=1e-6, atol=1e-7)
    assert ql_e.w_folded is None and ql_e.weight.untyped_storage().nbytes() <= 4
    assert ql_e.weight.shape == ql_f.weight.shape and ql_e.weight.dtype == ql_f.weight.dtype


def test_emulated_activation_codes_are_the_fake_quant_grid(calibrated):
    """codes * scale of every reader is the fake-quant activation, for a transform group with
    three readers (q, k, v: FlatQuant's per-linear clip pairs)."""
    d = calibrated("fair_calib", 4, 4)
    fake = load_quantized(make(), d, lowbit="fake")
    emu = load_quantized(make(), d, lowbit="emulate")
    rec, _ = layer_io(fake, IDS)
    x = rec["model.layers.1.self_attn.q_proj"][0]
    inq = fake.blocks[1].self_attn.q_proj.inq
    inp = emu.blocks[1].self_attn.q_proj.backend.inp
    assert inp.n_readers == 3
    lowbit.set_norm_fusion(emu.model, False)    # x is the normalized input
    codes, s = inp.quantize(x.reshape(-1, x.shape[-1]))
    with torch.no_grad():
        for k in range(3):
            ref = inq(x, k).reshape(-1, x.shape[-1])
            assert torch.allclose(codes[k].float() * s[k].unsqueeze(1), ref, rtol=1e-6, atol=1e-7)


def test_emulated_model_decodes_and_scores_like_fake_quant(calibrated):
    """A calibrated tiny model gives the same greedy diffusion decode and the same choices of
    a likelihood comparison through the emulation as through fake quantization."""
    from fair_calib.decoding.generate import generate
    from fair_calib.decoding.policies import DecodePolicy

    d = calibrated("fair_calib", 4, 4)
    fake = load_quantized(make(), d, lowbit="fake")
    emu = load_quantized(make(), d, lowbit="emulate")
    prompts = IDS[:2, :6].tolist()
    pol = DecodePolicy(name="low_confidence", steps=8, gen_length=8, block_length=4)
    outs = [generate(lm, prompts, pol) for lm in (fake, emu)]
    assert torch.equal(outs[0], outs[1])
    ids = torch.randint(0, 60, (16, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        lp = [torch.log_softmax(lm.logits(ids).float(), -1) for lm in (fake, emu)]
    picks = [p.gather(-1, ids.unsqueeze(-1)).squeeze(-1).sum(-1).reshape(8, 2).argmax(-1) for p in lp]
    assert torch.equal(picks[0], picks[1])


def test_setting_and_refusal(monkeypatch):
    monkeypatch.setenv(lowbit.SETTING, "bogus")
    with pytest.raises(ValueError, match="FAIR_CALIB_LOWBIT"):
        lowbit.setting()
    monkeypatch.setenv(lowbit.SETTING, "real")
    with pytest.raises(RuntimeError, match="FAIR_CALIB_LOWBIT=real: device cpu is not CUDA"):
        lowbit.resolve_mode(torch.device("cpu"))
    monkeypatch.setenv(lowbit.SETTING, "auto")
    assert lowbit.resolve_mode(torch.device("cpu")) == "fake"
    assert lowbit.gemm_kind(4, 4) == "fp8" and lowbit.gemm_kind(3, 4) == "fp8"
    assert lowbit.gemm_kind(8, 8) == "int8" and lowbit.gemm_kind(4, 16) is None
    # W8A8 runs real under auto on the int8 Triton GEMM, not on cuBLAS's int8 GEMM
    monkeypatch.delenv("FAIR_CALIB_LOWBIT_GEMM", raising=False)
    assert lowbit.kinds_for("auto") == ("fp8", "int8") == lowbit.kinds_for("real")
    monkeypatch.setenv("FAIR_CALIB_LOWBIT_GEMM", "cublas")
    assert lowbit.kinds_for("auto") == ("fp8",) and lowbit.kinds_for("real") == ("fp8", "int8")


def norm_input(loaded, block, norm_name, ids):
    """What the RMSNorm ``norm_name`` of ``block`` receives on a forward of ``ids``."""
    rec = {}
    h = block.get_submodule(norm_name).register_forward_pre_hook(
        lambda m, a: rec.__setitem__("x", a[0]))
    with torch.no_grad():
        loaded.logits(ids)
    h.remove()
    return rec["x"]


def test_norms_fused_into_their_groups(calibrated):
    """Both RMSNorms of every block run inside their group's quantizer (load_quantized fuses
    them); the fused group's codes x scales on the norm's input are the fake quant of the
    normalized input, for each of q/k/v; switching fusion off changes no logit."""
    d = calibrated("fair_calib", 4, 4)
    fake = load_quantized(make(), d, lowbit="fake")
    emu = load_quantized(make(), d, lowbit="emulate")
    for block in emu.blocks:
        assert isinstance(block.input_layernorm, lowbit.DeferredNorm)
        assert isinstance(block.post_attention_layernorm, lowbit.DeferredNorm)
    assert "model.layers.0.input_layernorm.weight" in dict(emu.model.named_parameters())
    x = norm_input(fake, fake.blocks[1], "input_layernorm", IDS)
    inq = fake.blocks[1].self_attn.q_proj.inq
    inp = emu.blocks[1].self_attn.q_proj.backend.inp
    assert inp.norm is not None
    codes, s = inp.quantize(x.reshape(-1, x.shape[-1]))
    with torch.no_grad():
        xn = fake.blocks[1].input_layernorm(x)
        for k in range(3):
            ref = inq(xn, k).reshape(-1, x.shape[-1])
            assert torch.allclose(codes[k].float() * s[k].unsqueeze(1), ref, rtol=1e-6, atol=1e-7)
        fused = emu.logits(IDS)
        assert lowbit.set_norm_fusion(emu.model, False) == 4
        assert torch.equal(emu.logits(IDS), fused)


def test_rms_norm_is_the_models_and_other_norms_are_refused():
    """rms_norm equals the model's RMSNorm bitwise (float32 and bfloat16); a norm with other
    arithmetic (a (1 + w) scale, a LayerNorm) is not taken for it."""
    lm = make()
    norm = lm.blocks[0].input_layernorm
    x = torch.randn(5, norm.weight.shape[0]) * 7
    assert lowbit.norm_eps(norm, x.shape[-1]) == norm.variance_epsilon
    assert torch.equal(lowbit.rms_norm(x, norm.weight, norm.variance_epsilon), norm(x))
    nb = type(norm)(x.shape[-1], eps=1e-5).to(torch.bfloat16)
    nb.weight.data.normal_()
    assert torch.equal(lowbit.rms_norm(x.bfloat16(), nb.weight, 1e-5), nb(x.bfloat16()))

    class OnePlus(type(norm)):
        def forward(self, h):
            return super().forward(h) * (1 + self.weight) / self.weight

    assert lowbit.norm_eps(OnePlus(x.shape[-1]), x.shape[-1]) is None
    assert lowbit.norm_eps(torch.nn.LayerNorm(x.shape[-1], bias=False), x.shape[-1]) is None
    assert lowbit.norm_eps(norm, x.shape[-1] + 1) is None


def test_norm_with_another_reader_is_not_fused(calibrated):
    """A norm whose output is read beyond its group's linears (here a hook adding the MLP's
    input to its output) stays a norm: the probe sees the block's update move and reverts;
    the other block is fused, and the model computes what fake quantization computes."""
    d = calibrated("fair_calib", 4, 4)
    fake = load_quantized(make(), d, lowbit="fake")
    emu = load_quantized(make(), d, fold=False)
    for block in emu.blocks:
        assert lowbit.attach_block(block, "emulate") == 7
    for lm in (fake, emu):
        lm.blocks[0].mlp.register_forward_hook(lambda m, a, out: out + a[0])
    assert lowbit.fuse_inputs(emu) == {"norms": 2, "gated": 1}
    assert not isinstance(emu.blocks[0].post_attention_layernorm, lowbit.DeferredNorm)
    assert not isinstance(emu.blocks[0].input_layernorm, lowbit.DeferredNorm)
    assert isinstance(emu.blocks[1].post_attention_layernorm, lowbit.DeferredNorm)
    with torch.no_grad():
        assert torch.allclose(emu.logits(IDS), fake.logits(IDS), rtol=1e-4, atol=1e-4)


def test_swiglu_products_fused_into_down_proj(calibrated):
    """Every block's SwiGLU MLP hands gate's and up's outputs to down_proj's group, which forms
    SiLU(gate) * up itself (load_quantized fuses them; parameter names unchanged): the codes
    from (gate, up) are those of the product, and switching fusion off changes no logit."""
    d = calibrated("fair_calib", 4, 4)
    emu = load_quantized(make(), d, lowbit="emulate")
    assert "model.layers.0.mlp.down_proj.linear.weight" in dict(emu.model.named_parameters())
    assert all(isinstance(b.mlp, lowbit._GatedForward) for b in emu.blocks)
    mlp = emu.blocks[1].mlp
    x = torch.randn(3, 5, mlp.gate_proj.in_features)
    with torch.no_grad():
        g, u = mlp.gate_proj(x), mlp.up_proj(x)
        inp = mlp.down_proj.backend.inp
        c1, s1 = inp.quantize(g.reshape(-1, inp.dim), u.reshape(-1, inp.dim))
        c0, s0 = inp.quantize((mlp.act_fn(g) * u).reshape(-1, inp.dim))
        assert torch.equal(c1, c0) and torch.equal(s1, s0)
        fused = emu.logits(IDS)
        assert lowbit.set_gated_fusion(emu.model, False) == 2
        assert torch.equal(emu.logits(IDS), fused)


def test_other_activations_are_not_fused(calibrated):
    """An MLP whose activation is not SiLU (GELU in block 0) keeps its own forward; block 1 is
    fused, and the model computes what fake quantization computes."""
    d = calibrated("fair_calib", 4, 4)
    fake = load_quantized(make(), d, lowbit="fake")
    emu = load_quantized(make(), d, fold=False)
    for block in emu.blocks:
        lowbit.attach_block(block, "emulate")
    for lm in (fake, emu):
        lm.blocks[0].mlp.act_fn = torch.nn.GELU()
    assert lowbit.fuse_inputs(emu)["gated"] == 1
    assert not isinstance(emu.blocks[0].mlp, lowbit._GatedForward)
    assert isinstance(emu.blocks[1].mlp, lowbit._GatedForward)
    with torch.no_grad():
        assert torch.allclose(emu.logits(IDS), fake.logits(IDS), rtol=1e-4, atol=1e-4)


def test_byte_counts_of_a_low_bit_model(calibrated):
    """The FP size counted from shapes is the same for the low-bit model; what it holds counts
    each weight stand-in as one element and the codes as packed; export refuses by name."""
    from fair_calib.quant.export import export_quantized, fp_bf16_bytes, resident_bytes

    d = calibrated("flatquant", 4, 4)
    fake = load_quantized(make(), d, lowbit="fake")
    emu = load_quantized(make(), d, lowbit="emulate")
    assert fp_bf16_bytes(emu.model) == fp_bf16_bytes(fake.model) == fp_bf16_bytes(make().model)
    ql = emu.blocks[0].mlp.down_proj
    be = ql.backend
    elem = ql.linear.weight.element_size()
    assert resident_bytes(ql.linear) == elem
    packed = ql.out_features * ql.in_features // 2 + 4 * ql.out_features
    assert resident_bytes(be) - resident_bytes(be.inp) == packed
    naive = sum(p.numel() * p.element_size() for p in emu.model.parameters())
    assert resident_bytes(emu.model) < min(resident_bytes(fake.model), naive)
    with pytest.raises(RuntimeError,
                       match=r"export: model\.layers\.0\.self_attn\.q_proj runs on low-bit"):
        export_quantized(emu.model, d / "x.safetensors")


INTERPRETER_SHIM = r"""
class Shim:
    # libdevice has no interpreter version: the same IEEE operations through tl (division
    # correctly rounded, rint half-to-even)
    @staticmethod
    @triton.jit
    def div_rn(a, b):
        return a / b

    @staticmethod
    @triton.jit
    def rsqrt(x):
        return tl.rsqrt(x)

    @staticmethod
    @triton.jit
    def exp(x):
        return tl.exp(x)

    @staticmethod
    @triton.jit
    def rint(x):
        f = tl.floor(x)
        r = x - f
        odd = f - 2.0 * tl.floor(f * 0.5)
        return tl.where(r > 0.5, f + 1.0, tl.where(r < 0.5, f, f + odd))


lt.libdevice = Shim
"""

CHUNKED_KERNEL_SCRIPT = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl
from fair_calib.quant import lowbit, lowbit_triton as lt


{shim}

class Group:
    apply_norm = lowbit.LowBitInput.apply_norm
    transform = lowbit.LowBitInput.transform
    scales_and_codes = lowbit.LowBitInput.scales_and_codes

    def __init__(self, n1, n2, p2):
        g = torch.Generator().manual_seed(n1 + n2)
        self.dim, self.n1, self.n2, self.bits, self.kind, self.static = n1 * n2, n1, n2, 4, "int8", False
        self.code_dtype = torch.int8
        self.p1 = torch.randn(n1, n1, generator=g) / n1 ** 0.5
        self.p2t = torch.randn(n2, n2, generator=g) / n2 ** 0.5 if p2 else None
        self.d = torch.rand(self.dim, generator=g) + 0.5
        self.norm = (torch.rand(self.dim, generator=g) + 0.5, 1e-6)
        self.r_max, self.r_min = torch.rand(2, generator=g) * 0.5 + 0.5, torch.rand(2, generator=g) * 0.5 + 0.5
        self.floor, self.static_scale, self.n_readers = torch.zeros(2), None, 2


def silu_mul_numpy(g, u):
    # the interpreter's exp is numpy's: the reference's SiLU uses it too (torch's CPU exp is
    # another correctly-rounded-or-not implementation; the GPU check compares with torch's)
    import numpy as np
    gn = g.numpy()
    return torch.from_numpy(gn / (np.float32(1.0) + np.exp(-gn))) * u


def check(inp, x, up, run):
    xin = x if up is None else silu_mul_numpy(x, up)
    ref_c, ref_s = inp.scales_and_codes(inp.transform(xin))
    c, s = run()
    # codes for the GEMM's padded rows: the tokens', then zero codes with scale 1
    t = x.shape[0]
    assert c.shape[1] == s.shape[1] == lt.gemm_rows(t) and lt.gemm_rows(t) % 16 == 0
    assert bool((c[:, t:].float() == 0).all()) and bool((s[:, t:] == 1).all())
    c, s = c[:, :t], s[:, :t]
    bad = (c.float() != ref_c).float().mean().item()
    rel = ((s - ref_s).abs() / ref_s).max().item()
    return bad, rel


TUNED = lt.SPLIT_TUNED
for n1, n2, p2 in ((128, 148, True), (96, 128, True), (28, 128, False)):
    inp = Group(n1, n2, p2)
    x = torch.randn(3, n1 * n2, generator=torch.Generator().manual_seed(1)) * 3
    x[:, :5] *= 30
    x[:, 5], x[:, 6] = 0.0, -0.0
    up = torch.randn(3, n1 * n2, generator=torch.Generator().manual_seed(2))
    for gated in (False, True):
        if gated:
            inp.norm = None        # a down_proj group: the product, no norm
        u = up if gated else None
        nw, eps = lt._fused_norm(inp, x)
        # loops unrolled / run-time; Z in registers (one 128-row chunk) or through the
        # scratch row; the SwiGLU product formed in the kernel; codes by the reciprocal; then
        # the module's table of per-shape settings
        for unroll, regs, in_kernel, fast, table in ((True, False, False, False, False),
                                                     (False, False, True, True, False),
                                                     (True, True, False, True, False),
                                                     (False, True, True, False, False),
                                                     (True, False, False, True, True)):
            lt.SPLIT_UNROLL, lt.SPLIT_REGS, lt.SPLIT_GATED, lt.FAST_DIV = unroll, regs, in_kernel, fast
            lt.SPLIT_BR = 128 if regs else 64
            lt.SPLIT_TUNED = TUNED if table else {}
            bad, rel = check(inp, x, u, lambda: lt._quantize_split(
                inp, x, u, nw, eps, inp.d, inp.p1, inp.p2t, n1, n2))
            print(n1, n2, gated, unroll, regs, in_kernel, fast, table, bad, rel)
            assert bad == 0.0 and rel < 1e-5, (n1, n2, gated, unroll, regs, in_kernel, fast, bad, rel)
lt.SPLIT_UNROLL, lt.SPLIT_REGS, lt.SPLIT_GATED, lt.FAST_DIV, lt.SPLIT_BR = True, False, False, True, 64

# the one-pass SwiGLU product (odd length: the last block masked)
# (zeros of both signs in the gate: SiLU's division skipped for them, the bits kept)
g = torch.randn(3, 1001, generator=torch.Generator().manual_seed(5)) * 4
g[0, :4], g[0, 4:8] = 0.0, -0.0
u = torch.randn(3, 1001, generator=torch.Generator().manual_seed(6))
assert torch.equal(lt.silu_mul(g, u).view(torch.int32), silu_mul_numpy(g, u).view(torch.int32))

# the one-tile kernel (q/k/v-sized factors, and a group without factors) with a gated input
for n1, n2, factors in ((16, 32, True), (8, 64, False)):
    inp = Group(n1, n2, True)
    inp.norm = None
    if not factors:
        inp.p1 = inp.p2t = inp.d = None
    x = torch.randn(5, n1 * n2, generator=torch.Generator().manual_seed(3)) * 2
    up = torch.randn(5, n1 * n2, generator=torch.Generator().manual_seed(4))
    for u in (up, None):
        bad, rel = check(inp, x, u, lambda: lt.quantize_input(inp, x, u))
        print("tile", n1, n2, factors, u is not None, bad, rel)
        assert bad == 0.0 and rel < 1e-5, (n1, n2, factors, bad, rel)

# the one-tile kernel with a fused norm and static scales
inp = Group(16, 32, True)
inp.static, inp.static_scale = True, torch.tensor([0.7, 0.3])
x = torch.randn(5, 512, generator=torch.Generator().manual_seed(7))
assert check(inp, x, None, lambda: lt.quantize_input(inp, x)) == (0.0, 0.0)

# codes by the reciprocal: quotients on half-integers (ties to even) and a hair off them take
# the division; the rest the product, all as the division rounds
inp = Group(8, 64, True)
inp.p1 = inp.p2t = inp.d = inp.norm = None
inp.static, inp.static_scale = True, torch.tensor([0.5, 0.3])
x = torch.arange(-9.0, 9.0, 0.25).repeat(8)[:512].reshape(1, 512).repeat(4, 1)
x[1] = torch.nextafter(x[1], torch.full_like(x[1], 9.0))
x[2] = torch.randn(512, generator=torch.Generator().manual_seed(8)) * 3
half = (torch.arange(-8.0, 8.0).repeat(32)[:512] + 0.5) * 0.3
x[3] = torch.nextafter(half, half * (1 + (torch.arange(512) % 3 - 1.0)))
# the plain product by the reciprocal gets some of these wrong: the test can see the fallback
ref_c, _ = inp.scales_and_codes(x)
naive = torch.clamp(torch.round(x * (1 / inp.static_scale).reshape(2, 1, 1)), -8, 7)
assert (naive != ref_c).any()
# (x holds zeros of both signs: FP8 codes keep the sign the division gives them)
x[0, :2] = torch.tensor([0.0, -0.0])
inp.kind, inp.code_dtype = "fp8", torch.float8_e4m3fn      # cuBLAS's FP8 GEMM's operand
for fast in (False, True):
    lt.FAST_DIV = fast
    c, s = lt.quantize_input(inp, x)
    assert check(inp, x, None, lambda: (c, s)) == (0.0, 0.0), fast
    assert torch.equal(torch.signbit(c[:, 0, :2].float()),
                       torch.signbit(torch.tensor([[0.0, -0.0]] * 2))), fast

# the 4-bit unpacking to int8 and FP8 codes
from fair_calib.quant.export import pack_int4
codes = torch.randint(-8, 8, (7, 66), generator=torch.Generator().manual_seed(9), dtype=torch.int8)
assert torch.equal(lt.unpack_int4(pack_int4(codes), 66, torch.int8), codes)
assert torch.equal(lt.unpack_int4(pack_int4(codes), 66, torch.float8_e4m3fn).float(), codes.float())
print("ok")
""".replace("{shim}", INTERPRETER_SHIM)


def test_chunked_kernels_equal_the_emulation_in_the_triton_interpreter():
    """The split activation kernel (loops unrolled, and run-time loops) with a fused RMSNorm or
    a gated SwiGLU input (formed by the one-pass product kernel), a diagonal and Kronecker factors (Dream's 128 x 148,
    LLaDA's 96 x 128, a left factor alone), and the one-tile kernel with a gated input, a
    fused norm or static scales, give
    the emulation's codes and scales, run on CPU by Triton's interpreter in
    float32 (the interpreter has no bfloat16 arithmetic; the bf16 kernels are compared with the
    emulation on the GPU by benchmarks/lowbit_rows_gpu.py)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", CHUNKED_KERNEL_SCRIPT], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr[-2000:]


def test_codes_by_the_reciprocal_only_for_groups_whose_clip_ratios_are_not_one():
    """With a clip ratio of 1 the scale is max / qmax and an element at half the token's max
    is an exact tie in almost every token, so such groups (QuaRot's, RTN's) keep the division;
    FAIR-Calib's learned ratios, and static scales, take the reciprocal; the switch is honoured;
    the decision is read once per group."""
    pytest.importorskip("triton")
    from fair_calib.quant import lowbit_triton as lt

    class Group:
        def __init__(self, r_max, r_min, static=False):
            self.static = static
            self.r_max, self.r_min = torch.tensor(r_max), torch.tensor(r_min)

    assert lt._fast_codes(Group([0.98, 0.97], [0.98, 0.9]), True)
    assert not lt._fast_codes(Group([0.98, 1.0], [0.98, 0.9]), True)
    assert not lt._fast_codes(Group([0.98], [1.0]), True)
    assert lt._fast_codes(Group([1.0], [1.0], static=True), True)
    assert not lt._fast_codes(Group([0.98], [0.98]), False)
    g = Group([0.98], [0.98])
    assert lt._fast_codes(g, True) and g._fast_codes is True


ANY_ROWS_SCRIPT = r"""
import copy, os
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl
from torch import nn
from fair_calib.quant import lowbit, lowbit_triton as lt
from fair_calib.quant.qlinear import InputQuant, QuantLinear
from fair_calib.quant.quantizers import ActQuantizer, WeightQuantizer


{shim}
seen = []
triton_gemm = lt.lowbit_gemm.gemm


def gemm(xc, wc, *args, **kw):
    # the real GEMM (lowbit_gemm, int8) in the interpreter; the rows it is given recorded
    seen.append(xc.shape[0])
    return triton_gemm(xc, wc, *args, **kw)


lt.lowbit_gemm.gemm = gemm


def block():
    torch.manual_seed(0)
    b = nn.Module()
    inq = InputQuant(64, ActQuantizer(4))
    inq.n_users = 2
    b.q = QuantLinear(nn.Linear(64, 48), inq, WeightQuantizer(48, 4), user=0)
    b.k = QuantLinear(nn.Linear(64, 32, bias=False), inq, WeightQuantizer(32, 4), user=1)
    return b


real, emu = block(), block()
assert lowbit.attach_block(real, "real", kinds=("fp8",)) == 2
assert lowbit.attach_block(emu, "emulate", kinds=("fp8",)) == 2
g = torch.Generator().manual_seed(1)
with torch.no_grad():
    for m in list(range(1, 65)) + [(2, 7), (3, 5, 3)]:
        shape = (m, 64) if isinstance(m, int) else (*m, 64)
        x = torch.randn(*shape, generator=g) * 3
        for name in ("q", "k"):
            y_real, y_emu = getattr(real, name)(x), getattr(emu, name)(x)
            assert y_real.shape == y_emu.shape, (m, name, y_real.shape, y_emu.shape)
            assert torch.equal(y_real, y_emu), (m, name, (y_real - y_emu).abs().max())
# the codes carry padding rows (cuBLAS's FP8 GEMM needs them); the Triton GEMM reads the tokens
assert sorted(set(seen)) == list(range(1, 65)), sorted(set(seen))
print("ok", len(seen))
""".replace("{shim}", INTERPRETER_SHIM)


def test_real_path_takes_any_token_count_in_the_triton_interpreter():
    """For every token count 1..64 (and batched shapes) the real path's kernels (Triton's
    interpreter, float32: the quantizing kernel and the int8 GEMM of lowbit_gemm, given the
    token rows only) give the emulation's outputs bit for bit, readers sharing one
    quantization. (The codes are written for a multiple of 16 rows, the padding rows zero with
    scale 1, for cuBLASLt's FP8 GEMM, which refuses token counts that are not multiples of 4.)"""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", ANY_ROWS_SCRIPT], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().startswith("ok"), r.stdout + r.stderr[-3000:]


def test_weight_storage_setting_and_same_outputs(calibrated, monkeypatch):
    """``FAIR_CALIB_LOWBIT_STORAGE``: auto stores codes one per byte on the real path (no
    per-forward unpacking) and packed elsewhere; either storage gives the same outputs."""
    assert lowbit.storage_for("real") == "bytes" and lowbit.storage_for("emulate") == "packed"
    monkeypatch.setenv("FAIR_CALIB_LOWBIT_STORAGE", "packed")
    assert lowbit.storage_for("real") == "packed"
    monkeypatch.setenv("FAIR_CALIB_LOWBIT_STORAGE", "half")
    with pytest.raises(ValueError, match="FAIR_CALIB_LOWBIT_STORAGE='half'"):
        lowbit.storage_for("real")
    d = calibrated("flatquant", 4, 4)
    outs = {}
    for storage in ("packed", "bytes"):
        monkeypatch.setenv("FAIR_CALIB_LOWBIT_STORAGE", storage)
        lm = load_quantized(make(), d, lowbit="emulate")
        be = lm.blocks[0].mlp.down_proj.backend
        assert be.packed == (storage == "packed")
        with torch.no_grad():
            outs[storage] = lm.logits(IDS)
    assert torch.equal(outs["packed"], outs["bytes"])
