"""The fused fake-quant chains: same function as the module path, in every quantizer form,
and a compiler failure falls back to eager instead of stopping a run."""
import warnings

import pytest
import torch

from fair_calib.quant import fused
from fair_calib.quant.qlinear import InputQuant, QuantLinear
from fair_calib.quant.quantizers import ActQuantizer, WeightQuantizer
from fair_calib.quant.transforms import AffineTransform


def _grads(form, x, cmax, cmin):
    xx = x.clone().requires_grad_(True)
    c1 = cmax.clone().requires_grad_(True)
    c2 = cmin.clone().requires_grad_(True)
    y = fused.clip_qdq(xx, c1, c2, 4, form)
    (y * torch.linspace(-1, 1, x.shape[-1], dtype=x.dtype)).sum().backward()
    return y.detach(), xx.grad, c1.grad, c2.grad


def test_quantizer_forms_agree_without_ties():
    """Eager (amax/amin) and compiled (arg-max) forms of the activation quantizer: one
    function, the same gradients when no token has a tied maximum."""
    torch.manual_seed(0)
    x = torch.randn(8, 48, dtype=torch.float64)
    cmax = torch.tensor(2.5, dtype=torch.float64)
    cmin = torch.tensor(1.5, dtype=torch.float64)
    ref = _grads("custom", x, cmax, cmin)
    for a, b in zip(ref, _grads("gather", x, cmax, cmin)):
        assert torch.allclose(a, b, atol=1e-12, rtol=1e-10)
    assert ref[2].abs() > 0 and ref[3].abs() > 0
    with pytest.raises(ValueError, match="form"):
        fused.clip_qdq(x, cmax, cmin, 4, "nope")


def _wrapped_linear(dim=24, out=10, seed=0, users=1):
    g = torch.Generator().manual_seed(seed)
    tr = AffineTransform(dim, generator=g)
    with torch.no_grad():
        tr.diag_scale.copy_(torch.exp(0.3 * torch.randn(dim, generator=g)))
        for f in (tr.f1, tr.f2):
            f.a.copy_(0.1 * torch.randn(f.n, f.n, generator=g))
            f.diag.copy_(torch.exp(0.1 * torch.randn(f.n, generator=g)))
    acts = [ActQuantizer(4, learnable_clip=True) for _ in range(users)]
    with torch.no_grad():
        for k, a in enumerate(acts):
            a.clip_max.fill_(1.0 + k)
            a.clip_min.fill_(0.5 + k)
    inq = InputQuant(dim, acts, transform=tr)
    lin = torch.nn.Linear(dim, out, dtype=torch.float32)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(out, dim, generator=g))
        lin.bias.copy_(torch.randn(out, generator=g))
    wq = WeightQuantizer(out, 4, learnable_clip=True)
    with torch.no_grad():
        wq.clip_max.copy_(torch.randn(out, 1, generator=g))
        wq.clip_min.copy_(torch.randn(out, 1, generator=g))
    return QuantLinear(lin, inq, wq)


def test_fused_chains_equal_the_unfused_module_arithmetic():
    """act_chain / weight_chain compute Q_X,k(T x) for every reader k and Q_W(W T^-1) exactly
    as the transform and quantizer modules do one step at a time."""
    ql = _wrapped_linear(users=3)
    x = torch.randn(5, 24)
    mats = ql.inq.transform._build_mats(torch.float32)
    p1, p2, p1i, p2i, d = mats
    tr = ql.inq.transform
    acts = ql.inq.acts
    outs = fused.act_chain(x, d, p1, p2, torch.stack([a.clip_max for a in acts]),
                           torch.stack([a.clip_min for a in acts]), 4, tr.n1, tr.n2,
                           torch.float32)
    assert len(outs) == 3 and not torch.equal(outs[0], outs[2])
    for a, o in zip(acts, outs):
        assert torch.allclose(o, a(tr(x, mats)), atol=1e-6)
    w = fused.weight_chain(ql.linear.weight, d, p1i, p2i, ql.wq.clip_max, ql.wq.clip_min, 4,
                           tr.n1, tr.n2, torch.float32)
    assert torch.allclose(w, ql.wq(tr.weight_times_inverse(ql.linear.weight, mats)), atol=1e-6)


def test_recomputed_chain_has_the_same_gradients():
    """With ``recompute`` the chain is checkpointed; values and gradients do not change."""
    ql = _wrapped_linear()
    x = torch.randn(6, 24)
    outs = []
    tr = ql.inq.transform
    act = ql.inq.act
    for recompute in (False, True):
        ql.zero_grad(set_to_none=True)
        mats = tr._build_mats(torch.float32)
        (a,) = fused.call(fused.act_chain, x, mats[4], mats[0], mats[1], act.clip_max[None],
                          act.clip_min[None], 4, tr.n1, tr.n2, torch.float32, device=x.device,
                          recompute=recompute)
        w = fused.call(fused.weight_chain, ql.linear.weight, mats[4], mats[2], mats[3],
                       ql.wq.clip_max, ql.wq.clip_min, 4, tr.n1, tr.n2, torch.float32,
                       device=x.device, recompute=recompute)
        (a @ w.T).pow(2).sum().backward()
        outs.append([p.grad.clone() for p in (tr.diag_scale, tr.f1.a, tr.f2.b, ql.wq.clip_max,
                                              ql.wq.clip_min, act.clip_max)])
    for g0, g1 in zip(*outs):
        assert torch.allclose(g0, g1, atol=1e-6, rtol=1e-5)


def test_compiler_failure_falls_back_to_eager_once(monkeypatch):
    """On CUDA the chains are compiled; a compiler that fails (no Triton, no C compiler) costs
    one warning and the eager result, and is not tried again."""
    calls = {"compile": 0, "run": 0}

    def broken_compile(fn, **_):
        calls["compile"] += 1

        def run(*args):
            calls["run"] += 1
            raise RuntimeError("no triton here")
        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    monkeypatch.setenv("FAIR_CALIB_COMPILE", "1")
    fused.reset()
    x = torch.randn(4, 12)
    ratio = torch.tensor([0.9])
    expected = fused.act_chain_folded(x, None, None, None, ratio, ratio, 4, 3, 4)
    fake_cuda = torch.device("cuda")       # only selects the compiled path; tensors stay on CPU
    with pytest.warns(RuntimeWarning, match="torch.compile of act_chain_folded failed"):
        got = fused.call(fused.act_chain_folded, x, None, None, None, ratio, ratio, 4, 3, 4, device=fake_cuda)
    assert torch.equal(got[0], expected[0])
    assert fused.fell_back()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = fused.call(fused.act_chain_folded, x, None, None, None, ratio, ratio, 4, 3, 4, device=fake_cuda)
    assert torch.equal(again[0], expected[0]) and calls == {"compile": 1, "run": 1}
    fused.reset()


def test_compile_setting_parses_the_environment(monkeypatch):
    for raw, want in (("0", "0"), ("false", "0"), ("off", "0"), ("1", "1"), ("yes", "1"),
                      ("plain", "plain")):
        monkeypatch.setenv("FAIR_CALIB_COMPILE", raw)
        assert fused.compile_setting() == want
    monkeypatch.delenv("FAIR_CALIB_COMPILE")
    assert fused.compile_enabled()


def test_bad_compile_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv("FAIR_CALIB_COMPILE", "maybe")
    with pytest.raises(ValueError, match="FAIR_CALIB_COMPILE='maybe'"):
        fused.compile_setting()
