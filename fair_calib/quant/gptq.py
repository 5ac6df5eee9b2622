"""GPTQ (Frantar et al.) for one weight matrix: QuaRot's symmetric per-row grid
(:func:`gptq_quantize`) and AutoGPTQ's group-wise grid with zero points (:func:`gptq_grouped`).

Columns are quantized left to right; each column's rounding error is spread onto the columns
not yet quantized through the inverse Hessian's Cholesky factor, in blocks of ``block_size``
(:func:`_sweep`, shared by both grids). H = X^T X (any positive scale) of the layer input;
dead columns (zero diagonal) get H_jj = 1 and a zero weight; ``damp`` * mean(diag H) is added to
the diagonal.

Two arithmetics (``fair_calib.names.registry.ARITHMETICS``): ``authors``, AutoGPTQ's ``GPTQ`` as QDLM vendors it: the
Hessian a float32 running mean 2/n sum x x^T fed one sequence at a time
(:func:`autogptq_hessian`, ``add_batch``), the sweep in float32, the damping the mean of a
contiguous ``torch.diag`` copy added by index (``fasterquant``); ``precise``: H = sum x x^T and
the sweep in float64 (:func:`group_hessian`; QuaRot's GPTQ always runs this one).
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from .groupwise import GroupCodes, autogptq_params, codes_of, n_groups
from ..names.registry import check_arithmetic
from .quantizers import qmax


def _prepare(w: torch.Tensor, hessian: torch.Tensor, damp: float, act_order: bool = False,
             authors: bool = False):
    """(W, U, perm): W with dead columns zeroed (permuted by decreasing diag H under
    ``act_order``), U the upper Cholesky factor of the damped H^{-1}, perm or None. In float64;
    ``authors``: as AutoGPTQ's ``fasterquant`` orders it, in float32, diag H read through
    ``torch.diag`` (a contiguous copy: its mean sums in another order than a strided view's),
    the damping added by index."""
    dtype = torch.float32 if authors else torch.float64
    diag = torch.diag if authors else torch.diagonal
    W = w.detach().to(dtype).clone()
    H = hessian.detach().to(dtype).clone().to(W.device)
    n = W.shape[1]
    if H.shape != (n, n):
        raise ValueError(f"Hessian {tuple(H.shape)} does not match weight {tuple(W.shape)}")
    dead = diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    perm = None
    if act_order:
        perm = torch.argsort(diag(H), descending=True)
        W = W[:, perm]
        H = H[perm][:, perm]
    if authors:
        index = torch.arange(n, device=H.device)
        H[index, index] += damp * torch.mean(torch.diag(H))
    else:
        H += damp * torch.diagonal(H).mean() * torch.eye(n, dtype=H.dtype, device=H.device)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    return W, U, perm


def _sweep(W: torch.Tensor, U: torch.Tensor, block_size: int,
           quant_col: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """The GPTQ column loop, in place on ``W``. ``quant_col(j, col, W)`` returns the quantized
    column j ([out, 1]); ``W`` is the matrix as updated at the start of the current block (the
    in-block updates live in a copy, as in the reference implementations)."""
    n = W.shape[1]
    for s in range(0, n, block_size):
        e = min(s + block_size, n)
        Wb = W[:, s:e].clone()
        Ub = U[s:e, s:e]
        Err = torch.zeros_like(Wb)
        for c in range(e - s):
            col = Wb[:, c:c + 1]
            err = (col - quant_col(s + c, col, W)) / Ub[c, c]
            Wb[:, c + 1:] -= err @ Ub[c:c + 1, c + 1:]
            Err[:, c:c + 1] = err
        W[:, e:] -= Err @ U[s:e, e:]


@torch.no_grad()
def gptq_quantize(w: torch.Tensor, hessian: torch.Tensor, bits: int, damp: float = 0.01,
                  block_size: int = 128, clip_ratio: float = 1.0,
                  scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (codes int8 [out, in], scale float32 [out, 1]); dequantized = codes * scale.
    ``scale``: fixed row scales (e.g. :func:`mse_clip_scale`), else clip_ratio * max|w| / q."""
    q = qmax(bits)
    if scale is None:
        Wd = w.detach().double()
        scale = (Wd.abs().amax(dim=1, keepdim=True) * clip_ratio / q).clamp(min=1e-8)
    else:
        scale = scale.detach().double().reshape(-1, 1).to(w.device)
    W, U, _ = _prepare(w, hessian, damp)
    codes = torch.zeros_like(W)

    def quant_col(j, col, _W):
        code = torch.clamp(torch.round(col / scale), -q - 1, q)
        codes[:, j:j + 1] = code
        return code * scale
    _sweep(W, U, block_size, quant_col)
    return codes.to(torch.int8), scale.float()


@torch.no_grad()
def gptq_grouped(w: torch.Tensor, hessian: torch.Tensor, bits: int, group_size: int = 128,
                 sym: bool = True, act_order: bool = False, damp: float = 0.01,
                 block_size: int = 128, arithmetic: str = "authors") -> GroupCodes:
    """AutoGPTQ's ``GPTQ.fasterquant`` (``static_groups=False``) with its ``Quantizer``
    (per channel, ``mse=False``): a group's (scale, zero) are found when the sweep reaches the
    group's first column, from the not-yet-quantized columns of the group as updated up to the
    start of the current block; under ``act_order`` the columns are visited by decreasing H_jj
    and the groups are consecutive in that order (``g_idx`` maps each column back).
    ``group_size`` <= 0: one group per row. ``arithmetic``: ``authors`` (float32, AutoGPTQ's
    order) or ``precise`` (float64)."""
    check_arithmetic(arithmetic, "gptq")
    n = w.shape[1]
    per_row = group_size is None or group_size <= 0
    gs = n if per_row else int(group_size)
    W, U, perm = _prepare(w, hessian, damp, act_order, authors=arithmetic == "authors")
    codes = torch.zeros_like(W)
    ng = n_groups(n, gs)
    scales = torch.zeros(W.shape[0], ng, dtype=W.dtype, device=W.device)
    zeros = torch.zeros_like(scales)
    cur: dict[str, torch.Tensor] = {}
    if per_row:   # one (scale, zero) per row, found before dead columns are zeroed
        cur["s"], cur["z"] = autogptq_params(w.detach().to(W.device, W.dtype), bits, sym)
        scales[:], zeros[:] = cur["s"], cur["z"]

    def quant_col(j, col, Wcur):
        if j % gs == 0 and not per_row:
            cur["s"], cur["z"] = autogptq_params(Wcur[:, j:j + gs], bits, sym)
            scales[:, j // gs:j // gs + 1], zeros[:, j // gs:j // gs + 1] = cur["s"], cur["z"]
        c = codes_of(col, cur["s"], cur["z"], bits)
        codes[:, j:j + 1] = c
        return cur["s"] * (c - cur["z"])
    _sweep(W, U, block_size, quant_col)
    g_idx = torch.arange(n, device=W.device) // gs
    if perm is not None:
        inv = torch.argsort(perm)
        codes = codes[:, inv]
        g_idx = g_idx[inv]
    return GroupCodes(codes.to(torch.uint8), scales.float(), zeros.float(),
                      g_idx.to(torch.int32), int(bits))


@torch.no_grad()
def mse_clip_scale(w: torch.Tensor, bits: int, norm: float = 2.4, grid: int = 100,
                   maxshrink: float = 0.8) -> torch.Tensor:
    """QuaRot's ``--w_clip`` (the GPTQ repositories' ``WeightQuantizer.find_params`` with
    ``mse=True``, symmetric, per row): among the scales p * max(|min(w, 0)|, max(w, 0)) / q,
    p = 1, 0.99, ..., 0.21 (clamped to 1e-5 first), keep per row the first minimising
    sum |Q(w) - w|^2.4. Runs in ``w``'s dtype (QuaRot: float32). Returns [out, 1]."""
    q = qmax(bits)
    zero = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
    xmax = torch.maximum(torch.minimum(w.min(1)[0], zero).abs(),
                         torch.maximum(w.max(1)[0], zero)).clamp(min=1e-5)
    scale = xmax / q
    best = torch.full_like(xmax, float("inf"))
    for i in range(int(maxshrink * grid)):
        s1 = (1 - i / grid) * xmax / q
        err = (torch.clamp(torch.round(w / s1[:, None]), -q - 1, q) * s1[:, None] - w)
        err = err.abs().pow(norm).sum(1)
        better = err < best
        best = torch.where(better, err, best)
        scale = torch.where(better, s1, scale)
    return scale.reshape(-1, 1)


def _feed(linear, pre_hook, n_batches: int, run) -> None:
    """``run(b)`` for b < n_batches with ``pre_hook`` on ``linear``'s input."""
    handle = linear.register_forward_pre_hook(pre_hook)
    try:
        for b in range(n_batches):
            run(b)
    finally:
        handle.remove()


@torch.no_grad()
def group_hessian(block, group, n_batches: int, run) -> torch.Tensor:
    """sum x x^T (float64) of the input of ``group``'s first linear (a ``QuantLinear``) over
    ``run(b)``, b < n_batches, taken after the group's online rotation if it has one (R^T H R)."""
    first = block.get_submodule(group.names[0])
    acc: list[torch.Tensor] = []

    def hook(_m, args):
        x = args[0].detach().float().reshape(-1, args[0].shape[-1]).double()
        h = x.T @ x
        if acc:
            acc[0] += h
        else:
            acc.append(h)
    _feed(first, hook, n_batches, run)
    H = acc[0]
    inq = getattr(first, "inq", None)
    if inq is not None and inq.rotation is not None:
        HR = inq.rotation.rotate(H)          # H R
        H = inq.rotation.rotate(HR.T)        # R^T H R (H symmetric)
    return H


@torch.no_grad()
def autogptq_hessian(block, group, n_batches: int, run) -> torch.Tensor:
    """AutoGPTQ's ``GPTQ.add_batch`` H (float32) of the input of ``group``'s first linear over
    ``run(b)``, b < n_batches: one update per sequence, as ``quantize()`` feeds its examples
    (``batch_size`` 1): H *= n / (n + 1); n += 1; x = sqrt(2 / n) * x; H += x x^T."""
    first = block.get_submodule(group.names[0])
    # refused before any batch runs
    if getattr(first, "inq", None) is not None and first.inq.rotation is not None:
        raise ValueError("autogptq_hessian: the group's input is rotated online; AutoGPTQ's "
                         "Hessian has no rotation (use group_hessian)")
    state: dict = {"H": None, "n": 0}

    def add_batch(inp: torch.Tensor) -> None:
        if len(inp.shape) == 2:
            inp = inp.unsqueeze(0)
        tmp = inp.shape[0]
        if len(inp.shape) == 3:
            inp = inp.reshape((-1, inp.shape[-1]))
        inp = inp.t()
        if state["H"] is None:
            state["H"] = torch.zeros((inp.shape[0], inp.shape[0]), device=inp.device)
        H = state["H"]
        H *= state["n"] / (state["n"] + tmp)
        state["n"] += tmp
        inp = math.sqrt(2 / state["n"]) * inp.float()
        H += inp.matmul(inp.t())

    def hook(_m, args):
        x = args[0].detach()
        for seq in (x.split(1) if x.dim() == 3 else (x,)):
            add_batch(seq)
    _feed(first, hook, n_batches, run)
    return state["H"]
