"""The fake-quant chains of a FlatQuant-style linear as pure functions, compiled on CUDA.

Three chains cover the hot paths of calibration and evaluation:

- :func:`act_chain`:    x -> Q_X(K (d * x))                 (calibration, activation side)
- :func:`weight_chain`: W -> Q_W((W / d) K^{-1})            (calibration, weight side)
- :func:`act_chain_folded`: the activation side with folded matrices and a fixed clip ratio
  (evaluation, no gradient).

In eager mode each is a handful of elementwise passes over tensors as large as the block's
weights (218 M elements per LLaDA-8B block) or activations, plus their backward: most of a
calibration step's time (``docs/benchmarks.md``). On CUDA :func:`call` hands them to
``torch.compile``, which fuses each chain (and its backward, recomputation included) into a
few kernels around the two small Kronecker matmuls: 1.6x faster calibration, and the
difference between a 1.2-1.3x and a 1.6-1.9x fake-quant forward. The compiled and eager
versions compute the same function. Compiled code rounds a few operations differently in the
last bit (the sigmoid of a clip, fused multiply-adds), which flips about one 4-bit grid point
in 10^7; ``benchmarks/calibration_gpu.py --check-fused`` measures this on the GPU. The
compiled chains use an autograd formulation of the clipped quantizer (``form="gather"``, see
:func:`clip_qdq`) so that Inductor derives and fuses the backward itself; eager mode uses the
memory-lean custom Function.

``FAIR_CALIB_COMPILE=0`` keeps everything eager; a compiler failure on first use (no Triton,
no C compiler) also falls back to eager, once, with a warning.
"""
from __future__ import annotations

import os
import warnings
from typing import Callable

import torch

from torch.utils.checkpoint import checkpoint

from .quantizers import SCALE_EPS, _ClipFakeQuant, round_ste
from .transforms import kron_last


def clip_qdq(x: torch.Tensor, clip: torch.Tensor, q: int, form: str) -> torch.Tensor:
    """Per-row symmetric fake quantization with clip factor sigmoid(``clip``), STE rounding.

    ``form``: "custom" (the memory-lean autograd Function, eager), "amax" (autograd through
    ``amax``) or "gather" (autograd through the gathered row maximum; the compiler's form).
    All three give the same values and, but for exact ties of the row maximum, the same
    gradients."""
    if form == "custom":
        return _ClipFakeQuant.apply(x, clip, q)
    ax = x.abs()
    if form == "gather":
        # the max's gradient goes to the arg-max index, not to the elements equal to the
        # maximum: the latter test fails when a recomputation rounds differently
        amax = ax.gather(-1, ax.argmax(dim=-1, keepdim=True))
    elif form == "amax":
        amax = ax.amax(dim=-1, keepdim=True)
    else:
        raise ValueError(f"unknown quantizer form {form!r}")
    s = torch.clamp(amax * torch.sigmoid(clip.to(x.dtype)) / q, min=SCALE_EPS)
    return torch.clamp(round_ste(x / s), -q - 1, q) * s


def act_chain(x: torch.Tensor, d: torch.Tensor | None, p1: torch.Tensor | None,
              p2: torch.Tensor | None, clip: torch.Tensor, q: int, n1: int, n2: int,
              out_dtype: torch.dtype, form: str = "custom") -> torch.Tensor:
    """Q_X(T x), T x = (P1 (x) P2)(d * x); float32 arithmetic (the Kronecker matmuls follow the
    caller's autocast), result cast to ``out_dtype``."""
    x = x.float()
    if d is not None:
        x = x * d
    if p1 is not None:
        x = kron_last(x, p1, p2.T, n1, n2)
    return clip_qdq(x.float(), clip, q, form).to(out_dtype)


def weight_chain(w: torch.Tensor, d: torch.Tensor | None, p1i: torch.Tensor | None,
                 p2i: torch.Tensor | None, clip: torch.Tensor, q: int, n1: int, n2: int,
                 out_dtype: torch.dtype, form: str = "custom") -> torch.Tensor:
    """Q_W(W T^{-1}) with T^{-1} = diag(1/d) K^{-1}: columns divided by d, then every row R
    (reshaped n1 x n2) becomes P1^{-T} R P2^{-1}; float32, result cast to ``out_dtype``."""
    w = w.float()
    if d is not None:
        w = w / d
    if p1i is not None:
        w = kron_last(w, p1i.T, p2i, n1, n2)
    return clip_qdq(w, clip, q, form).to(out_dtype)


def act_chain_folded(x: torch.Tensor, d: torch.Tensor | None, p1: torch.Tensor | None,
                     p2_t: torch.Tensor | None, ratio: torch.Tensor, q: int, n1: int,
                     n2: int) -> torch.Tensor:
    """Evaluation: T x in x's dtype (matrices given in it), per-token quantization in float32
    with the fixed clip ratio, result in x's dtype."""
    if d is not None:
        x = x * d
    if p1 is not None:
        x = kron_last(x, p1, p2_t, n1, n2)
    xf = x.float()
    s = torch.clamp(xf.abs().amax(dim=-1, keepdim=True) * ratio / q, min=SCALE_EPS)
    return (torch.clamp(torch.round(xf / s), -q - 1, q) * s).to(x.dtype)


# Compiled callables per (chain, recompute, form); chains whose compilation failed (eager from
# then on); compiled callables whose first call succeeded (later errors are real errors).
_compiled: dict[tuple, Callable] = {}
_failed: set[Callable] = set()
_verified: set[tuple] = set()


def reset() -> None:
    """Forget compiled chains and failures (benchmarks switch settings within one process)."""
    _compiled.clear()
    _failed.clear()
    _verified.clear()


# The quantizer form (see :func:`clip_qdq`) inside compiled chains.
COMPILED_FORM = "gather"


def compile_setting() -> str:
    """``FAIR_CALIB_COMPILE``: "1" (default; compile on CUDA), "0" (eager), "plain" (eager with
    the compiler's quantizer form, ``COMPILED_FORM``: the reference the compiled path is checked
    against in ``benchmarks/calibration_gpu.py --check-fused``)."""
    raw = os.environ.get("FAIR_CALIB_COMPILE", "1")
    v = raw.strip().lower()
    v = {"false": "0", "no": "0", "off": "0", "true": "1", "yes": "1", "on": "1"}.get(v, v)
    if v not in ("0", "1", "plain"):
        raise ValueError(f"FAIR_CALIB_COMPILE={raw!r}: expected 1 (compile on CUDA), 0 (eager) "
                         "or plain")
    return v


def compile_enabled() -> bool:
    return compile_setting() == "1"


def _raise_recompile_limit(n: int = 64) -> None:
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name) and getattr(cfg, name) < n:
            setattr(cfg, name, n)


def _recomputed(fn: Callable) -> Callable:
    """``fn`` under activation checkpointing. Compiled, the checkpoint is traced into the graph:
    the backward graph recomputes the fused forward instead of storing its float32
    intermediates. (Wrapping a compiled function in an *outer* checkpoint instead would rerun
    it eagerly, with dynamo disabled, and hand the compiled backward the wrong saved tensors.)"""
    def run(*args):
        return checkpoint(fn, *args, use_reentrant=False)
    run.__name__ = fn.__name__ + "_recomputed"
    return run


def call(fn: Callable, *args, device: torch.device, recompute: bool = False) -> torch.Tensor:
    """``fn(*args)``, compiled on CUDA unless ``FAIR_CALIB_COMPILE`` says otherwise;
    ``recompute``: checkpoint it (intermediates recomputed in the backward pass). A failure of
    the first compiled call (no Triton, no C compiler) falls back to eager for the rest of the
    process; later errors are real errors and propagate."""
    setting = compile_setting()
    takes_form = fn in _TAKES_FORM
    if device.type != "cuda" or setting != "1" or fn in _failed:
        form = COMPILED_FORM if setting == "plain" else "custom"
        full = args + ((form,) if takes_form else ())
        if recompute:
            return checkpoint(fn, *full, use_reentrant=False)
        return fn(*full)
    key = (fn, recompute, COMPILED_FORM)
    c = _compiled.get(key)
    if c is None:
        _raise_recompile_limit()
        c = _compiled[key] = torch.compile(_recomputed(fn) if recompute else fn)
    full = args + ((COMPILED_FORM,) if takes_form else ())
    if key in _verified:
        return c(*full)
    try:
        out = c(*full)
    except Exception as err:  # noqa: BLE001 - a missing toolchain must not stop the run
        _failed.add(fn)
        warnings.warn(f"torch.compile of {fn.__name__} failed ({type(err).__name__}: {err}); "
                      "using the eager version", RuntimeWarning, stacklevel=2)
        return call(fn, *args, device=device, recompute=recompute)
    _verified.add(key)
    return out


def fell_back() -> bool:
    """Whether a compilation failed in this process (the eager chains are in use)."""
    return bool(_failed)


_TAKES_FORM = (act_chain, weight_chain)
