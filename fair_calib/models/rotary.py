"""Rotary position embedding in one fused pass on CUDA, with transformers' exact arithmetic.

transformers' Llama and Qwen2 attention (LLaDA and Dream load onto these, :mod:`hub`) call
their module's ``apply_rotary_pos_emb(q, k, cos, sin)``: ten elementwise kernels a layer, the
largest cost of the forward after the matmuls and attention (docs/benchmarks.md).
:func:`install` puts a dispatcher in its place that runs :mod:`rotary_triton`'s one-pass kernel
where it computes the same bits (CUDA tensors, no autograd graph, the shapes and layouts below)
and transformers' own function everywhere else (CPU, training, anything unexpected): outputs
are bit for bit the same either way, so every number of the pipeline is unchanged; only the
time moves (a forward with and one without were compared bit for bit on lent H100s by the
since-retired ``benchmarks/lowbit_gpu.py``; docs/benchmarks.md).

``FAIR_CALIB_ROTARY``: ``fused`` (default) or ``native`` (transformers' function always).
"""
from __future__ import annotations

import functools
import importlib

import torch

from ..jobs.environment import env_choice

SETTING = "FAIR_CALIB_ROTARY"
MODES = ("fused", "native")
# the transformers modules whose attention reads ``apply_rotary_pos_emb`` from their globals
MODULES = ("transformers.models.llama.modeling_llama", "transformers.models.qwen2.modeling_qwen2")
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# None: read the setting at each call; True / False: forced (benchmarks compare both)
FORCE: bool | None = None


def setting() -> str:
    return env_choice(SETTING, "fused", MODES)


def enabled() -> bool:
    return setting() == "fused" if FORCE is None else FORCE


def install() -> list[str]:
    """Route the modules' ``apply_rotary_pos_emb`` through :func:`_dispatcher` (idempotent);
    the names of the modules patched now."""
    done = []
    for name in MODULES:
        mod = importlib.import_module(name)
        fn = mod.apply_rotary_pos_emb
        if not getattr(fn, "fair_calib_native", None):
            mod.apply_rotary_pos_emb = _dispatcher(fn)
            done.append(name)
    return done


def _dispatcher(native):
    @functools.wraps(native)
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if enabled() and fusable(q, k, cos, sin, unsqueeze_dim):
            from . import rotary_triton
            return rotary_triton.rotate(q, k, cos, sin, torch.result_type(q, cos))
        return native(q, k, cos, sin, unsqueeze_dim)
    apply_rotary_pos_emb.fair_calib_native = native
    return apply_rotary_pos_emb


def fusable(q, k, cos, sin, unsqueeze_dim=1) -> bool:
    """Whether the fused kernel runs here: CUDA tensors it computes exactly
    (:func:`same_bits_possible`)."""
    return q.is_cuda and same_bits_possible(q, k, cos, sin, unsqueeze_dim)


def same_bits_possible(q, k, cos, sin, unsqueeze_dim=1) -> bool:
    """Whether the fused kernel computes exactly what transformers' function would: no
    gradient to track, q [B, Hq, S, D] and k [B, Hk, S, D] of one dtype laid out densely as
    [B, H, S, D] or as the attention's transposed view of [B, S, H, D], cos and sin [B or 1,
    S, D] with one layout, D even, and q's dtype or float32 for cos and sin, all on one
    device."""
    if unsqueeze_dim != 1 or q.dim() != 4 or k.dim() != 4 or cos.dim() != 3:
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, cos, sin)):
        return False
    B, _, S, D = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (B, S, D) or q.dtype != k.dtype \
            or q.dtype not in _DTYPES or cos.dtype != sin.dtype \
            or cos.dtype not in (q.dtype, torch.float32) or D % 2:
        return False
    if cos.shape != sin.shape or cos.stride() != sin.stride() or cos.shape[0] not in (1, B) \
            or tuple(cos.shape[1:]) != (S, D) or cos.stride(-1) != 1:
        return False
    return all(_dense_heads(t) for t in (q, k)) and all(
        t.device == q.device for t in (k, cos, sin))


def _dense_heads(t: torch.Tensor) -> bool:
    """t [B, H, S, D] is dense as [B, H, S, D] or as [B, S, H, D] (then viewed transposed)."""
    B, H, S, D = t.shape
    return t.stride() in ((H * S * D, S * D, D, 1), (S * H * D, D, H * D, 1))
