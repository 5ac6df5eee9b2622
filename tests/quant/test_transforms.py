import pytest
import torch

from fair_calib.quant.hadamard import KronRotation, sylvester_hadamard
from fair_calib.quant.qlinear import InputQuant, QuantLinear
from fair_calib.quant.quantizers import ActQuantizer, WeightQuantizer
from fair_calib.quant.transforms import AffineTransform, closest_factor_pair

torch.set_num_threads(1)


@pytest.mark.parametrize("n,pair", [(4096, (64, 64)), (12288, (96, 128)), (3584, (56, 64)),
                                    (18944, (128, 148)), (13, (1, 13)), (96, (8, 12))])
def test_closest_factor_pair(n, pair):
    assert closest_factor_pair(n) == pair


def _randomised(dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = AffineTransform(dim, generator=g)
    with torch.no_grad():
        for name, p in t.named_parameters():
            r = 0.3 * torch.randn(p.shape, generator=g)
            # scales (diagonal, singular values) are the parameters themselves: keep them > 0
            p.copy_(torch.exp(r) if name.split(".")[-1] in ("diag", "diag_scale") else r)
    return t


def _dense(t: AffineTransform) -> torch.Tensor:
    p1, _ = t.f1.matrices(torch.float64)
    p2, _ = t.f2.matrices(torch.float64)
    return torch.kron(p1, p2) @ torch.diag(t.diag_scale.double())


def test_kronecker_transform_matches_dense_and_inverts():
    t = _randomised(24)
    assert (t.n1, t.n2) == (4, 6)
    T = _dense(t)
    x = torch.randn(3, 5, 24, dtype=torch.float64)
    assert torch.allclose(t(x), x @ T.T, atol=1e-10)
    assert torch.allclose(t.inverse(t(x)), x, atol=1e-10)
    w = torch.randn(7, 24, dtype=torch.float64)
    assert torch.allclose(t.weight_times_inverse(w), w @ torch.linalg.inv(T), atol=1e-9)
    # W T^{-1} (T x) == W x in float32 too
    xf, wf = x.float(), w.float()
    y = t(xf) @ t.weight_times_inverse(wf).T
    assert torch.allclose(y, xf @ wf.T, atol=1e-4, rtol=1e-4)


def test_smooth_init():
    t = AffineTransform(8, kron=False)
    wmax = torch.tensor([1.0, 2, 4, 8, 1, 1, 1, 1])
    xmax = torch.tensor([1.0, 1, 1, 1, 10, 100, 1000, 1])
    t.init_smooth(wmax, xmax, alpha=0.3)
    want = wmax.pow(0.7) / xmax.pow(0.3)
    assert torch.allclose(t.diag_scale, want, rtol=1e-5)
    # FlatQuant's get_init_scale: max|X| floored at 1e-5, the ratio at 1e-5
    t.init_smooth(torch.zeros(8), torch.zeros(8), alpha=0.3)
    assert torch.allclose(t.diag_scale, torch.full((8,), 1e-5))


def _qlinear(seed=0, bias=True, w_bits=4, a_bits=4):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(24, 10, bias=bias)
    inq = InputQuant(24, ActQuantizer(a_bits, learnable_clip=True), transform=_randomised(24, seed))
    return QuantLinear(lin, inq, WeightQuantizer(10, w_bits, learnable_clip=True))


def test_folded_equals_unfolded():
    ql = _qlinear()
    x = torch.randn(4, 9, 24)
    with torch.no_grad():
        y0 = ql(x)
        ql.fold()
        y1 = ql(x)
    assert ql.w_folded is not None
    rel = (y1 - y0).norm() / y0.norm()
    assert rel < 1e-4, float(rel)
    ql.unfold()
    with torch.no_grad():
        assert torch.allclose(ql(x), y0)


def test_high_bits_transform_is_exact():
    ql = _qlinear(w_bits=16, a_bits=16)
    x = torch.randn(2, 5, 24)
    with torch.no_grad():
        assert torch.allclose(ql(x), ql.linear(x), atol=1e-4)


@pytest.mark.parametrize("n", [16, 24, 96, 148])
def test_kron_rotation_orthogonal(n):
    r = KronRotation(n, torch.Generator().manual_seed(1))
    R = r.matrix()
    assert torch.allclose(R @ R.T, torch.eye(n, dtype=R.dtype), atol=1e-5)
    x = torch.randn(3, n)
    assert torch.allclose(r.rotate(x), x @ R.float(), atol=1e-5)
    h = sylvester_hadamard(8)
    assert torch.equal(h @ h.T, 8 * torch.eye(8, dtype=h.dtype))


@pytest.mark.parametrize("n", [6, 16])
def test_planned_construction_equals_eager_for_every_count(n):
    """The compiled calibration path builds a factor's matrices with the host-planned squaring
    counts as a tensor (one fixed graph: every squaring computed, kept by the count); run
    eagerly it must give :func:`factor_matrices`' values and gradients bit for bit, for every
    count the fixed graph covers."""
    from fair_calib.quant.transforms import (MAX_COMPILED_SQUARINGS, InvertibleFactor, _plan_tensor,
                                             _squarings, factor_matrices, factor_matrices_planned)
    g = torch.Generator().manual_seed(n)
    f = InvertibleFactor(n, generator=g)
    weights = torch.randn(2, n, n, generator=g)
    for count in range(MAX_COMPILED_SQUARINGS + 1):
        with torch.no_grad():
            for p, target in ((f.a, 0.37 * 2 ** count), (f.b, 0.3 * 2 ** count)):
                skew = torch.randn(n, n, generator=g)
                skew = skew - skew.T
                p.copy_(skew / 2 * target / float(skew.abs().sum(dim=0).max()))
            f.diag.copy_(torch.rand(n, generator=g) + 0.5)
        counts = [_squarings(float((p - p.T).detach().abs().sum(dim=0).max())) for p in (f.a, f.b)]
        assert counts == [count, count]
        results = []
        for planned in (False, True):
            for p in f.parameters():
                p.grad = None
            r0_inv = f._r0_inverse(torch.float32)
            if planned:
                plan = _plan_tensor(*counts, torch.float32, f.a.device)
                mats = factor_matrices_planned(f.a, f.b, f.diag, f.r0, r0_inv, plan)
            else:
                mats = factor_matrices(f.a, f.b, f.diag, f.r0, r0_inv, *counts, torch.float32)
            ((mats[0] * weights[0]).sum() + (mats[1] * weights[1]).sum()).backward()
            results.append([m.detach() for m in mats] + [p.grad.clone() for p in f.parameters()])
        for eager, planned in zip(*results):
            assert torch.equal(eager, planned)
