"""Does every token count run through the real low-bit path, and give the emulation's result?
(issue 30, item 1)

For each quantized structure (FAIR-Calib/FlatQuant's Kronecker transforms, QuaRot's online
Hadamards, RTN's plain per-token quantization; W4A4, FP8 GEMMs, norms and SwiGLU products
fused as ``load_quantized`` fuses them) on one block at the real LLaDA-8B / Dream-7B shapes
(random weights), at every token count 1..64 and a sample up to 4,096:

- ``block``: the block's real output against the same block in emulation (the same modules
  switched to ``emulate``: codes from torch's arithmetic, the integer product exact in
  float64): relative error of the block's update, ||d_real - d_emu|| / ||d_emu||; bar
  <= ``TOLERANCE`` (a bf16 transform summed in another order flips a few codes, ~1e-3 of them);
- ``rows``: every linear of the block at m = 1..64 rows against the same rows inside a batch
  of 64 and of 4,096: bit for bit (a padding row never changes another row's result).

    PYTHONPATH=. python benchmarks/lowbit_rows_gpu.py [--shapes llada-8b dream-7b]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import shapes  # noqa: E402
from benchmarks.lowbit_gpu import (block_groups, emit, ids_for, quantize_fair_calib,  # noqa: E402
                                   quantize_quarot, quantize_rtn)
from fair_calib.quant import lowbit  # noqa: E402
from fair_calib.quant.blockio import call_block, capture_block_inputs  # noqa: E402

TOKENS = list(range(1, 65)) + [100, 255, 401, 403, 408, 856, 1000, 1280, 2047, 4096]
TOLERANCE = 0.02
DEVICE = "cuda"


def structure(shape: str, name: str, dev: str):
    lm = shapes.build(shape, layers=1, device=dev)
    groups = block_groups(lm, dev)
    hd = shapes.SHAPES[shape]["hidden_size"] // shapes.SHAPES[shape]["num_attention_heads"]
    {"fair_calib": lambda: quantize_fair_calib(lm, groups),
     "quarot": lambda: quantize_quarot(lm, groups, hd),
     "rtn": lambda: quantize_rtn(lm, groups)}[name]()
    return lm


def set_mode(block, mode: str) -> None:
    for m in block.modules():
        if isinstance(m, (lowbit.LowBitInput, lowbit.LowBitLinear)):
            m.mode = mode


@torch.no_grad()
def check_blocks(lm, shape: str, name: str, dev: str) -> float:
    block = lm.blocks[0]
    worst = 0.0
    for m in TOKENS:
        ids = ids_for(shape, 1, m, dev)
        inputs = capture_block_inputs(lm.model, block, ids, 1, device=dev,
                                      hidden_dtype=torch.bfloat16)
        h = inputs.hidden[0]
        real = call_block(block, inputs, 0, h)
        set_mode(block, "emulate")
        try:
            emu = call_block(block, inputs, 0, h)
        finally:
            set_mode(block, "real")
        d_real, d_emu = (real - h).double(), (emu - h).double()
        rel = float((d_real - d_emu).norm() / d_emu.norm())
        worst = max(worst, rel)
        if m > 64 or m in (1, 3, 17, 64):
            emit({"kind": "rows_block", "shape": shape, "structure": name, "tokens": m,
                  "rel_update_error": rel, "finite": bool(torch.isfinite(real).all())})
    emit({"kind": "rows_block_worst", "shape": shape, "structure": name,
          "tokens": f"1..64 and {TOKENS[64:]}", "max_rel_update_error": worst,
          "ok": worst <= TOLERANCE})
    return worst


@torch.no_grad()
def check_rows(lm, shape: str, name: str, dev: str) -> bool:
    """Each linear of the block on m rows vs the same rows in batches of 64 and 4,096."""
    g = torch.Generator(device=dev).manual_seed(0)
    ok = True
    for lname, ql in lm.blocks[0].named_modules():
        be = getattr(ql, "backend", None)
        if not isinstance(be, lowbit.LowBitLinear):
            continue
        x = torch.randn(4096, be.in_features, device=dev, generator=g, dtype=torch.bfloat16)
        up = torch.randn_like(x) if lname.endswith("down_proj") else None

        def run(rows):
            return be(x[:rows]) if up is None else be(x[:rows], up[:rows])
        full, y64 = run(4096), run(64)
        bad = [m for m in range(1, 65) if not (torch.equal(run(m), y64[:m])
                                               and torch.equal(y64, full[:64]))]
        ok &= not bad
        emit({"kind": "rows_linear", "shape": shape, "structure": name, "linear": lname,
              "gated_input": up is not None, "rows_not_bitwise_equal": bad})
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["llada-8b", "dream-7b"])
    ap.add_argument("--structures", nargs="+", default=["fair_calib", "quarot", "rtn"])
    args = ap.parse_args(argv)
    dev = DEVICE
    emit({"kind": "env", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__})
    failed = []
    for shape in args.shapes:
        for name in args.structures:
            t0 = time.perf_counter()
            lm = structure(shape, name, dev)
            worst = check_blocks(lm, shape, name, dev)
            rows_ok = check_rows(lm, shape, name, dev)
            if worst > TOLERANCE or not rows_ok:
                failed.append((shape, name))
            emit({"kind": "rows_done", "shape": shape, "structure": name,
                  "seconds": round(time.perf_counter() - t0, 1)})
            del lm
            torch.cuda.empty_cache()
    emit({"kind": "rows_summary", "failed": failed})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
