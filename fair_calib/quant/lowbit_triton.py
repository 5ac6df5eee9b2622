"""CUDA kernels of the low-bit backend (:mod:`lowbit`); imported only on CUDA, needs Triton.

- :func:`quantize_input`: one fused Triton kernel per input group and call. Each program takes
  one token's row viewed as [n1, n2]: for a fused SwiGLU down_proj the product SiLU(gate) * up
  (:func:`lowbit.fuse_block_gated`; the kernel reads gate's and up's outputs), the group's
  RMSNorm where it is fused (:func:`lowbit.fuse_block_norms`; the input is then the norm's
  input), d (bf16 product, as the fake quant), P1 X P2^T on the tensor cores (bf16 operands,
  float32 accumulation, each product rounded to the model dtype as ``kron_last`` rounds it),
  the token's max/min once, then for every reader the codes (FP8 e4m3 or int8) and the
  float32 scale. Divisions are IEEE (``div_rn``) and rounding is half-to-even (``rint``), as
  torch's, so the codes are those of :meth:`LowBitInput.scales_and_codes` on the same
  transformed values; for groups with learned clip ratios the codes come from the reciprocal
  with the division only where a half-integer is near (:func:`_codes`, the same codes). Two
  factors of which one is wider than 64 (LLaDA's 96 x 128, Dream's 128 x 148 and 148 x 128)
  take :func:`_act_quant_split_kernel`, each side of the tile split into two power-of-two
  pieces (148 = 128 + 32) rather than padded to one (256), the product formed a chunk of rows
  at a time through a scratch row or, for one row chunk, held in registers; settings per tile
  shape (``SPLIT_TUNED``): Dream's and LLaDA's tiles form their SwiGLU product inside the
  kernel and keep the token in registers (LLaDA's capped at 128 registers a thread), other
  shapes take it from the one-pass :func:`silu_mul`. A factor wider than 256 (QuaRot's 1024-wide
  Hadamard on LLaDA's down_proj input) is applied by cuBLAS first (``kron_last``, the fake
  quant's own operations) and the kernel quantizes. Timings of each choice:
  ``docs/benchmarks.md``.
- :func:`gemm`: int8 codes x int8 codes in :mod:`lowbit_gemm` (the default), or on cuBLAS
  (``FAIR_CALIB_LOWBIT_GEMM=cublas``): FP8 codes x FP8 codes (``torch._scaled_mm``, float32
  accumulation, per-token x per-channel scales and the bias in the epilogue, bf16 out), or
  int8 x int8 (``torch._int_mm``, int32 accumulation, scales applied after). 4-bit packed
  weights are unpacked to the operand dtype by :func:`unpack_int4` before the product.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from . import lowbit_gemm
from .transforms import kron_last, tile_shape

MAX_TILE = 128 * 128       # elements of one token's tile when the kernel applies the factors
MAX_FACTOR = 128
NUM_WARPS: int | None = None   # override of the activation kernel's warps (benchmark sweeps)
# programs per multiprocessor of the activation kernel (each loops over tokens); None: one
# program per token
PROGRAMS_PER_SM: int | None = None
# factors wider than one tile (up to WIDE_MAX): the split kernel instead of cuBLAS products
# before the quantizing kernel
WIDE = True
WIDE_MAX = 256
# two factors of which one is wider than this also take the chunked kernel: measured on an
# H100 at 4096 tokens, LLaDA's 96 x 128 down_proj input 193 us chunked vs 343 us in one tile
WIDE_ABOVE = 64
# the one-tile kernel forms a SwiGLU product itself up to this many tile elements; larger
# tiles (RTN's down_proj: 18944 as 74 x 256) take the one-pass product kernel first
GATED_TILE_MAX = 4096
SPLIT_BR = 64          # rows of the product per chunk in the split kernel
SPLIT_WARPS = 4
SPLIT_UNROLL = True    # the split kernel's loops over chunks unrolled (else run-time loops)
# per tile shape (n1, n2): settings that beat the defaults in the (retired) lowbit_gpu.py and
# split_kernel_gpu.py sweeps (H100, SwiGLU product included, docs/benchmarks.md): Dream's
# down_proj 481 us at 4096 tokens against 647 at the defaults, and the fastest of 8 settings
# at 408 and 856; LLaDA's capped at 128 registers a thread (two programs a multiprocessor)
# 0.79-0.87x the uncapped unrolled setting at 408-4096 tokens, the same codes
SPLIT_TUNED: dict[tuple[int, int], dict] = {
    (128, 148): {"SPLIT_BR": 128, "SPLIT_WARPS": 8, "SPLIT_UNROLL": False, "SPLIT_REGS": True,
                 "SPLIT_GATED": True},
    (96, 128): {"SPLIT_BR": 128, "SPLIT_WARPS": 8, "SPLIT_UNROLL": False, "SPLIT_REGS": True,
                "SPLIT_GATED": True, "SPLIT_MAXNREG": 128},
}
# the split kernel keeps the transformed token in registers (one row chunk covering the tile,
# at most 4 column chunks) instead of a scratch row read back after the max/min
SPLIT_REGS = False
# the split kernel forms a SwiGLU product itself (else the one-pass product kernel first)
SPLIT_GATED = False
# codes as rint(z * (1/s)), the exact division only for pieces where a half-integer is near
# (:func:`_codes`): the same codes as rint(z / s), fewer instructions; for groups whose clip
# ratios are not 1 (:func:`_fast_codes`)
FAST_DIV = True
# register cap a thread (Triton's ``maxnreg``) of the split kernel and of the one-tile kernel,
# for sweeps; None: the compiler's choice (Nsight Compute, Triton 3.6: one-tile 116-172
# registers, split 234 in its registers form; a one-tile cap of 128 measured within the
# spread: docs/benchmarks.md)
SPLIT_MAXNREG: int | None = None
TILE_MAXNREG: int | None = None
# columns of the right product per chunk. Seen on an H100 and an H200 (Triton 3.6): chunks of
# 32 columns (and a 32-column piece) gave wrong products and illegal memory accesses
SPLIT_BC = 64
_SMS: dict[int, int] = {}


def _grid(T: int, device: torch.device) -> int:
    if PROGRAMS_PER_SM is None:
        return T
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return max(1, min(T, _SMS[idx] * PROGRAMS_PER_SM))


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


@triton.jit
def _rms_norm(x, nw, eps, n):
    """The token's RMSNorm as :func:`lowbit.rms_norm` computes it: float32 mean of squares
    (padding is zero), IEEE division and rsqrt, the product rounded to x's dtype, then times
    the weight (float32 product of two bf16 values, exact, rounded once)."""
    dt = x.dtype
    xf = x.to(tl.float32)
    ss = tl.sum(tl.sum(xf * xf, axis=1), axis=0)
    r = libdevice.rsqrt(libdevice.div_rn(ss, n * 1.0) + eps)
    x = (xf * r).to(dt)
    return (nw * x.to(tl.float32)).to(dt)


@triton.jit
def _reader_scale(k, hi, lo, rmax_ptr, rmin_ptr, floor_ptr, static_ptr, qmax_f,
                  STATIC: tl.constexpr):
    """Reader k's scale for a token of max ``hi`` >= 0 and -min ``lo`` >= 0: its static scale,
    or max(lo r_min, hi r_max) / qmax floored (1 where the token is all zero), as
    :meth:`lowbit.LowBitInput.scales_and_codes` computes it."""
    if STATIC:
        s = tl.load(static_ptr + k)
    else:
        m = tl.maximum(lo * tl.load(rmin_ptr + k), hi * tl.load(rmax_ptr + k))
        s = tl.maximum(libdevice.div_rn(m, qmax_f), tl.load(floor_ptr + k))
        s = tl.where(m == 0.0, 1.0, s)
    return s


@triton.jit
def _token_extremes(hi_t, lo_t):
    """(hi, lo) of a token for :func:`_reader_scale`: max(max of hi_t, 0) and -min(min of
    lo_t, 0) over a 2-D tile, as float32 (zero counts, as the tile's padding does)."""
    hi = tl.max(tl.max(hi_t, axis=1), axis=0).to(tl.float32)
    lo = tl.min(tl.min(lo_t, axis=1), axis=0).to(tl.float32)
    return tl.maximum(hi, 0.0), -tl.minimum(lo, 0.0)


@triton.jit
def _codes(zf, s, QMAX: tl.constexpr, FAST: tl.constexpr):
    """clamp(rint(zf / s)) with zf / s rounded as IEEE division rounds it (torch's division).
    FAST: q = zf * r (r = 1/s rounded) is within 1.5 ulp of zf / s, so within 2 ulp of the
    rounded quotient; where no element's q lies within 2^-20 |q| of a half-integer (8 ulp,
    NaN and inf included by the negated test) both round to the same integer, and only a
    piece with such an element pays for the division."""
    if FAST:
        q = zf * libdevice.div_rn(1.0, s)
        h = tl.floor(q) + 0.5
        risky = (tl.abs(q - h) > tl.abs(q) * 9.5367431640625e-07) == 0
        if tl.max(risky.to(tl.int32), axis=None) > 0:
            q = libdevice.div_rn(zf, s)
        q = libdevice.rint(q)
    else:
        q = libdevice.rint(libdevice.div_rn(zf, s))
    return tl.minimum(tl.maximum(q, -QMAX - 1.0), QMAX * 1.0)


@triton.jit
def _pad_row(codes_ptr, scales_ptr, row, off, mask, N: tl.constexpr, B1: tl.constexpr,
             B2: tl.constexpr):
    """A padding row of the GEMM's operand (no input token): codes 0 and scale 1, finite, so
    the GEMM's rows for it are finite too (and discarded)."""
    tl.store(scales_ptr + row, 1.0)
    zero = tl.zeros([B1, B2], dtype=tl.float32).to(codes_ptr.dtype.element_ty)
    tl.store(codes_ptr + row * N + off, zero, mask=mask)


@triton.jit
def _pad_row_chunked(codes_ptr, scales_ptr, row, N: tl.constexpr, CH: tl.constexpr,
                     NCH: tl.constexpr):
    """:func:`_pad_row` for a row written in NCH chunks of CH."""
    tl.store(scales_ptr + row, 1.0)
    for ch in tl.static_range(NCH):
        o = ch * CH + tl.arange(0, CH)
        zero = tl.zeros([CH], dtype=tl.float32).to(codes_ptr.dtype.element_ty)
        tl.store(codes_ptr + row * N + o, zero, mask=o < N)


@triton.jit
def _act_quant_kernel(x_ptr, u_ptr, nw_ptr, d_ptr, p1_ptr, p2t_ptr, rmax_ptr, rmin_ptr, floor_ptr,
                      static_ptr, codes_ptr, scales_ptr, T, T_IN, qmax_f, eps,
                      N1: tl.constexpr, N2: tl.constexpr, B1: tl.constexpr, B2: tl.constexpr,
                      GATED: tl.constexpr, HAS_NORM: tl.constexpr, HAS_D: tl.constexpr,
                      HAS_P1: tl.constexpr, HAS_P2: tl.constexpr,
                      K: tl.constexpr, QMAX: tl.constexpr, STATIC: tl.constexpr,
                      FP32: tl.constexpr, FAST: tl.constexpr):
    # programs loop over tokens (pid, pid + grid, ...): the factors are read once per program
    i = tl.arange(0, B1)[:, None]
    j = tl.arange(0, B2)[None, :]
    mask = (i < N1) & (j < N2)
    off = i * N2 + j
    if HAS_NORM:
        nw = tl.load(nw_ptr + off, mask=mask, other=0.0).to(tl.float32)
    if HAS_D:
        d = tl.load(d_ptr + off, mask=mask, other=0.0).to(tl.float32)
    if HAS_P1:
        a = tl.arange(0, B1)
        p1 = tl.load(p1_ptr + a[:, None] * N1 + a[None, :],
                     mask=(a[:, None] < N1) & (a[None, :] < N1), other=0.0)
    if HAS_P2:
        b = tl.arange(0, B2)
        p2 = tl.load(p2t_ptr + b[:, None] * N2 + b[None, :],
                     mask=(b[:, None] < N2) & (b[None, :] < N2), other=0.0)
    # T rows of codes, the input's T_IN and padding rows after them (:func:`gemm_rows`)
    for tt in range(tl.program_id(0), T, tl.num_programs(0)):
        t = tl.cast(tt, tl.int64)
        if t >= T_IN:
            for k in tl.static_range(K):
                _pad_row(codes_ptr, scales_ptr, k * T + t, off, mask, N1 * N2, B1, B2)
        else:
            x = tl.load(x_ptr + t * (N1 * N2) + off, mask=mask, other=0.0)
            if GATED:
                x = _silu_mul(x, tl.load(u_ptr + t * (N1 * N2) + off, mask=mask, other=0.0))
            dt = x.dtype
            if HAS_NORM:
                x = _rms_norm(x, nw, eps, N1 * N2)
            if HAS_D:
                x = (x.to(tl.float32) * d).to(dt)
            if HAS_P1:
                if FP32:
                    x = tl.dot(p1, x, input_precision="ieee").to(dt)
                else:
                    x = tl.dot(p1, x).to(dt)
                if HAS_P2:
                    if FP32:
                        x = tl.dot(x, p2, input_precision="ieee").to(dt)
                    else:
                        x = tl.dot(x, p2).to(dt)
            xf = x.to(tl.float32)
            hi, lo = _token_extremes(xf, xf)
            for k in tl.static_range(K):
                s = _reader_scale(k, hi, lo, rmax_ptr, rmin_ptr, floor_ptr, static_ptr, qmax_f,
                                  STATIC)
                q = _codes(xf, s, QMAX, FAST)
                row = k * T + t
                tl.store(codes_ptr + row * (N1 * N2) + off, q.to(codes_ptr.dtype.element_ty),
                         mask=mask)
                tl.store(scales_ptr + row, s)


@triton.jit
def _piece(ptr, r0, RP: tl.constexpr, c0, CP: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr):
    """Rows r0..r0+RP x columns c0..c0+CP of a row-major [N1, N2] tile (zero outside)."""
    r = r0 + tl.arange(0, RP)[:, None]
    c = c0 + tl.arange(0, CP)[None, :]
    return tl.load(ptr + r * N2 + c, mask=(r < N1) & (c < N2), other=0.0)


@triton.jit
def _silu_mul(g, u):
    """:func:`lowbit.silu_mul` as torch computes it on CUDA: SiLU in float32 (IEEE division,
    the accurate exp) rounded to g's dtype, then the product (exact in float32 for two bf16
    values) rounded once. Zero padding stays zero."""
    dt = g.dtype
    gf = g.to(tl.float32)
    # a zero numerator sends IEEE division down its slow path (a tile's zero padding made
    # whole warps take it); SiLU(+-0) = +-0 / 2 = +-0 is taken directly
    zero = gf == 0.0
    gs = tl.where(zero, 1.0, gf)
    a = tl.where(zero, gf, libdevice.div_rn(gs, 1.0 + libdevice.exp(-gs))).to(dt)
    return (a.to(tl.float32) * u.to(tl.float32)).to(dt)


@triton.jit
def _sumsq(x):
    xf = x.to(tl.float32)
    return tl.sum(tl.sum(xf * xf, axis=1), axis=0)


@triton.jit
def _prep(x, nw_ptr, d_ptr, rinv, r0, RP: tl.constexpr, c0, CP: tl.constexpr,
          N1: tl.constexpr, N2: tl.constexpr, HAS_NORM: tl.constexpr, HAS_D: tl.constexpr):
    """One piece of the token: the norm (:func:`_rms_norm`'s steps, the token's 1/rms given),
    then the diagonal, each product rounded to x's dtype."""
    dt = x.dtype
    if HAS_NORM:
        nw = _piece(nw_ptr, r0, RP, c0, CP, N1, N2).to(tl.float32)
        x = (x.to(tl.float32) * rinv).to(dt)
        x = (nw * x.to(tl.float32)).to(dt)
    if HAS_D:
        d = _piece(d_ptr, r0, RP, c0, CP, N1, N2).to(tl.float32)
        x = (x.to(tl.float32) * d).to(dt)
    return x


@triton.jit
def _token_rinv(xr, eps, RA: tl.constexpr, RB: tl.constexpr, SR: tl.constexpr, CA: tl.constexpr,
                CB: tl.constexpr, SC: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr):
    """1 / rms of the token (:func:`_rms_norm`'s arithmetic), summed over its pieces."""
    ss = _sumsq(_piece(xr, 0, RA, 0, CA, N1, N2))
    if SC:
        ss += _sumsq(_piece(xr, 0, RA, CA, CB, N1, N2))
    if SR:
        ss += _sumsq(_piece(xr, RA, RB, 0, CA, N1, N2))
        if SC:
            ss += _sumsq(_piece(xr, RA, RB, CA, CB, N1, N2))
    return libdevice.rsqrt(libdevice.div_rn(ss, N1 * N2 * 1.0) + eps)


@triton.jit
def _x_piece(xr, ur, nw_ptr, d_ptr, rinv, r0, RP: tl.constexpr, c0, CP: tl.constexpr,
             N1: tl.constexpr, N2: tl.constexpr, GATED: tl.constexpr, HAS_NORM: tl.constexpr,
             HAS_D: tl.constexpr):
    x = _piece(xr, r0, RP, c0, CP, N1, N2)
    if GATED:
        x = _silu_mul(x, _piece(ur, r0, RP, c0, CP, N1, N2))
    return _prep(x, nw_ptr, d_ptr, rinv, r0, RP, c0, CP, N1, N2, HAS_NORM, HAS_D)


@triton.jit
def _x_pieces(xr, ur, nw_ptr, d_ptr, rinv, RA: tl.constexpr, RB: tl.constexpr, SR: tl.constexpr,
              CA: tl.constexpr, CB: tl.constexpr, SC: tl.constexpr, N1: tl.constexpr,
              N2: tl.constexpr, GATED: tl.constexpr, HAS_NORM: tl.constexpr,
              HAS_D: tl.constexpr):
    """The token's four pieces (rows RA | RB x columns CA | CB), the SwiGLU product formed
    (GATED: x is the gate, u up), normalized and scaled by the diagonal; an absent piece
    (SR / SC false) is returned as the first, unused."""
    xaa = _x_piece(xr, ur, nw_ptr, d_ptr, rinv, 0, RA, 0, CA, N1, N2, GATED, HAS_NORM, HAS_D)
    xab = xaa
    xba = xaa
    xbb = xaa
    if SC:
        xab = _x_piece(xr, ur, nw_ptr, d_ptr, rinv, 0, RA, CA, CB, N1, N2, GATED, HAS_NORM,
                       HAS_D)
    if SR:
        xba = _x_piece(xr, ur, nw_ptr, d_ptr, rinv, RA, RB, 0, CA, N1, N2, GATED, HAS_NORM,
                       HAS_D)
        if SC:
            xbb = _x_piece(xr, ur, nw_ptr, d_ptr, rinv, RA, RB, CA, CB, N1, N2, GATED,
                           HAS_NORM, HAS_D)
    return xaa, xab, xba, xbb


@triton.jit
def _left_product(r, xaa, xab, xba, xbb, p1_ptr, RA: tl.constexpr, RB: tl.constexpr,
                  SR: tl.constexpr, SC: tl.constexpr, BR: tl.constexpr, N1: tl.constexpr):
    """Rows r * BR .. of P1 X as its column pieces (ya [BR, CA], yb [BR, CB]; yb = ya where
    SC is false), the row pieces' float32 partial sums added, rounded to the model dtype."""
    dt = xaa.dtype
    ka = tl.arange(0, RA)
    kb = RA + tl.arange(0, RB)
    rr = r * BR + tl.arange(0, BR)
    p1a = tl.load(p1_ptr + rr[:, None] * N1 + ka[None, :],
                  mask=(rr[:, None] < N1) & (ka[None, :] < N1), other=0.0)
    ya = tl.dot(p1a, xaa)                                     # [BR, CA] float32
    if SC:
        yb = tl.dot(p1a, xab)                                 # [BR, CB]
    if SR:
        p1b = tl.load(p1_ptr + rr[:, None] * N1 + kb[None, :],
                      mask=(rr[:, None] < N1) & (kb[None, :] < N1), other=0.0)
        ya = tl.dot(p1b, xba, ya)
        if SC:
            yb = tl.dot(p1b, xbb, yb)
    ya = ya.to(dt)
    if SC:
        yb = yb.to(dt)
    else:
        yb = ya                       # unused (SC false): keeps the helpers' signatures
    return ya, yb


@triton.jit
def _row_chunk(r, xaa, xab, xba, xbb, p1_ptr, p2t_ptr, zrow, hi, lo, RA: tl.constexpr,
               RB: tl.constexpr, SR: tl.constexpr, CA: tl.constexpr, CB: tl.constexpr,
               SC: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, N1: tl.constexpr,
               N2: tl.constexpr, HAS_P2: tl.constexpr, UNROLL: tl.constexpr):
    """Rows r * BR .. of Z = P1 X P2^T into the scratch row; the running max and min."""
    ya, yb = _left_product(r, xaa, xab, xba, xbb, p1_ptr, RA, RB, SR, SC, BR, N1)
    rr = r * BR + tl.arange(0, BR)
    if HAS_P2:
        if UNROLL:
            for c in tl.static_range((N2 + BC - 1) // BC):
                z = _right_product(ya, yb, p2t_ptr, c * BC, BC, CA, CB, SC, N2)
                hi, lo = _store_tracking(zrow, z, rr, c * BC, BC, N1, N2, hi, lo)
        else:
            for c in tl.range(0, (N2 + BC - 1) // BC, num_stages=1):
                z = _right_product(ya, yb, p2t_ptr, c * BC, BC, CA, CB, SC, N2)
                hi, lo = _store_tracking(zrow, z, rr, c * BC, BC, N1, N2, hi, lo)
    else:
        hi, lo = _store_tracking(zrow, ya, rr, 0, CA, N1, N2, hi, lo)
        if SC:
            hi, lo = _store_tracking(zrow, yb, rr, CA, CB, N1, N2, hi, lo)
    return hi, lo


@triton.jit
def _store_codes(z, s, crow, c0, CP: tl.constexpr, BR: tl.constexpr, N1: tl.constexpr,
                 N2: tl.constexpr, QMAX: tl.constexpr, FAST: tl.constexpr):
    """A [BR, CP] piece of the transformed token (columns c0..) quantized into its codes row."""
    rr = tl.arange(0, BR)
    cc = c0 + tl.arange(0, CP)
    q = _codes(z.to(tl.float32), s, QMAX, FAST)
    tl.store(crow + rr[:, None] * N2 + cc[None, :], q.to(crow.dtype.element_ty),
             mask=(rr[:, None] < N1) & (cc[None, :] < N2))


@triton.jit
def _token_in_registers(xaa, xab, xba, xbb, p1_ptr, p2t_ptr, rmax_ptr, rmin_ptr, floor_ptr,
                        static_ptr, codes_ptr, scales_ptr, t, T, qmax_f, RA: tl.constexpr,
                        RB: tl.constexpr, SR: tl.constexpr, CA: tl.constexpr,
                        CB: tl.constexpr, SC: tl.constexpr, BR: tl.constexpr,
                        BC: tl.constexpr, NCC: tl.constexpr, N1: tl.constexpr,
                        N2: tl.constexpr, K: tl.constexpr, QMAX: tl.constexpr,
                        STATIC: tl.constexpr, FAST: tl.constexpr):
    """The whole of Z = P1 X P2^T held as up to four [BR, BC] column chunks (BR covers the
    rows), the max/min taken over them, then each reader's codes written from them: no
    scratch row."""
    ya, yb = _left_product(0, xaa, xab, xba, xbb, p1_ptr, RA, RB, SR, SC, BR, N1)
    z0 = _right_product(ya, yb, p2t_ptr, 0, BC, CA, CB, SC, N2)
    hi_t = z0                          # elementwise over the chunks, then one reduction
    lo_t = z0
    z1 = z0
    z2 = z0
    z3 = z0
    if NCC > 1:
        z1 = _right_product(ya, yb, p2t_ptr, BC, BC, CA, CB, SC, N2)
        hi_t = tl.maximum(hi_t, z1)
        lo_t = tl.minimum(lo_t, z1)
    if NCC > 2:
        z2 = _right_product(ya, yb, p2t_ptr, 2 * BC, BC, CA, CB, SC, N2)
        hi_t = tl.maximum(hi_t, z2)
        lo_t = tl.minimum(lo_t, z2)
    if NCC > 3:
        z3 = _right_product(ya, yb, p2t_ptr, 3 * BC, BC, CA, CB, SC, N2)
        hi_t = tl.maximum(hi_t, z3)
        lo_t = tl.minimum(lo_t, z3)
    hi, lo = _token_extremes(hi_t, lo_t)
    for k in tl.static_range(K):
        s = _reader_scale(k, hi, lo, rmax_ptr, rmin_ptr, floor_ptr, static_ptr, qmax_f, STATIC)
        tl.store(scales_ptr + k * T + t, s)
        crow = codes_ptr + (k * T + t) * (N1 * N2)
        _store_codes(z0, s, crow, 0, BC, BR, N1, N2, QMAX, FAST)
        if NCC > 1:
            _store_codes(z1, s, crow, BC, BC, BR, N1, N2, QMAX, FAST)
        if NCC > 2:
            _store_codes(z2, s, crow, 2 * BC, BC, BR, N1, N2, QMAX, FAST)
        if NCC > 3:
            _store_codes(z3, s, crow, 3 * BC, BC, BR, N1, N2, QMAX, FAST)


@triton.jit
def _right_product(ya, yb, p2t_ptr, c0, CP: tl.constexpr, CA: tl.constexpr, CB: tl.constexpr,
                   SC: tl.constexpr, N2: tl.constexpr):
    """Columns c0..c0+CP of [ya | yb] P2^T (the row pieces' partial sums added in float32),
    rounded to the model dtype."""
    cc = c0 + tl.arange(0, CP)
    ka = tl.arange(0, CA)
    p2a = tl.load(p2t_ptr + ka[:, None] * N2 + cc[None, :],
                  mask=(ka[:, None] < N2) & (cc[None, :] < N2), other=0.0)
    z = tl.dot(ya, p2a)
    if SC:
        kb = CA + tl.arange(0, CB)
        p2b = tl.load(p2t_ptr + kb[:, None] * N2 + cc[None, :],
                      mask=(kb[:, None] < N2) & (cc[None, :] < N2), other=0.0)
        z = tl.dot(yb, p2b, z)
    return z.to(ya.dtype)


@triton.jit
def _store_tracking(zrow, z, rr, c0, CP: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr,
                    hi, lo):
    """Write a [rows, CP] piece of the transformed token to its scratch row; the token's
    running max and min with it."""
    cc = c0 + tl.arange(0, CP)
    tl.store(zrow + rr[:, None] * N2 + cc[None, :], z,
             mask=(rr[:, None] < N1) & (cc[None, :] < N2))
    zf = z.to(tl.float32)
    hi = tl.maximum(hi, tl.max(tl.max(zf, axis=1), axis=0))
    lo = tl.minimum(lo, tl.min(tl.min(zf, axis=1), axis=0))
    return hi, lo


@triton.jit
def _act_quant_split_kernel(x_ptr, u_ptr, nw_ptr, d_ptr, p1_ptr, p2t_ptr, rmax_ptr, rmin_ptr,
                            floor_ptr, static_ptr, z_ptr, codes_ptr, scales_ptr, T, T_IN, qmax_f,
                            eps,
                            N1: tl.constexpr, N2: tl.constexpr, RA: tl.constexpr,
                            RB: tl.constexpr, SR: tl.constexpr, CA: tl.constexpr,
                            CB: tl.constexpr, SC: tl.constexpr, BR: tl.constexpr,
                            BC: tl.constexpr, UNROLL: tl.constexpr, REGS: tl.constexpr,
                            NCC: tl.constexpr, GATED: tl.constexpr,
                            HAS_NORM: tl.constexpr, HAS_D: tl.constexpr,
                            HAS_P2: tl.constexpr, K: tl.constexpr, QMAX: tl.constexpr,
                            STATIC: tl.constexpr, FAST: tl.constexpr, CH: tl.constexpr,
                            NCH: tl.constexpr):
    """Factors wider than one tile: each side of the token's [N1, N2] tile split in two
    power-of-two pieces (RA + RB rows, CA + CB columns; SR / SC: whether there is a second
    piece; Dream's 148 is 128 + 32) rather than padded to one, Z = P1 X P2^T formed BR rows at
    a time (its columns in chunks of BC), each product rounded to the model dtype as the whole
    products are. The contractions add the pieces' float32 partial sums before rounding
    (another summation order, as cuBLAS has its own). REGS (one row chunk, NCC <= 4 column
    chunks): Z stays in registers (:func:`_token_in_registers`); else it is written to a
    scratch row ``z`` while the token's max/min accumulate, then quantized from it. UNROLL:
    the loops over chunks unrolled, else run-time loops. GATED: the SwiGLU product formed
    here from gate (x) and up (u); else it reaches this kernel formed by :func:`silu_mul`.
    Settings per tile shape: ``SPLIT_TUNED``; timings: docs/benchmarks.md."""
    t = tl.program_id(0).to(tl.int64)
    if t >= T_IN:          # a padding row (:func:`gemm_rows`): no input token
        for k in tl.static_range(K):
            _pad_row_chunked(codes_ptr, scales_ptr, k * T + t, N1 * N2, CH, NCH)
    else:
        xr = x_ptr + t * (N1 * N2)
        ur = u_ptr + t * (N1 * N2)
        zrow = z_ptr + t * (N1 * N2)
        if HAS_NORM:
            rinv = _token_rinv(xr, eps, RA, RB, SR, CA, CB, SC, N1, N2)
        else:
            rinv = 1.0
        xaa, xab, xba, xbb = _x_pieces(xr, ur, nw_ptr, d_ptr, rinv, RA, RB, SR, CA, CB, SC, N1,
                                       N2, GATED, HAS_NORM, HAS_D)
        if REGS:
            _token_in_registers(xaa, xab, xba, xbb, p1_ptr, p2t_ptr, rmax_ptr, rmin_ptr, floor_ptr,
                                static_ptr, codes_ptr, scales_ptr, t, T, qmax_f, RA, RB, SR, CA,
                                CB, SC, BR, BC, NCC, N1, N2, K, QMAX, STATIC, FAST)
        else:
            hi = tl.zeros([], dtype=tl.float32)
            lo = tl.zeros([], dtype=tl.float32)
            if UNROLL:
                for r in tl.static_range((N1 + BR - 1) // BR):
                    hi, lo = _row_chunk(r, xaa, xab, xba, xbb, p1_ptr, p2t_ptr, zrow, hi, lo, RA,
                                        RB, SR, CA, CB, SC, BR, BC, N1, N2, HAS_P2, UNROLL)
            else:
                for r in tl.range(0, (N1 + BR - 1) // BR, num_stages=1):
                    hi, lo = _row_chunk(r, xaa, xab, xba, xbb, p1_ptr, p2t_ptr, zrow, hi, lo, RA,
                                        RB, SR, CA, CB, SC, BR, BC, N1, N2, HAS_P2, UNROLL)
            tl.debug_barrier()                 # the scratch row is read back by other threads
            lo = -lo
            for k in tl.static_range(K):
                s = _reader_scale(k, hi, lo, rmax_ptr, rmin_ptr, floor_ptr, static_ptr, qmax_f,
                                  STATIC)
                tl.store(scales_ptr + k * T + t, s)
                for ch in tl.static_range(NCH):
                    o = ch * CH + tl.arange(0, CH)
                    zf = tl.load(zrow + o, mask=o < N1 * N2, other=0.0).to(tl.float32)
                    q = _codes(zf, s, QMAX, FAST)
                    tl.store(codes_ptr + (k * T + t) * (N1 * N2) + o,
                             q.to(codes_ptr.dtype.element_ty), mask=o < N1 * N2)


def quantize_input(inp, x2: torch.Tensor, up: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [K, R, dim], scales [K, R]) of a :class:`lowbit.LowBitInput` for x2 [T, dim],
    or with ``up`` [T, dim] for :func:`lowbit.silu_mul` (x2, up) formed in the kernel; R =
    :func:`gemm_rows` (T) >= T, the rows after T padding (codes 0, scale 1)."""
    x2 = x2.contiguous()
    up = None if up is None else up.contiguous()
    T, dim = x2.shape
    nw, eps = _fused_norm(inp, x2)
    if inp.norm is not None and nw is None:     # a norm the kernel does not take: torch first
        x2, up = inp.apply_norm(x2 if up is None else silu_mul(x2, up)), None
    # the kernels index the factors row-major
    d, p1, p2t = (None if v is None else v.contiguous() for v in (inp.d, inp.p1, inp.p2t))
    n1, n2 = inp.n1, inp.n2
    big = p1 is not None and (_pow2(n1) > MAX_FACTOR or (p2t is not None and _pow2(n2) > MAX_FACTOR)
                              or _pow2(n1) * _pow2(n2) > MAX_TILE
                              or (p2t is not None and max(_pow2(n1), _pow2(n2)) > WIDE_ABOVE))
    if big and WIDE and _pow2(n1) <= WIDE_MAX and (p2t is None or _pow2(n2) <= WIDE_MAX) \
            and x2.dtype != torch.float32:
        return _quantize_split(inp, x2, up, nw, eps, d, p1, p2t, n1, n2)
    if big:                                     # factors beyond one tile: cuBLAS first
        x2 = silu_mul(x2, up) if up is not None else x2
        if nw is not None:
            x2 = inp.apply_norm(x2)
        x2 = (x2 * d.to(x2.dtype)) if d is not None else x2
        x2 = kron_last(x2, p1.to(x2.dtype), None if p2t is None else p2t.to(x2.dtype), n1, n2)
        up = nw = d = p1 = p2t = None
    if p1 is None:
        n1, n2 = tile_shape(dim)
    rows = gemm_rows(T)
    codes, scales = _outputs(inp, rows, dim, x2.device)
    if T == 0:
        return codes, scales
    B1 = triton.next_power_of_2(n1) if p1 is None else _pow2(n1)
    B2 = triton.next_power_of_2(n2) if p1 is None else _pow2(n2)
    if up is not None and B1 * B2 > GATED_TILE_MAX:
        x2, up = silu_mul(x2, up), None
    ops = (x2, *_operands(inp, x2, up, nw, d, p1, p2t, scales), codes, scales, rows, T,
           float(2 ** (inp.bits - 1) - 1), eps)
    flags = dict(N1=n1, N2=n2, B1=B1, B2=B2, GATED=up is not None, HAS_NORM=nw is not None,
                 HAS_D=d is not None, HAS_P1=p1 is not None, HAS_P2=p2t is not None,
                 K=inp.n_readers, QMAX=2 ** (inp.bits - 1) - 1, STATIC=inp.static,
                 FP32=x2.dtype == torch.float32, FAST=_fast_codes(inp, FAST_DIV))
    warps = NUM_WARPS or (4 if B1 * B2 <= 4096 else 8)
    _act_quant_kernel[(_grid(rows, x2.device),)](
        *ops, **flags, num_warps=warps, **_cap(TILE_MAXNREG))
    return codes, scales


# rows of the FP8 GEMM's activation operand: cuBLASLt's row-wise scaled FP8 GEMM
# (``torch._scaled_mm``, torch 2.11 + CUDA 13 on an H100) refuses a token count that is not
# a multiple of 4 (CUBLAS_STATUS_NOT_SUPPORTED), so the codes are written for a multiple of
# 16 rows, the padding rows zero codes with scale 1, and the GEMM's rows for them dropped.
# Every row's integer dot product is exact (float32 sums of integer products below 2^24), so
# a padded row cannot change another row's result, whichever algorithm the GEMM picks. The
# Triton GEMM (:mod:`lowbit_gemm`) takes any row count and reads only the token rows.
GEMM_ROW_MULTIPLE = 16


def gemm_rows(tokens: int) -> int:
    """Rows of codes written for ``tokens`` input tokens (a multiple of GEMM_ROW_MULTIPLE)."""
    return -(-tokens // GEMM_ROW_MULTIPLE) * GEMM_ROW_MULTIPLE


def _outputs(inp, T: int, dim: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty(inp.n_readers, T, dim, device=device, dtype=inp.code_dtype),
            torch.empty(inp.n_readers, T, device=device, dtype=torch.float32))


def _operands(inp, x2, up, nw, d, p1, p2t, dummy) -> tuple:
    """The kernels' pointer arguments after x: up, norm weight, d, P1, P2^T (in x's dtype),
    then the readers' clip ratios, floors and static scales (``dummy`` where absent)."""
    def cast(v):
        return dummy if v is None else v.to(x2.dtype)
    dyn = not inp.static
    return (dummy if up is None else up, dummy if nw is None else nw, cast(d), cast(p1),
            cast(p2t), inp.r_max if dyn else dummy, inp.r_min if dyn else dummy,
            inp.floor if dyn else dummy, dummy if dyn else inp.static_scale)


def split_pow2(n: int) -> tuple[int, int]:
    """(a, b): a the largest power of two <= n (at least 16), b the power of two (at least 16)
    covering the rest, 0 where a covers n: 148 -> (128, 32), 96 -> (64, 32), 128 -> (128, 0)."""
    a = max(16, 1 << (n.bit_length() - 1))
    return (a, 0) if a >= n else (a, _pow2(n - a))


def _fused_norm(inp, x2):
    """(norm weight, eps) for the kernel when the group's RMSNorm is fused and its weight has
    x's dtype (the product the kernel rounds once); else (None, 0.0)."""
    if inp.norm is None or inp.norm[0].dtype != x2.dtype:
        return None, 0.0
    return inp.norm[0].detach().contiguous(), float(inp.norm[1])


def _quantize_split(inp, x2, up, nw, eps, d, p1, p2t, n1, n2):
    T, dim = x2.shape
    rows = gemm_rows(T)
    codes, scales = _outputs(inp, rows, dim, x2.device)
    if T == 0:
        return codes, scales
    st = split_settings(n1, n2)
    if min(_pow2(n2), st["SPLIT_BC"]) < 64 and p2t is not None:
        raise ValueError(f"lowbit_triton.SPLIT_BC={st['SPLIT_BC']}: column chunks below 64 are "
                         "refused (wrong products on Triton 3.6, H100 and H200)")
    gated = up is not None and st["SPLIT_GATED"] and nw is None
    if up is not None and not gated:
        x2, up = silu_mul(x2, up), None
    BR, BC = min(_pow2(n1), st["SPLIT_BR"]), min(_pow2(n2), st["SPLIT_BC"])
    ncc = triton.cdiv(n2, BC)
    regs = st["SPLIT_REGS"] and p2t is not None and BR >= n1 and ncc <= 4
    z = scales if regs else torch.empty_like(x2)          # no scratch row in registers
    CH = 2048
    (ra, rb), (ca, cb) = split_pow2(n1), split_pow2(n2)
    _act_quant_split_kernel[(rows,)](
        x2, *_operands(inp, x2, up, nw, d, p1, p2t, scales),
        z, codes, scales, rows, T, float(2 ** (inp.bits - 1) - 1), eps,
        N1=n1, N2=n2, RA=ra, RB=max(rb, 16), SR=rb > 0, CA=ca, CB=max(cb, 16),
        SC=cb > 0, BR=BR, BC=BC, UNROLL=st["SPLIT_UNROLL"], REGS=regs, NCC=ncc,
        GATED=gated, HAS_NORM=nw is not None, HAS_D=d is not None,
        HAS_P2=p2t is not None, K=inp.n_readers, QMAX=2 ** (inp.bits - 1) - 1,
        STATIC=inp.static, FAST=_fast_codes(inp, st["FAST_DIV"]), CH=CH,
        NCH=triton.cdiv(dim, CH), num_warps=st["SPLIT_WARPS"], **_cap(st["SPLIT_MAXNREG"]))
    return codes, scales


def _fast_codes(inp, allowed: bool) -> bool:
    """Whether the group's codes take the reciprocal (``FAST_DIV``): not where a reader's clip
    ratio is 1 (QuaRot's, RTN's), since the scale is then max / qmax and an element at half
    the token's max, present in almost every token, lands exactly on a half-integer: every
    tile fell back to the division, and QuaRot's and RTN's forwards measured 0.02-0.05x
    slower. Decided once per group (one read of its ratios)."""
    if not allowed:
        return False
    fast = getattr(inp, "_fast_codes", None)
    if fast is None:
        fast = bool(inp.static) or not bool(((inp.r_max == 1) | (inp.r_min == 1)).any())
        inp._fast_codes = fast
    return fast


def _cap(maxnreg: int | None) -> dict:
    return {} if maxnreg is None else {"maxnreg": maxnreg}


def split_settings(n1: int, n2: int) -> dict:
    """Rows per chunk, warps and unrolling of the split kernel for an n1 x n2 tile: the
    module's defaults, overridden by the measured choice for that shape (SPLIT_TUNED)."""
    return {"SPLIT_BR": SPLIT_BR, "SPLIT_BC": SPLIT_BC, "SPLIT_WARPS": SPLIT_WARPS,
            "SPLIT_UNROLL": SPLIT_UNROLL, "SPLIT_REGS": SPLIT_REGS, "SPLIT_GATED": SPLIT_GATED,
            "FAST_DIV": FAST_DIV, "SPLIT_MAXNREG": SPLIT_MAXNREG,
            **SPLIT_TUNED.get((n1, n2), {})}


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, out_ptr, n, BLOCK: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    g = tl.load(g_ptr + o, mask=m, other=0.0)
    u = tl.load(u_ptr + o, mask=m, other=0.0)
    tl.store(out_ptr + o, _silu_mul(g, u), mask=m)


def silu_mul(g: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """:func:`lowbit.silu_mul` (torch's arithmetic) in one pass: both inputs read once, the
    product written once (torch's SiLU and product are two kernels and three passes)."""
    g, up = g.contiguous(), up.contiguous()
    out = torch.empty_like(g)
    n = g.numel()
    BLOCK = 2048
    if n:
        _silu_mul_kernel[(triton.cdiv(n, BLOCK),)](g, up, out, n, BLOCK=BLOCK, num_warps=8)
    return out


@triton.jit
def _unpack_int4_kernel(p_ptr, out_ptr, n_bytes, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    b = tl.load(p_ptr + offs, mask=offs < n_bytes, other=0).to(tl.int32)
    lo = b & 0xF
    hi = (b >> 4) & 0xF
    lo = tl.where(lo >= 8, lo - 16, lo).to(tl.float32)
    hi = tl.where(hi >= 8, hi - 16, hi).to(tl.float32)
    v = tl.reshape(tl.join(lo, hi), [2 * BLOCK])          # low nibble first
    o = pid * (2 * BLOCK) + tl.arange(0, 2 * BLOCK)
    tl.store(out_ptr + o, v.to(out_ptr.dtype.element_ty), mask=o < 2 * n_bytes)


# bytes a program and warps of the unpacking kernel (a sweep of 1024-8192 bytes and 4 or 8
# warps changed nothing beyond 5%: docs/benchmarks.md)
UNPACK_BLOCK = 2048
UNPACK_WARPS = 4


def unpack_int4(packed: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """uint8 [out, n / 2] (two codes a byte, low nibble first) -> codes [out, n] in ``dtype``."""
    out = torch.empty(packed.shape[0], n, device=packed.device, dtype=dtype)
    nb = packed.numel()
    _unpack_int4_kernel[(triton.cdiv(nb, UNPACK_BLOCK),)](
        packed, out, nb, BLOCK=UNPACK_BLOCK, num_warps=UNPACK_WARPS)
    return out


def weight_codes(lin) -> torch.Tensor:
    """The linear's weight codes [out, in] in the GEMM's operand dtype."""
    want = lin.code_dtype
    if lin.packed:
        return unpack_int4(lin.qweight, lin.in_features, want)
    return lin.qweight if lin.qweight.dtype == want else lin.qweight.to(want)


def gemm(lin, xc: torch.Tensor, xs: torch.Tensor, out_dtype: torch.dtype, tokens: int
         ) -> torch.Tensor:
    """y [tokens, out] = xs * ws * (xc @ codes^T) + bias, in ``out_dtype``; xc and xs carry
    padding rows after the tokens (:func:`gemm_rows`)."""
    w = weight_codes(lin)
    if lin.gemm == "triton":          # any row count: the padding rows are not computed
        return lowbit_gemm.gemm(xc[:tokens], w, xs[:tokens], lin.w_scale, lin.bias, out_dtype)
    return _cublas_gemm(lin, w, xc, xs, out_dtype)[:tokens]


def _cublas_gemm(lin, w, xc, xs, out_dtype):
    if lin.kind == "fp8":
        global BIAS_IN_EPILOGUE
        bias = None if lin.bias is None else lin.bias.to(torch.bfloat16)
        if bias is not None and BIAS_IN_EPILOGUE:
            try:
                y = _scaled_mm(xc, w, xs, lin.w_scale, bias)
            except RuntimeError:          # a torch whose row-wise FP8 GEMM takes no bias
                BIAS_IN_EPILOGUE = False
        if bias is None or not BIAS_IN_EPILOGUE:
            y = _scaled_mm(xc, w, xs, lin.w_scale, None)
            if bias is not None:
                y = y + bias
        return y if out_dtype == torch.bfloat16 else y.to(out_dtype)
    acc = _int_mm_padded(xc, w.t())
    y = acc.float() * xs.reshape(-1, 1) * lin.w_scale.reshape(1, -1)
    if lin.bias is not None:
        y = y + lin.bias.float()
    return y.to(out_dtype)


BIAS_IN_EPILOGUE = True


def _scaled_mm(xc, w, xs, ws, bias):
    """FP8 x FP8 -> bf16 with float32 accumulation (no fast accumulation: the integer sums
    stay exact) and row-wise scales: per token (xs) and per output channel (ws)."""
    return torch._scaled_mm(xc, w.t(), scale_a=xs.reshape(-1, 1), scale_b=ws.reshape(1, -1),
                            bias=bias, out_dtype=torch.bfloat16, use_fast_accum=False)


def _int_mm_padded(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch._int_mm`` needs more than 16 rows: pad small batches with zero rows."""
    m = a.shape[0]
    if m > 16:
        return torch._int_mm(a, b)
    pad = torch.zeros(17 - m, a.shape[1], dtype=a.dtype, device=a.device)
    return torch._int_mm(torch.cat([a, pad]), b)[:m]
