"""FlatQuant-style learnable invertible transforms.

A transform T acts on a layer input x (last dim ``n``): T x = K (d * x), with
- d a per-channel diagonal scale (the parameter ``diag_scale`` itself, as FlatQuant's, so weight
  decay acts on the same quantity), SmoothQuant-initialised
  ``d_j = max(max|W_:,j|^(1-a) / max|X_j|^a, 1e-5)`` (a = 0.3), and
- K = P1 (x) P2 a Kronecker product of two small factors with n1 * n2 = n, (n1, n2) the closest
  factor pair (4096 = 64 x 64, 12288 = 96 x 128, 3584 = 56 x 64, 18944 = 128 x 148).
Each factor is P = R0 exp(A - A^T) diag(s) exp(B - B^T)^T (s = ``diag``, init 1, the
parameter itself as FlatQuant's ``linear_diag``), with R0 a fixed random
orthogonal start (identity if ``init='identity'``): an SVD-like parametrisation whose inverse,
exp(B - B^T) diag(1/s) exp(A - A^T)^T R0^T, needs no matrix inversion and is exact up to
the orthogonality of the matrix exponential (the fixed R0,
stored in float32, is inverted exactly). Matrices are built in float32 during calibration and
in float64 for folding, never in half precision.

For a linear y = W x the layer computes W T^{-1} (T x); with the (row-major) identity
(P1 (x) P2) vec(X) = vec(P1 X P2^T) neither T nor T^{-1} is ever materialised at n x n.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def closest_factor_pair(n: int) -> tuple[int, int]:
    """(n1, n2) with n1 * n2 = n, n1 <= n2, n2 - n1 minimal."""
    if n < 1:
        raise ValueError(f"dimension must be positive, got {n}")
    for a in range(int(math.isqrt(n)), 0, -1):
        if n % a == 0:
            return a, n // a
    return 1, n


def tile_shape(n: int) -> tuple[int, int]:
    """(n1, n2) with n1 * n2 = n for the low-bit kernel's 2-D tile of a token when no Kronecker
    factors fix it: n2 the largest power of two dividing n (at most 1024)."""
    n2 = 1
    while n % (n2 * 2) == 0 and n2 * 2 <= 1024:
        n2 *= 2
    return (n // n2, n2) if n2 > 1 else closest_factor_pair(n)


def random_orthogonal(n: int, generator: torch.Generator | None = None,
                      dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Haar-random orthogonal matrix (QR of a Gaussian with the sign fix)."""
    g = torch.randn(n, n, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(g)
    q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
    return q.to(dtype)


# How A X B^T is computed for X of shape [..., n1, n2] (A: n1 x n1, B: n2 x n2). "bmm": the
# left factor as a batched product over all rows (many tiny GEMMs); "mm": both factors as one
# large GEMM each (the left one on the transposed view, at the price of a transposing copy).
# Measured on an H200 (benchmarks/calibration_gpu.py of be0153a): "bmm" is faster for the W4A4 forward
# (1.20x vs 1.30x of bf16 at the LLaDA-8B shape) and no slower in calibration.
KRON_MODE = "bmm"


def kron_apply(xr: torch.Tensor, a: torch.Tensor, bt: torch.Tensor | None) -> torch.Tensor:
    """A @ X @ bt over the last two dimensions of ``xr`` (``bt`` = B^T; None: identity)."""
    if bt is None:
        return torch.matmul(a, xr)
    if KRON_MODE == "bmm":
        return torch.matmul(torch.matmul(a, xr), bt)
    z = torch.matmul(xr, bt)                                   # one GEMM: [rows*n1, n2] @ bt
    return torch.matmul(z.transpose(-1, -2), a.T).transpose(-1, -2)   # one GEMM over n1


def kron_last(x: torch.Tensor, left: torch.Tensor, right_t: torch.Tensor | None, n1: int,
              n2: int) -> torch.Tensor:
    """(left (x) right) applied to the last dimension (n1 * n2) of ``x``; ``right_t`` = right^T."""
    shape = x.shape
    return kron_apply(x.reshape(*shape[:-1], n1, n2), left, right_t).reshape(shape)


def _squarings(norm: float, target: float = 0.5) -> int:
    if not math.isfinite(norm):      # NaN/inf parameters: let the non-finite check report them
        return 0
    return 0 if norm <= target else int(math.ceil(math.log2(norm / target)))


def expm(x: torch.Tensor, squarings: int | None = None, degree: int = 12) -> torch.Tensor:
    """exp(x) of a square matrix by scaling and squaring with a degree-12 Taylor polynomial.

    ``squarings`` s is chosen so that ||x||_1 / 2^s <= 1/2 (truncation error < 1e-13
    relative); pass it in to avoid the host synchronisation of reading the norm (the
    calibration driver reads all factors' norms at once per step, see
    :func:`plan_squarings`). Unlike ``torch.linalg.matrix_exp`` on CUDA it never synchronises
    by itself when ``squarings`` is given, and its backward is plain matrix products."""
    if squarings is None:
        squarings = _squarings(float(x.detach().abs().sum(dim=0).max()) if x.numel() else 0.0)
    y = x / float(2 ** squarings)
    eye = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device)
    p = eye + y / degree
    for j in range(degree - 1, 0, -1):          # Horner: I + y/j (I + y/(j+1) (...))
        p = torch.addmm(eye, y, p, alpha=1.0 / j)
    for _ in range(squarings):
        p = p @ p
    return p


@torch.no_grad()
def squaring_norms(factors: list["InvertibleFactor"]) -> torch.Tensor:
    """[len(factors), 2]: the 1-norms of each factor's two skew matrices, on their device (no
    host synchronisation; hand them to :func:`set_squaring_plans` once read)."""
    return torch.stack([torch.stack([(f.a - f.a.T).abs().sum(dim=0).max(),
                                     (f.b - f.b.T).abs().sum(dim=0).max()]) for f in factors])


def set_squaring_plans(factors: list["InvertibleFactor"], norms: list[list[float]]) -> None:
    """Store the squaring counts for the factors' next constructions from their skew norms."""
    for f, (na, nb) in zip(factors, norms):
        f._plan = (_squarings(na), _squarings(nb))


@torch.no_grad()
def plan_squarings(factors: list["InvertibleFactor"]) -> None:
    """Read the 1-norms of all factors' skew matrices with one host synchronisation and store
    the squaring counts for their next constructions (cleared by
    :meth:`InvertibleFactor.forget_plan`)."""
    if factors:
        set_squaring_plans(factors, squaring_norms(factors).double().cpu().tolist())


class InvertibleFactor(nn.Module):
    """One n x n factor P = R0 U diag(s) V^T with U, V = exp(skew) (:func:`expm`)."""

    def __init__(self, n: int, init: str = "orthogonal", generator: torch.Generator | None = None):
        super().__init__()
        self.n = n
        self.a = nn.Parameter(torch.zeros(n, n))
        self.b = nn.Parameter(torch.zeros(n, n))
        self.diag = nn.Parameter(torch.ones(n))
        if init == "identity":
            r0 = torch.eye(n, dtype=torch.float64)
        elif init == "orthogonal":
            r0 = random_orthogonal(n, generator)
        else:
            raise ValueError(f"unknown factor init {init!r} (identity | orthogonal)")
        self.register_buffer("r0", r0.float())
        self._plan: tuple[int, int] | None = None

    def forget_plan(self) -> None:
        self._plan = None

    def _parts(self, dtype: torch.dtype):
        a = self.a.to(dtype)
        b = self.b.to(dtype)
        sa, sb = self._plan if self._plan is not None else (None, None)
        u = expm(a - a.T, sa)
        v = expm(b - b.T, sb)
        return self.r0.to(dtype), u, self.diag.to(dtype), v

    def matrices(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """(P, P^{-1}) in ``dtype`` (float32 or float64)."""
        if dtype not in (torch.float32, torch.float64):
            raise ValueError("transform matrices are built in float32/float64 only")
        with torch.autocast(self.a.device.type, enabled=False):   # never in half precision
            r0, u, sv, v = self._parts(dtype)
            p = r0 @ u @ torch.diag(sv) @ v.T
            # r0 is stored in float32, so it is orthogonal only to ~1e-7: invert it exactly
            # instead of transposing (a well-conditioned n x n solve, n <= a few hundred). It is
            # fixed, so the inverse is cached (keyed on the buffer's storage and version).
            p_inv = v @ torch.diag(1.0 / sv) @ u.T @ self._r0_inverse(dtype)
        return p, p_inv

    def _r0_inverse(self, dtype: torch.dtype) -> torch.Tensor:
        key = (self.r0.data_ptr(), self.r0._version, self.r0.device, dtype)
        c = getattr(self, "_r0_inv_cache", None)
        if c is None or c[0] != key:
            with torch.no_grad():
                c = (key, torch.linalg.inv(self.r0.to(dtype)))
            self._r0_inv_cache = c
        return c[1]


class AffineTransform(nn.Module):
    """T x = K (d * x), K = P1 (x) P2 (``kron``), d = ``diag_scale`` (``smooth``).

    ``factors``: (n1, n2) instead of the closest factor pair (FlatQuant's o_proj: heads x
    head_dim). ``right_online=False``: the activation side applies P1 only (P1 (x) I), because
    P2 is applied upstream (FlatQuant folds o_proj's head_dim factor into v_proj); the weight
    side W T^{-1} still uses both factors."""

    def __init__(self, dim: int, kron: bool = True, smooth: bool = True,
                 init: str = "orthogonal", generator: torch.Generator | None = None,
                 factors: tuple[int, int] | None = None, right_online: bool = True):
        super().__init__()
        self.dim = dim
        self.n1, self.n2 = closest_factor_pair(dim) if factors is None else factors
        if self.n1 * self.n2 != dim:
            raise ValueError(f"factors {factors} do not multiply to {dim}")
        self.right_online = bool(right_online)
        self.f1 = InvertibleFactor(self.n1, init, generator) if kron else None
        self.f2 = InvertibleFactor(self.n2, init, generator) if kron else None
        self.diag_scale = nn.Parameter(torch.ones(dim)) if smooth else None
        self._folded: dict[str, torch.Tensor] | None = None
        self._folded_cast: dict[torch.dtype, tuple] = {}
        self._step_cache: tuple | None = None
        self.step_cache = False

    @torch.no_grad()
    def init_smooth(self, w_absmax: torch.Tensor, x_absmax: torch.Tensor, alpha: float = 0.3) -> None:
        """SmoothQuant init as FlatQuant's ``get_init_scale``: d = max|W|^(1-a) / max|X|^a per
        input channel, max|X| floored at 1e-5 (its running max starts there), d at 1e-5."""
        if self.diag_scale is None:
            return
        w = w_absmax.double()
        x = x_absmax.double().clamp(min=1e-5)
        d = w.pow(1.0 - alpha) / x.pow(alpha)
        self.diag_scale.copy_(d.clamp(min=1e-5).to(self.diag_scale.dtype))

    def _mats(self, dtype: torch.dtype):
        """(P1, P2, P1^-1, P2^-1, d): folded ones, or built from the parameters.

        With ``step_cache`` on (set by the calibration driver, which calls :meth:`clear_cache`
        before every optimisation step) built matrices are reused until a parameter changes
        (its version counter), the dtype or the grad mode changes: within one step the
        activation side and the weight side W T^{-1} of every linear of the group share one
        construction (and one backward) of the small matrix exponentials. Off (default) they
        are built on every call."""
        if self._folded is not None:
            f = self._folded
            return (f.get("p1"), f.get("p2"), f.get("p1_inv"), f.get("p2_inv"), f.get("d"))
        if not self.step_cache:
            return self._build_mats(dtype)
        key = (dtype, torch.is_grad_enabled(), tuple(p._version for p in self.parameters()),
               tuple(p.data_ptr() for p in self.parameters()))
        c = self._step_cache
        if c is not None and c[0] == key:
            return c[1]
        mats = self._build_mats(dtype)
        self._step_cache = (key, mats)
        return mats

    def clear_cache(self) -> None:
        self._step_cache = None

    def _build_mats(self, dtype: torch.dtype):
        p1 = p2 = p1i = p2i = d = None
        if self.f1 is not None:
            p1, p1i = self.f1.matrices(dtype)
            p2, p2i = self.f2.matrices(dtype)
        if self.diag_scale is not None:
            d = self.diag_scale.to(dtype)
        return p1, p2, p1i, p2i, d

    def forward(self, x: torch.Tensor, mats=None) -> torch.Tensor:
        """T x over the last dimension (``mats``: from :meth:`_mats`, else built here)."""
        p1, p2, _, _, d = mats if mats is not None else self._mats(x.dtype)
        if d is not None:
            x = x * d.to(x.dtype)
        if p1 is not None:
            right = p2.to(x.dtype).T if self.right_online else None
            x = kron_last(x, p1.to(x.dtype), right, self.n1, self.n2)
        return x

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """T^{-1} y over the last dimension."""
        _, _, p1i, p2i, d = self._mats(y.dtype)
        if p1i is not None:
            right = p2i.to(y.dtype).T if self.right_online else None
            y = kron_last(y, p1i.to(y.dtype), right, self.n1, self.n2)
        if d is not None:
            y = y / d.to(y.dtype)
        return y

    def weight_times_inverse(self, w: torch.Tensor, mats=None) -> torch.Tensor:
        """W T^{-1} for W of shape [out, dim], with T^{-1} = diag(1/d) K^{-1}.

        Columns are first divided by d, then every row r becomes r K^{-1} = (K^{-T} r^T)^T with
        K^{-T} = P1^{-T} (x) P2^{-T}, i.e. reshaped row R -> P1^{-T} R P2^{-1}."""
        _, _, p1i, p2i, d = mats if mats is not None else self._mats(w.dtype)
        if d is not None:
            w = w / d.to(w.dtype)
        if p1i is not None:
            w = kron_last(w, p1i.to(w.dtype).T, p2i.to(w.dtype), self.n1, self.n2)
        return w

    @torch.no_grad()
    def fold(self, dtype: torch.dtype = torch.float32) -> None:
        """Precompute the matrices (in float64, stored as ``dtype``); later calls reuse them."""
        self._folded = None
        self._folded_cast = {}
        self._step_cache = None
        p1, p2, p1i, p2i, d = self._build_mats(torch.float64)
        self._folded = {k: v.to(dtype) for k, v in
                        dict(p1=p1, p2=p2, p1_inv=p1i, p2_inv=p2i, d=d).items() if v is not None}

    def folded_mats(self, dtype: torch.dtype):
        """(d, P1, P2^T) of the folded transform in ``dtype`` (inference in the model dtype),
        converted once and cached; None entries for absent parts."""
        if self._folded is None:
            raise RuntimeError("folded_mats() needs fold() first")
        c = self._folded_cast.get(dtype)
        if c is None:
            f = self._folded
            conv = (lambda k: None if k not in f else f[k].to(dtype))
            p2 = conv("p2")
            c = self._folded_cast[dtype] = (conv("d"), conv("p1"),
                                            None if p2 is None else p2.T.contiguous())
        return c

    def unfold(self) -> None:
        self._folded = None
        self._folded_cast = {}

    def _apply(self, fn, recurse=True):
        # Folded matrices follow the module's device but keep their own (float32/64) dtype, so a
        # model-wide ``.to(bfloat16)`` never turns them into half precision.
        super()._apply(fn, recurse)
        self._step_cache = None
        self._folded_cast = {}
        if self._folded is not None:
            dev = fn(torch.empty(0)).device
            self._folded = {k: v.to(dev) for k, v in self._folded.items()}
        return self
