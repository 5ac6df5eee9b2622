"""The low-bit backend's integer GEMM in Triton: y = xs * ws * (codes_x @ codes_W^T) + bias.

cuBLASLt's row-wise scaled FP8 GEMM (``torch._scaled_mm``) runs one 128 x 128 tile at every
shape; at the 400-900 tokens of a batch-1 decode it reached about a third of the H100's FP8
peak, no faster than the bf16 GEMM (``docs/benchmarks.md``). This kernel takes the codes as
int8 (every code of up to 8 bits, so W4A4, W3A4 and W8A8 alike) on the INT8 tensor cores with
int32 accumulation: the dot product is exact by construction, whatever the tile, the order of
the K loop or the split. The epilogue is :func:`lowbit.emulate_gemm`'s arithmetic in the same
order, each operation rounded once (float32 acc * xs, * ws, + bias, rounded to the output
dtype; no fused multiply-add), so the output equals the emulation bit for bit.
(An FP8-operand variant, exact with the accumulator promoted to float32 after every
tensor-core instruction, measured 2.0-2.3x this kernel's time on an H100 and was removed:
``docs/benchmarks.md``. cuBLAS remains the FP8 GEMM, ``FAIR_CALIB_LOWBIT_GEMM=cublas``.)

Tiles per shape: :func:`config_for` (measured: ``docs/benchmarks.md``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl



@triton.jit
def _tile_ids(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """Program -> (row tile, column tile), GROUP_M row tiles at a time so that the programs
    running together share their weight tiles in L2."""
    npm = tl.cdiv(M, BM)
    npn = tl.cdiv(N, BN)
    width = GROUP_M * npn
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(npm - first_m, GROUP_M)
    return first_m + (pid % width) % size_m, (pid % width) // size_m


@triton.jit
def _gemm_kernel(a_ptr, b_ptr, as_ptr, bs_ptr, bias_ptr, c_ptr, M, N, K,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                 STAGES: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr):
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BM, BN, GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_p = a_ptr + rm[:, None].to(tl.int64) * K + rk[None, :]
    b_p = b_ptr + rn[None, :].to(tl.int64) * K + rk[:, None]
    acc = tl.zeros((BM, BN), dtype=tl.int32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        if EVEN_K:
            a = tl.load(a_p, mask=rm[:, None] < M, other=0)
            b = tl.load(b_p, mask=rn[None, :] < N, other=0)
        else:
            a = tl.load(a_p, mask=(rm[:, None] < M) & (rk[None, :] + k0 < K), other=0)
            b = tl.load(b_p, mask=(rn[None, :] < N) & (rk[:, None] + k0 < K), other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        a_p += BK
        b_p += BK
    xs = tl.load(as_ptr + rm, mask=rm < M, other=1.0)
    ws = tl.load(bs_ptr + rn, mask=rn < N, other=1.0)
    y = acc.to(tl.float32) * xs[:, None]
    y = y * ws[None, :]
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    c_p = c_ptr + rm[:, None].to(tl.int64) * N + rn[None, :]
    tl.store(c_p, y.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


# (BM, BN, BK, GROUP_M, STAGES, warps). The rule of :func:`config_for` is what
# ``benchmarks/lowbit_gemm_gpu.py`` (commit be0153a) measured fastest on an H100 (2026-11-27)
# for LLaDA-8B's and Dream-7B's linears at 16-6,144 rows (every setting gives the same output
# bit for bit)
SMALL_TILES = (64, 64, 128, 8, 5, 4)       # up to 128 rows
NARROW_TILES = (64, 64, 256, 8, 4, 4)      # outputs up to 1,024 wide (k/v), up to 1,024 rows
DECODE_TILES = (64, 128, 128, 8, 4, 4)     # up to 512 rows (a prompt-152 decode's 408 tokens)
MID_TILES = (64, 128, 128, 8, 3, 4)        # 513-768 rows, outputs up to 8,192 wide
LARGE_TILES = (128, 128, 128, 8, 3, 4)
CONFIG: tuple | None = None     # override (benchmark sweeps)


def config_for(m: int, n: int, k: int) -> tuple[int, int, int, int, int, int]:
    """Tile setting for an [m, k] x [k, n] product."""
    if CONFIG is not None:
        return CONFIG
    if n <= 1024:
        return NARROW_TILES if m <= 1024 else SMALL_TILES if m <= 2048 else DECODE_TILES
    if m <= 128:
        return DECODE_TILES if n >= 16384 else SMALL_TILES
    if m <= 512:
        return DECODE_TILES
    return MID_TILES if m <= 768 and n <= 8192 else LARGE_TILES


def gemm(xc: torch.Tensor, wc: torch.Tensor, xs: torch.Tensor, ws: torch.Tensor,
         bias: torch.Tensor | None, out_dtype: torch.dtype,
         config: tuple | None = None) -> torch.Tensor:
    """y [M, N] = (xc [M, K] @ wc [N, K]^T) * xs [M] * ws [N] (+ bias [N]) in ``out_dtype``;
    codes int8, scales float32, each operand contiguous."""
    M, K = xc.shape
    N = wc.shape[0]
    if wc.shape[1] != K or xc.dtype != torch.int8 or wc.dtype != torch.int8:
        raise ValueError(f"lowbit_gemm.gemm: codes {tuple(xc.shape)} {xc.dtype} and weight "
                         f"{tuple(wc.shape)} {wc.dtype}: int8 codes with equal inner sizes")
    out = torch.empty(M, N, device=xc.device, dtype=out_dtype)
    if M == 0:
        return out
    BM, BN, BK, GROUP_M, STAGES, warps = config or config_for(M, N, K)
    grid = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    _gemm_kernel[(grid,)](
        xc, wc, xs, ws, xs if bias is None else bias, out, M, N, K,
        BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M, STAGES=STAGES, HAS_BIAS=bias is not None,
        EVEN_K=K % BK == 0, num_warps=warps, enable_fp_fusion=False)
    return out
