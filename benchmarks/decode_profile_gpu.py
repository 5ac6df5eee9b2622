"""Where does a replayed batch-1 decoding step spend its time? (issue 30, item 3: "then cut what
the GPU still spends at these shapes, measured, not guessed")

The project's ``decode`` at the real LLaDA-8B / Dream-7B shapes (random weights, full depth
unless ``--layers``), prompts of 600 and 152 tokens, gen_length 256, ``--steps`` steps (32: every
step has the grid's shape, fewer of them), bf16 and W4A4 structures (``--variants``; one code a byte), each
through CUDA-graph replay after a warm-up decode that captured its graph, under
``torch.profiler``. One JSON line per decode: wall time a step, GPU busy time a step (the union
of its kernels' intervals), the idle remainder, and the kernels that take the most GPU time (per
step, by name), split into the replayed forward's and the step's own work (commits, sampling).
With ``--eager`` the same decodes also run eagerly (the kernel breakdown where CUPTI does not
see kernels inside graphs).

    PYTHONPATH=. python benchmarks/decode_profile_gpu.py [--shapes llada-8b dream-7b]
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import shapes  # noqa: E402
from benchmarks.decode_graphs_gpu import POLICY, prompt  # noqa: E402
from benchmarks.structures import (block_groups, emit, quantize_fair_calib,  # noqa: E402
                                   quantize_quarot, quantize_rtn, to_byte_storage)
from fair_calib.decoding import decode, make_policy  # noqa: E402

TOP = 14


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of ``[start, end)`` intervals (microseconds)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def kernel_events(prof) -> list:
    return [e for e in prof.events() if e.device_type == DeviceType.CUDA and e.time_range.end > 0]


def summarise(prof, steps: int, wall_s: float) -> dict:
    """Busy/idle per step and the heaviest kernels per step (GPU microseconds)."""
    ks = kernel_events(prof)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in ks:
        rec = by_name[e.name[:90]]
        rec[0] += 1
        rec[1] += e.time_range.elapsed_us()
    busy = union_us([(e.time_range.start, e.time_range.end) for e in ks])
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:TOP]
    return {"steps": steps, "wall_ms_step": 1e3 * wall_s / steps,
            "busy_ms_step": busy / 1e3 / steps,
            "kernels_step": len(ks) / steps,
            "kernel_sum_ms_step": sum(v[1] for v in by_name.values()) / 1e3 / steps,
            "top": [{"name": n, "per_step": c / steps, "us_step": round(t / steps, 1)}
                    for n, (c, t) in top]}


def profiled_decode(lm, shape: str, n: int, steps: int, graphs: bool) -> dict:
    pol = dict(POLICY[shape], steps=steps)
    policy = make_policy(lm.adapter.decoding, pol)
    lm.replay_graphs(graphs)
    ids = [prompt(shape, n)]
    decode(lm, ids, policy)                 # eager first call, then the capture (graphs)
    decode(lm, ids, policy)
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        decode(lm, ids, policy)
        sync()
        wall = time.perf_counter() - t0
    return summarise(prof, steps, wall)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def quantize(lm, shape: str, variant: str, dev: str) -> None:
    """W4A4 ``variant`` on the real low-bit path, 4-bit codes one a byte (the CUDA default)."""
    groups = block_groups(lm, dev)
    if variant == "fair_calib":
        quantize_fair_calib(lm, groups)
    elif variant == "quarot":
        hd = shapes.SHAPES[shape]["hidden_size"] // shapes.SHAPES[shape]["num_attention_heads"]
        quantize_quarot(lm, groups, hd)
    else:
        quantize_rtn(lm, groups)
    to_byte_storage(lm)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["llada-8b", "dream-7b"])
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompts", type=int, nargs="+", default=[600, 152])
    ap.add_argument("--variants", nargs="+", default=["bf16", "fair_calib"],
                    choices=["bf16", "fair_calib", "quarot", "rtn"])
    ap.add_argument("--eager", action="store_true", help="also profile eager decodes")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script only")
    args = ap.parse_args(argv)
    dev = args.device
    emit({"kind": "env", "torch": torch.__version__,
          "gpu": torch.cuda.get_device_name() if dev == "cuda" else dev})
    for shape in args.shapes:
        for variant in args.variants:
            lm = shapes.build(shape, layers=args.layers, device=dev, authors_rotary=True)
            if variant != "bf16":
                quantize(lm, shape, variant, dev)
            for n in args.prompts:
                for graphs in ((True, False) if args.eager else (True,)):
                    emit({"kind": "decode_profile", "shape": shape, "variant": variant,
                          "prompt": n, "mode": "graphs" if graphs else "eager",
                          **profiled_decode(lm, shape, n, args.steps, graphs)})
            del lm
            gc.collect()
            if dev == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
