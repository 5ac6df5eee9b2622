"""The fused fake-quant chains: same function as the module path, in every quantizer form,
and a compiler failure falls back to eager instead of stopping a run."""
import warnings

import pytest
import torch

from fair_calib.quant import fused
from fair_calib.quant.qlinear import InputQuant, QuantLinear
from fair_calib.quant.quantizers import ActQuantizer, WeightQuantizer
from fair_calib.quant.transforms import AffineTransform


def _grads(form, x, c):
    xx = x.clone().requires_grad_(True)
    cc = c.clone().requires_grad_(True)
    y = fused.clip_qdq(xx, cc, 7, form)
    (y * torch.linspace(-1, 1, x.shape[-1], dtype=x.dtype)).sum().backward()
    return y.detach(), xx.grad, cc.grad


@pytest.mark.parametrize("clip_shape", [(8, 1), ()])
def test_quantizer_forms_agree_without_ties(clip_shape):
    """custom Function, autograd through amax, autograd through the gathered max: one function."""
    torch.manual_seed(0)
    x = torch.randn(8, 48, dtype=torch.float64)
    c = torch.randn(clip_shape, dtype=torch.float64) + 2.0
    ref = _grads("custom", x, c)
    for form in ("amax", "gather"):
        for a, b in zip(ref, _grads(form, x, c)):
            assert torch.allclose(a, b, atol=1e-12, rtol=1e-10)
    with pytest.raises(ValueError, match="form"):
        fused.clip_qdq(x, c, 7, "nope")


def _wrapped_linear(dim=24, out=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    tr = AffineTransform(dim, generator=g)
    with torch.no_grad():
        tr.log_d.copy_(0.3 * torch.randn(dim, generator=g))
        for f in (tr.f1, tr.f2):
            f.a.copy_(0.1 * torch.randn(f.n, f.n, generator=g))
            f.sigma.copy_(0.1 * torch.randn(f.n, generator=g))
    inq = InputQuant(dim, ActQuantizer(4, learnable_clip=True), transform=tr)
    lin = torch.nn.Linear(dim, out, dtype=torch.float32)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(out, dim, generator=g))
        lin.bias.copy_(torch.randn(out, generator=g))
    return QuantLinear(lin, inq, WeightQuantizer(out, 4, learnable_clip=True))


def test_fused_chains_equal_the_unfused_module_arithmetic():
    """act_chain / weight_chain compute Q_X(T x) and Q_W(W T^-1) exactly as the transform and
    quantizer modules do one step at a time."""
    ql = _wrapped_linear()
    x = torch.randn(5, 24)
    mats = ql.inq.transform._build_mats(torch.float32)
    p1, p2, p1i, p2i, d = mats
    tr = ql.inq.transform
    a = fused.act_chain(x, d, p1, p2, ql.inq.act.clip, 7, tr.n1, tr.n2, torch.float32)
    assert torch.allclose(a, ql.inq.act(tr(x, mats)), atol=1e-6)
    w = fused.weight_chain(ql.linear.weight, d, p1i, p2i, ql.wq.clip, 7, tr.n1, tr.n2,
                           torch.float32)
    assert torch.allclose(w, ql.wq(tr.weight_times_inverse(ql.linear.weight, mats)), atol=1e-6)


def test_recomputed_chain_has_the_same_gradients():
    """With ``recompute`` the chain is checkpointed; values and gradients do not change."""
    ql = _wrapped_linear()
    x = torch.randn(6, 24)
    outs = []
    for recompute in (False, True):
        ql.zero_grad(set_to_none=True)
        mats = ql.inq.transform._build_mats(torch.float32)
        tr = ql.inq.transform
        a = fused.call(fused.act_chain, x, mats[4], mats[0], mats[1], ql.inq.act.clip, 7,
                       tr.n1, tr.n2, torch.float32, device=x.device, recompute=recompute)
        w = fused.call(fused.weight_chain, ql.linear.weight, mats[4], mats[2], mats[3],
                       ql.wq.clip, 7, tr.n1, tr.n2, torch.float32, device=x.device,
                       recompute=recompute)
        (a @ w.T).pow(2).sum().backward()
        outs.append([p.grad.clone() for p in (tr.log_d, tr.f1.a, tr.f2.b, ql.wq.clip, ql.inq.act.clip)])
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
    ratio = torch.tensor(0.9)
    expected = fused.act_chain_folded(x, None, None, None, ratio, 7, 3, 4)
    fake_cuda = torch.device("cuda")       # only selects the compiled path; tensors stay on CPU
    with pytest.warns(RuntimeWarning, match="torch.compile of act_chain_folded failed"):
        got = fused.call(fused.act_chain_folded, x, None, None, None, ratio, 7, 3, 4, device=fake_cuda)
    assert torch.equal(got, expected)
    assert fused.fell_back()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = fused.call(fused.act_chain_folded, x, None, None, None, ratio, 7, 3, 4, device=fake_cuda)
    assert torch.equal(again, expected) and calls == {"compile": 1, "run": 1}
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
