"""QuaRot's arithmetic (spcl/QuaRot ``fake_quant/``), written here from its formulas: the
online Hadamard across heads on the o_proj input (``online_partial_had``), true Hadamard
factors (``get_hadK``), sequential GPTQ inside a block (``gptq_fwrd``) with the MSE clip search
of ``--w_clip`` and the activation clip ratio of the README command (1.0)."""
import hashlib
import math

import pytest
import torch

from fair_calib.calibrate import _targets_and_stats, calibrate
from fair_calib.methods import make_method
from fair_calib.quant.blockio import call_block, capture_block_inputs
from fair_calib.quant.discovery import discover_groups, get_submodule
from fair_calib.quant.gptq import gptq_quantize, mse_clip_scale
from fair_calib.quant.hadamard import KronRotation, hadamard, hadamard_split
from fair_calib.quant.qlinear import QuantLinear
from fair_calib.quant.quantizers import ActQuantizer
from fair_calib.quant.toy import tiny_random_loaded

torch.set_num_threads(1)
IDS = torch.randint(0, 60, (8, 16), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("k", [2, 4, 12, 20, 28, 36, 40, 44, 60, 108, 140, 148])
def test_hadamard_matrices_are_hadamard(k):
    h = hadamard(k)
    assert torch.equal(h.abs(), torch.ones(k, k, dtype=h.dtype))
    assert torch.equal(h @ h.T, k * torch.eye(k, dtype=h.dtype))


@pytest.mark.parametrize("n,k", [(192, 12), (224, 28), (296, 148), (80, 40), (64, 1), (120, 60)])
def test_rotations_are_orthogonal_with_entries_one_over_sqrt_n(n, k):
    assert hadamard_split(n)[0] == k
    for signs in (False, True):
        r = KronRotation(n, torch.Generator().manual_seed(0), signs=signs).matrix()
        assert torch.allclose(r @ r.T, torch.eye(n, dtype=r.dtype), atol=1e-6)
        assert torch.allclose(r.abs(), torch.full((n, n), 1 / math.sqrt(n), dtype=r.dtype), atol=1e-7)
    # the structure of QuaRot's matmul_hadU_cuda: x viewed K x n/K, H_{n/K} on the last axis,
    # then H_K on the first; divided by sqrt(n)
    x = torch.randn(3, n, dtype=torch.float64)
    hk = hadamard(k) if k > 1 else torch.ones(1, 1, dtype=torch.float64)
    hp = hadamard(n // k)
    want = (hk @ x.reshape(3, k, n // k) @ hp).reshape(3, n) / math.sqrt(n)
    got = KronRotation(n, None, signs=False).rotate(x)
    assert torch.allclose(got, want, atol=1e-10)


def test_no_factor_width_falls_back_to_random_orthogonal():
    assert hadamard_split(6 * 16) == (12, 8, True)
    assert hadamard_split(13 * 2) == (13, 2, False)     # no Hadamard matrix of order 26
    with pytest.raises(ValueError):
        hadamard(6)


@pytest.mark.parametrize("n", [52 * 4, 156 * 2, 11008])   # 11008 = 172 x 64 (Llama-2-7B MLP)
def test_widths_of_quarots_williamson_tables_are_refused(n):
    with pytest.raises(ValueError, match=f"width {n} .*QuaRot"):
        hadamard_split(n)


# sha256 of (H > 0) as uint8, row-major, of QuaRot's tables (spcl/QuaRot, fake_quant/
# hadamard_utils.py, get_had12 ... get_had140 at commit 5008669), computed from that file.
QUAROT_TABLE_SHA256 = {
    12: "c1be30fecbc13e7e475b0deabb92352b7210407fe494be276878be3e43ba69bb",
    20: "cff143e84622972bf8fffa0759340640c046ec5879deeb8d95d038282ef1cdda",
    28: "90e9b61e93164eb5aede6c0a5f5539ba418b69484589748c7c3119b351cd0d85",
    36: "147097e41d5a37076143c1be0f028b10754a72ad3f1f7f72c81b5f8aa76342f7",
    40: "09c4022b9b0bdfd17e93a7e7ec69229985b4e95a9a7100efc987754ee9761bcd",
    60: "e0d3fe922af47d1e588204a355745f282f46828441471a07ec961431c76d2403",
    108: "f2515b85a3163765111b92720629458e3f38e241dd83224b10852eed89535b1f",
    140: "2b20c54cd8c49cdc0a36c9d323380c5c9c95c16538d7c9eeb7e69b23f1ab944d",
}


@pytest.mark.parametrize("k", sorted(QUAROT_TABLE_SHA256))
def test_hadamard_factors_are_quarots_tables(k):
    h = hadamard(k)
    assert h.abs().eq(1).all()
    digest = hashlib.sha256((h > 0).to(torch.uint8).flatten().numpy().tobytes()).hexdigest()
    assert digest == QUAROT_TABLE_SHA256[k]


# Rotated widths of the paper's models: LLaDA-8B hidden 4096, MLP 12288, 32 heads of 128;
# Dream-7B (Qwen2.5-7B) hidden 3584, MLP 18944, 28 heads of 128.
MODEL_WIDTHS = {4096: 1, 12288: 12, 128: 1, 32: 1, 3584: 28, 28: 28, 18944: 148}


def quarot_get_hadK_order(n):
    """get_hadK: the first of its orders dividing n (then n / K must be a power of two)."""
    for k in (172, 156, 140, 108, 60, 52, 36, 28, 40, 20, 12):
        if n % k == 0:
            return k if (n // k) & (n // k - 1) == 0 else None
    return 1 if n & (n - 1) == 0 else None


@pytest.mark.parametrize("n,k", sorted(MODEL_WIDTHS.items()))
def test_model_widths_use_quarots_order_where_it_has_one(n, k):
    assert hadamard_split(n) == (k, n // k, True)
    # QuaRot's choice where it has one; 18944 = 148 x 128 is our extension (get_hadK fails)
    assert quarot_get_hadK_order(n) == (None if k == 148 else k)


def quarot_matmul_hadU(x, had_k):
    """matmul_hadU's arithmetic: butterflies (a + b, a - b) on adjacent pairs of the viewed
    (rows, n, 1) tensor until the middle axis has K entries, then had_K @ (K x n/K) per row,
    divided by sqrt(n) computed as a float32 tensor (torch.tensor(n).sqrt())."""
    n = x.shape[-1]
    k = had_k.shape[0]
    y = x.reshape(-1, n, 1)
    while y.shape[1] > k:
        pairs = y.reshape(y.shape[0], y.shape[1] // 2, 2, y.shape[2])
        y = torch.stack([pairs[:, :, 0] + pairs[:, :, 1], pairs[:, :, 0] - pairs[:, :, 1]], 2)
        y = y.reshape(pairs.shape[0], pairs.shape[1], -1)
    if k > 1:
        y = had_k.to(y) @ y
    return y.reshape(x.shape) / torch.tensor(n).sqrt()


def _had_k(n):
    k = hadamard_split(n)[0]
    return hadamard(k) if k > 1 else torch.ones(1, 1, dtype=torch.float64)


@pytest.mark.parametrize("n", [3584, 12288, 18944, 4096, 224])
def test_online_rotation_is_quarots_matmul_hadU(n):
    x = torch.randn(4, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    want = quarot_matmul_hadU(x, _had_k(n))
    got = KronRotation(n, None, signs=False).rotate(x)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("n", [28 * 16, 12 * 32, 148 * 4, 256])
def test_residual_rotation_is_quarots_random_hadamard_matrix_bit_for_bit(n):
    """random_hadamard_matrix: matmul_hadU(diag(s)) in float64, for our signs s."""
    rot = KronRotation(n, torch.Generator().manual_seed(3))
    want = quarot_matmul_hadU(torch.diag(rot.s.double()), _had_k(n))
    assert torch.equal(rot.quarot_matrix(), want)


def _rotated_wrapped(lm, w_bits, a_bits, cfg=None):
    m = make_method({"type": "quarot", **(cfg or {})}, w_bits, a_bits)
    m.prepare_model(lm)
    inputs = capture_block_inputs(lm.model, lm.blocks[0], IDS, 4)
    wrapped = []
    for i, block in enumerate(lm.blocks):
        groups = discover_groups(block, lambda: call_block(block, inputs, 0))
        _, stats = _targets_and_stats(block, inputs, groups, False, i)
        m.quantize_block(block, groups, stats, i)
        wrapped.append((block, groups))
        with torch.no_grad():
            inputs = inputs.with_hidden([call_block(block, inputs, b) for b in range(len(inputs))])
    return m, wrapped


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_cross_head_hadamard_keeps_the_fp_function_at_16_bits(arch):
    make = lambda: tiny_random_loaded(arch, layers=2, kv_heads=2 if arch == "qwen2" else None)  # noqa: E731
    with torch.no_grad():
        want = make().logits(IDS)
    lm = make()
    _, wrapped = _rotated_wrapped(lm, 16, 16)
    o = wrapped[0][0].self_attn.o_proj
    rot = o.inq.rotation
    assert (rot.m, rot.p, rot.right) == (4, 16, False)
    # x @ R = vec(H_heads X) / sqrt(heads), X the heads x head_dim view (online_partial_had)
    x = torch.randn(5, 64)
    h4 = hadamard(4).float()
    assert torch.allclose(rot.rotate(x), (h4 @ x.reshape(5, 4, 16)).reshape(5, 64) / 2, atol=1e-6)
    with torch.no_grad():
        got = lm.logits(IDS)
    assert torch.allclose(got, want, atol=1e-4 * want.abs().max()), (got - want).abs().max()


def test_quarot_defaults_are_the_readme_commands():
    m = make_method({"type": "quarot"}, 4, 4)
    assert m.training_settings()["propagate"] == "quant"
    lm = tiny_random_loaded("llama", layers=1)
    _, wrapped = _rotated_wrapped(lm, 4, 4)
    acts = [mod for mod in wrapped[0][0].modules() if isinstance(mod, ActQuantizer)]
    assert acts and all(a.clip_ratio == 1.0 and not a.learnable_clip for a in acts)


def ref_mse_scale(w, bits):
    """WeightQuantizer.find_params(mse=True, sym, per channel), norm 2.4, grid 100, 0.8."""
    maxq = 2 ** (bits - 1) - 1
    tmp = torch.zeros(w.shape[0])
    xmin = torch.minimum(w.min(1)[0], tmp)
    xmax = torch.maximum(w.max(1)[0], tmp)
    xmax = torch.maximum(torch.abs(xmin), xmax).clamp(min=1e-5)
    scale = xmax / maxq
    best = torch.full([w.shape[0]], float("inf"))
    for i in range(int(0.8 * 100)):
        p = 1 - i / 100
        scale1 = p * xmax / maxq
        q = torch.clamp(torch.round(w / scale1.unsqueeze(1)), -(maxq + 1), maxq) * scale1.unsqueeze(1)
        err = torch.sum((q - w).abs().pow(2.4), 1)
        tmp = err < best
        if torch.any(tmp):
            best[tmp] = err[tmp]
            scale[tmp] = scale1[tmp]
    return scale.reshape(-1, 1)


def test_mse_clip_search_equals_the_reference():
    torch.manual_seed(0)
    w = torch.randn(32, 64)
    w[3, 5] = 12.0                                 # an outlier row: the search clips it
    got, want = mse_clip_scale(w, 4), ref_mse_scale(w, 4)
    assert torch.equal(got, want)
    assert got[3, 0] < 12.0 / 7


def test_sequential_gptq_equals_a_hand_rolled_loop():
    """Each group's Hessian comes from the block run with the earlier groups already
    quantized and activations in full precision, its input taken after the online rotation;
    GPTQ with the w_clip scale in the rotated basis."""
    torch.manual_seed(0)
    lm = tiny_random_loaded("llama", layers=1)
    ref = tiny_random_loaded("llama", layers=1)
    m, wrapped = _rotated_wrapped(lm, 4, 4)
    _, ref_wrapped = _rotated_wrapped(ref, 4, 4)
    block, groups = wrapped[0]
    rblock, _ = ref_wrapped[0]
    inputs = capture_block_inputs(lm.model, block, IDS, 4)
    rinputs = capture_block_inputs(ref.model, rblock, IDS, 4)
    m.fit_block(block, groups, inputs, 0, lambda b: call_block(block, inputs, b))

    acts = [a for a in rblock.modules() if isinstance(a, ActQuantizer)]
    for a in acts:
        a.enabled = False
    codes_fp_hessian = {}
    for gi, g in enumerate(groups):
        first = get_submodule(rblock, g.names[0])
        xs = []
        h = first.register_forward_pre_hook(lambda mod, a: xs.append(a[0].detach().reshape(-1, a[0].shape[-1])))
        with torch.no_grad():
            for b in range(len(rinputs)):
                call_block(rblock, rinputs, b)
        h.remove()
        x = torch.cat(xs).double()
        if first.inq.rotation is not None:
            x = first.inq.rotation.rotate(x)
        H = x.T @ x
        for n in g.names:
            ql: QuantLinear = get_submodule(rblock, n)
            w = ql.inq.weight_inverse(ql.linear.weight.double())
            codes, scale = gptq_quantize(w, H, 4, damp=0.01, scale=mse_clip_scale(w.float(), 4))
            got_codes, got_scale = get_submodule(block, n)._gptq
            assert torch.equal(got_codes, codes), n
            assert torch.allclose(got_scale, scale), n
            if gi == len(groups) - 1:
                codes_fp_hessian[n] = codes
            ql.w_quant = codes.float() * scale
    # the last group's Hessian differs from the FP block's (sequential propagation matters)
    fp = tiny_random_loaded("llama", layers=1)
    _, fp_wrapped = _rotated_wrapped(fp, 4, 4)
    fblock, _ = fp_wrapped[0]
    for a in fblock.modules():
        if isinstance(a, ActQuantizer):
            a.enabled = False
    down = get_submodule(fblock, groups[-1].names[0])
    xs = []
    h = down.register_forward_pre_hook(lambda mod, a: xs.append(a[0].detach().reshape(-1, a[0].shape[-1])))
    finputs = capture_block_inputs(fp.model, fblock, IDS, 4)
    with torch.no_grad():
        for b in range(len(finputs)):
            call_block(fblock, finputs, b)
    h.remove()
    x = down.inq.rotation.rotate(torch.cat(xs).double())
    w = down.inq.weight_inverse(down.linear.weight.double())
    c_fp, _ = gptq_quantize(w, x.T @ x, 4, damp=0.01, scale=mse_clip_scale(w.float(), 4))
    assert not torch.equal(c_fp, codes_fp_hessian[groups[-1].names[0]])


def test_quarot_calibrates_end_to_end(tmp_path):
    lm = tiny_random_loaded("llama", layers=2)
    meta = calibrate(lm, make_method({"type": "quarot"}, 4, 4), IDS, tmp_path, batch_size=4,
                     log=lambda s: None)
    assert meta["propagate"] == "quant"
    assert all(isinstance(get_submodule(lm.blocks[1], n), QuantLinear)
               and get_submodule(lm.blocks[1], n).w_quant is not None
               for n in ("self_attn.q_proj", "mlp.down_proj"))
