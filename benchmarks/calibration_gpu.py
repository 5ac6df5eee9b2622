"""How long and how much GPU memory does FAIR-Calib's W4A4 calibration take at the real
LLaDA-8B / Dream-7B shapes (random weights)? JSON lines: ``matmul`` (the measured bf16 matmul
peak), then per shape ``calibration`` on ``--calib-layers`` blocks as the calibrate stage runs
it (model in host memory, one block at a time on the GPU): peak GPU memory, seconds per
block-epoch (block 0's first epoch compiles the chains), the per-block overhead, the projection
to every block at 15 epochs, and the FLOP floor (a step is about three forward passes' matmuls).
``FAIR_CALIB_COMPILE=0`` measures the eager chains.

    PYTHONPATH=. python benchmarks/calibration_gpu.py [--shapes llada-8b,dream-7b]
    PYTHONPATH=. python benchmarks/calibration_gpu.py --smoke       (tiny shape, CPU)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import shapes  # noqa: E402
from benchmarks.shapes import emit  # noqa: E402
from fair_calib.calibrate import calibrate  # noqa: E402
from fair_calib.methods import make_method  # noqa: E402
from fair_calib.quant import fused  # noqa: E402

SMOKE_SHAPE = dict(cls="llama", hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=4, vocab_size=300,
                   rope_theta=10000.0, max_position_embeddings=256, rms_norm_eps=1e-5,
                   adapter="tiny-llada", mask_id=299)


def bench_calibration(shape: str, args, dev: str, peak_tflops: float | None) -> None:
    lm = shapes.build(shape, layers=args.calib_layers, device=dev)
    lm.model.to("cpu")                       # model in host memory, blocks visit the GPU
    if dev == "cuda":
        torch.cuda.empty_cache()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, shapes.SHAPES[shape]["vocab_size"] - 2, (args.n_samples, args.seq_len),
                        generator=gen)
    weights = torch.rand(args.seq_len, generator=gen) + 0.05     # stands in for the prior
    method = make_method({"type": "fair_calib", "epochs": args.epochs}, 4, 4, seed=0)
    t0 = time.perf_counter()
    meta = calibrate(lm, method, ids, "/nonexistent-not-written", weights=weights,
                     batch_size=args.batch_size, log=lambda s: None, device=dev,
                     write_outputs=False)
    if dev == "cuda":
        torch.cuda.synchronize()
    total = time.perf_counter() - t0
    rows, last = meta["stats"], args.epochs - 1
    # a block's last epoch row holds the whole block's time; the per-epoch median takes the
    # epochs before it, of the blocks after the first where there are several
    per_block = [r["seconds"] for r in rows if r["epoch"] == last]
    epoch_rows = [r["seconds"] for r in rows if 0 <= r["epoch"] < last
                  and (r["block"] > 0 or args.calib_layers == 1)]
    sec_epoch = statistics.median(epoch_rows) if epoch_rows else float("nan")
    overhead = statistics.median(per_block[1:] or per_block) - args.epochs * sec_epoch
    one_time = max(per_block[0] - args.epochs * sec_epoch - overhead, 0.0)
    n_blocks = shapes.SHAPES[shape]["num_hidden_layers"]
    rec = {"kind": "calibration", "shape": shape, "device": dev_name(dev),
           "compiled": fused.compile_enabled() and dev == "cuda",
           "compile_fell_back": fused.fell_back(), "n_samples": args.n_samples,
           "seq_len": args.seq_len, "batch_size": args.batch_size,
           "blocks_measured": args.calib_layers, "epochs": args.epochs,
           "peak_mem_gb": meta["peak_mem_mb"] / 1024, "sec_per_block_epoch": sec_epoch,
           "block_overhead_s": overhead, "one_time_first_block_s": one_time,
           "projected_all_blocks_15_epochs_min":
               (one_time + n_blocks * (overhead + 15 * sec_epoch)) / 60,
           "total_s": total, "final_losses": [r["loss"] for r in rows if r["epoch"] == last]}
    if peak_tflops:
        # a step: about three forward passes' matmuls of one block (the LM head left out)
        block_fwd = (shapes.forward_flops(shape, args.n_samples, args.seq_len, layers=1)
                     - 2 * args.n_samples * args.seq_len * shapes.SHAPES[shape]["hidden_size"]
                     * shapes.SHAPES[shape]["vocab_size"])
        floor = 3 * block_fwd / (peak_tflops * 1e12)
        rec.update({"flop_floor_all_blocks_15_epochs_min": n_blocks * 15 * floor / 60,
                    "matmul_utilisation": floor / sec_epoch})
    emit(rec)


def dev_name(dev: str) -> str:
    return torch.cuda.get_device_name() if dev == "cuda" else "cpu"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="llada-8b,dream-7b")
    ap.add_argument("--n-samples", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--calib-layers", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="tiny shape on CPU (tests the script)")
    args = ap.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    names = args.shapes.split(",")
    if args.smoke:
        shapes.SHAPES["smoke"] = dict(SMOKE_SHAPE)
        names, args.n_samples, args.seq_len = ["smoke"], 8, 32
    peak = None
    if dev == "cuda":
        peak = shapes.matmul_tflops()
        emit({"kind": "matmul", "device": dev_name(dev), "bf16_tflops": peak, "torch":
              torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    for name in names:
        bench_calibration(name, args, dev, peak)


if __name__ == "__main__":
    main()
