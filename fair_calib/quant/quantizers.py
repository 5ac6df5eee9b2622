"""Symmetric uniform quantizers (z = 0) with straight-through rounding.

Q(u) = s * clip(round(u / s), -2^(b-1), 2^(b-1) - 1), s = clip_ratio * max|u| / (2^(b-1) - 1).
Weights: one scale per output channel (row). Activations: one scale per token (dynamic, computed
from the current input). Bit widths >= 16 mean "not quantized" (identity).
"""
from __future__ import annotations

import math

import torch
from torch import nn

SCALE_EPS = 1e-8


def round_ste(x: torch.Tensor) -> torch.Tensor:
    """Round to nearest; the gradient passes through unchanged (straight-through estimator)."""
    return x + (torch.round(x) - x).detach()


def qmax(bits: int) -> int:
    return 2 ** (bits - 1) - 1


def is_quantized(bits: int | None) -> bool:
    return bits is not None and 0 < int(bits) < 16


def fake_quant(x: torch.Tensor, scale: torch.Tensor, bits: int) -> torch.Tensor:
    """Quantize-dequantize ``x`` with a (broadcastable) positive ``scale``; STE rounding."""
    q = qmax(bits)
    return torch.clamp(round_ste(x / scale), -q - 1, q) * scale


def sym_scale(amax: torch.Tensor, bits: int) -> torch.Tensor:
    return torch.clamp(amax / qmax(bits), min=SCALE_EPS)


# FlatQuant initialises every clip logit at 4 (sigmoid(4) = 0.98201), weights and activations.
CLIP_INIT_LOGIT = 4.0


def _row_max(x: torch.Tensor, form: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(max, min) over the last dimension, keepdim. ``form`` "ref": ``amax``/``amin`` (a tie's
    gradient is shared evenly, as FlatQuant's activation quantizer); "index": the arg-max's
    element gets it (``max(dim)``, FlatQuant's weight path, and the compiled form: a test for
    equality with the maximum fails when a recomputation rounds differently)."""
    if form == "ref":
        return x.amax(dim=-1, keepdim=True), x.amin(dim=-1, keepdim=True)
    if form in ("index", "gather"):
        return x.max(dim=-1, keepdim=True)[0], x.min(dim=-1, keepdim=True)[0]
    raise ValueError(f"unknown quantizer form {form!r}")


def lac_fake_quant(x: torch.Tensor, c_max: torch.Tensor, c_min: torch.Tensor, bits: int,
                   form: str = "ref") -> torch.Tensor:
    """FlatQuant's per-token symmetric activation quantizer with learnable clipping
    (``flatquant/quant_utils.py``, ActivationQuantizer with ``lac``):
    s = max(|min(x_min, 0)| sigmoid(c_min), max(x_max, 0) sigmoid(c_max)) / q (1 where 0),
    y = clamp(round(x / s), -q-1, q) s; the scale is differentiable in x and both clips."""
    q = qmax(bits)
    hi, lo = _row_max(x, form)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    hi = torch.maximum(hi, zero) * torch.sigmoid(c_max.to(x.dtype))
    lo = torch.minimum(lo, zero) * torch.sigmoid(c_min.to(x.dtype))
    m = torch.maximum(lo.abs(), hi)
    s = torch.where(m == 0, torch.ones((), dtype=x.dtype, device=x.device), m / q)
    return torch.clamp(round_ste(x / s), -q - 1, q) * s


def minmax_fake_quant(w: torch.Tensor, bits: int) -> torch.Tensor:
    """Per-row symmetric quantizer of the GPTQ repositories (FlatQuant's and QuaRot's
    ``WeightQuantizer.find_params`` + ``quantize``): s = max(|min(w, 0)|, max(w, 0)) clamped
    to 1e-5, over q; the scale keeps its gradient (FlatQuant trains through it)."""
    q = qmax(bits)
    s = minmax_scale(w, bits)
    return torch.clamp(round_ste(w / s), -q - 1, q) * s


def minmax_scale(w: torch.Tensor, bits: int) -> torch.Tensor:
    """The row scales of :func:`minmax_fake_quant`."""
    hi, lo = _row_max(w, "index")
    zero = torch.zeros((), dtype=w.dtype, device=w.device)
    m = torch.maximum(torch.minimum(lo, zero).abs(), torch.maximum(hi, zero)).clamp(min=1e-5)
    return m / qmax(bits)


def lwc_clamp(w: torch.Tensor, c_max: torch.Tensor, c_min: torch.Tensor) -> torch.Tensor:
    """FlatQuant's learnable weight clipping (``flat_linear.py``, ``apply_wclip``): every row
    clamped to [min_row sigmoid(c_min), max_row sigmoid(c_max)], one factor pair per row."""
    hi, lo = _row_max(w, "index")
    hi = hi * torch.sigmoid(c_max.to(w.dtype))
    lo = lo * torch.sigmoid(c_min.to(w.dtype))
    return torch.clamp(w, min=lo, max=hi)


def lwc_fake_quant(w: torch.Tensor, c_max: torch.Tensor, c_min: torch.Tensor,
                   bits: int) -> torch.Tensor:
    """Clamp (LWC), then the min/max quantizer on the clamped weight, as FlatQuant.

    The clamped row's max and min are the clamp bounds themselves (or, on a side where the row
    has no element of that sign, both the bound and the reference's value give 0 in the scale),
    so the scale is taken from the bounds instead of two more reductions over the weight: the
    reference's values and gradients (the scale's gradient reaches the bound through a clamped
    element in the reference, directly here), except where sigmoid(c) rounds to exactly 1."""
    q = qmax(bits)
    hi, lo = _row_max(w, "index")
    hi = hi * torch.sigmoid(c_max.to(w.dtype))
    lo = lo * torch.sigmoid(c_min.to(w.dtype))
    wc = torch.clamp(w, min=lo, max=hi)
    zero = torch.zeros((), dtype=w.dtype, device=w.device)
    s = torch.maximum(torch.minimum(lo, zero).abs(), torch.maximum(hi, zero)).clamp(min=1e-5) / q
    return torch.clamp(round_ste(wc / s), -q - 1, q) * s


class WeightQuantizer(nn.Module):
    """Per-output-channel symmetric quantizer for a weight ``[out, in]``.

    ``learnable_clip``: FlatQuant's LWC, two logits per row (``clip_max``, ``clip_min``, init
    ``clip_init_logit`` = 4), the weight clamped before its min/max scale is computed
    (:func:`lwc_fake_quant`); otherwise a fixed ``clip_ratio`` on max|w|. ``learnable_scale``
    (LSQ-style, used by QDrop): the scale itself is a parameter, initialised from max|w| of the
    weight given at ``init_scale``.
    """

    def __init__(self, out_features: int, bits: int, learnable_clip: bool = False,
                 clip_init_logit: float = CLIP_INIT_LOGIT, clip_ratio: float = 1.0,
                 learnable_scale: bool = False):
        super().__init__()
        self.bits = int(bits)
        self.clip_ratio = float(clip_ratio)
        self.enabled = is_quantized(bits)
        if learnable_clip and learnable_scale:
            raise ValueError("learnable_clip and learnable_scale are exclusive")
        lwc = learnable_clip and self.enabled
        self.clip_max = nn.Parameter(torch.full((out_features, 1), float(clip_init_logit))) if lwc else None
        self.clip_min = nn.Parameter(torch.full((out_features, 1), float(clip_init_logit))) if lwc else None
        self.scale = (nn.Parameter(torch.ones(out_features, 1))
                      if (learnable_scale and self.enabled) else None)

    @property
    def learnable_clip(self) -> bool:
        return self.clip_max is not None

    @torch.no_grad()
    def init_scale(self, w: torch.Tensor) -> None:
        if self.scale is not None:
            self.scale.copy_(sym_scale(w.abs().amax(dim=1, keepdim=True) * self.clip_ratio, self.bits))

    def get_scale(self, w: torch.Tensor) -> torch.Tensor:
        if self.scale is not None:
            return self.scale.abs().to(w.dtype).clamp(min=SCALE_EPS)
        return sym_scale(w.abs().amax(dim=1, keepdim=True) * self.clip_ratio, self.bits)

    def _prepared(self, w: torch.Tensor, out_fac: torch.Tensor | None) -> torch.Tensor:
        if self.learnable_clip:
            w = lwc_clamp(w, self.clip_max, self.clip_min)
        if out_fac is not None:
            hd = out_fac.shape[0]
            w = torch.matmul(out_fac.to(w.dtype), w.reshape(-1, hd, w.shape[-1])).reshape(w.shape)
        return w

    def row_scale(self, w: torch.Tensor, out_fac: torch.Tensor | None = None) -> torch.Tensor:
        """The per-row scale ``forward`` uses for ``w`` (export: codes = Q_W(w) / scale)."""
        if self.learnable_clip and self.scale is None:
            return minmax_scale(self._prepared(w, out_fac), self.bits)
        return self.get_scale(self._prepared(w, out_fac))

    def forward(self, w: torch.Tensor, out_fac: torch.Tensor | None = None) -> torch.Tensor:
        """Q_W(w); ``out_fac``: FlatQuant's output-side head transform of v_proj, applied after
        the clamp and before the scale is computed (``flat_linear.py`` order)."""
        if self.enabled and self.learnable_clip and self.scale is None and out_fac is None:
            return lwc_fake_quant(w, self.clip_max, self.clip_min, self.bits)
        w = self._prepared(w, out_fac)
        if not self.enabled:
            return w
        if self.learnable_clip:
            return minmax_fake_quant(w, self.bits)
        return fake_quant(w, self.get_scale(w), self.bits)


class ActQuantizer(nn.Module):
    """Dynamic per-token symmetric quantizer over the last dimension.

    ``learnable_clip``: FlatQuant's LAC, two scalar logits (``clip_max``, ``clip_min``, init
    ``clip_init_logit`` = 4) on the token's max and min (:func:`lac_fake_quant`); otherwise a
    fixed ``clip_ratio`` on max|x| (1.0 for RTN and QuaRot's README commands).
    ``learnable_scale`` (LSQ-style, QDrop): a static per-layer scale parameter replacing the
    dynamic per-token max; initialised by :meth:`init_scale` from calibration activations.
    """

    def __init__(self, bits: int, learnable_clip: bool = False,
                 clip_init_logit: float = CLIP_INIT_LOGIT, clip_ratio: float = 1.0,
                 learnable_scale: bool = False):
        super().__init__()
        self.bits = int(bits)
        self.clip_ratio = float(clip_ratio)
        self.enabled = is_quantized(bits)
        lac = learnable_clip and self.enabled
        self.clip_max = nn.Parameter(torch.tensor(float(clip_init_logit))) if lac else None
        self.clip_min = nn.Parameter(torch.tensor(float(clip_init_logit))) if lac else None
        self.scale = (nn.Parameter(torch.tensor(1.0))
                      if (learnable_scale and self.enabled) else None)

    @property
    def learnable_clip(self) -> bool:
        return self.clip_max is not None

    @torch.no_grad()
    def init_scale(self, x: torch.Tensor) -> None:
        """LSQ init: the mean over tokens of the per-token max scale."""
        if self.scale is not None:
            amax = x.detach().abs().amax(dim=-1).float().mean() * self.clip_ratio
            self.scale.copy_(sym_scale(amax, self.bits))

    def get_scale(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale is not None:
            return self.scale.abs().to(x.dtype).clamp(min=SCALE_EPS)
        return sym_scale(x.abs().amax(dim=-1, keepdim=True) * self.clip_ratio, self.bits)

    def ratios(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(max-side, min-side) clip factors as float32 scalars (folded inference)."""
        if self.learnable_clip:
            return (torch.sigmoid(self.clip_max.detach().float()).to(device),
                    torch.sigmoid(self.clip_min.detach().float()).to(device))
        r = torch.tensor(self.clip_ratio, device=device)
        return r, r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x
        if self.learnable_clip and self.scale is None:
            return lac_fake_quant(x, self.clip_max, self.clip_min, self.bits)
        return fake_quant(x, self.get_scale(x), self.bits)
