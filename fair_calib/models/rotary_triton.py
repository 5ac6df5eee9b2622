"""CUDA kernel of :mod:`rotary`: transformers' ``apply_rotary_pos_emb`` in one pass.

transformers computes ``(q * cos) + (rotate_half(q) * sin)`` (and the same for k) as ten
elementwise kernels a layer (a negation, a concatenation, two products and a sum for each of
q and k), every intermediate written to memory: 7.4 ms of Dream-7B's and 16.7 ms of LLaDA-8B's
forward at 8 x 512 tokens on an H100 (docs/benchmarks.md). This kernel reads q, k, cos and
sin once and writes the rotated q and k once, with torch's arithmetic: each product of the
operands (in float32: exact for two bf16 or fp16 values, rounded once with a float32 cos/sin)
rounded to the result dtype, then their float32 sum rounded to it, subnormals kept. The kernel
is compiled without floating-point contraction (``enable_fp_fusion=False``): a product and the
sum fused into one multiply-add would round once, not twice, where the result is float32
(LLaDA's float32 rotary); and with plain ``*`` and ``+``, not libdevice's ``mul_rn``/``add_rn``,
which Triton links flushing subnormals to zero.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl



@triton.jit
def _rotate_heads(x_ptr, o_ptr, b, s, sxb, sxh, sxs, sob, soh, sos, c, sn, d, partner, neg,
                  H: tl.constexpr, HB: tl.constexpr, D: tl.constexpr):
    """Rows (b, :, s, :) of x: x * cos + rotate_half(x) * sin, each product rounded to the
    output dtype, then the sum."""
    h = tl.arange(0, HB)[:, None]
    m = (h < H) & (d[None, :] < D)
    xr = x_ptr + b * sxb + s * sxs + h * sxh
    x = tl.load(xr + d[None, :], mask=m, other=0.0)
    xp = tl.load(xr + partner[None, :], mask=m, other=0.0)
    rot = tl.where(neg[None, :], -xp, xp)              # rotate_half: cat(-x2, x1), exact
    odt = o_ptr.dtype.element_ty
    t1 = (x.to(tl.float32) * c[None, :]).to(odt)
    t2 = (rot.to(tl.float32) * sn[None, :]).to(odt)
    out = (t1.to(tl.float32) + t2.to(tl.float32)).to(odt)
    tl.store(o_ptr + b * sob + s * sos + h * soh + d[None, :], out, mask=m)


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, oq_ptr, ok_ptr, S,
                   sqb, sqh, sqs, skb, skh, sks, soqb, soqh, soqs, sokb, sokh, soks, scb, scs,
                   HQ: tl.constexpr, HQB: tl.constexpr, HK: tl.constexpr, HKB: tl.constexpr,
                   D: tl.constexpr, DB: tl.constexpr):
    # one program per (batch row, position): all of its q and k heads, one cos/sin row
    pid = tl.program_id(0).to(tl.int64)
    b = pid // S
    s = pid % S
    d = tl.arange(0, DB)
    half = D // 2
    neg = d < half
    partner = tl.where(neg, d + half, d - half)
    cm = d < D
    c = tl.load(cos_ptr + b * scb + s * scs + d, mask=cm, other=0.0).to(tl.float32)
    sn = tl.load(sin_ptr + b * scb + s * scs + d, mask=cm, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, oq_ptr, b, s, sqb, sqh, sqs, soqb, soqh, soqs, c, sn, d, partner, neg,
                  HQ, HQB, D)
    _rotate_heads(k_ptr, ok_ptr, b, s, skb, skh, sks, sokb, sokh, soks, c, sn, d, partner, neg,
                  HK, HKB, D)


def rotate(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_embed, k_embed) for q [B, Hq, S, D], k [B, Hk, S, D] (last dims contiguous), cos and
    sin [B or 1, S, D] (same strides); outputs in ``out_dtype`` laid out as torch's
    elementwise result is (:func:`_like`)."""
    B, HQ, S, D = q.shape
    HK = k.shape[1]
    oq, ok = _like(q, out_dtype), _like(k, out_dtype)
    if oq.numel() == 0:
        return oq, ok
    scb = 0 if cos.shape[0] == 1 else cos.stride(0)
    _rotary_kernel[(B * S,)](
        q, k, cos, sin, oq, ok, S,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        oq.stride(0), oq.stride(1), oq.stride(2), ok.stride(0), ok.stride(1), ok.stride(2),
        scb, cos.stride(1),
        HQ=HQ, HQB=triton.next_power_of_2(HQ), HK=HK, HKB=triton.next_power_of_2(HK),
        D=D, DB=triton.next_power_of_2(D), num_warps=4, enable_fp_fusion=False)
    return oq, ok


def _like(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An empty tensor of t's shape laid out as torch's elementwise ops lay out their result
    for t dense as [B, H, S, D] (contiguous, whatever the strides of size-1 dimensions) or as
    [B, S, H, D] viewed transposed (that permutation, dense)."""
    if t.is_contiguous():
        return torch.empty(t.shape, dtype=dtype, device=t.device)
    B, H, S, D = t.shape
    return torch.empty_strided(t.shape, (S * H * D, D, H * D, 1), dtype=dtype, device=t.device)
