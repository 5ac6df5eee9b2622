"""Hadamard rotations of any width QuaRot handles, built from documented constructions.

A width n = K * 2^j is rotated by R = diag(s) (H_K^T (x) H_{2^j}) / sqrt(n) (row vectors,
x -> x @ R), the structure of QuaRot's ``matmul_hadU`` / ``matmul_hadU_cuda`` (the input viewed
as K x 2^j, a Sylvester transform on the 2^j axis, then H_K on the K axis); s are random signs
for the residual rotation (``random_hadamard_matrix``) and all ones for the online rotations.

H_K for K > 1 is a true Hadamard matrix (entries +-1, H H^T = K I), generated here rather than
copied from a table, and equal entry for entry to QuaRot's table of that order (``get_hadK`` in
spcl/QuaRot ``fake_quant/hadamard_utils.py``, Apache-2.0; pinned by hashes of its tables in
``tests/methods/test_quarot_fidelity.py``):
- Paley I, q prime, q = 3 (mod 4): order q + 1 (12, 20, 60, 108, 140);
- Paley II, q prime, q = 1 (mod 4): order 2 (q + 1) in the block form of QuaRot's tables
  (28 from q = 13, 36 from 17);
- Sylvester doubling [[H, H], [H, -H]] of a smaller one (40 = 2 x 20).
QuaRot also ships orders 52, 156 and 172 (Williamson-type, not constructed here): a width that
QuaRot would rotate with one of them is refused by :func:`hadamard_split`, never rotated by a
different matrix. Extensions beyond QuaRot (it asserts on these widths): order 148 = Paley II
with q = 73 (Dream-7B's MLP width 18944 = 148 x 128, so its down_proj rotation is still a true
Hadamard), and for any other width that is no power of two times one of these orders (e.g. 26
or 176 = 11 x 16) a seeded Haar-random orthogonal factor for the odd part. (:func:`hadamard`
builds further Paley orders, e.g. 44, which rotations do not use.)
"""
from __future__ import annotations

import torch
from torch import nn

from .hadamard_orders import (HADAMARD_ORDERS, QUAROT_ONLY_ORDERS,  # noqa: F401 (re-exported)
                              hadamard_recipe, hadamard_split, is_pow2)
from .hadamard_orders import is_prime as _is_prime
from .transforms import random_orthogonal


def sylvester_hadamard(n: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    if not is_pow2(n):
        raise ValueError(f"Sylvester Hadamard needs a power of two, got {n}")
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def _jacobsthal(q: int) -> torch.Tensor:
    """Q_ij = chi(j - i) over GF(q), chi the quadratic character (q prime)."""
    squares = {(a * a) % q for a in range(1, q)}
    chi = torch.tensor([0.0] + [1.0 if a in squares else -1.0 for a in range(1, q)],
                       dtype=torch.float64)
    idx = (torch.arange(q).unsqueeze(0) - torch.arange(q).unsqueeze(1)) % q
    return chi[idx]


def paley1(q: int) -> torch.Tensor:
    """Order q + 1 (q prime, q = 3 mod 4): H = I - S, S = [[0, 1^T], [-1, Q]] skew (the sign
    convention under which orders 12, 20, 60, 108, 140 equal QuaRot's tables entry for entry)."""
    if not (_is_prime(q) and q % 4 == 3):
        raise ValueError(f"Paley I needs a prime q = 3 (mod 4), got {q}")
    s = torch.zeros(q + 1, q + 1, dtype=torch.float64)
    s[0, 1:] = 1.0
    s[1:, 0] = -1.0
    s[1:, 1:] = _jacobsthal(q)
    return torch.eye(q + 1, dtype=torch.float64) - s


def paley2(q: int) -> torch.Tensor:
    """Order 2 (q + 1) (q prime, q = 1 mod 4): C = [[0, 1^T], [1, Q]] symmetric conference
    matrix, H = [[C + I, C - I], [C - I, -C - I]] (the block form of QuaRot's had28 / had36:
    for q = 13 and 17 this is its table entry for entry)."""
    if not (_is_prime(q) and q % 4 == 1):
        raise ValueError(f"Paley II needs a prime q = 1 (mod 4), got {q}")
    c = torch.zeros(q + 1, q + 1, dtype=torch.float64)
    c[0, 1:] = 1.0
    c[1:, 0] = 1.0
    c[1:, 1:] = _jacobsthal(q)
    a = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    b = torch.tensor([[1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64)
    return torch.kron(a, c) + torch.kron(b, torch.eye(q + 1, dtype=torch.float64))


def hadamard(k: int) -> torch.Tensor:
    """A +-1 Hadamard matrix of order k (float64), or ValueError if none is constructed
    (:func:`~fair_calib.quant.hadamard_orders.hadamard_recipe` says which construction)."""
    kind, q = hadamard_recipe(k)
    if kind == "sylvester":
        return sylvester_hadamard(k)
    if kind == "paley1":
        return paley1(q)
    if kind == "paley2":
        return paley2(q)
    h = hadamard(q)                                  # "double": Sylvester doubling
    return torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)


class KronRotation(nn.Module):
    """Fixed orthogonal R = diag(s) (M (x) H_p / sqrt(p)) of size n = m p, applied as x @ R, with
    M = H_m^T / sqrt(m) (a true Hadamard, see :func:`hadamard_split`; random orthogonal only
    where none exists). ``split``: (m, p) instead of :func:`hadamard_split` (m must have a
    Hadamard matrix); ``right=False``: identity instead of H_p, i.e. a rotation of the m axis
    only (QuaRot's online Hadamard across heads on the o_proj input: m heads, p = head_dim)."""

    def __init__(self, n: int, generator: torch.Generator | None = None, signs: bool = True,
                 split: tuple[int, int] | None = None, right: bool = True):
        super().__init__()
        self.n = n
        if split is None:
            self.m, self.p, exact = hadamard_split(n)
        else:
            (self.m, self.p), exact = split, True
        if self.m * self.p != n:
            raise ValueError(f"split {split} does not multiply to {n}")
        self.exact = exact
        s = (torch.randint(0, 2, (n,), generator=generator, dtype=torch.float64) * 2 - 1
             if signs else torch.ones(n, dtype=torch.float64))
        if self.m == 1:
            m = torch.ones(1, 1, dtype=torch.float64)
        elif exact:
            m = hadamard(self.m).T / self.m ** 0.5
        else:
            m = random_orthogonal(self.m, generator)
        self.right = bool(right)
        h = sylvester_hadamard(self.p) / self.p ** 0.5 if self.right else None
        self.register_buffer("s", s.float())
        self.register_buffer("mfac", m.float())
        self.register_buffer("hfac", None if h is None else h.float())

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """x @ R over the last dimension."""
        dt = x.dtype
        shape = x.shape
        x = x * self.s.to(dt)
        xr = x.reshape(*shape[:-1], self.m, self.p)
        # (x @ (M (x) H)) reshaped = M^T X H
        xr = torch.matmul(self.mfac.to(dt).T, xr)
        if self.hfac is not None:
            xr = torch.matmul(xr, self.hfac.to(dt))
        return xr.reshape(shape)

    def matrix(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return self.rotate(torch.eye(self.n, dtype=dtype))

    def quarot_matrix(self) -> torch.Tensor:
        """R in float64 as QuaRot's ``random_hadamard_matrix`` computes it (``matmul_hadU`` of
        diag(s)): the +-1 product diag(s) (H_K^T (x) H_p), exact, divided by sqrt(n) taken in
        float32 (``torch.tensor(n).sqrt()``), so the residual rotation is bit-identical to
        theirs for the same signs. Cross-head or non-Hadamard rotations: :meth:`matrix`."""
        if not (self.exact and self.right):
            return self.matrix(torch.float64)
        hk = hadamard(self.m).T.contiguous() if self.m > 1 else torch.ones(1, 1, dtype=torch.float64)
        signed = self.s.double().unsqueeze(1) * torch.kron(hk, sylvester_hadamard(self.p))
        return signed / torch.tensor(self.n).sqrt().double()

    def _apply(self, fn, recurse=True):  # buffers follow the device, stay float32
        super()._apply(fn, recurse)
        for k in ("s", "mfac", "hfac"):
            t = getattr(self, k)
            if t is not None and t.dtype != torch.float32:
                setattr(self, k, t.float())
        return self
