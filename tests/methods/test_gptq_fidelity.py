"""``gptq`` against AutoGPTQ's arithmetic (QDLM's copy: ``auto_gptq/quantization/gptq.py``
``GPTQ.add_batch`` / ``GPTQ.fasterquant`` and ``quantizer.py`` ``Quantizer``), written here from
its code: the float32 running-mean Hessian, the group parameters found at each group's first
column from the weights as updated at the start of the block, zero points, act-order, dead
columns; and the sequential (``true_sequential``) loop over a block's groups with Hessians from
the partly quantized block. ``arithmetic: authors`` (the default) equals it bit for bit;
``arithmetic: precise`` (float64) equals the same steps run in float64 up to rounding."""
import math

import pytest
import torch

from fair_calib.calibrate import calibrate
from fair_calib.methods import load_quantized, make_method
from fair_calib.quant.blockio import call_block, capture_block_inputs
from fair_calib.quant.discovery import discover_groups, get_submodule
from fair_calib.quant.gptq import autogptq_hessian, gptq_grouped, gptq_quantize
from fair_calib.quant.toy import tiny_random_loaded

torch.set_num_threads(1)
IDS = torch.randint(0, 60, (8, 16), generator=torch.Generator().manual_seed(1))


# ------------------------------------------------------------------ the reference, transcribed
def ref_find_params(x, bits, sym):
    """AutoGPTQ Quantizer.configure(bits, perchannel=True, sym, mse=False).find_params(x, weight=True)."""
    x = x.clone()
    maxq = 2 ** bits - 1
    tmp = torch.zeros(x.shape[0], dtype=x.dtype)   # AutoGPTQ: float32, as its W
    xmin = torch.minimum(x.min(1)[0], tmp)
    xmax = torch.maximum(x.max(1)[0], tmp)
    if sym:
        xmax = torch.maximum(torch.abs(xmin), xmax)
        tmp = xmin < 0
        if torch.any(tmp):
            xmin[tmp] = -xmax[tmp]
    tmp = (xmin == 0) & (xmax == 0)
    xmin[tmp] = -1
    xmax[tmp] = +1
    scale = (xmax - xmin) / maxq
    zero = torch.full_like(scale, (maxq + 1) / 2) if sym else torch.round(-xmin / scale)
    return scale.reshape(-1, 1), zero.reshape(-1, 1)


def ref_quantize(x, scale, zero, maxq):
    q = torch.clamp(torch.round(x / scale) + zero, 0, maxq)
    return scale * (q - zero)


class RefHessian:
    """GPTQ.__init__'s H and GPTQ.add_batch for an nn.Linear."""

    def __init__(self, columns):
        self.H = torch.zeros((columns, columns))
        self.nsamples = 0

    def add_batch(self, inp):
        if len(inp.shape) == 2:
            inp = inp.unsqueeze(0)
        tmp = inp.shape[0]
        if len(inp.shape) == 3:
            inp = inp.reshape((-1, inp.shape[-1]))
        inp = inp.t()
        self.H *= self.nsamples / (self.nsamples + tmp)
        self.nsamples += tmp
        inp = math.sqrt(2 / self.nsamples) * inp.float()
        self.H += inp.matmul(inp.t())


def ref_fasterquant(W, H, bits, group_size=-1, sym=True, actorder=False, blocksize=128,
                    percdamp=0.01, dtype=torch.float64):
    """GPTQ.fasterquant (static_groups=False) in ``dtype`` (AutoGPTQ: ``W.float()`` and its
    float32 H); returns (Q, scale, zero, g_idx)."""
    W = W.clone().to(dtype)
    H = H.clone().to(dtype)
    maxq = 2 ** bits - 1
    columns = W.shape[1]
    cur = ref_find_params(W, bits, sym)          # quantizer not ready: full-row parameters
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    if actorder:
        perm = torch.argsort(torch.diag(H), descending=True)
        W = W[:, perm]
        H = H[perm][:, perm]
        invperm = torch.argsort(perm)
    Q = torch.zeros_like(W)
    damp = percdamp * torch.mean(torch.diag(H))
    diag = torch.arange(columns)
    H[diag, diag] += damp
    H = torch.linalg.cholesky(H)
    H = torch.cholesky_inverse(H)
    Hinv = torch.linalg.cholesky(H, upper=True)
    scale, zero, now_idx = [], [], 1
    for i1 in range(0, columns, blocksize):
        i2 = min(i1 + blocksize, columns)
        W1 = W[:, i1:i2].clone()
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            w = W1[:, i]
            d = Hinv1[i, i]
            if group_size != -1:
                if (i1 + i) % group_size == 0:
                    cur = ref_find_params(W[:, (i1 + i):(i1 + i + group_size)], bits, sym)
                if ((i1 + i) // group_size) - now_idx == -1:
                    scale.append(cur[0])
                    zero.append(cur[1])
                    now_idx += 1
            q = ref_quantize(w.unsqueeze(1), cur[0], cur[1], maxq).flatten()
            Q1[:, i] = q
            err1 = (w - q) / d
            W1[:, i:] -= err1.unsqueeze(1).matmul(Hinv1[i, i:].unsqueeze(0))
            Err1[:, i] = err1
        Q[:, i1:i2] = Q1
        W[:, i2:] -= Err1.matmul(Hinv[i1:i2, i2:])
    gs = group_size if group_size != -1 else columns
    g_idx = torch.tensor([i // gs for i in range(columns)], dtype=torch.int32)
    if actorder:
        Q = Q[:, invperm]
        g_idx = g_idx[invperm]
    if not scale:
        scale.append(cur[0])
        zero.append(cur[1])
    return Q, torch.cat(scale, dim=1), torch.cat(zero, dim=1), g_idx


def _inputs(seed=0, cols=80, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(300, cols, generator=g, dtype=torch.float64) @ \
        (torch.eye(cols, dtype=torch.float64) + 0.3 * torch.randn(cols, cols, generator=g, dtype=torch.float64))
    x[:, 7] = 0.0                                     # a dead input column
    x[:, 11] *= 6.0                                   # an outlier channel (act-order moves it)
    w = torch.randn(24, cols, generator=g, dtype=torch.float64)
    w[2] = w[2].abs()                                 # an all-positive row (symmetric quirk)
    return w.to(dtype), x.to(dtype)


def _problem(seed=0, rows=24, cols=80):
    w, x = _inputs(seed, cols)
    return w[:rows], x.T @ x


def _autogptq_h(x, seq=20):
    """AutoGPTQ's H of ``x`` [tokens, cols] fed as sequences of ``seq`` tokens."""
    ref = RefHessian(x.shape[1])
    for s in x.float().split(seq):
        ref.add_batch(s.unsqueeze(0))
    return ref.H


# ------------------------------------------------------------------ the single-matrix sweep
@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("group_size,block", [(32, 128), (16, 32), (-1, 128), (128, 128)])
@pytest.mark.parametrize("sym,act_order", [(True, False), (False, False), (True, True), (False, True)])
def test_gptq_grouped_equals_autogptq_bit_for_bit(bits, group_size, block, sym, act_order):
    """``authors``: AutoGPTQ's float32 fasterquant on its float32 H, every quantity equal."""
    w, x = _inputs(dtype=torch.float32)
    H = _autogptq_h(x)
    Q, scale, zero, g_idx = ref_fasterquant(w, H, bits, group_size, sym, act_order, block,
                                            dtype=torch.float32)
    gc = gptq_grouped(w, H, bits, group_size=group_size, sym=sym, act_order=act_order,
                      block_size=block)
    assert torch.equal(gc.g_idx, g_idx)
    assert torch.equal(gc.scale, scale) and torch.equal(gc.zero, zero)
    assert torch.equal(gc.dequantize(), Q)
    assert gc.codes.min() >= 0 and gc.codes.max() <= 2 ** bits - 1


def test_autogptq_hessian_equals_add_batch_fed_one_sequence_at_a_time():
    """The running 2/n mean, sequence by sequence (AutoGPTQ's quantize() with batch_size 1),
    whatever the micro-batch the block is run on; not the float64 sum."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8, bias=False)
    seqs = torch.randn(6, 10, 16) * torch.linspace(0.1, 5, 16)
    group = type("G", (), {"names": ["lin"]})()
    block = torch.nn.Sequential()
    block.add_module("lin", lin)
    for micro in (1, 2, 3):
        H = autogptq_hessian(block, group, 6 // micro, lambda b: block(seqs[b * micro:(b + 1) * micro]))
        ref = RefHessian(16)
        for s in seqs:
            ref.add_batch(s.unsqueeze(0))
        assert torch.equal(H, ref.H), micro
    x = seqs.reshape(-1, 16).double()
    assert not torch.equal(H, (x.T @ x * 2 / 6).float())       # another arithmetic


@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("group_size,block", [(32, 128), (16, 32), (-1, 128), (128, 128)])
@pytest.mark.parametrize("sym,act_order", [(True, False), (False, False), (True, True), (False, True)])
def test_gptq_grouped_precise_equals_autogptq_in_float64(bits, group_size, block, sym, act_order):
    """``precise``: the same steps in float64 (H = X^T X), equal up to rounding."""
    w, H = _problem()
    Q, scale, zero, g_idx = ref_fasterquant(w, H, bits, group_size, sym, act_order, block)
    gc = gptq_grouped(w, H, bits, group_size=group_size, sym=sym, act_order=act_order,
                      block_size=block, arithmetic="precise")
    assert torch.equal(gc.g_idx, g_idx)
    assert torch.allclose(gc.scale.double(), scale, rtol=1e-6, atol=0)
    assert torch.equal(gc.zero.double(), zero)
    assert torch.allclose(gc.dequantize().double(), Q, rtol=1e-6, atol=1e-7)
    assert gc.codes.min() >= 0 and gc.codes.max() <= 2 ** bits - 1


def test_the_comparison_sees_each_step():
    """Changing one step of the reference (where the group parameters are read, act-order,
    symmetric grid, the damping) changes the result: the equality above is not vacuous."""
    w, H = _problem()
    want = gptq_grouped(w, H, 4, group_size=16, sym=True, act_order=False, block_size=32,
                        arithmetic="precise").dequantize().double()
    for variant in (dict(group_size=16, sym=False, actorder=False, blocksize=32),
                    dict(group_size=16, sym=True, actorder=True, blocksize=32),
                    dict(group_size=32, sym=True, actorder=False, blocksize=32),
                    dict(group_size=16, sym=True, actorder=False, blocksize=32, percdamp=0.1)):
        Q, *_ = ref_fasterquant(w, H, 4, **variant)
        assert not torch.allclose(Q, want, rtol=1e-6, atol=1e-7), variant
    # group parameters from the in-block-updated weights (not AutoGPTQ's) differ too
    Q_blk16, *_ = ref_fasterquant(w, H, 4, 16, True, False, blocksize=16)
    assert not torch.allclose(Q_blk16, want, rtol=1e-6, atol=1e-7)


def test_quarots_symmetric_gptq_is_unchanged_by_the_shared_sweep():
    """QuaRot's grid through the shared sweep: codes in [-q-1, q], error feedback as before."""
    w, H = _problem(1, rows=8, cols=40)
    codes, scale = gptq_quantize(w, H, 4, damp=0.01)
    assert codes.min() >= -8 and codes.max() <= 7
    assert torch.allclose(scale.double(), w.abs().amax(1, keepdim=True) / 7)
    # GPTQ lowers the Hessian-weighted error below round-to-nearest on the same grid
    e_gptq = codes.double() * scale.double() - w
    e_rtn = torch.clamp(torch.round(w / scale.double()), -8, 7) * scale.double() - w
    assert torch.trace(e_gptq @ H @ e_gptq.T) < torch.trace(e_rtn @ H @ e_rtn.T)


# ------------------------------------------------------------------ the block loop
@pytest.mark.parametrize("arithmetic", ["authors", "precise"])
def test_sequential_gptq_block_equals_autogptqs_loop(arithmetic):
    """AutoGPTQ's quantize(): groups in execution order, each group's Hessian from the block run
    with the earlier groups' weights already quantized; activations never quantized. The
    default (``authors``) equals it bit for bit; ``precise`` (float64) up to rounding."""
    lm = tiny_random_loaded("llama", layers=1)
    ref = tiny_random_loaded("llama", layers=1)
    cfg = {"type": "gptq", "group_size": 32}
    if arithmetic == "precise":
        cfg["arithmetic"] = "precise"
    m = make_method(cfg, 4, 16)
    block, rblock = lm.blocks[0], ref.blocks[0]
    inputs = capture_block_inputs(lm.model, block, IDS, 4)
    rinputs = capture_block_inputs(ref.model, rblock, IDS, 4)
    groups = discover_groups(block, lambda: call_block(block, inputs, 0))
    m.quantize_block(block, groups, [None] * len(groups), 0)
    m.fit_block(block, groups, inputs, 0, lambda b: call_block(block, inputs, b))
    exact = arithmetic == "authors"
    for g in groups:
        first = get_submodule(rblock, g.names[0])
        xs = []
        h = first.register_forward_pre_hook(lambda mod, a: xs.append(a[0].detach()))
        with torch.no_grad():
            for b in range(len(rinputs)):
                call_block(rblock, rinputs, b)
        h.remove()
        if exact:
            hess = RefHessian(first.in_features)
            for x in xs:                      # quantize(batch_size=1): one sequence per call
                for seq in x.split(1):
                    hess.add_batch(seq)
            H = hess.H
        else:
            x = torch.cat([x.reshape(-1, x.shape[-1]) for x in xs]).double()
            H = x.T @ x
        for n in g.names:
            lin = get_submodule(rblock, n)
            Q, scale, zero, _ = ref_fasterquant(lin.weight.detach(), H, 4, 32,
                                                dtype=torch.float32 if exact else torch.float64)
            got = get_submodule(block, n)
            if exact:
                assert torch.equal(got._groups.dequantize(), Q), n
                assert torch.equal(got._groups.scale, scale), n
            else:
                assert torch.allclose(got._groups.dequantize().double(), Q, rtol=1e-5, atol=1e-6), n
            assert torch.equal(got._groups.zero.double(), zero.double()), n
            with torch.no_grad():
                lin.weight.copy_(Q.float())       # sequential: later groups see it quantized


def test_the_two_arithmetics_differ_on_a_block():
    """Not vacuous: on the same block the float32 and float64 arithmetics choose other codes
    somewhere (the setting reaches the computation)."""
    codes = {}
    for arithmetic in ("authors", "precise"):
        lm = tiny_random_loaded("llama", layers=1, hidden=128, intermediate=256)
        m = make_method({"type": "gptq", "group_size": 32, "arithmetic": arithmetic}, 3, 16)
        ids = torch.randint(0, 60, (8, 32), generator=torch.Generator().manual_seed(4))
        inputs = capture_block_inputs(lm.model, lm.blocks[0], ids, 4)
        block = lm.blocks[0]
        groups = discover_groups(block, lambda: call_block(block, inputs, 0))
        m.quantize_block(block, groups, [None] * len(groups), 0)
        m.fit_block(block, groups, inputs, 0, lambda b: call_block(block, inputs, b))
        codes[arithmetic] = torch.cat([get_submodule(block, n)._groups.codes.flatten()
                                       for g in groups for n in g.names])
    assert not torch.equal(codes["authors"], codes["precise"])
    with pytest.raises(ValueError, match="arithmetic must be one of"):
        make_method({"type": "gptq", "arithmetic": "float64"}, 4, 16)


def test_gptq_is_weight_only_and_round_trips(tmp_path):
    with pytest.raises(ValueError, match="weight-only"):
        make_method({"type": "gptq"}, 4, 8)
    make = lambda: tiny_random_loaded("llama", layers=2)   # noqa: E731
    lm = make()
    meta = calibrate(lm, make_method({"type": "gptq", "group_size": 32}, 4, 16), IDS, tmp_path,
                     batch_size=4, log=lambda s: None)
    assert meta["propagate"] == "quant"
    with torch.no_grad():
        want = lm.logits(IDS)
        got = load_quantized(make(), tmp_path).logits(IDS)
        fp = make().logits(IDS)
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, fp, atol=1e-3)
