"""The fake-quantized linear layer.

y = Q_W(W T^{-1}) Q_X(T x) + b, where T is the (optional) transform of the layer's input group.
Linears that read the same tensor (q/k/v, gate/up) share one :class:`InputQuant` (transform and
activation quantizer); each linear has its own weight quantizer. All quantization arithmetic
runs in float32 (float64 while folding), whatever the model dtype; the output is cast back.

``fold()`` precomputes Q_W(W T^{-1}) once (W T^{-1} in float64) and the transform matrices, so evaluation
does one transform + one quantize + one matmul per call; it gives the unfolded outputs up to
float32 rounding (and, rarely, a weight sitting exactly on a rounding boundary).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .quantizers import ActQuantizer, WeightQuantizer
from .transforms import AffineTransform


class InputQuant(nn.Module):
    """Shared by the linears of one input group: optional online rotation (fixed matrix,
    QuaRot's online Hadamard), optional learnable transform T, activation quantizer Q_X."""

    def __init__(self, dim: int, act: ActQuantizer, transform: AffineTransform | None = None,
                 online_rotation: nn.Module | None = None, act_drop: float = 0.0):
        super().__init__()
        self.dim = dim
        self.transform = transform
        self.act = act
        self.act_drop = float(act_drop)   # QDrop: prob. of keeping an FP activation (training)
        self.rotation = online_rotation   # fixed orthogonal R with ``.rotate(x) = x @ R``

    def transform_x(self, x: torch.Tensor) -> torch.Tensor:
        if self.rotation is not None:
            x = self.rotation.rotate(x)
        if self.transform is not None:
            x = self.transform(x)
        return x

    def weight_inverse(self, w: torch.Tensor) -> torch.Tensor:
        """W R then W T^{-1}: the weight side of the same change of basis."""
        if self.rotation is not None:
            w = self.rotation.rotate(w)
        if self.transform is not None:
            w = self.transform.weight_times_inverse(w)
        return w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xt = self.transform_x(x)
        xq = self.act(xt)
        if self.training and self.act_drop > 0.0 and self.act.enabled:
            keep_fp = torch.rand_like(xq) < self.act_drop
            xq = torch.where(keep_fp, xt, xq)
        return xq

    def fold(self) -> None:
        if self.transform is not None:
            self.transform.fold(torch.float32)

    def unfold(self) -> None:
        if self.transform is not None:
            self.transform.unfold()


class QuantLinear(nn.Module):
    """Fake-quant replacement of an ``nn.Linear``; keeps the FP linear as ``.linear``."""

    def __init__(self, linear: nn.Linear, inq: InputQuant | None, wq: WeightQuantizer):
        super().__init__()
        self.linear = linear
        for p in linear.parameters():
            p.requires_grad_(False)
        self.inq = inq
        self.wq = wq
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.register_buffer("w_folded", None)
        # Already-quantized weight in the transformed basis (GPTQ); replaces Q_W(W T^{-1}).
        self.register_buffer("w_quant", None)

    @property
    def weight(self) -> torch.Tensor:  # some model code reads ``.weight`` (dtype/device checks)
        return self.linear.weight

    @property
    def bias(self):
        return self.linear.bias

    def effective_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Q_W(W T^{-1}) computed from the FP weight (differentiable in the quant params)."""
        if self.w_quant is not None:
            return self.w_quant.to(dtype)
        w = self.linear.weight.to(dtype)
        if self.inq is not None:
            w = self.inq.weight_inverse(w)
        return self.wq(w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xq = self.inq(xf) if self.inq is not None else xf
        w = self.w_folded if self.w_folded is not None else self.effective_weight(torch.float32)
        b = self.linear.bias
        y = F.linear(xq, w.float(), None if b is None else b.float())
        return y.to(dtype)

    @torch.no_grad()
    def fold(self) -> None:
        """Store Q_W(W T^{-1}) and freeze the transform matrices.

        W T^{-1} is computed in float64 (T^{-1} from float64 factors) and rounded to float32
        before the weight quantizer, which runs in float32 exactly as during calibration: with no
        transform (RTN) the folded weight is bit-identical to the unfolded one."""
        self.w_folded = None
        if self.w_quant is not None:
            w = self.w_quant.float()
        else:
            if self.inq is not None:
                self.inq.unfold()
            w = self.linear.weight.double()
            if self.inq is not None:
                w = self.inq.weight_inverse(w)
            w = self.wq(w.float())
        self.w_folded = w.detach()
        if self.inq is not None:
            self.inq.fold()

    def unfold(self) -> None:
        self.w_folded = None
        if self.inq is not None:
            self.inq.unfold()

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, w_bits={self.wq.bits}, "
                f"folded={self.w_folded is not None}")
