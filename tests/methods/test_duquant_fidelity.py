"""``duquant`` against DuQuant as QDLM runs it (``--quant_method duquant --block_size B
--max_rotation_step 256 --smooth --alpha 0.5 --lac 0.9 --swc 0.8 --epochs 0``), written here from
its code: ``get_rot.py`` and ``utils.get_rot`` / ``exchange_row_col``, ``UniformAffineQuantizer``
(``rotation``, ``permutation_zigzag``, ``online_duquant_cali``, ``init_duquant``,
``per_token_dynamic_calibration`` with swc / lac, ``fake_quant``), ``QuantLinear`` (the weight
quantizer copies the activation quantizer's R and permutation), the k/v <- q and up <- gate
copies of ``int_llama_layer.py``, and ``quantize/duquant.py``'s loop (smoothing, then the layer
run once on ``rotate_inps``: the mean of the calibration inputs, then each quantized layer's
output; ``quant_inplace``). The default (``arithmetic: authors``) is compared bit for bit with
that code run as DuQuant runs it: the layer in float16 (``qlayer.half()``), Q/K (after a
Hadamard of ``block_size``, with ``lac``) and V quantized for the attention matmuls,
``get_rot``'s ``torch.randn`` from the global RNG seeded once (``main.py``) and never again.
``arithmetic: precise`` is compared with the same code in float32, its ``torch.randn`` drawn
from a generator seeded per block (the project's substitution), up to rounding."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fair_calib.calibrate import calibrate
from fair_calib.methods import load_quantized, make_method
from fair_calib.methods.duquant import givens_spread
from fair_calib.quant.blockio import call_block, capture_block_inputs
from fair_calib.quant.discovery import get_submodule
from fair_calib.quant.toy import tiny_random_loaded
from fixtures import duquant_layers, duquant_smoothing
from fixtures.duquant_smoothing import ref_uaq_half, register_ref_attention

torch.set_num_threads(1)
IDS = torch.randint(0, 60, (8, 16), generator=torch.Generator().manual_seed(2))
BLOCK, STEPS, ALPHA, LAC, SWC = 16, 256, 0.5, 0.9, 0.8
GEN = [None]     # get_rot's random source (the reference: the global RNG, None)


# ---------------------------------------------------------------- utils.py / get_rot.py
def exchange_row_col(_tensor, i, j):
    tensor = _tensor.detach().clone()
    indices_row = torch.arange(tensor.size(0))
    indices_row[i], indices_row[j] = indices_row[j].item(), indices_row[i].item()
    tensor = tensor[indices_row]
    indices_col = torch.arange(tensor.size(1))
    indices_col[i], indices_col[j] = indices_col[j].item(), indices_col[i].item()
    return tensor[:, indices_col]


def rot_pkl(n):
    R = torch.eye(n)
    for i in range(n - 1):
        rot_i = torch.eye(n)
        cos = 1 / np.sqrt(i + 2)
        sin = np.sqrt(i + 1) / np.sqrt(i + 2)
        rot_i[i, i] = rot_i[i + 1, i + 1] = cos
        rot_i[i, i + 1] = -sin
        rot_i[i + 1, i] = sin
        R = torch.matmul(rot_i, R)
    return exchange_row_col(R, 0, n - 1)


def get_rot(n):
    R = rot_pkl(n)
    random_matrix = torch.randn(n - 1, n - 1, generator=GEN[0])
    q, r = torch.linalg.qr(random_matrix)
    q = torch.cat([torch.zeros(n - 1, 1), q], dim=1)
    q = torch.cat([torch.zeros(1, n), q], dim=0)
    q[0, 0] = 1
    return torch.matmul(R, q)


# ---------------------------------------------------------------- UniformAffineQuantizer
def get_hadamard(n):
    if n == 1:
        return torch.tensor([[1.]], dtype=torch.float32)
    H_n_minus_1 = get_hadamard(n // 2)
    return torch.cat([torch.cat([H_n_minus_1, H_n_minus_1], dim=1),
                      torch.cat([H_n_minus_1, -H_n_minus_1], dim=1)], dim=0) / math.sqrt(2)


def ref_qk_quant(a_bits):
    """``qkt_matmul``'s quantizers (``act_quant_params``, ``rotate=None``): init_duquant's
    Hadamard of block_size, then per row with ``lac``."""
    def quant(x):
        x_shape = x.shape
        hadamard = get_hadamard(BLOCK).to(x)
        x = x.reshape(-1, BLOCK)
        x = x.matmul(hadamard).view(x_shape)
        return ref_uaq_half(x, a_bits, lac=LAC)
    return quant


class RefQuantizer:
    def __init__(self, n_bits, swc=None, lac=None, half=False):
        self.n_bits, self.swc, self.lac, self.half = n_bits, swc, lac, half
        self.R, self.permutation_list, self.init = None, None, False

    def rotation(self, weight):
        weight = weight.detach().clone()
        _weight = weight.detach().clone()
        hidden_dim = weight.shape[-1]
        exchange_ids, peak_values = [], []
        weight = weight.reshape(-1, BLOCK)
        Rot = get_rot(BLOCK)
        for j in range(STEPS):
            r, c = divmod(weight.argmax().item(), weight.shape[-1])
            r2, c2 = divmod(weight.argmin().item(), weight.shape[-1])
            peak_values.append((weight[r, c] - weight[r2, c2]).item())
            exchange_id = r if weight[r, c].abs() > weight[r2, c2].abs() else r2
            exchange_ids.append(exchange_id)
            R = exchange_row_col(Rot.clone(), 0, exchange_id % BLOCK).to(weight)
            weight = torch.matmul(weight, R)
        r, c = divmod(weight.argmax().item(), weight.shape[-1])
        r2, c2 = divmod(weight.argmin().item(), weight.shape[-1])
        peak_values.append((weight[r, c] - weight[r2, c2]).item())
        weight = _weight.detach().clone()
        select_length = torch.argmin(torch.tensor(peak_values)).item()
        exchange_ids = exchange_ids[:select_length]
        R_ = torch.eye(BLOCK).to(weight)
        for exchange_id in exchange_ids:
            R = exchange_row_col(Rot.clone(), 0, exchange_id % BLOCK).to(R_)
            R_ = torch.matmul(R_, R)
        weight = torch.matmul(weight.reshape(-1, BLOCK), R_).reshape(-1, hidden_dim)
        return weight, exchange_ids, R_

    def permutation_zigzag(self, weight):
        weight = weight.detach().clone()
        hidden_dim = weight.shape[-1]
        weight_max = weight.abs().max(dim=0).values
        pairs = [(i, weight_max[i].item()) for i in range(hidden_dim)]
        pairs.sort(key=lambda x: x[1], reverse=True)

        def zigzag(numbers):
            cur, up = 0, True
            l = [[] for i in range(hidden_dim // BLOCK)]
            for i in range(len(numbers)):
                l[cur].append(numbers[i])
                if up:
                    cur += 1
                    if cur == len(l):
                        cur -= 1
                        up = False
                else:
                    cur -= 1
                    if cur == -1:
                        cur += 1
                        up = True
            return l
        pairs = zigzag(pairs)
        for i in range(len(pairs)):
            pairs[i].sort(key=lambda x: x[1], reverse=True)
        perm = torch.zeros(hidden_dim, dtype=torch.long)
        for i in range(len(pairs)):
            perm[i * BLOCK:(i + 1) * BLOCK] = torch.tensor([_[0] for _ in pairs[i]])
        return weight[:, perm], perm

    def online_duquant_cali(self, weight):
        weight_shape = weight.shape           # QDLM's copy returns the input's shape
        weight, _, R1 = self.rotation(weight.detach().clone())
        weight, perm = self.permutation_zigzag(weight)
        weight, _, R2 = self.rotation(weight)
        self.R = torch.stack([R1, R2])
        self.permutation_list = perm.unsqueeze(0)
        return weight.reshape(weight_shape)

    def init_duquant(self, x):
        if not self.init:
            self.init = True
            return self.online_duquant_cali(x)
        x_size = x.shape
        for i in range(len(self.permutation_list)):
            x = x.reshape(-1, BLOCK)
            x = x.matmul(self.R[i].to(x)).reshape(x_size).squeeze(0)
            x = x[:, self.permutation_list[i]]
        x = x.reshape(-1, BLOCK)
        return x.matmul(self.R[-1].to(x)).reshape(x_size)

    def __call__(self, x):
        if hasattr(self, "smooth_scales"):
            if self.half:
                x /= self.smooth_scales
            else:
                x = x / self.smooth_scales
        x = self.init_duquant(x)
        if self.n_bits >= 16:
            return x
        if self.half:
            return ref_uaq_half(x, self.n_bits, lac=self.lac, swc=self.swc)
        xmin, xmax = x.amin([-1], keepdim=True), x.amax([-1], keepdim=True)
        if self.swc:
            xmax, xmin = self.swc * xmax, self.swc * xmin
        elif self.lac:
            xmax, xmin = self.lac * xmax, self.lac * xmin
        scale = ((xmax - xmin) / (2 ** self.n_bits - 1)).clamp(min=1e-5, max=1e4)
        zp = (-xmin / scale).clamp(min=-1e4, max=1e4).round()
        x_int = (torch.round(x.float() / scale) + zp).clamp(0, 2 ** self.n_bits - 1)
        return (x_int - zp) * scale


class RefQuantLinear(nn.Module):
    """``QuantLinear`` with weight and activation quantization on; ``src``: the linear whose
    quantizers it copies before its first forward (k/v <- q, up <- gate)."""

    def __init__(self, lin, w_bits, a_bits, src=None, half=False):
        super().__init__()
        self.weight, self.bias = lin.weight, lin.bias
        self.act = RefQuantizer(a_bits, lac=LAC, half=half)
        self.wq = RefQuantizer(w_bits, swc=SWC, half=half)
        self.src, self.frozen = src, False

    def forward(self, x):
        if self.src is not None and not self.act.init:
            self.act.R, self.act.permutation_list = self.src.act.R, self.src.act.permutation_list
            self.act.init = True
            if hasattr(self.src.act, "smooth_scales"):
                self.act.smooth_scales = self.src.act.smooth_scales
        x = self.act(x)
        if self.frozen:
            w = self.weight
        else:
            self.wq.R, self.wq.permutation_list = self.act.R, self.act.permutation_list
            self.wq.init = True
            w = self.wq(self.weight)
        return F.linear(x, w, self.bias)

    def quant_inplace(self):
        self.weight = nn.Parameter(self.wq(self.weight), requires_grad=False)
        self.frozen = True


def act_scales_of(model):
    return duquant_smoothing.act_scales_of(model, IDS)


def smooth_layer(layer, i, act_scales):
    """DuQuant's ``--smooth`` (tests/fixtures/duquant_smoothing.py); o_proj's online divisor
    as a row, as this file's reference applies it."""
    _, online = duquant_smoothing.smooth_layer(layer, i, act_scales, ALPHA)
    return None if online is None else online.view(1, -1)


def wrap_layer(layer, w_bits, a_bits, online, half=False):
    a, mlp = layer.self_attn, layer.mlp
    Q = lambda lin, src=None: RefQuantLinear(lin, w_bits, a_bits, src, half)   # noqa: E731
    q, gate = Q(a.q_proj), Q(mlp.gate_proj)
    out = {"self_attn.q_proj": q, "self_attn.k_proj": Q(a.k_proj, q), "self_attn.v_proj": Q(a.v_proj, q),
           "self_attn.o_proj": Q(a.o_proj), "mlp.gate_proj": gate, "mlp.up_proj": Q(mlp.up_proj, gate),
           "mlp.down_proj": Q(mlp.down_proj)}
    if online is not None:
        out["self_attn.o_proj"].act.smooth_scales = online
    for name, ql in out.items():
        parent, child = name.split(".")
        setattr(getattr(layer, parent), child, ql)
    return out


@torch.no_grad()
def ref_duquant(lm, w_bits, a_bits, half=False, seed=0, style=None, rope32=False, scales=None):
    """``duquant()`` on every layer, in place; returns each layer's RefQuantLinears. ``half``:
    as DuQuant runs (float16 layers, Q/K/V quantized, ``torch.manual_seed(seed)`` once before
    the first layer); else float32 and ``get_rot`` from a generator seeded per block.
    ``style``: the layers compute as DuQuant's layer class of that name
    (``tests/fixtures/duquant_layers.py``: llama, dream, llada; ``rope32``: LLaDA's
    ``rope_full_precision``); None: the model's own layer code (with ``half``, Q/K/V quantized
    before its SDPA). ``scales``: a list given the float16 smoothing scales of each layer."""
    model = lm.model
    act_scales = act_scales_of(model)
    layers = model.model.layers
    inps = capture_block_inputs(model, layers[0], IDS, 4)
    one = capture_block_inputs(model, layers[0], IDS[:1], 1)    # batch-1 masks / positions
    if half:
        v = lambda x: ref_uaq_half(x, a_bits)     # noqa: E731
        if style is None:
            model.config._attn_implementation = register_ref_attention(
                "ref_duquant_qkv", ref_qk_quant(a_bits), ref_qk_quant(a_bits), v)
        rotate_inps = torch.cat(inps.hidden).half().mean(dim=0)
        GEN[0] = None
        torch.manual_seed(seed)                               # main.py
    else:
        rotate_inps = torch.cat(inps.hidden).mean(dim=0)
    out = []
    for i, layer in enumerate(layers):
        if half:
            sc, online = duquant_smoothing.smooth_layer_half(layer, i, act_scales, ALPHA)
            if scales is not None:
                scales.append(sc)
        else:
            online = smooth_layer(layer, i, act_scales)
            GEN[0] = torch.Generator().manual_seed(i)           # the project's per-block seed
        qls = wrap_layer(layer, w_bits, a_bits, online, half)
        if style is not None:
            duquant_layers.use_layer(layer, model.config, style, duquant_layers.Quant(
                ref_qk_quant(a_bits), ref_qk_quant(a_bits), v), rope32)
        rotate_inps = call_block(layer, one, 0, rotate_inps.unsqueeze(0))[0]
        for ql in qls.values():
            ql.quant_inplace()
        out.append(qls)
    return out


def test_givens_spread_is_rot_pkl():
    for n in (2, 16, 128):
        assert torch.equal(givens_spread(n), rot_pkl(n))
    # its channel-0 row spreads evenly: what the greedy step relies on
    assert torch.allclose(givens_spread(16)[0].abs(), torch.full((16,), 0.25), atol=1e-6)


GROUP_OF = {"self_attn.q_proj": 0, "self_attn.k_proj": 0, "self_attn.v_proj": 0,
            "self_attn.o_proj": 1, "mlp.gate_proj": 2, "mlp.up_proj": 2, "mlp.down_proj": 3}


def _maker(arch):
    return ((lambda: tiny_random_loaded("llama", layers=2)) if arch == "llama" else
            (lambda: tiny_random_loaded("qwen2", layers=2, kv_heads=2)))


def _per_sequence_logits(lm):
    """One sequence at a time: init_duquant's x[:, perm] after squeeze(0) assumes batch 1."""
    return torch.cat([lm.logits(IDS[k:k + 1]) for k in range(IDS.shape[0])])


LAYOUTS = duquant_layers.LAYOUTS


def _record_rotation_inputs(monkeypatch):
    """Every rotation search's input, in order: the project's and the reference's."""
    from fair_calib.methods.duquant import DuQuantRotation

    got, want = [], []
    cal, ref_cal = DuQuantRotation.calibrate, RefQuantizer.online_duquant_cali

    def calibrate(self, x, steps, gen):
        got.append(x.clone())
        return cal(self, x, steps, gen)

    def online_duquant_cali(self, weight):
        want.append(weight.detach().clone().reshape(-1, weight.shape[-1]))
        return ref_cal(self, weight)
    monkeypatch.setattr(DuQuantRotation, "calibrate", calibrate)
    monkeypatch.setattr(RefQuantizer, "online_duquant_cali", online_duquant_cali)
    return got, want


@pytest.mark.parametrize("layout,bits", [("llada", (4, 4)), ("llada", (8, 8)),
                                         ("llada-rope32", (4, 4)), ("dream", (4, 4)),
                                         ("dream", (8, 8)), ("llama", (4, 4))])
def test_duquant_equals_duquants_layers_bit_for_bit(tmp_path, monkeypatch, layout, bits):
    """The default against DuQuant run as it runs, through its own layer classes
    (``int_llada_layer`` / ``int_dream_layer`` / ``int_llama_layer``: the norm's
    multiply-then-cast, rotary, attention in their dtypes and order): every rotation search's
    input, smoothing scale, rotation, permutation, quantized weight, folded norm, each quantized
    block's output and the logits ``torch.equal``."""
    make, rope32 = LAYOUTS[layout]
    style = layout.split("-")[0]
    lm, ref = make(), make()
    got_x, want_x = _record_rotation_inputs(monkeypatch)
    m = make_method({"type": "duquant", "block_size": BLOCK}, *bits, seed=3)
    calibrate(lm, m, IDS, tmp_path, batch_size=4, log=lambda s: None)
    assert lm.blocks[0]._duquant_layer == style
    want_scales = []
    want = ref_duquant(ref, *bits, half=True, seed=3, style=style, rope32=rope32,
                       scales=want_scales)
    for i, sc in enumerate(want_scales):        # the smoothing (activation statistics)
        for j, key in enumerate(["qkv", "out", "fc1", "down"]):
            assert torch.equal(m.scales[i][j], sc[key]), (i, key)
    assert len(got_x) == len(want_x) == 4 * len(want)     # q/k/v, o, gate/up, down per block
    for k, (g, w) in enumerate(zip(got_x, want_x)):
        assert g.dtype == w.dtype == torch.float16 and torch.equal(g, w), k
    rotated = permuted = 0
    for i, qls in enumerate(want):
        blk = lm.blocks[i]
        for n, rq in qls.items():
            ql = get_submodule(blk, n)
            assert torch.equal(ql.inq.rotation.R, rq.act.R), (i, n)
            assert torch.equal(ql.inq.rotation.perm, rq.act.permutation_list), (i, n)
            assert torch.equal(ql.w_quant, rq.weight), (i, n)
            rotated += sum(not torch.equal(r, torch.eye(BLOCK, dtype=r.dtype)) for r in rq.act.R)
            permuted += int(not torch.equal(rq.act.permutation_list[0], torch.arange(ql.in_features)))
        for n in ("input_layernorm", "post_attention_layernorm"):
            assert torch.equal(get_submodule(blk, n).weight, get_submodule(ref.blocks[i], n).weight)
    with torch.no_grad():
        # each quantized block on the same input (a calibration sequence, block by block)
        one = capture_block_inputs(lm.model, lm.blocks[0], IDS[1:2], 1)
        h = one.hidden[0]
        for i in range(len(want)):
            out = call_block(lm.blocks[i], one, 0, h)
            assert torch.equal(out, call_block(ref.blocks[i], one, 0, h)), i
            h = out
        want_logits = _per_sequence_logits(ref)
        got = _per_sequence_logits(load_quantized(make(), tmp_path))
    assert torch.equal(got, want_logits)
    assert rotated >= 8 and permuted >= 4          # not vacuous


def test_the_global_stream_is_seeded_by_the_config_seed(tmp_path):
    """Another config seed gives other rotations (the equality above pins the one stream
    seeded once); seeding the stream leaves the caller's global RNG where it was."""
    runs = {}
    for seed in (3, 4):
        lm = _maker("llama")()
        m = make_method({"type": "duquant", "block_size": BLOCK}, 4, 4, seed=seed)
        calibrate(lm, m, IDS, tmp_path / str(seed), batch_size=4, log=lambda s: None)
        runs[seed] = [get_submodule(b, "self_attn.q_proj").inq.rotation.R.clone() for b in lm.blocks]
    assert not torch.equal(runs[3][0], runs[4][0])
    m = make_method({"type": "duquant", "block_size": BLOCK}, 4, 4, seed=3)
    lm = _maker("llama")()
    torch.manual_seed(123)
    m.prepare_model(lm)
    assert torch.equal(torch.randn(3), torch.randn(3, generator=torch.Generator().manual_seed(123)))


@pytest.mark.parametrize("arch", ["llama", "qwen2-gqa"])
@pytest.mark.parametrize("bits", [(8, 8), (4, 4)])
def test_duquant_precise_equals_duquants_steps_in_float32(tmp_path, arch, bits):
    make = _maker(arch)
    lm, ref = make(), make()
    m = make_method({"type": "duquant", "block_size": BLOCK, "arithmetic": "precise"}, *bits)
    calibrate(lm, m, IDS, tmp_path, batch_size=4, log=lambda s: None)
    want = ref_duquant(ref, *bits)
    rotated = permuted = 0
    for i, qls in enumerate(want):
        blk = lm.blocks[i]
        for n, rq in qls.items():
            ql = get_submodule(blk, n)
            rot = ql.inq.rotation
            assert torch.allclose(rot.R, rq.act.R, atol=1e-5), (i, n)
            assert torch.equal(rot.perm, rq.act.permutation_list), (i, n)
            assert torch.allclose(ql._groups.dequantize(), rq.weight, rtol=1e-5, atol=1e-5), (i, n)
            rotated += sum(not torch.allclose(r, torch.eye(BLOCK)) for r in rq.act.R)
            permuted += int(not torch.equal(rq.act.permutation_list[0], torch.arange(rot.perm.shape[1])))
        for n in ("input_layernorm", "post_attention_layernorm"):
            assert torch.allclose(get_submodule(blk, n).weight,
                                  get_submodule(ref.blocks[i], n).weight, rtol=1e-6)
    with torch.no_grad():
        want_logits = _per_sequence_logits(ref)
        got = load_quantized(make(), tmp_path).logits(IDS)
        fp = make().logits(IDS)
    assert torch.allclose(got, want_logits, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(got, fp, atol=1e-3)
    # not vacuous: both rotations of most groups moved, the permutations are not the identity
    assert rotated >= 8 and permuted >= 4


def test_the_comparison_sees_each_step():
    """Clip ratios and bits reach the reference quantizer (a mutation there would show)."""
    x = torch.randn(5, 32)
    q = RefQuantizer(4, lac=LAC)
    q.init, q.R, q.permutation_list = True, torch.eye(BLOCK).repeat(2, 1, 1), torch.arange(32)[None]
    q2 = RefQuantizer(4, lac=1.0)
    q2.init, q2.R, q2.permutation_list = q.init, q.R, q.permutation_list
    assert not torch.equal(q(x), q2(x))
    assert math.isclose(float(givens_spread(4).det()), 1.0, abs_tol=1e-5) or \
        math.isclose(float(givens_spread(4).det()), -1.0, abs_tol=1e-5)


@pytest.mark.parametrize("arithmetic", ["authors", "precise"])
def test_a_resumed_run_replays_the_rotation_stream(tmp_path, arithmetic):
    """Block 0 restored from its saved state (with its rotation-pass input and, by default,
    the global RNG's state after it), block 1 recomputed: its rotation input comes through the
    restored quantized block 0 and its draws continue the stream, so its rotations and codes
    are those of the uninterrupted run."""
    from fair_calib.jobs import io

    cfg = {"type": "duquant", "block_size": BLOCK, "arithmetic": arithmetic}
    calibrate(tiny_random_loaded("qwen2", layers=2, kv_heads=2), make_method(cfg, 4, 4), IDS,
              tmp_path, batch_size=4, log=lambda s: None)
    whole, _ = io.load_tensors(tmp_path / "params.safetensors")
    (tmp_path / "blocks" / "1.safetensors").unlink()
    (tmp_path / "meta.json").unlink()
    logs = []
    calibrate(tiny_random_loaded("qwen2", layers=2, kv_heads=2), make_method(cfg, 4, 4), IDS,
              tmp_path, batch_size=4, log=logs.append)
    assert any("block 0: resumed" in s for s in logs)
    again, _ = io.load_tensors(tmp_path / "params.safetensors")
    assert set(again) == set(whole)
    for k in whole:
        assert torch.equal(again[k], whole[k]), k
