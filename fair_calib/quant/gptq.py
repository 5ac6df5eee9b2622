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
                  block_size: int = 128, clip_ratio: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (codes int8 [out, in], scale float32 [out, 1]); dequantized = codes * scale."""
    W = w.detach().double().clone()
    H = hessian.detach().double().clone().to(W.device)
    n = W.shape[1]
    if H.shape != (n, n):
        raise ValueError(f"Hessian {tuple(H.shape)} does not match weight {tuple(W.shape)}")
    q = qmax(bits)
    scale = (W.abs().amax(dim=1, keepdim=True) * clip_ratio / q).clamp(min=1e-8)
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
