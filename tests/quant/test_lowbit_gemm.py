"""The real path's int8 GEMM (:mod:`fair_calib.quant.lowbit_gemm`) in Triton's interpreter:
the emulation's output bit for bit (:func:`lowbit.emulate_gemm`, the integer dot product exact,
the scales and bias in its order), at every tile setting, any row count, K not a multiple of
the tile, W4A4 and W8A8 code ranges. (The interpreter rounds to bfloat16 by truncation, so
outputs are compared in float32 here; on an H100 ``benchmarks/lowbit_gemm_gpu.py`` of commit
be0153a checked the bfloat16 outputs bit for bit, and ``benchmarks/lowbit_rows_gpu.py`` does.)"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from fair_calib.quant import lowbit_gemm as lg
from fair_calib.quant.lowbit import emulate_gemm

g = torch.Generator().manual_seed(0)
CONFIGS = [(16, 32, 64, 2, 2, 4), (32, 16, 32, 1, 3, 4), (64, 64, 128, 8, 2, 4)]
n_checked = 0
for M, N, K, lo, hi in [(1, 24, 64, -8, 8), (17, 40, 200, -8, 8), (48, 96, 256, -128, 128),
                        (33, 8, 96, -16, 16)]:
    xc = torch.randint(lo, hi, (M, K), generator=g, dtype=torch.int8)
    wc = torch.randint(lo, hi, (N, K), generator=g, dtype=torch.int8)
    xc[0], wc[0] = lo, lo                      # the largest products, in every accumulator row 0
    xs = torch.rand(M, generator=g) + 0.1
    ws = torch.rand(N, generator=g) * 0.01
    b = torch.randn(N, generator=g).to(torch.bfloat16)
    for bias in (None, b):
        ref = emulate_gemm(xc, xs, wc, ws, bias, torch.float32)
        outs = [lg.gemm(xc, wc, xs, ws, bias, torch.float32, config=c) for c in CONFIGS]
        for c, y in zip(CONFIGS, outs):
            assert y.shape == (M, N)
            assert torch.equal(y, ref), (M, N, K, c, (y - ref).abs().max())
            n_checked += 1
assert torch.equal(lg.gemm(xc[:0], wc, xs[:0], ws, None, torch.float32), torch.empty(0, wc.shape[0]))
try:
    lg.gemm(xc.float(), wc, xs, ws, None, torch.float32)
    raise SystemExit("float codes accepted")
except ValueError as e:
    assert "int8" in str(e), e
print("ok", n_checked)
"""


def test_int8_gemm_equals_the_emulation_at_every_tile_setting():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and r.stdout.strip().startswith("ok"), r.stdout + r.stderr[-3000:]


def test_tile_settings_follow_the_measured_rule():
    """Small row counts take 64 x 64 tiles, a prompt-152 decode's few hundred rows 64 x 128,
    576-768 rows 64 x 128 with fewer stages unless the output is wide, larger batches
    128 x 128; narrow outputs (Dream's k/v) 64 x 64; an override wins."""
    pytest.importorskip("triton")
    from fair_calib.quant import lowbit_gemm as lg

    assert lg.config_for(16, 4096, 4096) == lg.SMALL_TILES
    assert lg.config_for(64, 18944, 3584) == lg.DECODE_TILES       # wide outputs: 64 x 128
    assert lg.config_for(416, 4096, 4096) == lg.DECODE_TILES
    assert lg.config_for(640, 4096, 12288) == lg.MID_TILES
    assert lg.config_for(640, 12288, 4096) == lg.LARGE_TILES
    assert lg.config_for(864, 512, 3584) == lg.NARROW_TILES        # Dream's k/v projections
    assert lg.config_for(1936, 512, 3584) == lg.SMALL_TILES
    assert lg.config_for(864, 4096, 12288) == lg.LARGE_TILES
    assert lg.config_for(6144, 512, 3584) == lg.DECODE_TILES
    try:
        lg.CONFIG = (16, 16, 32, 1, 2, 4)
        assert lg.config_for(416, 4096, 4096) == (16, 16, 32, 1, 2, 4)
    finally:
        lg.CONFIG = None


def test_gemm_setting_and_code_dtypes(monkeypatch):
    """``FAIR_CALIB_LOWBIT_GEMM``: auto is the Triton GEMM, whose codes are int8 for every
    width; cublas keeps FP8 codes for widths of up to 5 bits; anything else is refused by
    name."""
    import torch

    from fair_calib.quant import lowbit

    monkeypatch.delenv("FAIR_CALIB_LOWBIT_GEMM", raising=False)
    assert lowbit.gemm_choice() == "triton"
    monkeypatch.setenv("FAIR_CALIB_LOWBIT_GEMM", "cuBLAS")
    assert lowbit.gemm_choice() == "cublas"
    monkeypatch.setenv("FAIR_CALIB_LOWBIT_GEMM", "fast")
    with pytest.raises(ValueError, match="FAIR_CALIB_LOWBIT_GEMM='fast'"):
        lowbit.gemm_choice()
    assert lowbit.code_dtype("fp8", "triton") == torch.int8
    assert lowbit.code_dtype("int8", "triton") == torch.int8
    assert lowbit.code_dtype("fp8", "cublas") == torch.float8_e4m3fn
    assert lowbit.code_dtype("int8", "cublas") == torch.int8
