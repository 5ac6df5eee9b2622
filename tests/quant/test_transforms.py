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
