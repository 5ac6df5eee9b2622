"""GPU benchmarks of decoding overhead, Stage I probing throughput and MC-likelihood evaluation
at the real LLaDA-8B / Dream-7B shapes with random weights.

    PYTHONPATH=. python benchmarks/decode_probe_eval_gpu.py [--layers N] [--quick]

Prints one JSON line per measurement:

* ``matmul``: measured dense bf16 throughput (the anchor for utilisation).
* ``decode_overhead``: one decoding step of the project's sampler (LLaDA low_confidence,
  Dream entropy) vs. the bare model forward on the same batch (batch 8, prompt 128 + window
  256). overhead = step - forward, as a fraction of the step (issue bar: <= 5 %).
* ``probe``: random-commit probing steps (K = 256 window, prompt 128) at several batch sizes;
  utilisation = forward matmul FLOPs / step time / measured peak; projection of the paper's
  budget (512 samples x 256 steps) = ceil(512 / B) * 256 * step time (bar: <= 30 min on H100).
* ``mc_likelihood``: documents/s of the LLaDA stratified MC estimator (mc_num 128, 32 rows per
  forward, 4 choices of 8 tokens after a 96-token context) for FP and fake-quant W4A4 (RTN
  folded weights + per-token activation quantization).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.shapes import SHAPES, build, cuda_time, forward_flops, matmul_tflops  # noqa: E402


PROFILE = False


def emit(**rec):
    print(json.dumps(rec), flush=True)


def prompts(batch: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab - 1000, (batch, length), generator=g).tolist()


@torch.no_grad()
def decode_overhead(loaded, shape: str, policy_name: str, peak: float, layers: int | None) -> None:
    from fair_calib.decoding import generate, make_policy

    batch, lp, k, steps = 8, 128, 256, 16
    over = {"name": policy_name, "gen_length": k, "steps": steps}
    if policy_name == "low_confidence":
        over["block_length"] = 32 if steps % (k // 32) == 0 else k
    policy = make_policy(loaded.adapter.decoding, over)
    ps = prompts(batch, lp, SHAPES[shape]["vocab_size"])
    ids = torch.tensor(ps, device="cuda")
    ids = torch.cat([ids, torch.full((batch, k), loaded.mask_id, device="cuda")], 1)
    attn = torch.ones_like(ids)
    # The forward the sampler needs: the whole sequence, LM head on the window only.
    fwd = cuda_time(lambda: loaded.logits(ids, None, keep_last=k), warmup=2, iters=5)
    gen_t = cuda_time(lambda: generate(loaded, ps, policy), warmup=1, iters=2)
    step = gen_t / steps
    if PROFILE:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            generate(loaded, ps, policy)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25), flush=True)
    emit(bench="decode_overhead", shape=shape, layers=layers, policy=policy_name, batch=batch,
         prompt=lp, gen_length=k, forward_s=round(fwd, 5), step_s=round(step, 5),
         overhead_frac=round((step - fwd) / step, 4),
         forward_tflops=round(forward_flops(shape, batch, lp + k, layers) / fwd / 1e12, 1),
         peak_tflops=round(peak, 1))


@torch.no_grad()
def probe_throughput(loaded, shape: str, batch: int, peak: float, layers: int | None,
                     full_layers: int) -> None:
    from fair_calib.probe import probe_model

    lp, k, steps_measured = 128, 256, 8
    ps = prompts(batch, lp, SHAPES[shape]["vocab_size"], seed=1)
    settings = {"steps": steps_measured, "gen_length": k, "batch_size": batch, "temperature": 0.0}
    probe_model(loaded, ps, {**settings, "steps": 2}, seed=0, progress=False)   # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    probe_model(loaded, ps, settings, seed=0, progress=False)
    torch.cuda.synchronize()
    step = (time.perf_counter() - t0) / steps_measured
    fl = forward_flops(shape, batch, lp + k, layers)
    ids = torch.tensor(ps, device="cuda")
    ids = torch.cat([ids, torch.full((batch, k), loaded.mask_id, device="cuda")], 1)
    fwd = cuda_time(lambda: loaded.logits(ids, keep_last=k), warmup=1, iters=3)
    # Project to the full depth: the per-layer cost scales linearly, the head does not.
    scale = full_layers / (layers or full_layers)
    head = 2 * batch * (lp + k) * SHAPES[shape]["hidden_size"] * SHAPES[shape]["vocab_size"]
    step_full = (step - step * head / fl) * scale + step * head / fl if layers else step
    proj_min = math.ceil(512 / batch) * 256 * step_full / 60
    emit(bench="probe", shape=shape, layers=layers, batch=batch, prompt=lp, window=k,
         step_s=round(step, 4), forward_s=round(fwd, 4),
         overhead_frac=round((step - fwd) / step, 4), utilisation=round(fl / step / 1e12 / peak, 3),
         achieved_tflops=round(fl / step / 1e12, 1), projected_full_depth_step_s=round(step_full, 4),
         projected_512x256_min=round(proj_min, 1), peak_tflops=round(peak, 1),
         peak_mem_gb=round(torch.cuda.max_memory_allocated() / 2**30, 1))


@torch.no_grad()
def mc_docs_per_s(loaded, shape: str, label: str, layers: int | None) -> None:
    from fair_calib.evaluate.likelihood import likelihood_settings, mc_loglikelihood

    st = likelihood_settings(loaded.adapter.likelihood | {"estimator": "llada"},
                             {"mc_num": 128, "batch_size": 32})
    vocab = SHAPES[shape]["vocab_size"]
    ctx = prompts(1, 96, vocab, seed=2)[0]
    choices = prompts(4, 8, vocab, seed=3)
    gen = torch.Generator().manual_seed(0)
    mc_loglikelihood(loaded, ctx, choices[0], st, gen)                     # warm-up
    torch.cuda.synchronize()
    docs = 3
    t0 = time.perf_counter()
    for _ in range(docs):
        for c in choices:
            mc_loglikelihood(loaded, ctx, c, st, gen)
    torch.cuda.synchronize()
    sec = (time.perf_counter() - t0) / docs
    emit(bench="mc_likelihood", shape=shape, layers=layers, model=label, mc_num=128, rows=32,
         context=96, choices=4, choice_len=8, docs_per_s=round(1 / sec, 3), sec_per_doc=round(sec, 3))


def fake_quant_rtn(loaded, w_bits=4, a_bits=4):
    """W4A4 round-to-nearest through the project's method registry (folded weights)."""
    import tempfile

    from fair_calib.calibrate import calibrate
    from fair_calib.methods import load_quantized, make_method

    ids = torch.randint(10, 1000, (4, 128))
    out = tempfile.mkdtemp()
    calibrate(loaded, make_method({"type": "rtn", "export": False}, w_bits, a_bits), ids, out,
              batch_size=4, log=lambda s: None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=None, help="fewer layers (projected to full)")
    ap.add_argument("--shapes", nargs="+", default=["llada-8b", "dream-7b"])
    ap.add_argument("--batches", nargs="+", type=int, default=[32, 64])
    ap.add_argument("--skip", nargs="*", default=[])
    ap.add_argument("--profile", action="store_true", help="kernel table of one decode call")
    args = ap.parse_args()
    global PROFILE
    PROFILE = args.profile
    torch.backends.cuda.matmul.allow_tf32 = True
    peak = matmul_tflops()
    emit(bench="matmul", device=torch.cuda.get_device_name(), tflops=round(peak, 1),
         torch=torch.__version__)
    for shape in args.shapes:
        loaded = build(shape, layers=args.layers)
        full = SHAPES[shape]["num_hidden_layers"]
        if "decode" not in args.skip:
            decode_overhead(loaded, shape, loaded.adapter.decoding["policy"], peak, args.layers)
        if "probe" not in args.skip:
            for b in args.batches:
                torch.cuda.reset_peak_memory_stats()
                probe_throughput(loaded, shape, b, peak, args.layers, full)
        if "mc" not in args.skip and shape == "llada-8b":
            mc_docs_per_s(loaded, shape, "fp", args.layers)
            calib = fake_quant_rtn(loaded)
            del loaded
            torch.cuda.empty_cache()
            from fair_calib.methods import load_quantized
            loaded = load_quantized(build(shape, layers=args.layers), calib)
            mc_docs_per_s(loaded, shape, "w4a4_rtn_fakequant", args.layers)
        del loaded
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
