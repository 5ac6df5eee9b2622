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


class _ClipFakeQuant(torch.autograd.Function):
    """Fake quantization with a learnable clip over the last dimension, in one function:
    s = max(max_k |x_k| * sigmoid(c) / q, eps), y = clamp(round(x / s), -q-1, q) * s.

    Same values and the same (straight-through) gradients as the autograd of
    ``fake_quant(x, sym_scale(amax * sigmoid(c)), bits)`` (the max's gradient is shared evenly
    by tied maxima, as ``amax`` does), but it saves only ``x`` and the small per-row tensors
    and its backward is a few fused-friendly passes instead of the chain's ~10."""

    @staticmethod
    def forward(ctx, x, c, q):
        amax = x.abs().amax(dim=-1, keepdim=True)
        sig = torch.sigmoid(c.to(x.dtype))
        raw = amax * sig / q
        s = torch.clamp(raw, min=SCALE_EPS)
        y = torch.clamp(torch.round(x / s), -q - 1, q) * s
        ctx.save_for_backward(x, c, amax, sig, raw, s)
        ctx.q = q
        return y

    @staticmethod
    def backward(ctx, g):
        x, c, amax, sig, raw, s = ctx.saved_tensors
        q = ctx.q
        u = x / s
        r = torch.round(u)
        inside = (r >= -q - 1) & (r <= q)
        gx = torch.where(inside, g, torch.zeros((), dtype=g.dtype, device=g.device))
        dyds = torch.where(inside, r - u, torch.clamp(r, -q - 1, q))
        gs = (g * dyds).sum(dim=-1, keepdim=True) * (raw >= SCALE_EPS).to(g.dtype)
        g_amax = gs * sig / q
        gc = None
        if ctx.needs_input_grad[1]:
            gc = (gs * amax / q * sig * (1 - sig)).sum_to_size(c.shape).to(c.dtype)
        ax = x.abs()
        at_max = (ax == amax).to(g.dtype)
        count = at_max.sum(dim=-1, keepdim=True)
        gx = gx + at_max * torch.sign(x) * (g_amax / count)
        return gx, gc, None


def clip_fake_quant(x: torch.Tensor, clip_logit: torch.Tensor, bits: int) -> torch.Tensor:
    return _ClipFakeQuant.apply(x, clip_logit, qmax(bits))


def _logit(p: float) -> float:
    if not 0.0 < p < 1.0:
        raise ValueError(f"sigmoid clip init must be in (0, 1), got {p}")
    return math.log(p / (1.0 - p))


class WeightQuantizer(nn.Module):
    """Per-output-channel symmetric quantizer for a weight ``[out, in]``.

    ``learnable_clip``: per-channel clip factors sigmoid(c) (init ``clip_init``, ~0.98) on max|w|;
    otherwise a fixed ``clip_ratio``. ``learnable_scale`` (LSQ-style, used by QDrop): the scale
    itself is a parameter, initialised from max|w| of the weight given at ``init_scale``.
    """

    def __init__(self, out_features: int, bits: int, learnable_clip: bool = False,
                 clip_init: float = 0.98, clip_ratio: float = 1.0, learnable_scale: bool = False):
        super().__init__()
        self.bits = int(bits)
        self.clip_ratio = float(clip_ratio)
        self.enabled = is_quantized(bits)
        if learnable_clip and learnable_scale:
            raise ValueError("learnable_clip and learnable_scale are exclusive")
        self.clip = (nn.Parameter(torch.full((out_features, 1), _logit(clip_init)))
                     if (learnable_clip and self.enabled) else None)
        self.scale = (nn.Parameter(torch.ones(out_features, 1))
                      if (learnable_scale and self.enabled) else None)

    @torch.no_grad()
    def init_scale(self, w: torch.Tensor) -> None:
        if self.scale is not None:
            self.scale.copy_(sym_scale(w.abs().amax(dim=1, keepdim=True) * self.clip_ratio, self.bits))

    def get_scale(self, w: torch.Tensor) -> torch.Tensor:
        if self.scale is not None:
            return self.scale.abs().to(w.dtype).clamp(min=SCALE_EPS)
        amax = w.abs().amax(dim=1, keepdim=True)
        if self.clip is not None:
            amax = amax * torch.sigmoid(self.clip.to(w.dtype))
        else:
            amax = amax * self.clip_ratio
        return sym_scale(amax, self.bits)

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return w
        if self.clip is not None and self.scale is None:
            return clip_fake_quant(w, self.clip, self.bits)
        return fake_quant(w, self.get_scale(w), self.bits)


class ActQuantizer(nn.Module):
    """Dynamic per-token symmetric quantizer over the last dimension.

    ``learnable_clip``: one clip factor sigmoid(c) for the layer input (init ``clip_init``);
    otherwise fixed ``clip_ratio`` (1.0 for RTN, 0.9 for QuaRot).
    ``learnable_scale`` (LSQ-style, QDrop): a static per-layer scale parameter replacing the
    dynamic per-token max; initialised by :meth:`init_scale` from calibration activations.
    """

    def __init__(self, bits: int, learnable_clip: bool = False, clip_init: float = 0.98,
                 clip_ratio: float = 1.0, learnable_scale: bool = False):
        super().__init__()
        self.bits = int(bits)
        self.clip_ratio = float(clip_ratio)
        self.enabled = is_quantized(bits)
        self.clip = (nn.Parameter(torch.tensor(_logit(clip_init)))
                     if (learnable_clip and self.enabled) else None)
        self.scale = (nn.Parameter(torch.tensor(1.0))
                      if (learnable_scale and self.enabled) else None)

    @torch.no_grad()
    def init_scale(self, x: torch.Tensor) -> None:
        """LSQ init: the mean over tokens of the per-token max scale."""
        if self.scale is not None:
            amax = x.detach().abs().amax(dim=-1).float().mean() * self.clip_ratio
            self.scale.copy_(sym_scale(amax, self.bits))

    def get_scale(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale is not None:
            return self.scale.abs().to(x.dtype).clamp(min=SCALE_EPS)
        amax = x.abs().amax(dim=-1, keepdim=True)
        if self.clip is not None:
            amax = amax * torch.sigmoid(self.clip.to(x.dtype))
        else:
            amax = amax * self.clip_ratio
        return sym_scale(amax, self.bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x
        if self.clip is not None and self.scale is None:
            return clip_fake_quant(x, self.clip, self.bits)
        return fake_quant(x, self.get_scale(x), self.bits)
