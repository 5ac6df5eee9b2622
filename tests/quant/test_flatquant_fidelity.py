"""FlatQuant's arithmetic (ruikangliu/FlatQuant), written here from its formulas:
``flat_linear.py`` (LWC, then the GPTQ-repo min/max weight quantizer), ``quant_utils.py``
(the per-token activation quantizer with LAC), ``model_tools/llama_utils.py`` (o_proj
transform, v_proj ``out_trans``) and ``train_utils.py`` (AdamW groups and schedule)."""
import copy
import math

import pytest
import torch

from fair_calib.calibrate import _make_optimizer, _targets_and_stats, _train_block, weighted_mse
from fair_calib.jobs.memory import PeakMemory
from fair_calib.methods import make_method
from fair_calib.quant.blockio import call_block, capture_block_inputs
from fair_calib.quant.discovery import discover_groups
from fair_calib.quant.qlinear import QuantLinear
from fair_calib.quant.quantizers import ActQuantizer, WeightQuantizer
from fair_calib.quant.toy import tiny_random_loaded

torch.set_num_threads(1)


def logit(p):
    return math.log(p / (1 - p))


# ------------------------------------------------------------------ reference formulas
def ref_round_ste(x):
    return (x.round() - x).detach() + x


def ref_weight(w, c_max, c_min, bits):
    """apply_wclip then WeightQuantizer.find_params (sym, per channel) and quantize."""
    wmax = w.max(1, keepdim=True)[0] * torch.sigmoid(c_max)
    wmin = w.min(1, keepdim=True)[0] * torch.sigmoid(c_min)
    w = torch.clamp(w, min=wmin, max=wmax)
    zero = torch.zeros(w.shape[0], dtype=w.dtype)
    xmin = torch.minimum(w.min(1)[0], zero)
    xmax = torch.maximum(w.max(1)[0], zero)
    xmax = torch.maximum(torch.abs(xmin), xmax).clamp(min=1e-5)
    maxq = 2 ** (bits - 1) - 1
    scale = (xmax / maxq).reshape(-1, 1)
    return torch.clamp(ref_round_ste(w / scale), -(maxq + 1), maxq) * scale


def ref_act(x, c_max, c_min, bits):
    """ActivationQuantizer.get_scale_zero (sym, lac) and sym_quant_dequant."""
    maxq = 2 ** (bits - 1) - 1
    r = x.reshape(-1, x.shape[-1])
    xmax, xmin = r.amax(1, keepdim=True), r.amin(1, keepdim=True)
    tmp = torch.zeros_like(xmax)
    xmax, xmin = torch.maximum(xmax, tmp), torch.minimum(xmin, tmp)
    xmax = xmax * torch.sigmoid(c_max)
    xmin = xmin * torch.sigmoid(c_min)
    xmax = torch.maximum(torch.abs(xmin), xmax)
    scale = torch.where(xmax == 0, torch.ones_like(xmax), xmax / maxq)
    scale = scale.repeat(1, r.shape[-1]).reshape(x.shape)
    return torch.clamp(ref_round_ste(x / scale), -(maxq + 1), maxq) * scale


# ------------------------------------------------------------------ 1. LWC
def test_lwc_codes_on_a_hand_made_weight():
    w = torch.tensor([[1.0, -0.4, 0.25, -2.0], [0.3, 0.1, -0.2, 0.05]], dtype=torch.float64)
    wq = WeightQuantizer(2, 4, learnable_clip=True).double()
    with torch.no_grad():
        wq.clip_max.copy_(torch.tensor([[logit(0.6)], [4.0]]))
        wq.clip_min.copy_(torch.tensor([[0.0], [4.0]]))
    y = wq(w)
    # row 0: clamp to [-2 * 0.5, 1 * 0.6] -> [0.6, -0.4, 0.25, -1.0]; scale 1/7
    assert torch.allclose(y[0] * 7, torch.tensor([4.0, -3.0, 2.0, -7.0], dtype=torch.float64))
    # row 1: clamp to [-0.2 s(4), 0.3 s(4)]; scale 0.3 s(4) / 7
    s1 = 0.3 / (1 + math.exp(-4)) / 7
    assert torch.allclose(y[1] / s1, torch.tensor([7.0, 2.0, -5.0, 1.0], dtype=torch.float64))


def test_lwc_gradients_equal_the_reference():
    torch.manual_seed(0)
    w0 = torch.randn(6, 32, dtype=torch.float64)
    cmax0 = 2.0 + torch.randn(6, 1, dtype=torch.float64)
    cmin0 = 2.0 + torch.randn(6, 1, dtype=torch.float64)
    g = torch.randn(6, 32, dtype=torch.float64)
    res = []
    for mine in (True, False):
        w = w0.clone().requires_grad_(True)
        wq = WeightQuantizer(6, 4, learnable_clip=True).double()
        with torch.no_grad():
            wq.clip_max.copy_(cmax0)
            wq.clip_min.copy_(cmin0)
        y = wq(w) if mine else ref_weight(w, wq.clip_max, wq.clip_min, 4)
        (y * g).sum().backward()
        res.append((y.detach(), w.grad, wq.clip_max.grad, wq.clip_min.grad))
    for a, b in zip(*res):
        assert torch.allclose(a, b, atol=1e-12)
    assert res[0][2].abs().sum() > 0 and res[0][3].abs().sum() > 0


def test_lwc_clip_gradient_by_hand():
    """Row [1, -0.4, 0.25, -2], s(c_max) = 0.6, s(c_min) = 0.5: only w_0 is clamped by the
    upper bound (0.6), the scale comes from the lower one, so d/dc_max sum(g y) =
    g_0 * max(w) * s'(c_max) = g_0 * 1 * 0.24 (straight-through rounding)."""
    w = torch.tensor([[1.0, -0.4, 0.25, -2.0]], dtype=torch.float64)
    wq = WeightQuantizer(1, 4, learnable_clip=True).double()
    with torch.no_grad():
        wq.clip_max.fill_(logit(0.6))
        wq.clip_min.fill_(0.0)
    g = torch.tensor([[0.7, -1.1, 0.3, 0.2]], dtype=torch.float64)
    (wq(w) * g).sum().backward()
    assert math.isclose(wq.clip_max.grad.item(), 0.7 * 0.24, rel_tol=1e-9)


def test_lac_values_and_gradients_equal_the_reference():
    torch.manual_seed(1)
    x0 = torch.randn(3, 5, 40, dtype=torch.float64)
    x0[0, 0] = x0[0, 0].abs()             # a token with no negative entry (min side 0)
    g = torch.randn(3, 5, 40, dtype=torch.float64)
    res = []
    for mine in (True, False):
        x = x0.clone().requires_grad_(True)
        aq = ActQuantizer(4, learnable_clip=True).double()
        with torch.no_grad():
            aq.clip_max.fill_(1.3)
            aq.clip_min.fill_(2.1)
        y = aq(x) if mine else ref_act(x, aq.clip_max, aq.clip_min, 4)
        (y * g).sum().backward()
        res.append((y.detach(), x.grad, aq.clip_max.grad, aq.clip_min.grad))
    for a, b in zip(*res):
        assert torch.allclose(a, b, atol=1e-12)
    assert res[0][2].abs() > 0 and res[0][3].abs() > 0


# ------------------------------------------------------------------ 2. init
def test_clip_logits_start_at_four():
    wq = WeightQuantizer(5, 4, learnable_clip=True)
    aq = ActQuantizer(4, learnable_clip=True)
    for p in (wq.clip_max, wq.clip_min, aq.clip_max, aq.clip_min):
        assert torch.all(p == 4.0)
    assert abs(torch.sigmoid(torch.tensor(4.0)).item() - 0.98201) < 5e-6
    lm = tiny_random_loaded("llama", layers=1)
    block = _wrapped(lm, make_method({"type": "flatquant"}, 4, 4))[0]
    logits = [p for n, p in block.named_parameters() if "clip_m" in n]
    assert logits and all(torch.all(p == 4.0) for p in logits)


# ------------------------------------------------------------------ helpers
def _wrapped(lm, method, n=4, seq=16):
    ids = torch.randint(0, 60, (n, seq), generator=torch.Generator().manual_seed(3))
    method.prepare_model(lm)
    block = lm.blocks[0]
    inputs = capture_block_inputs(lm.model, block, ids, n)
    groups = discover_groups(block, lambda: call_block(block, inputs, 0))
    targets, stats = _targets_and_stats(block, inputs, groups, False, 0)
    method.quantize_block(block, groups, stats, 0)
    return block, inputs, targets


# ------------------------------------------------------------------ 3. per-linear clips
def test_one_activation_clip_pair_per_linear():
    lm = tiny_random_loaded("llama", layers=1)
    block, inputs, _ = _wrapped(lm, make_method({"type": "flatquant"}, 4, 4))
    att, mlp = block.self_attn, block.mlp
    assert att.q_proj.inq is att.k_proj.inq is att.v_proj.inq      # one shared transform
    acts = [ql.inq.acts[ql.user] for ql in (att.q_proj, att.k_proj, att.v_proj)]
    acts += [ql.inq.acts[ql.user] for ql in (mlp.gate_proj, mlp.up_proj)]
    assert len({id(a) for a in acts}) == 5 and all(a.learnable_clip for a in acts)
    # k reads the input through its own quantizer: changing k's clip leaves q's output alone
    with torch.no_grad():
        q0 = call_block(block, inputs, 0)
        x = torch.randn(2, 16, att.q_proj.in_features)
        yq, yk = att.q_proj(x), att.k_proj(x)
        att.k_proj.inq.acts[att.k_proj.user].clip_max.fill_(-1.0)
        assert torch.equal(att.q_proj(x), yq) and not torch.equal(att.k_proj(x), yk)
        assert q0.shape == inputs.hidden[0].shape


# ------------------------------------------------------------------ 4. o_proj transform
def _randomise_transforms(block, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in block.named_parameters():
            leaf = name.split(".")[-1]
            if leaf in ("a", "b"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif leaf in ("diag", "diag_scale"):
                p.copy_(torch.exp(0.2 * torch.randn(p.shape, generator=g)))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_o_proj_heads_transform_structure_and_fp_invariance(arch):
    lm = tiny_random_loaded(arch, layers=1, kv_heads=2 if arch == "qwen2" else None)
    with torch.no_grad():
        ids = torch.randint(0, 60, (2, 16), generator=torch.Generator().manual_seed(0))
        want = lm.logits(ids)
    block, _, _ = _wrapped(lm, make_method({"type": "flatquant"}, 16, 16))
    o, v = block.self_attn.o_proj, block.self_attn.v_proj
    t = o.inq.transform
    assert (t.n1, t.n2) == (4, 16) and t.diag_scale is None and not t.right_online
    assert v.out_transform is t and o.out_transform is None
    _randomise_transforms(block)
    with torch.no_grad():
        got = lm.logits(ids)
        for m in block.modules():
            if isinstance(m, QuantLinear):
                m.fold()
        folded = lm.logits(ids)
    tol = 1e-4 * want.abs().max()
    assert torch.allclose(got, want, atol=tol) and torch.allclose(folded, want, atol=tol)


def test_v_proj_fold_equals_the_online_o_transform():
    """W16A4: P2 folded into v_proj (FlatQuant) gives the o_proj input the online full
    Kronecker transform P1 (x) P2 would; W4: v_proj's weight is Q(P2-per-head(LWC(W T^-1)))."""
    def run(fold_v):
        lm = tiny_random_loaded("llama", layers=1)
        block, inputs, _ = _wrapped(lm, make_method({"type": "flatquant"}, 16, 4))
        _randomise_transforms(block)
        if not fold_v:
            block.self_attn.v_proj._out_transform = (None,)
            block.self_attn.o_proj.inq.transform.right_online = True
        with torch.no_grad():
            return call_block(block, inputs, 0)
    a, b = run(True), run(False)
    assert torch.allclose(a, b, atol=1e-5 * b.abs().max())

    lm = tiny_random_loaded("qwen2", layers=1, kv_heads=2)
    block, _, _ = _wrapped(lm, make_method({"type": "flatquant"}, 4, 4))
    _randomise_transforms(block, 1)
    v = block.self_attn.v_proj
    with torch.no_grad():
        for p in (v.wq.clip_max, v.wq.clip_min):
            p.copy_(1.0 + torch.rand(p.shape))
        p2 = v.out_transform.f2.matrices(torch.float32)[0]
        w = v.inq.weight_inverse(v.linear.weight.float(), v.inq.transform_mats())
        wmax = w.max(1, keepdim=True)[0] * torch.sigmoid(v.wq.clip_max)
        wmin = w.min(1, keepdim=True)[0] * torch.sigmoid(v.wq.clip_min)
        w = torch.clamp(w, min=wmin, max=wmax)
        w = (p2 @ w.reshape(-1, 16, w.shape[1])).reshape(w.shape)   # out_trans per head
        want = ref_weight(w, torch.full((w.shape[0], 1), 50.0), torch.full((w.shape[0], 1), 50.0), 4)
        assert torch.allclose(v.effective_weight(), want, atol=1e-6)
        b_want = (p2 @ v.linear.bias.reshape(-1, 16, 1)).reshape(-1)
        assert torch.allclose(v.effective_bias(torch.float32), b_want, atol=1e-6)


# ------------------------------------------------------------------ 5. optimiser
def test_param_groups_and_schedule_are_flatquants():
    lm = tiny_random_loaded("llama", layers=1)
    method = make_method({"type": "flatquant", "lr": 5e-3, "epochs": 15}, 4, 4)
    block, _, _ = _wrapped(lm, method)
    tr = method.training_settings()
    assert (tr["weight_decay"], tr["clip_lr_mult"], tr["eta_min_ratio"]) == (0.01, 10.0, 1e-3)
    assert tr["normalize_loss"] and not tr["shuffle"]
    groups = method.param_groups(block, 5e-3)
    assert [g["lr"] for g in groups] == [5e-3, 5e-3, 5e-2, 5e-2]
    names = {id(p): n for n, p in block.named_parameters()}
    kinds = [{names[id(p)].split(".")[-1] for p in g["params"]} for g in groups]
    assert kinds == [{"a", "b", "diag"}, {"diag_scale"}, {"clip_max", "clip_min"},
                     {"clip_max", "clip_min"}]
    assert sum(len(g["params"]) for g in groups) == len(method.parameters(block))
    opt, sched = _make_optimizer(method, block, tr, 4)
    for _ in range(2):
        opt.step()
        sched.step()
    eta = 5e-3 * 1e-3       # one absolute floor for every group, as CosineAnnealingLR(eta_min)
    for g, base in zip(opt.param_groups, (5e-3, 5e-3, 5e-2, 5e-2)):
        assert math.isclose(g["lr"], eta + (base - eta) * (1 + math.cos(math.pi * 2 / 4)) / 2,
                            rel_tol=1e-9)
        assert g["weight_decay"] == 0.01


def test_one_step_equals_a_hand_computed_adamw_step():
    """One micro-batch, one epoch: p <- p (1 - lr_g wd) - lr_g m_hat / (sqrt(v_hat) + eps) with
    m_hat = g, v_hat = g^2 (first step), g the gradient of loss / loss.detach()."""
    lm = tiny_random_loaded("llama", layers=1)
    method = make_method({"type": "flatquant", "lr": 5e-3, "epochs": 1}, 4, 4)
    block, inputs, targets = _wrapped(lm, method)
    ref = copy.deepcopy(block)
    loss = weighted_mse(call_block(ref, inputs, 0), targets[0], None)
    (loss / loss.detach()).backward()
    lr_of = {}
    for g in method.param_groups(ref, 5e-3):
        for p in g["params"]:
            lr_of[id(p)] = g["lr"]
    want = {}
    for n, p in ref.named_parameters():
        if p.grad is not None and id(p) in lr_of:     # (norm weights get grads, not steps)
            lr = lr_of[id(p)]
            want[n] = p.detach() * (1 - lr * 0.01) - lr * p.grad / (p.grad.abs() + 1e-8)
    assert want
    _train_block(method, block, inputs, targets, None, 0, method.training_settings(), 0,
                 torch.device("cpu"), PeakMemory("cpu").start(), lambda s: None)
    got = dict(block.named_parameters())
    for n, w in want.items():
        assert torch.allclose(got[n].detach(), w, atol=2e-6, rtol=1e-5), n


def test_batches_in_order():
    lm = tiny_random_loaded("llama", layers=1)
    method = make_method({"type": "flatquant", "epochs": 2}, 4, 4)
    ids = torch.randint(0, 60, (12, 8), generator=torch.Generator().manual_seed(3))
    block = lm.blocks[0]
    inputs = capture_block_inputs(lm.model, block, ids, 4)
    groups = discover_groups(block, lambda: call_block(block, inputs, 0))
    targets, stats = _targets_and_stats(block, inputs, groups, False, 0)
    method.quantize_block(block, groups, stats, 0)
    seen = []
    ptrs = [h.data_ptr() for h in inputs.hidden]
    hook = block.register_forward_pre_hook(
        lambda m, a: seen.append(ptrs.index(a[0].data_ptr())) if torch.is_grad_enabled() else None)
    _train_block(method, block, inputs, targets, None, 0, method.training_settings(), 0,
                 torch.device("cpu"), PeakMemory("cpu").start(), lambda s: None)
    hook.remove()
    assert seen == [0, 1, 2, 0, 1, 2]
