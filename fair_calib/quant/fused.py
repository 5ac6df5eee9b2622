"""The fake-quant chains of a FlatQuant-style linear as pure functions, compiled on CUDA.

Three chains cover the hot paths of calibration and evaluation:

- :func:`act_chain`:    x -> Q_X,k(K (d * x)) for every reading linear k (calibration)
- :func:`weight_chain`: W -> Q_W(LWC((W / d) K^{-1}))       (calibration, weight side)
- :func:`act_chain_folded`: the activation side with folded matrices and fixed clip factors
  (evaluation, no gradient).

In eager mode each is a handful of elementwise passes over tensors as large as the block's
weights (218 M elements per LLaDA-8B block) or activations, plus their backward: most of a
calibration step's time (``docs/benchmarks.md``). On CUDA :func:`call` hands them to
``torch.compile``, which fuses each chain (and its backward, recomputation included) into a
few kernels around the two small Kronecker matmuls: 1.6x faster calibration, and the
difference between a 1.2-1.3x and a 1.6-1.9x fake-quant forward. The compiled and eager
versions compute the same function. Compiled code rounds a few operations differently in the
last bit (the sigmoid of a clip, fused multiply-adds), which flips about one 4-bit grid point
in 10^7 (``benchmarks/calibration_gpu.py --check-fused`` of commit be0153a measured it on a
GPU). The compiled chains take the token maximum's gradient through the arg-max (``form="gather"``, see
:func:`clip_qdq`); eager mode shares it among exact ties as FlatQuant's ``amax`` does.

``FAIR_CALIB_COMPILE=0`` keeps everything eager; a compiler failure on first use (no Triton,
no C compiler) also falls back to eager, once, with a warning.
"""
from __future__ import annotations

import os
import warnings
from typing import Callable

import torch

from torch.utils.checkpoint import checkpoint

from .quantizers import lac_fake_quant, lwc_clamp, lwc_fake_quant, minmax_fake_quant, qmax
from .transforms import kron_last


def clip_qdq(x: torch.Tensor, c_max: torch.Tensor, c_min: torch.Tensor, bits: int,
             form: str) -> torch.Tensor:
    """Per-token fake quantization with FlatQuant's learnable clipping (:func:`lac_fake_quant`).

    ``form``: "custom"/"ref" (eager: ``amax``/``amin``, FlatQuant's own ops) or "gather" (the
    compiled form: the row maximum's gradient goes to the arg-max, which does not depend on a
    recomputation rounding like an equality test would). Same values; the same gradients but
    for exact ties of a token's maximum."""
    if form not in ("custom", "ref", "gather"):
        raise ValueError(f"unknown quantizer form {form!r}")
    return lac_fake_quant(x, c_max, c_min, bits, "index" if form == "gather" else "ref")


def head_rows(w: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Every head's block of rows W_h (``p.shape[0]`` rows each) replaced by p W_h: the
    output-side transform FlatQuant folds into v_proj (``out_trans``); also for a bias."""
    hd = p.shape[0]
    lead = w.shape[1:]
    return torch.matmul(p, w.reshape(-1, hd, *lead) if lead else w.reshape(-1, hd, 1)).reshape(w.shape)


def act_chain(x: torch.Tensor, d: torch.Tensor | None, p1: torch.Tensor | None,
              p2: torch.Tensor | None, c_max: torch.Tensor | None, c_min: torch.Tensor | None,
              bits: int, n1: int, n2: int, out_dtype: torch.dtype,
              form: str = "custom") -> tuple[torch.Tensor, ...]:
    """Q_X,k(T x) for every reader k of the input, T x = (P1 (x) P2)(d * x) (P2 None: P1 over
    the first axis only); one transform, then one quantization per learnable clip pair
    (``c_max[k]``, ``c_min[k]``: one per reading linear, FlatQuant's LAC). float32
    arithmetic (the Kronecker matmuls follow the caller's autocast), results in ``out_dtype``."""
    x = x.float()
    if d is not None:
        x = x * d
    if p1 is not None:
        x = kron_last(x, p1, None if p2 is None else p2.T, n1, n2)
    x = x.float()
    return tuple(clip_qdq(x, c_max[k], c_min[k], bits, form).to(out_dtype)
                 for k in range(c_max.shape[0]))


def weight_chain(w: torch.Tensor, d: torch.Tensor | None, p1i: torch.Tensor | None,
                 p2i: torch.Tensor | None, c_max: torch.Tensor | None,
                 c_min: torch.Tensor | None, bits: int, n1: int, n2: int,
                 out_dtype: torch.dtype, out_fac: torch.Tensor | None = None,
                 form: str = "custom") -> torch.Tensor:
    """Q_W(W T^{-1}) as FlatQuant's ``_train_forward``: W T^{-1} (columns divided by d, every
    row R reshaped n1 x n2 becomes P1^{-T} R P2^{-1}), learnable clipping (when ``c_max``),
    the output-side head transform (``out_fac``, v_proj), then the min/max quantizer; float32,
    result in ``out_dtype``."""
    w = w.float()
    if d is not None:
        w = w / d
    if p1i is not None:
        w = kron_last(w, p1i.T, p2i, n1, n2)
    if c_max is not None and out_fac is None:
        return lwc_fake_quant(w, c_max, c_min, bits).to(out_dtype)
    if c_max is not None:
        w = lwc_clamp(w, c_max, c_min)
    if out_fac is not None:
        w = head_rows(w, out_fac)
    return minmax_fake_quant(w, bits).to(out_dtype)


def act_chain_folded(x: torch.Tensor, d: torch.Tensor | None, p1: torch.Tensor | None,
                     p2_t: torch.Tensor | None, r_max: torch.Tensor, r_min: torch.Tensor,
                     bits: int, n1: int, n2: int) -> tuple[torch.Tensor, ...]:
    """Evaluation: T x in x's dtype (matrices given in it), then one per-token quantization in
    float32 per reader k with the fixed clip factors ``r_max[k]``, ``r_min[k]``; results in
    x's dtype."""
    if d is not None:
        x = x * d
    if p1 is not None:
        x = kron_last(x, p1, p2_t, n1, n2)
    xf = x.float()
    q = qmax(bits)
    hi = torch.clamp(xf.amax(dim=-1, keepdim=True), min=0.0)
    lo = torch.clamp(xf.amin(dim=-1, keepdim=True), max=0.0).abs()
    outs = []
    for k in range(r_max.shape[0]):
        m = torch.maximum(lo * r_min[k], hi * r_max[k])
        s = torch.where(m == 0, torch.ones_like(m), m / q)
        outs.append((torch.clamp(torch.round(xf / s), -q - 1, q) * s).to(x.dtype))
    return tuple(outs)


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
    against by ``benchmarks/calibration_gpu.py --check-fused`` of commit be0153a)."""
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
    def run(*args, **kw):
        return checkpoint(fn, *args, use_reentrant=False, **kw)
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
        kw = {"form": form} if takes_form else {}
        if recompute:
            return checkpoint(fn, *args, use_reentrant=False, **kw)
        return fn(*args, **kw)
    key = (fn, recompute, COMPILED_FORM)
    c = _compiled.get(key)
    if c is None:
        _raise_recompile_limit()
        c = _compiled[key] = torch.compile(_recomputed(fn) if recompute else fn)
    kw = {"form": COMPILED_FORM} if takes_form else {}
    if key in _verified:
        return c(*args, **kw)
    try:
        out = c(*args, **kw)
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
