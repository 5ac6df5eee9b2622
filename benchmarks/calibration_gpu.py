"""GPU benchmark for issue 5: FAIR-Calib calibration memory/time and fake-quant forward speed.

Random weights at the real LLaDA-8B / Dream-7B shapes (``benchmarks/shapes.py``); no downloads.
Prints one JSON line per measurement:

- ``matmul``: measured dense bf16 matmul throughput (the physical anchor);
- ``calibration``: FAIR-Calib (W4A4, prior-weighted loss with random position weights) on
  ``--calib-layers`` blocks of the model at ``--n-samples`` x ``--seq-len`` tokens, micro-batch
  ``--batch-size``, ``--epochs`` epochs per block. The model lives in CPU memory; each block is
  moved to the GPU for its calibration (``calibrate(device=...)``), so the reported peak is
  what calibration itself needs (one block + captured inputs/targets + activations). Reported:
  peak GPU memory, seconds per block-epoch (median over the measured epochs), per-block overhead
  (group discovery, FP targets, initial loss), the projection for all blocks at 15 epochs, and
  the FLOP bound: a training step costs about 3 forward matmul passes (forward, input gradient,
  gradient of the fake-quant weight Q(W T^-1)), so an epoch needs at least
  3 * F_block(n_samples x seq_len) / measured matmul peak;
- ``forward``: bf16 FP forward vs fake-quant W4A4 forward (FlatQuant/FAIR-Calib structure:
  online Kronecker transform + per-token activation quantizer per input group, folded bf16
  weights) at batch ``--fwd-batch`` x ``--fwd-seq``, ``--fwd-layers`` layers (default: full depth),
  with the fused (torch.compile) activation quantizer and, for comparison, the eager one.

Usage (device machine):  PYTHONPATH=. python benchmarks/calibration_gpu.py
Smoke test on CPU:        PYTHONPATH=. python benchmarks/calibration_gpu.py --smoke
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import shapes  # noqa: E402
from fair_calib.calibrate import calibrate  # noqa: E402
from fair_calib.methods import make_method  # noqa: E402
from fair_calib.methods.base import fold_block  # noqa: E402
from fair_calib.quant import qlinear, transforms  # noqa: E402
from fair_calib.quant.blockio import call_block, capture_block_inputs  # noqa: E402
from fair_calib.quant.discovery import discover_groups  # noqa: E402

SMOKE_SHAPE = dict(cls="llama", hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=4, vocab_size=300,
                   rope_theta=10000.0, max_position_embeddings=256, rms_norm_eps=1e-5,
                   adapter="tiny-llada", mask_id=299)


def emit(rec: dict) -> None:
    print(json.dumps(rec), flush=True)


def sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def timed(fn, dev: str, warmup: int = 2, iters: int = 5) -> float:
    if dev == "cuda":
        return shapes.cuda_time(fn, warmup=warmup, iters=iters)
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def block_fwd_flops(shape: str, batch: int, seq: int) -> float:
    s = shapes.SHAPES[shape]
    head = 2 * batch * seq * s["hidden_size"] * s["vocab_size"]
    return shapes.forward_flops(shape, batch, seq, layers=1) - head


def bench_calibration(shape: str, args, dev: str, peak_tflops: float | None) -> None:
    layers = args.calib_layers
    lm = shapes.build(shape, layers=layers, device=dev)
    lm.model.to("cpu")                       # model in CPU memory, blocks visit the GPU
    if dev == "cuda":
        torch.cuda.empty_cache()
    gen = torch.Generator().manual_seed(0)
    vocab = shapes.SHAPES[shape]["vocab_size"]
    ids = torch.randint(0, vocab - 2, (args.n_samples, args.seq_len), generator=gen)
    weights = torch.rand(args.seq_len, generator=gen) + 0.05     # stands in for the prior
    method = make_method({"type": "fair_calib", "epochs": args.epochs}, 4, 4, seed=0)
    base = torch.cuda.memory_allocated() / 2**20 if dev == "cuda" else 0.0
    t0 = time.perf_counter()
    meta = calibrate(lm, method, ids, "/nonexistent-not-written", weights=weights,
                     batch_size=args.batch_size, log=lambda s: None, device=dev,
                     write_outputs=False)
    sync(dev)
    total = time.perf_counter() - t0
    rows = meta["stats"]
    ep = [r["seconds"] for r in rows if r["epoch"] >= 0]
    # the last row's "seconds" is replaced by the whole block's time; use the epochs before it
    per_block = [r["seconds"] for r in rows if r["epoch"] == args.epochs - 1]
    epoch_rows = [r for r in rows if 0 <= r["epoch"] < args.epochs - 1]
    sec_epoch = statistics.median(r["seconds"] for r in epoch_rows) if epoch_rows else float("nan")
    overhead = statistics.median(per_block) - args.epochs * sec_epoch
    n_blocks = shapes.SHAPES[shape]["num_hidden_layers"]
    proj = n_blocks * (overhead + 15 * sec_epoch)
    fl_epoch = 3 * block_fwd_flops(shape, args.n_samples, args.seq_len)
    rec = {"kind": "calibration", "shape": shape, "device": dev_name(dev), "method": "fair_calib",
           "kron_mode": transforms.KRON_MODE,
           "bits": "W4A4", "n_samples": args.n_samples, "seq_len": args.seq_len,
           "batch_size": args.batch_size, "blocks_measured": layers, "epochs": args.epochs,
           "peak_mem_gb": meta["peak_mem_mb"] / 1024, "resident_before_gb": base / 1024,
           "sec_per_block_epoch": sec_epoch, "block_overhead_s": overhead,
           "projected_all_blocks_15_epochs_min": proj / 60, "n_blocks": n_blocks,
           "total_s": total, "final_losses": [r["loss"] for r in rows if r["epoch"] == args.epochs - 1],
           "initial_losses": [r["loss"] for r in rows if r["epoch"] == -1],
           "epoch_seconds": ep, "train_tflop_per_epoch": fl_epoch / 1e12}
    if peak_tflops:
        bound = fl_epoch / (peak_tflops * 1e12)
        rec.update({"flop_bound_sec_per_block_epoch": bound,
                    "flop_bound_all_blocks_15_epochs_min": n_blocks * 15 * bound / 60,
                    "matmul_utilisation": bound / sec_epoch})
    emit(rec)
    del lm, meta
    if dev == "cuda":
        torch.cuda.empty_cache()


def bench_forward(shape: str, args, dev: str) -> None:
    layers = args.fwd_layers or shapes.SHAPES[shape]["num_hidden_layers"]
    lm = shapes.build(shape, layers=layers, device=dev)
    vocab = shapes.SHAPES[shape]["vocab_size"]
    ids = torch.randint(0, vocab - 2, (args.fwd_batch, args.fwd_seq),
                        generator=torch.Generator().manual_seed(1)).to(dev)
    model = lm.model

    def fwd():
        with torch.no_grad():
            return model(input_ids=ids).logits

    t_fp = timed(fwd, dev)
    with torch.no_grad():
        y_fp = fwd().float()
    mem_fp = torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else 0.0
    # wrap every block the way FAIR-Calib/FlatQuant does (random orthogonal Kronecker factors,
    # smooth scale 1, clip 0.98), then fold: bf16 quantized weights + online transform
    method = make_method({"type": "fair_calib"}, 4, 4, seed=0)
    probe = capture_block_inputs(model, lm.blocks[0], ids[:1, :64], 1, device=dev,
                                 hidden_dtype=next(model.parameters()).dtype)
    with torch.no_grad():
        groups = discover_groups(lm.blocks[0], lambda: call_block(lm.blocks[0], probe, 0))
    t0 = time.perf_counter()
    for i, block in enumerate(lm.blocks):
        method.quantize_block(block, groups, None, i)
        fold_block(block)
    model.eval()                             # as load_quantized leaves it
    sync(dev)
    t_fold = time.perf_counter() - t0
    if dev == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    res = {}
    default_kron = transforms.KRON_MODE
    for mode in ("compiled", "eager", "compiled_bmm"):
        qlinear._COMPILED.clear()
        transforms.KRON_MODE = "bmm" if mode.endswith("bmm") else default_kron
        if mode == "eager" or dev != "cuda":
            qlinear._COMPILED["state"] = "failed"
        t = timed(fwd, dev, warmup=3 if mode.startswith("compiled") else 2)
        res[mode] = {"sec": t, "ratio_vs_bf16": t / t_fp, "kron_mode": transforms.KRON_MODE,
                     "compile_fell_back": qlinear._COMPILED.get("state") == "failed"}
    transforms.KRON_MODE = default_kron
    with torch.no_grad():
        y_q = fwd().float()
    rel = float((y_q - y_fp).norm() / y_fp.norm())
    emit({"kind": "forward", "shape": shape, "device": dev_name(dev), "layers": layers,
          "batch": args.fwd_batch, "seq": args.fwd_seq, "bf16_sec": t_fp,
          "w4a4_fake_quant": res, "fold_s": t_fold,
          "fp_model_peak_gb": mem_fp,
          "fake_quant_peak_gb": (torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else 0.0),
          "rel_logit_diff_vs_fp": rel,
          "fwd_tflops_bf16": shapes.forward_flops(shape, args.fwd_batch, args.fwd_seq, layers) / t_fp / 1e12})
    del lm, model
    if dev == "cuda":
        torch.cuda.empty_cache()


def profile_calibration(shape: str, args, dev: str) -> None:
    """Where a calibration step's GPU time goes: 1 block, 16 sequences, 1 epoch, profiled."""
    from torch.profiler import ProfilerActivity, profile

    lm = shapes.build(shape, layers=1, device=dev)
    lm.model.to("cpu")
    vocab = shapes.SHAPES[shape]["vocab_size"]
    ids = torch.randint(0, vocab - 2, (16, args.seq_len), generator=torch.Generator().manual_seed(0))
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    method = make_method({"type": "fair_calib", "epochs": 2}, 4, 4, seed=0)
    with profile(activities=acts) as prof:
        calibrate(lm, method, ids, "/nonexistent-not-written", weights=torch.ones(args.seq_len),
                  batch_size=args.batch_size, log=lambda s: None, device=dev, write_outputs=False)
    key = "self_cuda_time_total" if dev == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60)
    print(table, flush=True)
    del lm


def profile_forward(shape: str, args, dev: str, layers: int = 4) -> None:
    """Where the fake-quant forward's GPU time goes (``layers`` layers, folded W4A4)."""
    from torch.profiler import ProfilerActivity, profile

    lm = shapes.build(shape, layers=layers, device=dev)
    model = lm.model
    ids = torch.randint(0, shapes.SHAPES[shape]["vocab_size"] - 2, (args.fwd_batch, args.fwd_seq)).to(dev)
    probe = capture_block_inputs(model, lm.blocks[0], ids[:1, :64], 1, device=dev,
                                 hidden_dtype=next(model.parameters()).dtype)
    with torch.no_grad():
        groups = discover_groups(lm.blocks[0], lambda: call_block(lm.blocks[0], probe, 0))
    method = make_method({"type": "fair_calib"}, 4, 4, seed=0)
    for i, block in enumerate(lm.blocks):
        method.quantize_block(block, groups, None, i)
        fold_block(block)
    model.eval()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    with torch.no_grad():
        for _ in range(3):
            model(input_ids=ids)
        sync(dev)
        with profile(activities=acts) as prof:
            for _ in range(3):
                model(input_ids=ids)
            sync(dev)
    key = "self_cuda_time_total" if dev == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=20, max_name_column_width=70), flush=True)
    del lm, model


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
    ap.add_argument("--fwd-batch", type=int, default=8)
    ap.add_argument("--fwd-seq", type=int, default=512)
    ap.add_argument("--fwd-layers", type=int, default=None, help="default: full depth")
    ap.add_argument("--skip", default="", help="comma list of: calibration,forward")
    ap.add_argument("--compare-kron", action="store_true",
                    help="also calibrate with the batched (bmm) Kronecker product")
    ap.add_argument("--profile", action="store_true", help="profile a short calibration first")
    ap.add_argument("--profile-forward", action="store_true",
                    help="profile the fake-quant forward (last shape, 4 layers) first")
    ap.add_argument("--smoke", action="store_true", help="tiny shape on CPU (tests the script)")
    args = ap.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    names = args.shapes.split(",")
    if args.smoke:
        shapes.SHAPES["smoke"] = dict(SMOKE_SHAPE)
        names = ["smoke"]
        args.n_samples, args.seq_len, args.fwd_batch, args.fwd_seq = 8, 32, 2, 16
    peak = None
    if dev == "cuda":
        peak = shapes.matmul_tflops()
        emit({"kind": "matmul", "device": dev_name(dev), "bf16_tflops": peak,
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    skip = set(filter(None, args.skip.split(",")))
    if args.profile:
        profile_calibration(names[0], args, dev)
    if args.profile_forward:
        profile_forward(names[-1], args, dev)
    for name in names:
        if "calibration" not in skip:
            bench_calibration(name, args, dev, peak)
            if args.compare_kron:
                default_kron, transforms.KRON_MODE = transforms.KRON_MODE, "bmm"
                bench_calibration(name, args, dev, peak)
                transforms.KRON_MODE = default_kron
        if "forward" not in skip:
            bench_forward(name, args, dev)


if __name__ == "__main__":
    main()
