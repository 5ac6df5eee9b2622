"""``gptq`` against AutoGPTQ's arithmetic (QDLM's copy: ``auto_gptq/quantization/gptq.py``
``GPTQ.fasterquant`` and ``quantizer.py`` ``Quantizer``), written here from its code: the group
parameters found at each group's first column from the weights as updated at the start of the
block, zero points, act-order, dead columns; and the sequential (``true_sequential``) loop over
a block's groups with Hessians from the partly quantized block."""
import pytest
import torch

from fair_calib.calibrate import calibrate
from fair_calib.methods import load_quantized, make_method
from fair_calib.quant.blockio import call_block, capture_block_inputs
from fair_calib.quant.discovery import discover_groups, get_submodule
from fair_calib.quant.gptq import gptq_grouped, gptq_quantize
from fair_calib.quant.toy import tiny_random_loaded

torch.set_num_threads(1)
IDS = torch.randint(0, 60, (8, 16), generator=torch.Generator().manual_seed(1))


# ------------------------------------------------------------------ the reference, transcribed
def ref_find_params(x, bits, sym):
    """AutoGPTQ Quantizer.configure(bits, perchannel=True, sym, mse=False).find_params(x, weight=True)."""
    x = x.clone()
    maxq = 2 ** bits - 1
    tmp = torch.zeros(x.shape[0], dtype=x.dtype)
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


def ref_fasterquant(W, H, bits, group_size=-1, sym=True, actorder=False, blocksize=128,
                    percdamp=0.01):
    """GPTQ.fasterquant (static_groups=False), float64; returns (Q, scale, zero, g_idx)."""
    W = W.clone().double()
    H = H.clone().double()
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


def _problem(seed=0, rows=24, cols=80):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(300, cols, generator=g, dtype=torch.float64) @ \
        (torch.eye(cols, dtype=torch.float64) + 0.3 * torch.randn(cols, cols, generator=g, dtype=torch.float64))
    x[:, 7] = 0.0                                     # a dead input column
    x[:, 11] *= 6.0                                   # an outlier channel (act-order moves it)
    w = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    w[2] = w[2].abs()                                 # an all-positive row (symmetric quirk)
    return w, x.T @ x


# ------------------------------------------------------------------ the single-matrix sweep
@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("group_size,block", [(32, 128), (16, 32), (-1, 128), (128, 128)])
@pytest.mark.parametrize("sym,act_order", [(True, False), (False, False), (True, True), (False, True)])
def test_gptq_grouped_equals_autogptq(bits, group_size, block, sym, act_order):
    w, H = _problem()
    Q, scale, zero, g_idx = ref_fasterquant(w, H, bits, group_size, sym, act_order, block)
    gc = gptq_grouped(w, H, bits, group_size=group_size, sym=sym, act_order=act_order,
                      block_size=block)
    assert torch.equal(gc.g_idx, g_idx)
    assert torch.allclose(gc.scale.double(), scale, rtol=1e-6, atol=0)
    assert torch.equal(gc.zero.double(), zero)
    assert torch.allclose(gc.dequantize().double(), Q, rtol=1e-6, atol=1e-7)
    assert gc.codes.min() >= 0 and gc.codes.max() <= 2 ** bits - 1


def test_the_comparison_sees_each_step():
    """Changing one step of the reference (where the group parameters are read, act-order,
    symmetric grid, the damping) changes the result: the equality above is not vacuous."""
    w, H = _problem()
    want = gptq_grouped(w, H, 4, group_size=16, sym=True, act_order=False, block_size=32).dequantize().double()
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
def test_sequential_gptq_block_equals_autogptqs_loop():
    """AutoGPTQ's quantize(): groups in execution order, each group's Hessian from the block run
    with the earlier groups' weights already quantized; activations never quantized."""
    lm = tiny_random_loaded("llama", layers=1)
    ref = tiny_random_loaded("llama", layers=1)
    m = make_method({"type": "gptq", "group_size": 32}, 4, 16)
    block, rblock = lm.blocks[0], ref.blocks[0]
    inputs = capture_block_inputs(lm.model, block, IDS, 4)
    rinputs = capture_block_inputs(ref.model, rblock, IDS, 4)
    groups = discover_groups(block, lambda: call_block(block, inputs, 0))
    m.quantize_block(block, groups, [None] * len(groups), 0)
    m.fit_block(block, groups, inputs, 0, lambda b: call_block(block, inputs, b))
    for g in groups:
        first = get_submodule(rblock, g.names[0])
        xs = []
        h = first.register_forward_pre_hook(lambda mod, a: xs.append(a[0].detach().reshape(-1, a[0].shape[-1])))
        with torch.no_grad():
            for b in range(len(rinputs)):
                call_block(rblock, rinputs, b)
        h.remove()
        x = torch.cat(xs).double()
        for n in g.names:
            lin = get_submodule(rblock, n)
            Q, scale, zero, _ = ref_fasterquant(lin.weight.detach().double(), x.T @ x, 4, 32)
            got = get_submodule(block, n)
            assert torch.allclose(got._groups.dequantize().double(), Q, rtol=1e-5, atol=1e-6), n
            assert torch.equal(got._groups.zero.double(), zero), n
            with torch.no_grad():
                lin.weight.copy_(Q.float())       # sequential: later groups see it quantized


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
