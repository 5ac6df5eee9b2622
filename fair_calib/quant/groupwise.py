"""Group-wise integer weight grids with zero points, as the weight-only baselines compute them.

A weight ``[out, in]`` is cut along its input columns into groups of ``group_size`` (the last
group may be shorter); every (row, group) has a scale s and a zero point z, and a code
c = clamp(round(w / s) + z, 0, 2^b - 1) stands for s (c - z). ``g_idx[j]`` is the group of
column j (``j // group_size``, or a permuted assignment under GPTQ's act-order).

Three reference grids are written here from their formulas:

* :func:`autogptq_params`: AutoGPTQ's ``Quantizer.find_params`` (per channel, ``mse=False``):
  xmin = min(min w, 0), xmax = max(max w, 0); symmetric: xmax = max(|xmin|, xmax) and, where
  xmin < 0, xmin = -xmax; an all-zero row gets [-1, 1]; s = (xmax - xmin) / (2^b - 1);
  z = (2^b - 1 + 1) / 2 (symmetric) or round(-xmin / s).
* :func:`awq_params`: llm-awq's ``pseudo_quantize_tensor`` with ``zero_point`` (its default):
  s = clamp(max w - min w, 1e-5) / (2^b - 1), z = clamp(-round(min w / s), 0, 2^b - 1) per group
  (no clamping of the range to include 0).
* :func:`minmax_asym_params`: DuQuant's ``UniformAffineQuantizer`` (asymmetric, ``minmax``):
  s = clamp((max - min) / (2^b - 1), 1e-5, 1e4), z = round(clamp(-min / s, -1e4, 1e4)) over the
  last dimension (per row of a weight, per token of an activation).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def maxq(bits: int) -> int:
    return 2 ** int(bits) - 1


def n_groups(n_columns: int, group_size: int | None) -> int:
    g = n_columns if not group_size or group_size <= 0 else int(group_size)
    return -(-n_columns // g)


@torch.no_grad()
def autogptq_params(x: torch.Tensor, bits: int, sym: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """AutoGPTQ's per-row (scale, zero), each ``[rows, 1]``, of ``x`` ``[rows, cols]``."""
    q = maxq(bits)
    zero_t = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
    xmin = torch.minimum(x.min(1)[0], zero_t)
    xmax = torch.maximum(x.max(1)[0], zero_t)
    if sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = torch.where(xmin < 0, -xmax, xmin)
    both = (xmin == 0) & (xmax == 0)
    xmin = torch.where(both, -torch.ones_like(xmin), xmin)
    xmax = torch.where(both, torch.ones_like(xmax), xmax)
    scale = (xmax - xmin) / q
    if sym:
        zero = torch.full_like(scale, (q + 1) / 2)
    else:
        zero = torch.round(-xmin / scale)
    return scale.reshape(-1, 1), zero.reshape(-1, 1)


@torch.no_grad()
def awq_params(w: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """llm-awq's zero-point (scale, zero), ``[rows, 1]``, over the last dimension of ``w``."""
    q = maxq(bits)
    mx = w.amax(dim=-1, keepdim=True)
    mn = w.amin(dim=-1, keepdim=True)
    scale = (mx - mn).clamp(min=1e-5) / q
    zero = (-torch.round(mn / scale)).clamp(0, q)
    return scale, zero


@torch.no_grad()
def minmax_asym_params(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """DuQuant's asymmetric min/max (scale, zero) over the last dimension (keepdim)."""
    q = maxq(bits)
    scale = ((x.amax(dim=-1, keepdim=True) - x.amin(dim=-1, keepdim=True)) / q).clamp(1e-5, 1e4)
    zero = (-x.amin(dim=-1, keepdim=True) / scale).clamp(-1e4, 1e4).round()
    return scale, zero


def codes_of(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """clamp(round(x / s) + z, 0, 2^b - 1) (float; exact small integers)."""
    return torch.clamp(torch.round(x / scale) + zero, 0, maxq(bits))


def fake_quant_zp(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """s (c - z) for the codes c of ``x`` (no gradient path: calibration-free baselines)."""
    return (codes_of(x, scale, zero, bits) - zero) * scale


def _grouped(w: torch.Tensor, group_size: int | None) -> torch.Tensor:
    """``w`` [out, in] -> [out * in / g, g]; the group size must divide ``in``."""
    g = w.shape[-1] if not group_size or group_size <= 0 else int(group_size)
    if w.shape[-1] % g:
        raise ValueError(f"group_size {g} does not divide the {w.shape[-1]} input columns")
    return w.reshape(-1, g)


@torch.no_grad()
def awq_pseudo_quantize(w: torch.Tensor, bits: int, group_size: int | None) -> torch.Tensor:
    """llm-awq's ``pseudo_quantize_tensor(w, n_bit, zero_point=True, q_group_size)``."""
    x = _grouped(w, group_size)
    scale, zero = awq_params(x, bits)
    return fake_quant_zp(x, scale, zero, bits).reshape(w.shape)


@dataclass
class GroupCodes:
    """Integer codes of one weight with per-(row, group) scales and zero points."""
    codes: torch.Tensor      # uint8 [out, in]
    scale: torch.Tensor      # float32 [out, n_groups]
    zero: torch.Tensor       # float32 [out, n_groups] (integers)
    g_idx: torch.Tensor      # int32 [in]
    bits: int

    def dequantize(self) -> torch.Tensor:
        g = self.g_idx.long()
        return (self.codes.float() - self.zero[:, g]) * self.scale[:, g]

    def state(self, prefix: str) -> dict[str, torch.Tensor]:
        return {f"{prefix}.codes": self.codes.to(torch.uint8).cpu(),
                f"{prefix}.scale": self.scale.float().cpu(), f"{prefix}.zero": self.zero.float().cpu(),
                f"{prefix}.g_idx": self.g_idx.to(torch.int32).cpu()}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor], prefix: str, bits: int) -> "GroupCodes":
        keys = [f"{prefix}.{k}" for k in ("codes", "scale", "zero", "g_idx")]
        missing = [k for k in keys if k not in state]
        if missing:
            raise KeyError(f"saved group-wise weight state lacks {missing}")
        codes, scale, zero, g_idx = (state[k] for k in keys)
        return cls(codes.to(torch.uint8), scale.float(), zero.float(), g_idx.to(torch.int32), int(bits))


@torch.no_grad()
def group_codes(w: torch.Tensor, bits: int, group_size: int | None, params) -> GroupCodes:
    """Codes of ``w`` with contiguous groups and ``params(x_group_rows, bits) -> (scale, zero)``
    (round-to-nearest; GPTQ builds its codes column by column instead)."""
    out, n = w.shape
    x = _grouped(w, group_size)
    scale, zero = params(x, bits)
    codes = codes_of(x, scale, zero, bits).reshape(out, n)
    g = x.shape[-1]
    return GroupCodes(codes.to(torch.uint8), scale.reshape(out, -1).float(),
                      zero.reshape(out, -1).float(),
                      (torch.arange(n, device=w.device) // g).to(torch.int32), int(bits))
