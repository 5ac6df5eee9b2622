"""GPTQ (Frantar et al.) for one weight matrix, symmetric per-output-channel grid.

Columns are quantized left to right; each column's rounding error is spread onto the columns
not yet quantized through the inverse Hessian's Cholesky factor, in blocks of ``block_size``.
H = X^T X (any positive scale) of the layer input; ``damp`` * mean(diag H) is added to the diagonal.
"""
from __future__ import annotations

import torch

from .quantizers import qmax


@torch.no_grad()
def gptq_quantize(w: torch.Tensor, hessian: torch.Tensor, bits: int, damp: float = 0.01,
                  block_size: int = 128, clip_ratio: float = 1.0,
                  scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (codes int8 [out, in], scale float32 [out, 1]); dequantized = codes * scale.
    ``scale``: fixed row scales (e.g. :func:`mse_clip_scale`), else clip_ratio * max|w| / q."""
    W = w.detach().double().clone()
    H = hessian.detach().double().clone().to(W.device)
    n = W.shape[1]
    if H.shape != (n, n):
        raise ValueError(f"Hessian {tuple(H.shape)} does not match weight {tuple(W.shape)}")
    q = qmax(bits)
    if scale is None:
        scale = (W.abs().amax(dim=1, keepdim=True) * clip_ratio / q).clamp(min=1e-8)
    else:
        scale = scale.detach().double().reshape(-1, 1).to(W.device)
    dead = torch.diagonal(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H += damp * torch.diagonal(H).mean() * torch.eye(n, dtype=H.dtype, device=H.device)
    L = torch.linalg.cholesky(H)
    Hinv = torch.cholesky_inverse(L)
    U = torch.linalg.cholesky(Hinv, upper=True)        # upper Cholesky factor of H^{-1}
    codes = torch.zeros_like(W)
    for s in range(0, n, block_size):
        e = min(s + block_size, n)
        Wb = W[:, s:e].clone()
        Ub = U[s:e, s:e]
        Err = torch.zeros_like(Wb)
        for c in range(e - s):
            col = Wb[:, c:c + 1]
            code = torch.clamp(torch.round(col / scale), -q - 1, q)
            codes[:, s + c:s + c + 1] = code
            err = (col - code * scale) / Ub[c, c]
            Wb[:, c + 1:] -= err @ Ub[c:c + 1, c + 1:]
            Err[:, c:c + 1] = err
        W[:, e:] -= Err @ U[s:e, e:]
    return codes.to(torch.int8), scale.float()


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
