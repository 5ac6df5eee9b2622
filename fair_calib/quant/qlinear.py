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

from torch.utils.checkpoint import checkpoint

from .quantizers import SCALE_EPS, ActQuantizer, WeightQuantizer, qmax
from .transforms import AffineTransform

# Recompute the (elementwise-heavy) quantizer/transform chains in the backward pass instead of
# storing their float32 intermediates: during calibration this keeps the saved activations of a
# block to the matmul inputs (the float32 copies of W T^{-1}, x/s, masks, ... are never stored).
CHECKPOINT_QUANT = True


def _act_qdq_eval(x: torch.Tensor, ratio: torch.Tensor, q: int) -> torch.Tensor:
    """Per-token fake quantization for inference (no gradient), float32 inside, out in x's dtype."""
    xf = x.float()
    s = torch.clamp(xf.abs().amax(dim=-1, keepdim=True) * ratio / q, min=SCALE_EPS)
    return (torch.clamp(torch.round(xf / s), -q - 1, q) * s).to(x.dtype)


_COMPILED: dict[str, object] = {}


def _act_qdq_fast(x: torch.Tensor, ratio: torch.Tensor, q: int) -> torch.Tensor:
    """:func:`_act_qdq_eval`, fused by ``torch.compile`` on CUDA when it works (else eager)."""
    if x.is_cuda and _COMPILED.get("state") != "failed":
        fn = _COMPILED.get("fn")
        if fn is None:
            fn = _COMPILED["fn"] = torch.compile(_act_qdq_eval, dynamic=True)
        try:
            return fn(x, ratio, q)
        except Exception:  # noqa: BLE001 - no triton / compiler: fall back to eager, once
            _COMPILED["state"] = "failed"
    return _act_qdq_eval(x, ratio, q)


def _no_autocast(device: torch.device):
    return torch.autocast(device.type, enabled=False)


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
        # number of linears reading this input (set by QuantMethod.quantize_block): the
        # transformed/quantized input is computed once per forward and reused by the others
        self.n_users = 1
        self._cache: tuple | None = None

    def transform_x(self, x: torch.Tensor, mats=None) -> torch.Tensor:
        if self.rotation is not None:
            x = self.rotation.rotate(x)
        if self.transform is not None:
            x = self.transform(x, mats)
        return x

    def weight_inverse(self, w: torch.Tensor, mats=None) -> torch.Tensor:
        """W R then W T^{-1}: the weight side of the same change of basis."""
        if self.rotation is not None:
            w = self.rotation.rotate(w)
        if self.transform is not None:
            w = self.transform.weight_times_inverse(w, mats)
        return w

    def transform_mats(self, dtype: torch.dtype = torch.float32):
        """The transform's matrices for this step, built outside any checkpointed region (so a
        recomputation reuses them); None without a transform."""
        if self.transform is None:
            return None
        return self.transform._mats(dtype)   # (InvertibleFactor.matrices disables autocast)

    def _compute(self, x: torch.Tensor, mats=None) -> torch.Tensor:
        """float32 in, float32 out: Q_X(T x) (QDrop: some entries kept at T x)."""
        xt = self.transform_x(x, mats).float()
        xq = self.act(xt)
        if self.training and self.act_drop > 0.0 and self.act.enabled:
            keep_fp = torch.rand_like(xq) < self.act_drop
            xq = torch.where(keep_fp, xt, xq)
        return xq

    def _compute_folded(self, x: torch.Tensor) -> torch.Tensor:
        """Inference with folded matrices: transform in x's dtype, fused per-token quantizer."""
        act = self.act
        xt = self.transform_x(x)
        if not act.enabled:
            return xt
        if act.scale is not None:
            return act(xt.float()).to(x.dtype)
        ratio = (torch.sigmoid(act.clip.float()) if act.clip is not None
                 else torch.tensor(act.clip_ratio, device=x.device))
        return _act_qdq_fast(xt, ratio, qmax(act.bits))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Q_X(T x) for the layer input ``x``; float32 result, except for folded inference
        (no grad, eval mode) where it stays in x's dtype. Linears sharing this module and fed
        the same tensor object reuse one result."""
        c = self._cache
        if c is not None and c[0] is x and c[2] < self.n_users and c[3] == torch.is_grad_enabled():
            out, uses = c[1], c[2] + 1
        else:
            uses = 1
            folded = self.transform is None or self.transform._folded is not None
            if folded and not self.training and not torch.is_grad_enabled():
                out = self._compute_folded(x)
            else:
                mats = self.transform_mats(torch.float32)
                if (CHECKPOINT_QUANT and torch.is_grad_enabled()
                        and any(p.requires_grad for p in self.parameters())):
                    out = checkpoint(self._compute, x.float(), mats, use_reentrant=False)
                else:
                    out = self._compute(x.float(), mats)
        self._cache = (x, out, uses, torch.is_grad_enabled()) if uses < self.n_users else None
        return out

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
        with _no_autocast(self.linear.weight.device):   # weight side always in full precision
            trainable = any(p.requires_grad for p in self.wq.parameters())
            if self.inq is not None and self.inq.transform is not None:
                trainable = trainable or any(p.requires_grad for p in self.inq.transform.parameters())
            mats = self.inq.transform_mats(dtype) if self.inq is not None else None
            if CHECKPOINT_QUANT and trainable and torch.is_grad_enabled():
                return checkpoint(self._weight_chain, dtype, mats, use_reentrant=False)
            return self._weight_chain(dtype, mats)

    def _weight_chain(self, dtype: torch.dtype, mats=None) -> torch.Tensor:
        w = self.linear.weight.to(dtype)
        if self.inq is not None:
            w = self.inq.weight_inverse(w, mats)
        return self.wq(w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        b = self.linear.bias
        if self.w_folded is not None and not torch.is_grad_enabled():
            # inference: folded weight in the model dtype, matmul in x's dtype
            xq = self.inq(x) if self.inq is not None else x
            w = self.w_folded
            return F.linear(xq.to(w.dtype), w, None if b is None else b.to(w.dtype)).to(dtype)
        xq = self.inq(x) if self.inq is not None else x.float()
        w = self.w_folded if self.w_folded is not None else self.effective_weight(torch.float32)
        # under CUDA autocast (calibration of a bf16 model) this matmul runs in bfloat16
        y = F.linear(xq.float(), w.float(), None if b is None else b.float())
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
        # stored in the model dtype (bf16 for evaluation, float32 in the tests): no float32
        # copy of every weight next to the model's own
        self.w_folded = w.detach().to(self.linear.weight.dtype)
        if self.inq is not None:
            self.inq.fold()

    def unfold(self) -> None:
        self.w_folded = None
        if self.inq is not None:
            self.inq.unfold()

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, w_bits={self.wq.bits}, "
                f"folded={self.w_folded is not None}")
