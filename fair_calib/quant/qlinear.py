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
    QuaRot's online Hadamard), optional learnable transform T, and the activation quantizers.

    ``act``: one :class:`ActQuantizer` shared by every reader (RTN, QuaRot, QDrop), or a list
    with one per reader (FlatQuant: each linear has its own learnable clip pair, as
    ``FlatQuantizedLinear.act_quantizer``); reader k of the group gets Q_X,k(T x).
    """

    def __init__(self, dim: int, act: ActQuantizer | list[ActQuantizer],
                 transform: AffineTransform | None = None,
                 online_rotation: nn.Module | None = None, act_drop: float = 0.0):
        super().__init__()
        self.dim = dim
        self.transform = transform
        self.acts = nn.ModuleList(list(act) if isinstance(act, (list, tuple)) else [act])
        self.act_drop = float(act_drop)   # QDrop: prob. of keeping an FP activation (training)
        self.rotation = online_rotation   # fixed orthogonal R with ``.rotate(x) = x @ R``
        # number of linears reading this input (set by QuantMethod.quantize_block): the
        # transformed/quantized inputs are computed once per forward and handed to each reader
        self.n_users = 1
        self._cache: tuple | None = None
        self._ratios: tuple | None = None   # folded inference: the clip factors, cached

    @property
    def act(self) -> ActQuantizer:
        """The first (or only) activation quantizer."""
        return self.acts[0]

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
        """The FlatQuant/FAIR-Calib structure (optional transform, learnable-clip dynamic
        quantizers) that :mod:`fused` covers; QuaRot's rotation, LSQ scales and QDrop's drop
        stay eager."""
        return (self.rotation is None
                and all(a.enabled and a.learnable_clip and a.scale is None for a in self.acts)
                and not (self.training and self.act_drop > 0.0))

    def _kron_shape(self, mats):
        """(d, P1, P2 as applied online, n1, n2); P2 None where the transform's right factor is
        folded upstream (FlatQuant's o_proj: into v_proj)."""
        t = self.transform
        if t is None:
            return None, None, None, 1, self.dim
        p1, p2, _, _, d = mats
        return d, p1, (p2 if t.right_online else None), t.n1, t.n2

    def _compute(self, x: torch.Tensor, mats=None, out_dtype: torch.dtype = torch.float32,
                 recompute: bool = False) -> tuple[torch.Tensor, ...]:
        """Q_X,k(T x) for every quantizer k (QDrop: some entries kept at T x), in ``out_dtype``;
        ``recompute``: checkpointed (a fused chain inside its compiled graph, see
        :func:`fused.call`)."""
        if self._fusable():
            d, p1, p2, n1, n2 = self._kron_shape(mats)
            c_max = torch.stack([a.clip_max for a in self.acts])
            c_min = torch.stack([a.clip_min for a in self.acts])
            return fused.call(fused.act_chain, x, d, p1, p2, c_max, c_min, self.act.bits,
                              n1, n2, out_dtype, device=x.device, recompute=recompute)
        if recompute:
            return checkpoint(self._compute_modules, x, mats, out_dtype, use_reentrant=False)
        return self._compute_modules(x, mats, out_dtype)

    def _compute_modules(self, x: torch.Tensor, mats, out_dtype: torch.dtype):
        """The general path, one module at a time (rotations, LSQ scales, QDrop's drop)."""
        xt = self.transform_x(x.float(), mats).float()
        outs = []
        for act in self.acts:
            xq = act(xt)
            if self.training and self.act_drop > 0.0 and act.enabled:
                keep_fp = torch.rand_like(xq) < self.act_drop
                xq = torch.where(keep_fp, xt, xq)
            outs.append(xq.to(out_dtype))
        return tuple(outs)

    def _compute_folded(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Inference with folded matrices: transform in x's dtype, per-token quantizers in
        float32, one compiled function on CUDA."""
        acts = list(self.acts)
        if (self.rotation is not None or not all(a.enabled for a in acts)
                or any(a.scale is not None for a in acts)):
            xt = self.transform_x(x)
            return tuple(xt if not a.enabled else a(xt.float()).to(x.dtype) for a in acts)
        t = self.transform
        d, p1, p2_t = t.folded_mats(x.dtype) if t is not None else (None, None, None)
        if t is not None and not t.right_online:
            p2_t = None
        n1, n2 = (t.n1, t.n2) if t is not None else (1, self.dim)
        r = self._ratios
        if r is None or r[0].device != x.device:
            pairs = [a.ratios(x.device) for a in acts]
            r = self._ratios = (torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs]))
        return fused.call(fused.act_chain_folded, x, d, p1, p2_t, r[0], r[1], self.act.bits,
                          n1, n2, device=x.device)

    def forward(self, x: torch.Tensor, user: int = 0) -> torch.Tensor:
        """Q_X,user(T x) for the layer input ``x``, in the matmul dtype (the autocast dtype
        under autocast, else float32), except for folded inference (no grad, eval mode) where
        it stays in x's dtype. The readers of this module fed the same tensor object share one
        computation (all quantizers at once)."""
        c = self._cache
        if c is not None and c[0] is x and c[2] < self.n_users and c[3] == torch.is_grad_enabled():
            outs, uses = c[1], c[2] + 1
        else:
            uses = 1
            folded = self.transform is None or self.transform._folded is not None
            if folded and not self.training and not torch.is_grad_enabled():
                outs = self._compute_folded(x)
            else:
                mats = self.transform_mats(torch.float32)
                out_dtype = matmul_dtype(x.device)
                recompute = (CHECKPOINT_QUANT and torch.is_grad_enabled()
                             and any(p.requires_grad for p in self.parameters()))
                outs = self._compute(x, mats, out_dtype, recompute)
        self._cache = (x, outs, uses, torch.is_grad_enabled()) if uses < self.n_users else None
        return outs[min(user, len(outs) - 1)]

    def fold(self) -> None:
        self._ratios = None
        if self.transform is not None:
            self.transform.fold(torch.float32)

    def unfold(self) -> None:
        self._ratios = None
        if self.transform is not None:
            self.transform.unfold()


class QuantLinear(nn.Module):
    """Fake-quant replacement of an ``nn.Linear``; keeps the FP linear as ``.linear``."""

    def __init__(self, linear: nn.Linear, inq: InputQuant | None, wq: WeightQuantizer,
                 user: int = 0, out_transform: AffineTransform | None = None):
        super().__init__()
        self.linear = linear
        for p in linear.parameters():
            p.requires_grad_(False)
        self.inq = inq
        self.wq = wq
        self.user = int(user)   # which of the input group's activation quantizers is ours
        # FlatQuant's v_proj: the o_proj transform's head_dim factor P2 applied to every head's
        # rows of Q_W's input (``out_trans``), so the o_proj input arrives already multiplied
        # by P2 and needs only the heads factor online. Held, not owned (o_proj's module).
        self._out_transform = (out_transform,)
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.register_buffer("w_folded", None)
        self.register_buffer("b_folded", None)
        # Already-quantized weight in the transformed basis (GPTQ); replaces Q_W(W T^{-1}).
        self.register_buffer("w_quant", None)
        # set by drop_fp_weight(): the FP weight is gone, only the folded one is left
        self.fp_weight_dropped = False
        # real low-bit execution (``lowbit.attach_block``): inference delegates to it
        self.backend: nn.Module | None = None

    @property
    def out_transform(self) -> AffineTransform | None:
        return self._out_transform[0]

    def out_factor(self, dtype: torch.dtype) -> torch.Tensor | None:
        """P2 of the o_proj transform this v_proj feeds (None for every other linear)."""
        t = self.out_transform
        if t is None:
            return None
        return t._mats(dtype)[1]

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
            for t in (self.inq.transform if self.inq is not None else None, self.out_transform):
                if t is not None:
                    trainable = trainable or any(p.requires_grad for p in t.parameters())
            mats = self.inq.transform_mats(dtype) if self.inq is not None else None
            out_fac = self.out_factor(dtype)
            recompute = CHECKPOINT_QUANT and trainable and torch.is_grad_enabled()
            return self._weight_chain(dtype, mats, out_dtype, recompute, out_fac)

    def _fusable(self) -> bool:
        wq, inq = self.wq, self.inq
        return (wq.enabled and wq.learnable_clip and wq.scale is None
                and (inq is None or inq.rotation is None))

    def _weight_chain(self, dtype: torch.dtype, mats, out_dtype: torch.dtype,
                      recompute: bool, out_fac: torch.Tensor | None = None) -> torch.Tensor:
        """Q_W(W T^{-1}) in ``dtype``, returned in ``out_dtype``; ``recompute``: checkpointed
        (a fused chain inside its compiled graph, see :func:`fused.call`)."""
        if dtype == torch.float32 and self._fusable():
            _, _, p1i, p2i, d = mats if mats is not None else (None,) * 5
            t = self.inq.transform if self.inq is not None else None
            n1, n2 = (t.n1, t.n2) if t is not None else (1, self.in_features)
            w = self.linear.weight
            return fused.call(fused.weight_chain, w, d, p1i, p2i, self.wq.clip_max,
                              self.wq.clip_min, self.wq.bits, n1, n2, out_dtype, out_fac,
                              device=w.device, recompute=recompute)
        if recompute:
            return checkpoint(self._weight_modules, dtype, mats, out_dtype, out_fac,
                              use_reentrant=False)
        return self._weight_modules(dtype, mats, out_dtype, out_fac)

    def _weight_modules(self, dtype: torch.dtype, mats, out_dtype: torch.dtype,
                        out_fac: torch.Tensor | None = None) -> torch.Tensor:
        """The general path, one module at a time (QuaRot's rotation, LSQ scales)."""
        w = self.linear.weight.to(dtype)
        if self.inq is not None:
            w = self.inq.weight_inverse(w, mats)
        return self.wq(w, out_fac).to(out_dtype)

    def effective_bias(self, dtype: torch.dtype) -> torch.Tensor | None:
        """The bias in the output basis: P2 applied per head for FlatQuant's v_proj."""
        b = self.linear.bias
        if b is None:
            return None
        if self.b_folded is not None:
            return self.b_folded.to(dtype)
        fac = self.out_factor(torch.float32)
        if fac is None:
            return b.to(dtype)
        with _no_autocast(b.device):
            return fused.head_rows(b.float(), fac).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if self.backend is not None and not torch.is_grad_enabled():
            return self.backend(x)          # integer codes (fair_calib.quant.lowbit)
        if self.w_folded is not None and not torch.is_grad_enabled():
            # inference: folded weight in the model dtype, matmul in x's dtype
            xq = self.inq(x, self.user) if self.inq is not None else x
            w = self.w_folded
            return F.linear(xq.to(w.dtype), w, self.effective_bias(w.dtype)).to(dtype)
        # calibration: under CUDA autocast (a bf16 model) the quantized input and weight come
        # out of their (float32) chains already in bfloat16 and this matmul runs in bfloat16
        mm = matmul_dtype(x.device)
        xq = self.inq(x, self.user) if self.inq is not None else x.to(mm)
        w = (self.w_folded.to(mm) if self.w_folded is not None
             else self.effective_weight(torch.float32, out_dtype=mm))
        y = F.linear(xq.to(mm), w, self.effective_bias(mm))
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
            fac = self.out_factor(torch.float64)
            w = self.wq(w.float(), None if fac is None else fac.float())
        # stored in the model dtype (bf16 for evaluation, float32 in the tests): no float32
        # copy of every weight next to the model's own
        self.w_folded = w.detach().to(self.linear.weight.dtype)
        b = self.linear.bias
        fac = self.out_factor(torch.float64)
        self.b_folded = (None if b is None or fac is None
                         else fused.head_rows(b.double(), fac).to(b.dtype))
        if self.inq is not None:
            self.inq.fold()

    def unfold(self) -> None:
        self._require_fp_weight("unfold()")
        self.w_folded = None
        self.b_folded = None
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
