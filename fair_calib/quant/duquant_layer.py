"""The quantized block computed as DuQuant's own layer classes compute it (QDLM's vendored
``DuQuant/models/int_llada_layer.py``, ``int_dream_layer.py``, ``int_llama_layer.py`` and
``quantize/du_norm.py``): ``smoothquant`` and ``duquant`` run their calibrated blocks through it
under ``arithmetic: authors``. An execution choice of the quantized block, written here from
those files' formulas; the block's own modules (its norms' weights, its :class:`QuantLinear`
modules, its activation) are used, only the order and dtypes of the arithmetic between them
are DuQuant's.

Every style (the block's hidden states arrive in float16, :func:`fair_calib.quant.half.make_half`):

* norms (``DuLladaRMSNorm`` / ``DuDreamRMSNorm`` / ``DuLlamaRMSNorm``): the variance of the
  float32 states, ``x * rsqrt(var + eps)`` (float32), the float16 weight multiplied into that
  float32 product, then one cast to float16 (transformers' RMSNorm casts first and multiplies
  in float16);
* MLP: ``down(act(gate(x)) * up(x))`` in float16; residual sums in float16.

Attention, per style (Q/K/V quantizers: the attention module's :class:`half.QKVQuant`):

* ``llama`` (``QuantLlamaAttention``) and ``dream`` (``QuantDreamAttention``): RoPE in float16
  (sin/cos computed in float32 and cast to float16, ``(q * cos) + (rotate_half(q) * sin)``),
  Q and K quantized, K/V heads repeated, ``matmul(q, k^T) / sqrt(head_dim)`` in float16, the
  mask added (``llama``: then ``max`` with float16's minimum), ``softmax(.., dtype=float32)``
  cast to float16, V quantized, ``matmul(p, v)`` in float16;
* ``llada`` (``QuantLLadaDecoderLayer.attention``): RoPE as LLaDA's ``RotaryEmbedding``
  (``rope_full_precision``: on the float32 q, k with float32 sin/cos, then cast to float16;
  else in float16), K/V heads repeated (``repeat_interleave``), Q and K quantized,
  ``matmul(q, k^T) * (1 / sqrt(head_dim))`` plus a float16 zero bias, ``torch.softmax`` in
  float16, V quantized, ``matmul(p, v)``.

The block layout is the native one (``self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``,
``input_layernorm``, ``post_attention_layernorm``): every LLaDA and Dream checkpoint the project
loads natively has it (LLaDA's ``attn_out``/``ff_proj``/``ff_out`` are renamed on loading).
Padding: a mask the model passes is applied (additively, 0 / float16's minimum) in every style;
LLaDA's layer ignores its mask (the project's LLaDA forward masks padding; unpadded inputs, as
calibration's, are unaffected).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .half import QKV_ATTR

STYLES = ("llama", "llada", "dream")
# the family -> DuQuant's layer class it runs through (the embedded tiny families included)
FAMILY_STYLE = {"llada": "llada", "tiny-llada": "llada", "dream": "dream", "tiny-dream": "dream"}


@dataclass(frozen=True)
class LayerArith:
    """Which of DuQuant's layers a block computes as: ``style`` (:data:`STYLES`), ``rope32``
    (LLaDA's ``rope_full_precision``), ``rotary``: the model's rotary module (float32 sin/cos
    where the block is handed them in a lower precision)."""
    style: str
    rope32: bool = False
    rotary: nn.Module | None = None


def layer_arith(loaded) -> LayerArith:
    """The layer arithmetic of ``loaded``'s family: LLaDA's for ``llada``/``tiny-llada``,
    Dream's for ``dream``/``tiny-dream``, DuQuant's Llama layer for any other family."""
    from ..models.hub import FLOAT32_ROTARY_ATTENTION

    style = FAMILY_STYLE.get(loaded.adapter.name, "llama")
    impl = str(loaded.model.config._attn_implementation).split("|")[-1]
    rotary = getattr(getattr(loaded.model, "model", None), "rotary_emb", None)
    return LayerArith(style, style == "llada" and impl == FLOAT32_ROTARY_ATTENTION, rotary)


def check_layout(block: nn.Module, index: int) -> None:
    need = ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
            "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
            "mlp.down_proj", "mlp.act_fn")
    for path in need:
        m = block
        for part in path.split("."):
            m = getattr(m, part, None)
        if m is None:
            raise RuntimeError(f"block {index} has no {path}: DuQuant's layer arithmetic "
                               "(arithmetic: authors) needs the native Llama/Qwen2 block layout; "
                               "use arithmetic: precise")


# ------------------------------------------------------------------ pieces
def du_rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``DuLlamaRMSNorm.forward`` (and its LLaDA / Dream copies): weight times the float32
    normalised states, then cast."""
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    h = x * torch.rsqrt(variance + eps)
    return (norm.weight * h).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _float32_sin_cos(arith: LayerArith, position_embeddings, position_ids, like: torch.Tensor):
    """The block's (cos, sin), float32 as the reference's tables are before any cast: as handed
    to the block where float32, else recomputed by the model's rotary module in float32."""
    cos, sin = position_embeddings
    if cos.dtype == torch.float32 or arith.rotary is None or position_ids is None:
        return cos, sin
    return arith.rotary(like.new_empty(0, dtype=torch.float32), position_ids)


def _additive_mask(mask: torch.Tensor | None, dtype, k_len: int) -> torch.Tensor | None:
    """A transformers mask (bool, True = attend; or additive) as DuQuant's additive one."""
    if mask is None:
        return None
    mask = mask[..., :k_len]
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            ~mask, torch.finfo(dtype).min)
    return mask.to(dtype)


def _quantizers(attn: nn.Module):
    qkv = getattr(attn, QKV_ATTR, None)
    ident = lambda x: x        # noqa: E731
    if qkv is None or qkv.bits >= 16:
        return ident, ident
    return qkv.qk, qkv.v


# ------------------------------------------------------------------ attention
def _attention(block: nn.Module, arith: LayerArith, h: torch.Tensor, mask, position_ids,
               position_embeddings) -> torch.Tensor:
    attn = block.self_attn
    bsz, q_len, hidden = h.shape
    hd = attn.head_dim
    q = attn.q_proj(h)
    k = attn.k_proj(h)
    v = attn.v_proj(h)
    nh, nkv = q.shape[-1] // hd, k.shape[-1] // hd
    q = q.view(bsz, q_len, nh, hd).transpose(1, 2)
    k = k.view(bsz, q_len, nkv, hd).transpose(1, 2)
    v = v.view(bsz, q_len, nkv, hd).transpose(1, 2)
    cos, sin = _float32_sin_cos(arith, position_embeddings, position_ids, h)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    quant_qk, quant_v = _quantizers(attn)
    if arith.style == "llada":
        if arith.rope32:            # rope_full_precision: q.float(), float32 sin/cos, type_as
            q_, k_ = q.float(), k.float()
        else:                       # sin/cos type_as(q): float16
            q_, k_, cos, sin = q, k, cos.to(q.dtype), sin.to(q.dtype)
        q = ((q_ * cos) + (rotate_half(q_) * sin)).to(q.dtype)
        k = ((k_ * cos) + (rotate_half(k_) * sin)).to(k.dtype)
        if nh != nkv:
            k = k.repeat_interleave(nh // nkv, dim=1, output_size=nh)
            v = v.repeat_interleave(nh // nkv, dim=1, output_size=nh)
        bias = torch.zeros(q_len, k.shape[-2], dtype=q.dtype, device=q.device)
        m = _additive_mask(mask, q.dtype, k.shape[-2])
        if m is not None:
            bias = bias + m
        q = quant_qk(q)
        k = quant_qk(k).transpose(-2, -1)
        w = torch.matmul(q, k) * (1 / math.sqrt(q.size(-1)))
        w += bias
        w = torch.softmax(w, dim=-1)
        out = torch.matmul(w, quant_v(v))
        out = out.transpose(1, 2).contiguous().view(bsz, q_len, nh * hd)
        return attn.o_proj(out)
    # llama / dream: rotary in float16 (sin/cos cast to the states' dtype)
    cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    q = (q * cos) + (rotate_half(q) * sin)
    k = (k * cos) + (rotate_half(k) * sin)
    q = quant_qk(q)
    k = quant_qk(k)
    if nh != nkv:                   # repeat_kv
        k = k[:, :, None].expand(bsz, nkv, nh // nkv, q_len, hd).reshape(bsz, nh, q_len, hd)
        v = v[:, :, None].expand(bsz, nkv, nh // nkv, q_len, hd).reshape(bsz, nh, q_len, hd)
    w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd)
    m = _additive_mask(mask, w.dtype, k.shape[-2])
    if m is not None:
        w = w + m
        if arith.style == "llama":
            w = torch.max(w, torch.tensor(torch.finfo(w.dtype).min))
    w = nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(w, quant_v(v))
    out = out.transpose(1, 2).contiguous().reshape(bsz, q_len, nh * hd)
    return attn.o_proj(out)


def layer_forward(block: nn.Module, arith: LayerArith, hidden_states: torch.Tensor,
                  attention_mask: torch.Tensor | None = None,
                  position_ids: torch.Tensor | None = None,
                  position_embeddings=None, **_) -> torch.Tensor:
    """The decoder layer's forward as DuQuant's quantized layer computes it (float16 states)."""
    if position_embeddings is None:
        raise RuntimeError("DuQuant's layer arithmetic: the block was called without "
                           "position_embeddings")
    residual = hidden_states
    h = du_rms_norm(block.input_layernorm, hidden_states)
    h = _attention(block, arith, h, attention_mask, position_ids, position_embeddings)
    hidden_states = residual + h
    residual = hidden_states
    h = du_rms_norm(block.post_attention_layernorm, hidden_states)
    mlp = block.mlp
    h = mlp.down_proj(mlp.act_fn(mlp.gate_proj(h)) * mlp.up_proj(h))
    return residual + h


def install(block: nn.Module, arith: LayerArith) -> None:
    """``block``'s forward replaced by :func:`layer_forward` (before ``make_half`` wraps it)."""
    if getattr(block, "_duquant_layer", None) is not None:
        return
    if arith.style not in STYLES:
        raise ValueError(f"unknown DuQuant layer style {arith.style!r}")
    block.forward = lambda *a, **kw: layer_forward(block, arith, *a, **kw)
    block._duquant_layer = arith.style
