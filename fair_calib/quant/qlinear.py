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

from . import fused
from .quantizers import ActQuantizer, WeightQuantizer, qmax
from .transforms import AffineTransform

# Recompute the (elementwise-heavy) quantizer/transform chains in the backward pass instead of
# storing their float32 intermediates: during calibration this keeps the saved activations of a
# block to the matmul inputs (the float32 copies of W T^{-1}, x/s, masks, ... are never stored).
CHECKPOINT_QUANT = True


def matmul_dtype(device: torch.device) -> torch.dtype:
    """The dtype a linear's matmul runs in: the autocast dtype under autocast, else float32."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return torch.float32


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
        self._ratio: torch.Tensor | None = None   # folded inference: the clip factor, cached

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

    def _fusable(self) -> bool:
        """The FlatQuant/FAIR-Calib structure (optional transform, clipped dynamic quantizer)
        that :mod:`fused` covers; QuaRot's rotation, LSQ scales and QDrop's drop stay eager."""
        a = self.act
        return (self.rotation is None and a.enabled and a.clip is not None and a.scale is None
                and not (self.training and self.act_drop > 0.0))

    def _compute(self, x: torch.Tensor, mats=None, out_dtype: torch.dtype = torch.float32,
                 recompute: bool = False) -> torch.Tensor:
        """Q_X(T x) (QDrop: some entries kept at T x), in ``out_dtype``; ``recompute``:
        checkpointed (a fused chain inside its compiled graph, see :func:`fused.call`)."""
        if self._fusable():
            p1, p2, _, _, d = mats if mats is not None else (None,) * 5
            t = self.transform
            n1, n2 = (t.n1, t.n2) if t is not None else (1, self.dim)
            return fused.call(fused.act_chain, x, d, p1, p2, self.act.clip, qmax(self.act.bits),
                              n1, n2, out_dtype, device=x.device, recompute=recompute)
        if recompute:
            return checkpoint(self._compute_modules, x, mats, out_dtype, use_reentrant=False)
        return self._compute_modules(x, mats, out_dtype)

    def _compute_modules(self, x: torch.Tensor, mats, out_dtype: torch.dtype) -> torch.Tensor:
        """The general path, one module at a time (rotations, LSQ scales, QDrop's drop)."""
        xt = self.transform_x(x.float(), mats).float()
        xq = self.act(xt)
        if self.training and self.act_drop > 0.0 and self.act.enabled:
            keep_fp = torch.rand_like(xq) < self.act_drop
            xq = torch.where(keep_fp, xt, xq)
        return xq.to(out_dtype)

    def _compute_folded(self, x: torch.Tensor) -> torch.Tensor:
        """Inference with folded matrices: transform in x's dtype, per-token quantizer in
        float32, one compiled function on CUDA."""
        act = self.act
        if self.rotation is not None or not act.enabled or act.scale is not None:
            xt = self.transform_x(x)
            if not act.enabled:
                return xt
            return act(xt.float()).to(x.dtype)
        t = self.transform
        d, p1, p2_t = t.folded_mats(x.dtype) if t is not None else (None, None, None)
        n1, n2 = (t.n1, t.n2) if t is not None else (1, self.dim)
        ratio = self._ratio
        if ratio is None or ratio.device != x.device:
            ratio = self._ratio = (torch.sigmoid(act.clip.detach().float()) if act.clip is not None
                                   else torch.tensor(act.clip_ratio, device=x.device))
        return fused.call(fused.act_chain_folded, x, d, p1, p2_t, ratio, qmax(act.bits), n1, n2,
                          device=x.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Q_X(T x) for the layer input ``x``, in the matmul dtype (the autocast dtype under
        autocast, else float32), except for folded inference (no grad, eval mode) where it
        stays in x's dtype. Linears sharing this module and fed the same tensor object reuse
        one result."""
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
                out_dtype = matmul_dtype(x.device)
                recompute = (CHECKPOINT_QUANT and torch.is_grad_enabled()
                             and any(p.requires_grad for p in self.parameters()))
                out = self._compute(x, mats, out_dtype, recompute)
        self._cache = (x, out, uses, torch.is_grad_enabled()) if uses < self.n_users else None
        return out

    def fold(self) -> None:
        self._ratio = None
        if self.transform is not None:
            self.transform.fold(torch.float32)

    def unfold(self) -> None:
        self._ratio = None
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
        # set by drop_fp_weight(): the FP weight is gone, only the folded one is left
        self.fp_weight_dropped = False

    @property
    def weight(self) -> torch.Tensor:  # some model code reads ``.weight`` (dtype/device checks)
        return self.linear.weight

    @property
    def bias(self):
        return self.linear.bias

    def effective_weight(self, dtype: torch.dtype = torch.float32,
                         out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """Q_W(W T^{-1}) computed in ``dtype`` from the FP weight (differentiable in the quant
        params), returned in ``out_dtype`` (default ``dtype``)."""
        out_dtype = out_dtype or dtype
        if self.w_quant is not None:
            return self.w_quant.to(out_dtype)
        self._require_fp_weight("effective_weight()")
        with _no_autocast(self.linear.weight.device):   # weight side always in full precision
            trainable = any(p.requires_grad for p in self.wq.parameters())
            if self.inq is not None and self.inq.transform is not None:
                trainable = trainable or any(p.requires_grad for p in self.inq.transform.parameters())
            mats = self.inq.transform_mats(dtype) if self.inq is not None else None
            recompute = CHECKPOINT_QUANT and trainable and torch.is_grad_enabled()
            return self._weight_chain(dtype, mats, out_dtype, recompute)

    def _fusable(self) -> bool:
        wq, inq = self.wq, self.inq
        return (wq.enabled and wq.clip is not None and wq.scale is None
                and (inq is None or inq.rotation is None))

    def _weight_chain(self, dtype: torch.dtype, mats, out_dtype: torch.dtype,
                      recompute: bool) -> torch.Tensor:
        """Q_W(W T^{-1}) in ``dtype``, returned in ``out_dtype``; ``recompute``: checkpointed
        (a fused chain inside its compiled graph, see :func:`fused.call`)."""
        if dtype == torch.float32 and self._fusable():
            _, _, p1i, p2i, d = mats if mats is not None else (None,) * 5
            t = self.inq.transform if self.inq is not None else None
            n1, n2 = (t.n1, t.n2) if t is not None else (1, self.in_features)
            w = self.linear.weight
            return fused.call(fused.weight_chain, w, d, p1i, p2i, self.wq.clip,
                              qmax(self.wq.bits), n1, n2, out_dtype, device=w.device,
                              recompute=recompute)
        if recompute:
            return checkpoint(self._weight_modules, dtype, mats, out_dtype, use_reentrant=False)
        return self._weight_modules(dtype, mats, out_dtype)

    def _weight_modules(self, dtype: torch.dtype, mats, out_dtype: torch.dtype) -> torch.Tensor:
        """The general path, one module at a time (QuaRot's rotation, LSQ scales)."""
        w = self.linear.weight.to(dtype)
        if self.inq is not None:
            w = self.inq.weight_inverse(w, mats)
        return self.wq(w).to(out_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        b = self.linear.bias
        if self.w_folded is not None and not torch.is_grad_enabled():
            # inference: folded weight in the model dtype, matmul in x's dtype
            xq = self.inq(x) if self.inq is not None else x
            w = self.w_folded
            return F.linear(xq.to(w.dtype), w, None if b is None else b.to(w.dtype)).to(dtype)
        # calibration: under CUDA autocast (a bf16 model) the quantized input and weight come
        # out of their (float32) chains already in bfloat16 and this matmul runs in bfloat16
        mm = matmul_dtype(x.device)
        xq = self.inq(x) if self.inq is not None else x.to(mm)
        w = (self.w_folded.to(mm) if self.w_folded is not None
             else self.effective_weight(torch.float32, out_dtype=mm))
        y = F.linear(xq.to(mm), w, None if b is None else b.to(mm))
        return y.to(dtype)

    @torch.no_grad()
    def fold(self) -> None:
        """Store Q_W(W T^{-1}) and freeze the transform matrices.

        W T^{-1} is computed in float64 (T^{-1} from float64 factors) and rounded to float32
        before the weight quantizer, which runs in float32 exactly as during calibration: with no
        transform (RTN) the folded weight is bit-identical to the unfolded one."""
        self._require_fp_weight("fold()")
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
        self._require_fp_weight("unfold()")
        self.w_folded = None
        if self.inq is not None:
            self.inq.unfold()

    @torch.no_grad()
    def drop_fp_weight(self) -> None:
        """Free the FP weight of a folded layer (evaluation): ``linear.weight`` becomes the
        folded quantized weight itself, so the layer holds one weight instead of two and code
        that reads ``.weight`` (dtype, device, shape) still works. Irreversible: ``unfold``,
        ``fold`` and ``effective_weight`` then raise."""
        if self.w_folded is None:
            raise RuntimeError("drop_fp_weight() needs fold() first")
        if self.fp_weight_dropped:
            return
        self.linear.weight = nn.Parameter(self.w_folded, requires_grad=False)
        self.w_quant = None
        self.fp_weight_dropped = True

    def _require_fp_weight(self, what: str) -> None:
        if self.fp_weight_dropped:
            raise RuntimeError(f"{what}: this layer's FP weight was dropped after folding "
                               "(load_quantized(..., keep_fp=True) keeps it)")

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, w_bits={self.wq.bits}, "
                f"folded={self.w_folded is not None}")
