import pytest
import torch

from fair_calib.quant.quantizers import (ActQuantizer, WeightQuantizer, fake_quant, qmax,
                                         round_ste, sym_scale)

torch.set_num_threads(1)


def test_fake_quant_known_values():
    x = torch.tensor([[0.3, -1.0, 0.52, 0.9]])
    s = sym_scale(x.abs().amax(dim=-1, keepdim=True), 4)       # 1/7
    assert torch.allclose(s, torch.tensor([[1 / 7]]))
    got = fake_quant(x, s, 4)
    want = torch.tensor([[2 / 7, -1.0, 4 / 7, 6 / 7]])
    assert torch.allclose(got, want, atol=1e-7)
    # clamping to the signed grid [-8, 7] with a smaller scale
    got = fake_quant(torch.tensor([2.0, -2.0]), torch.tensor(0.1), 4)
    assert torch.allclose(got, torch.tensor([0.7, -0.8]))
    assert qmax(8) == 127 and qmax(3) == 3


def test_weight_quantizer_per_output_channel_and_bits():
    w = torch.tensor([[1.0, 0.5, -0.25], [10.0, -3.0, 6.0]])
    wq = WeightQuantizer(2, 3)            # qmax 3: row scales 1/3 and 10/3
    got = wq(w)
    want = torch.tensor([[1.0, 2 / 3, -1 / 3], [10.0, -10 / 3, 20 / 3]])
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.equal(WeightQuantizer(2, 16)(w), w)   # >= 16 bits: identity


def test_act_quantizer_per_token():
    x = torch.tensor([[[0.1, 0.2, -0.7], [5.0, 1.0, -2.0]]])
    got = ActQuantizer(4)(x)
    s0, s1 = 0.7 / 7, 5.0 / 7
    want = torch.tensor([[[1 * s0, 2 * s0, -7 * s0], [7 * s1, 1 * s1, -3 * s1]]])
    assert torch.allclose(got, want, atol=1e-6)
    aq = ActQuantizer(4, clip_ratio=0.5)
    assert torch.allclose(aq(torch.tensor([[1.0, 0.5]])), torch.tensor([[0.5, 0.5]]))


def test_ste_gradient_passes_through():
    x = torch.tensor([0.26, -0.74, 0.41], requires_grad=True)
    round_ste(x * 3).sum().backward()
    assert torch.allclose(x.grad, torch.full((3,), 3.0))
    x = torch.tensor([0.05, 5.0, -0.3], requires_grad=True)
    fake_quant(x, torch.tensor(0.1), 4).sum().backward()
    assert torch.allclose(x.grad, torch.tensor([1.0, 0.0, 1.0]))   # 5.0 is clamped


def test_lsq_scale_learnable():
    w = torch.randn(4, 16)
    wq = WeightQuantizer(4, 4, learnable_scale=True)
    wq.init_scale(w)
    assert torch.allclose(wq.scale, w.abs().amax(1, keepdim=True) / 7)
    ((wq(w) - w) ** 2).sum().backward()
    assert wq.scale.grad.abs().sum() > 0
    with pytest.raises(ValueError):
        WeightQuantizer(4, 4, learnable_clip=True, learnable_scale=True)
