"""DuQuant's float16 layers, as QDLM runs SmoothQuant and DuQuant from its code base
(``quantize/duquant.py``: ``qlayer.half()`` before smoothing; ``quantize/quantizer.py``:
``UniformAffineQuantizer``; ``models/int_llama_layer.py``: ``qkt_matmul`` / ``pv_matmul``).
``smoothquant`` and ``duquant`` use it under ``arithmetic: authors`` (their default).

* :func:`uaq_params`, :func:`uaq_fake_quant`, :func:`uaq_codes`: ``UniformAffineQuantizer``
  asymmetric min/max over the last dimension in the tensor's own dtype, both bounds times a
  clip ratio (``swc`` weights / ``lac`` activations), scale clamped to [1e-5, 1e4], zero point
  round(clamp(-min / s, +-1e4)); ``fake_quant``: ``round(x.float() / s).half()`` + z, clamped to
  [0, 2^b - 1], then (q - z) s in float16.
* :class:`HalfQuantLinear`: the linear computed as DuQuant's ``QuantLinear`` in its float16
  layer: quantized input and weight, ``F.linear`` in float16.
* :func:`make_half`: the block's parameters in float16 and its hidden states cast to float16 at
  its entrance and back at its exit (the residual stream between blocks keeps the model dtype).
* :func:`install_qkv_attention`: the attention matmuls' inputs quantized (``qkt_matmul``:
  Q and K per (token, head), DuQuant also rotating them by a Hadamard of ``block_size`` first,
  with ``lac``; ``pv_matmul``: V per (token, head), the attention probabilities at 16 bits,
  i.e. not quantized), through an attention implementation that wraps the model's own; in a
  quantized block, whose forward is DuQuant's layer (:mod:`.duquant_layer`), they are applied
  inside its attention instead (:meth:`QKVQuant.qk`, :meth:`QKVQuant.v`).
"""
from __future__ import annotations

import contextlib
import math
import sys
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from .groupwise import GroupCodes
from .qlinear import QuantLinear
from .quantizers import ActQuantizer, WeightQuantizer

CLIPMIN, CLIPMAX = 1e-5, 1e4          # DuQuant's quantize/const.py
QKV_ATTR = "qdlm_qkv"                 # the attention module's matmul-input quantizer
QKV_PREFIX = "qdlm_qkv|"              # the wrapping attention implementation's name


# ------------------------------------------------------------------ UniformAffineQuantizer
def uaq_params(x: torch.Tensor, bits: int, ratio: float | None = None):
    """``per_token_dynamic_calibration`` (asymmetric): (scale, round_zero_point), keepdim."""
    xmin = x.amin([-1], keepdim=True)
    xmax = x.amax([-1], keepdim=True)
    if ratio:
        xmax = ratio * xmax
        xmin = ratio * xmin
    scale = ((xmax - xmin) / (2 ** bits - 1)).clamp(min=CLIPMIN, max=CLIPMAX)
    zero_point = -(xmin) / scale
    return scale, zero_point.clamp(min=-CLIPMAX, max=CLIPMAX).round()


def _x_int(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """``fake_quant``'s integers: round(x / s) in float32, cast to float16 (its "avoid
    overflow"), plus z, clamped to [0, 2^b - 1]."""
    y = x.float() / scale
    x_int = ((y.round() - y).detach() + y).half()          # round_ste
    return x_int.add(zero).clamp(0, 2 ** bits - 1)


def uaq_fake_quant(x: torch.Tensor, bits: int, ratio: float | None = None) -> torch.Tensor:
    """``UniformAffineQuantizer.forward``'s quantize-dequantize of ``x`` (float16)."""
    scale, zero = uaq_params(x, bits, ratio)
    return _x_int(x, scale, zero, bits).sub(zero).mul(scale)


def uaq_codes(w: torch.Tensor, bits: int, ratio: float | None = None) -> GroupCodes:
    """A weight's per-row codes as ``quant_inplace`` computes them (one group per row)."""
    scale, zero = uaq_params(w, bits, ratio)
    codes = _x_int(w, scale, zero, bits)
    return GroupCodes(codes.to(torch.uint8), scale.float(), zero.float(),
                      torch.zeros(w.shape[1], dtype=torch.int32, device=w.device), int(bits))


def dequantize_half(gc: GroupCodes) -> torch.Tensor:
    """(q - z) s in float16, as ``fake_quant`` ends (bit for bit its weight)."""
    g = gc.g_idx.long()
    return gc.codes.half().sub(gc.zero[:, g].half()).mul(gc.scale[:, g].half())


class HalfActQuantizer(ActQuantizer):
    """Per-token ``UniformAffineQuantizer`` in the input's dtype; ``clip_ratio``: ``lac``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x
        return uaq_fake_quant(x, self.bits, self.clip_ratio)


class HalfWeightQuantizer(WeightQuantizer):
    """Per-row ``UniformAffineQuantizer`` in the weight's dtype; ``clip_ratio``: ``swc``."""

    def forward(self, w: torch.Tensor, out_fac: torch.Tensor | None = None) -> torch.Tensor:
        if not self.enabled:
            return w
        return uaq_fake_quant(w, self.bits, self.clip_ratio)


class HalfQuantLinear(QuantLinear):
    """DuQuant's ``QuantLinear.forward`` in its float16 layer: the input group's quantized
    input (its input quantizer computes in the input's dtype), the quantized weight (codes set:
    ``w_quant``; else quantized on the fly, as during DuQuant's rotation pass), ``F.linear``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq = self.inq(x, self.user) if self.inq is not None else x
        if self.w_folded is not None and not torch.is_grad_enabled():
            w = self.w_folded
        elif self.w_quant is not None:
            w = self.w_quant
        else:
            w = self.linear.weight
            if self.inq is not None:
                w = self.inq.weight_inverse(w)
            w = self.wq(w)
        b = self.linear.bias
        return F.linear(xq, w.to(xq.dtype), None if b is None else b.to(xq.dtype))


# ------------------------------------------------------------------ the float16 block
def _cast_hidden(args, kwargs, dtype):
    """(args, kwargs, the hidden states' dtype) with the hidden states (the first positional
    argument, or ``hidden_states``) cast to ``dtype``; other arguments as they are (RoPE's
    sin/cos keep theirs: the rotation runs in float32 where they are float32)."""
    if args and isinstance(args[0], torch.Tensor):
        return (args[0].to(dtype), *args[1:]), kwargs, args[0].dtype
    h = kwargs.get("hidden_states")
    if isinstance(h, torch.Tensor):
        return args, {**kwargs, "hidden_states": h.to(dtype)}, h.dtype
    raise TypeError("float16 block: no hidden states among the block's arguments")


def _no_foreign_autocast(device: torch.device):
    """Inside the block: no bfloat16 autocast (the driver's, for bf16 models); float16
    autocast (DuQuant's rotation pass on CUDA) is kept."""
    on = torch.is_autocast_enabled(device.type)
    if on and torch.get_autocast_dtype(device.type) != torch.float16:
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def make_half(block: nn.Module) -> None:
    """``qlayer.half()``: every parameter and buffer of ``block`` in float16, its hidden states
    cast to float16 when it is called and its output back to the caller's dtype."""
    block.half()
    if getattr(block, "_half_block", False):
        return
    inner = block.forward

    def forward(*args, **kwargs):
        args, kwargs, dtype = _cast_hidden(args, kwargs, torch.float16)
        with _no_foreign_autocast(next(block.parameters()).device):
            out = inner(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            return out.to(dtype)
        return (out[0].to(dtype), *out[1:])
    block.forward = forward
    block._half_block = True


# ------------------------------------------------------------------ the attention matmuls
@lru_cache(maxsize=None)
def _hadamard(n: int) -> torch.Tensor:
    """``utils.get_hadamard(n)``: Sylvester's construction, each level divided by sqrt 2."""
    if n == 1:
        return torch.tensor([[1.0]], dtype=torch.float32)
    h = _hadamard(n // 2)
    return torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0) / math.sqrt(2)


def hadamard_matrix(n: int) -> torch.Tensor:
    if n <= 0 or n & (n - 1):
        raise ValueError(f"DuQuant's q/k Hadamard needs a power-of-two block_size, got {n}")
    return _hadamard(n)


class QKVQuant:
    """The inputs of DuQuant's attention matmuls, quantized as ``QuantMatMul.quant_x1/x2``
    (``act_quant_params`` for Q and K: per row of the head dimension, ``lac``, DuQuant's
    Hadamard of ``hadamard`` first; ``v_quant_params`` for V: per row, no clipping)."""

    def __init__(self, bits: int, lac: float | None = None, hadamard: int | None = None):
        self.bits, self.lac, self.hadamard = int(bits), lac, hadamard

    def _qk(self, x: torch.Tensor) -> torch.Tensor:
        if self.hadamard:                        # init_duquant with rotate=None
            shape = x.shape
            x = x.reshape(-1, self.hadamard).matmul(hadamard_matrix(self.hadamard).to(x)).view(shape)
        return uaq_fake_quant(x, self.bits, self.lac)

    def qk(self, x: torch.Tensor) -> torch.Tensor:
        """``qkt_matmul.quant_x1`` / ``quant_x2`` on Q or K in the layer's dtype."""
        return x if self.bits >= 16 else self._qk(x)

    def v(self, x: torch.Tensor) -> torch.Tensor:
        """``pv_matmul.quant_x2`` on V."""
        return x if self.bits >= 16 else uaq_fake_quant(x, self.bits)

    def __call__(self, q, k, v):
        # Q and K come rotated by RoPE in float32 where sin/cos are float32 (LLaDA's
        # full-precision rotary): back to the layer's dtype first, as ``type_as(q)``
        q, k = q.to(v.dtype), k.to(v.dtype)
        if self.bits >= 16:
            return q, k, v
        return self._qk(q), self._qk(k), uaq_fake_quant(v, self.bits)


_recorders: list[list] = []


@contextlib.contextmanager
def record_attention():
    """Collects every module that calls the wrapping attention implementation meanwhile."""
    seen: list = []
    _recorders.append(seen)
    try:
        yield seen
    finally:
        _recorders.remove(seen)


def _eager_of(module: nn.Module):
    return getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)


def install_qkv_attention(model: nn.Module) -> str:
    """Switch ``model`` to an attention implementation that quantizes Q, K and V with the
    calling module's ``qdlm_qkv`` (:class:`QKVQuant`, set on the attention modules of the
    blocks that have been quantized) and then runs the model's own implementation."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    base = model.config._attn_implementation
    if base.startswith(QKV_PREFIX):
        return base
    name = QKV_PREFIX + base

    def attention(module, query, key, value, *args, **kwargs):
        for seen in _recorders:
            seen.append(module)
        quant = getattr(module, QKV_ATTR, None)
        if quant is not None:
            query, key, value = quant(query, key, value)
        fn = ALL_ATTENTION_FUNCTIONS.get_interface(base, _eager_of(module))
        return fn(module, query, key, value, *args, **kwargs)

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    model.config._attn_implementation = name
    return name
