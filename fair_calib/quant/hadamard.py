"""Random Hadamard-type rotations of any size (QuaRot).

For n = 2^k * m with m odd, the rotation is R = diag(s) (M (x) H_{2^k} / sqrt(2^k)), s random
signs, H Sylvester's Hadamard matrix. For m = 1 this is the usual randomised Hadamard transform.
For m > 1 (3584 = 7 * 512, 18944 = 37 * 512, 11008 = 43 * 256) no Hadamard matrix of order m
exists when m is odd > 1, so M is a seeded Haar-random orthogonal m x m matrix (QuaRot ships
hand-made Hadamard matrices of orders like 172 or 148 instead; any orthogonal M keeps the
rotation exact, the random one spreads outliers across its m-blocks equally well in expectation).
Rotations act on row vectors: x -> x @ R (``rotate``), applied through the Kronecker structure without
materialising R unless asked.
"""
from __future__ import annotations

import torch
from torch import nn

from .transforms import random_orthogonal


def sylvester_hadamard(n: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    if n < 1 or n & (n - 1):
        raise ValueError(f"Sylvester Hadamard needs a power of two, got {n}")
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def split_pow2(n: int) -> tuple[int, int]:
    """n = m * p with p the largest power of two dividing n; returns (m, p)."""
    p = n & -n
    return n // p, p


class KronRotation(nn.Module):
    """Fixed orthogonal R = diag(s) (M (x) Hp / sqrt(p)) of size n, applied as x @ R."""

    def __init__(self, n: int, generator: torch.Generator | None = None, signs: bool = True):
        super().__init__()
        self.n = n
        self.m, self.p = split_pow2(n)
        s = (torch.randint(0, 2, (n,), generator=generator, dtype=torch.float64) * 2 - 1
             if signs else torch.ones(n, dtype=torch.float64))
        m = random_orthogonal(self.m, generator) if self.m > 1 else torch.ones(1, 1, dtype=torch.float64)
        h = sylvester_hadamard(self.p) / self.p ** 0.5
        self.register_buffer("s", s.float())
        self.register_buffer("mfac", m.float())
        self.register_buffer("hfac", h.float())

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """x @ R over the last dimension."""
        dt = x.dtype
        shape = x.shape
        x = x * self.s.to(dt)
        xr = x.reshape(*shape[:-1], self.m, self.p)
        # (x @ (M (x) H)) reshaped = M^T X H
        xr = torch.matmul(torch.matmul(self.mfac.to(dt).T, xr), self.hfac.to(dt))
        return xr.reshape(shape)

    def matrix(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return self.rotate(torch.eye(self.n, dtype=dtype))

    def _apply(self, fn, recurse=True):  # buffers follow the device, stay float32
        super()._apply(fn, recurse)
        for k in ("s", "mfac", "hfac"):
            t = getattr(self, k)
            if t.dtype != torch.float32:
                setattr(self, k, t.float())
        return self
