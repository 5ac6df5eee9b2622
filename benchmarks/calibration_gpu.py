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
import os
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
from fair_calib.quant import fused, qlinear, transforms  # noqa: E402
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
    return shapes.call_time(fn, dev, warmup, iters)


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
    # the last epoch row's "seconds" is replaced by the whole block's time; the per-epoch median
    # uses the epochs before it, of the blocks after the first where more than one is measured
    # (block 0's first epoch compiles the chains: that one-time cost is reported apart); the
    # per-block overhead (groups, FP targets, initial loss) comes from the later blocks.
    per_block = [r["seconds"] for r in rows if r["epoch"] == args.epochs - 1]
    epoch_rows = [r for r in rows if 0 <= r["epoch"] < args.epochs - 1
                  and (r["block"] > 0 or layers == 1)]
    sec_epoch = statistics.median(r["seconds"] for r in epoch_rows) if epoch_rows else float("nan")
    later = per_block[1:] or per_block
    overhead = statistics.median(later) - args.epochs * sec_epoch
    one_time = max(per_block[0] - args.epochs * sec_epoch - overhead, 0.0)
    n_blocks = shapes.SHAPES[shape]["num_hidden_layers"]
    proj = one_time + n_blocks * (overhead + 15 * sec_epoch)
    fl_epoch = 3 * block_fwd_flops(shape, args.n_samples, args.seq_len)
    rec = {"kind": "calibration", "shape": shape, "device": dev_name(dev), "method": "fair_calib",
           "kron_mode": transforms.KRON_MODE, "compiled": fused.compile_enabled() and dev == "cuda",
           "recompute": qlinear.CHECKPOINT_QUANT,
           "compile_fell_back": fused.fell_back(),
           "bits": "W4A4", "n_samples": args.n_samples, "seq_len": args.seq_len,
           "batch_size": args.batch_size, "blocks_measured": layers, "epochs": args.epochs,
           "peak_mem_gb": meta["peak_mem_mb"] / 1024, "resident_before_gb": base / 1024,
           "sec_per_block_epoch": sec_epoch, "block_overhead_s": overhead,
           "one_time_first_block_s": one_time,
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
    # smooth scale 1, clip logits 4, o_proj heads transform folded into v_proj), then fold:
    # bf16 quantized weights + online transform
    method = make_method({"type": "fair_calib"}, 4, 4, seed=0)
    method.prepare_model(lm)
    probe = capture_block_inputs(model, lm.blocks[0], ids[:1, :64], 1, device=dev,
                                 hidden_dtype=next(model.parameters()).dtype)
    with torch.no_grad():
        groups = discover_groups(lm.blocks[0], lambda: call_block(lm.blocks[0], probe, 0))
    t0 = time.perf_counter()
    for i, block in enumerate(lm.blocks):
        method.quantize_block(block, groups, None, i)
        fold_block(block, drop_fp=True)       # as load_quantized does
    model.eval()                             # as load_quantized leaves it
    sync(dev)
    t_fold = time.perf_counter() - t0
    if dev == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    res = {}
    default_kron = transforms.KRON_MODE
    for mode in ("compiled", "eager", "compiled_mm"):
        fused.reset()
        torch._dynamo.reset()
        transforms.KRON_MODE = "mm" if mode.endswith("_mm") else default_kron
        os.environ["FAIR_CALIB_COMPILE"] = "0" if mode == "eager" else "1"
        t = timed(fwd, dev, warmup=3 if mode.startswith("compiled") else 2)
        res[mode] = {"sec": t, "ratio_vs_bf16": t / t_fp, "kron_mode": transforms.KRON_MODE,
                     "compile_fell_back": fused.fell_back()}
    transforms.KRON_MODE = default_kron
    os.environ["FAIR_CALIB_COMPILE"] = "1"
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


def check_fused(shape: str, dev: str, tokens: int = 1024) -> None:
    """The compiled chains against the eager ones, in float32.

    1. Each chain alone at the shape's two input widths (hidden, intermediate), on the same
       inputs: values (relative difference, share of flipped 4-bit grid points) and gradients
       of every input. Compiled code rounds a few operations differently in the last bit (e.g.
       the sigmoid of the clip), so a handful of grid points flip; everything else agrees to
       float32 rounding.
    2. A whole wrapped block, compiled vs eager, next to eager vs eager with the block input
       and every clip logit perturbed by one part in 10^7 (about one float32 ulp): fake
       quantization is discontinuous, so a few flipped grid points cascade through the
       block's four quantizers. The compiled difference should be of the size of that
       perturbation's, i.e. of the effect of last-bit noise.
    """
    s = shapes.SHAPES[shape]
    g = torch.Generator(device=dev).manual_seed(0)
    rec = {"kind": "fused_check", "shape": shape, "form": fused.COMPILED_FORM}
    rel = lambda a, b: float((a - b).norm() / a.norm())  # noqa: E731
    os.environ["FAIR_CALIB_COMPILE"] = "1"
    for dim in (s["hidden_size"], s["intermediate_size"]):
        n1, n2 = transforms.closest_factor_pair(dim)
        x = torch.randn(tokens, dim, device=dev, generator=g) * (torch.rand(dim, device=dev, generator=g) + 0.5)
        w = torch.randn(512, dim, device=dev, generator=g)
        d = torch.rand(dim, device=dev, generator=g) + 0.5
        p1 = torch.linalg.qr(torch.randn(n1, n1, device=dev, generator=g))[0]
        p2 = torch.linalg.qr(torch.randn(n2, n2, device=dev, generator=g))[0]
        cases = {"act": (fused.act_chain, (x, d, p1, p2, torch.full((1,), 2.0, device=dev),
                                           torch.full((1,), 1.5, device=dev))),
                 "weight": (fused.weight_chain, (w, d, torch.linalg.inv(p1), torch.linalg.inv(p2),
                                                 torch.full((512, 1), 2.0, device=dev),
                                                 torch.full((512, 1), 1.5, device=dev)))}
        for name, (fn, args) in cases.items():
            outs = []
            for f in (fn, torch.compile(fn)):
                a = [t.clone().requires_grad_() for t in args]
                y = f(*a, 4, n1, n2, torch.float32, form=fused.COMPILED_FORM)
                y = y[0] if isinstance(y, tuple) else y
                (y * torch.linspace(-1, 1, dim, device=dev)).sum().backward()
                outs.append((y.detach(), [t.grad for t in a]))
            (ye, ge), (yc, gc) = outs
            step = ye.abs().amax(dim=-1, keepdim=True) / 7
            rec[f"{name}_{dim}"] = {
                "value_rel": rel(ye, yc),
                "flipped_share": float(((ye - yc).abs() > 0.5 * step).float().mean()),
                "grad_rel_max": max(rel(a, b) for a, b in zip(ge, gc))}
    # 2. the whole block
    lm = shapes.build(shape, layers=1, device=dev)
    block = lm.blocks[0]
    ids = torch.randint(0, s["vocab_size"] - 2, (1, 512), generator=torch.Generator().manual_seed(2)).to(dev)
    inputs = capture_block_inputs(lm.model, block, ids, 1, device=dev, hidden_dtype=torch.float32)
    block.float()
    with torch.no_grad():
        groups = discover_groups(block, lambda: call_block(block, inputs, 0))
    method = make_method({"type": "fair_calib"}, 4, 4, seed=0)
    method.prepare_model(lm)                    # v_proj / o_proj for the heads transform
    method.quantize_block(block, groups, None, 0)
    with torch.no_grad():
        for p in method.parameters(block):      # move off the identity-like start
            p.add_(0.01 * torch.randn_like(p))

    clips = [p for n, p in block.named_parameters() if n.endswith(("clip_max", "clip_min"))]

    def out(env, scale=1.0):
        os.environ["FAIR_CALIB_COMPILE"] = env
        h = [t * scale for t in inputs.hidden]
        with torch.no_grad():
            for c in clips:                       # the clip logits, perturbed alike
                c.mul_(scale)
        try:
            with torch.enable_grad():
                return call_block(block, inputs.with_hidden(h), 0).detach()
        finally:
            with torch.no_grad():
                for c in clips:
                    c.div_(scale)

    ref = out("0")
    rec["block_rel_compiled_vs_eager"] = rel(ref, out("1"))
    rec["block_rel_eager_1e-7_perturbation"] = rel(ref, out("0", 1.0 + 1e-7))
    os.environ["FAIR_CALIB_COMPILE"] = "1"
    rec["compile_fell_back"] = fused.fell_back()
    emit(rec)
    del lm


def profile_calibration(shape: str, args, dev: str) -> None:
    """Where a training step's time goes: 1 block, 16 sequences, profiled after an unprofiled
    warm-up calibration (no compilation in the profile). Two profiled calibrations, without
    training (epochs 0: targets, initial loss, moves) and with one epoch, are subtracted: per
    training step, wall time against the GPU's busy time (kernel time summed) and the kernel
    count. A step whose wall time is far above its kernel time is bound by the host (Python,
    autograd, kernel launches), not by the GPU. Prints the one-epoch profile's top operators by
    GPU time and by CPU time."""
    from torch.profiler import ProfilerActivity, profile

    lm = shapes.build(shape, layers=1, device=dev)
    lm.model.to("cpu")
    vocab = shapes.SHAPES[shape]["vocab_size"]
    ids = torch.randint(0, vocab - 2, (16, args.seq_len), generator=torch.Generator().manual_seed(0))
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])

    def run_once(epochs):
        method = make_method({"type": "fair_calib", "epochs": epochs}, 4, 4, seed=0)
        t0 = time.perf_counter()
        calibrate(lm, method, ids, "/nonexistent-not-written", weights=torch.ones(args.seq_len),
                  batch_size=args.batch_size, log=lambda s: None, device=dev, write_outputs=False)
        sync(dev)
        return time.perf_counter() - t0

    run_once(2)                                 # compiles the chains
    plain = {e: run_once(e) for e in (0, 1)}
    res = {}
    for epochs in (0, 1):
        with profile(activities=acts) as prof:
            wall = run_once(epochs)
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        res[epochs] = (wall, sum(e.device_time for e in kernels) / 1e6, len(kernels))
    events = prof.key_averages()
    for key in (("self_cuda_time_total", "cpu_time_total") if dev == "cuda"
                else ("cpu_time_total",)):
        print(events.table(sort_by=key, row_limit=30, max_name_column_width=70), flush=True)
    steps = len(ids) // args.batch_size
    emit({"kind": "profile", "shape": shape, "device": dev_name(dev), "steps": steps,
          "step_wall_s": (plain[1] - plain[0]) / steps,
          "step_wall_profiled_s": (res[1][0] - res[0][0]) / steps,
          "step_gpu_kernel_s": (res[1][1] - res[0][1]) / steps,
          "step_kernels": (res[1][2] - res[0][2]) / steps,
          "untrained_wall_s": plain[0], "untrained_gpu_kernel_s": res[0][1]})
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
    method.prepare_model(lm)
    for i, block in enumerate(lm.blocks):
        method.quantize_block(block, groups, None, i)
        fold_block(block, drop_fp=True)       # as load_quantized does
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
    ap.add_argument("--compare-eager", default="",
                    help="comma list of shapes to also calibrate with FAIR_CALIB_COMPILE=0")
    ap.add_argument("--compare-no-recompute", default="",
                    help="comma list of shapes to also calibrate without recomputing the chains")
    ap.add_argument("--check-fused", action="store_true",
                    help="first compare compiled and eager chains (loss, gradients) on one block")
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
    if args.check_fused:
        check_fused(names[-1], dev)
    for name in names:
        if "calibration" not in skip:
            bench_calibration(name, args, dev, peak)
            if name in args.compare_no_recompute.split(","):
                qlinear.CHECKPOINT_QUANT = False
                bench_calibration(name, args, dev, peak)
                qlinear.CHECKPOINT_QUANT = True
            if name in args.compare_eager.split(","):
                os.environ["FAIR_CALIB_COMPILE"] = "0"
                bench_calibration(name, args, dev, peak)
                os.environ["FAIR_CALIB_COMPILE"] = "1"
            if args.compare_kron:
                default_kron, transforms.KRON_MODE = transforms.KRON_MODE, "bmm"
                bench_calibration(name, args, dev, peak)
                transforms.KRON_MODE = default_kron
        if "forward" not in skip:
            bench_forward(name, args, dev)


if __name__ == "__main__":
    main()
