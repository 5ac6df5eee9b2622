"""Two small measurements of the low-bit backend's kernels (issue 20), run by
``benchmarks/lowbit_gpu.py`` (stage ``micro``):

- the 4-bit unpacking (``lowbit_triton.unpack_int4``) at a few block sizes and warps, on
  Dream-7B's down_proj / gate_proj and q_proj weights: time, bytes read + written over time,
  and bitwise equality with the module's setting;
- the codes' division (``lowbit_triton._codes``) on random numerators against numerators a
  quarter zero, by IEEE division and by the reciprocal (FAST), 16 scales a loaded element so
  that the arithmetic, not the memory, is timed: a zero numerator takes the division's slow
  path.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
import triton.testing

from fair_calib.quant import lowbit_triton as lt
from fair_calib.quant.lowbit_triton import _codes


@triton.jit
def _codes_kernel(z_ptr, out_ptr, n, s, FAST: tl.constexpr, BLOCK: tl.constexpr,
                  REPS: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    zf = tl.load(z_ptr + o, mask=o < n, other=1.0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k in tl.static_range(REPS):
        acc += _codes(zf, s * (1.0 + 0.01 * k), 7, FAST)
    tl.store(out_ptr + o, acc, mask=o < n)


def _median_us(fn) -> float:
    return round(triton.testing.do_bench(fn, return_mode="median") * 1e3, 1)


@torch.no_grad()
def unpack_sweep(dev, res: dict) -> dict:
    """Per setting "b{block}_w{warps}": summed microseconds over the three weights (inf where the
    codes differ from the module's setting)."""
    sums = {}
    saved = lt.UNPACK_BLOCK, lt.UNPACK_WARPS
    for rows, cols in ((18944, 3584), (3584, 18944), (3584, 3584)):
        packed = torch.randint(0, 256, (rows, cols // 2), device=dev, dtype=torch.uint8)
        ref = lt.unpack_int4(packed, cols, torch.float8_e4m3fn).view(torch.uint8)
        for blk in (1024, 2048, 4096, 8192):
            for w in (4, 8):
                lt.UNPACK_BLOCK, lt.UNPACK_WARPS = blk, w
                out = lt.unpack_int4(packed, cols, torch.float8_e4m3fn).view(torch.uint8)
                same = bool(torch.equal(out, ref))
                us = _median_us(lambda: lt.unpack_int4(packed, cols, torch.float8_e4m3fn))
                key = f"b{blk}_w{w}"
                res[f"unpack_{rows}x{cols}_{key}"] = [us, round(packed.numel() * 3 / us / 1e6, 2),
                                                      same]
                sums[key] = sums.get(key, 0.0) + (us if same else float("inf"))
        lt.UNPACK_BLOCK, lt.UNPACK_WARPS = saved
    return sums


@torch.no_grad()
def division_check(dev, res: dict) -> None:
    n = 4096 * 4096
    z = torch.randn(n, device=dev) * 3
    zz = z.clone()
    zz[::4] = 0.0
    out = torch.empty(n, device=dev)
    modes = {"div": False, "reciprocal": True}
    for name, data in (("random", z), ("quarter_zero", zz)):
        ref = None
        for mode, fast in modes.items():
            def run():
                _codes_kernel[(triton.cdiv(n, 1024),)](data, out, n, 0.37, FAST=fast,
                                                       BLOCK=1024, REPS=16, num_warps=8)
            run()
            ref = out.clone() if ref is None else ref
            res[f"codes_{name}_{mode}_us"] = _median_us(run)
            res[f"codes_{name}_{mode}_same"] = bool(torch.equal(out, ref))


def micro_kernels(dev, emit) -> dict:
    """Both measurements as one record; returns the unpacking setting of least summed time
    ({"UNPACK_BLOCK": ..., "UNPACK_WARPS": ...})."""
    res = {"kind": "micro"}
    sums = unpack_sweep(dev, res)
    division_check(dev, res)
    best = res["unpack_best"] = min(sums, key=sums.get)
    emit(res)
    blk, w = best[1:].split("_w")
    return {"UNPACK_BLOCK": int(blk), "UNPACK_WARPS": int(w)}
