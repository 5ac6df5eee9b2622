"""Host side of the real W4A4 forward (issue 20): where the CPU time to enqueue one forward goes.

The quantized forward launches about three times the kernels of the bf16 one, and on the lent
machines its enqueue took 45-130 ms against the bf16 forward's 20-55 ms: where the host is
slow, the host, not the GPU, sets its time. This profiles the Python side of one forward
(cProfile; the GPU synchronised before and after) of the bf16 model and of the FAIR-Calib
W4A4 model at the real shapes, and prints the functions with the most own time, the launches
per forward (torch profiler) and the enqueue time without the profiler, with the Triton
kernels launched directly (``fair_calib.triton_launch``, the default) and through Triton's
own launch path.

    PYTHONPATH=. python benchmarks/lowbit_host.py [--shapes dream-7b llada-8b] [--tokens 32x104]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import lowbit_gpu as lg  # noqa: E402
from benchmarks import shapes  # noqa: E402
from fair_calib import triton_launch  # noqa: E402


@torch.no_grad()
def enqueue_ms(model, ids, n=9) -> float:
    """Median host time to enqueue one forward from an idle GPU."""
    return lg.host_times(lambda: model(input_ids=ids), n)[0] * 1e3


def launches(model, ids) -> int:
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(input_ids=ids)
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA")


def host_profile(model, ids, top: int) -> list[dict]:
    pr = cProfile.Profile()
    with torch.no_grad():
        torch.cuda.synchronize()
        pr.enable()
        model(input_ids=ids)
        pr.disable()
        torch.cuda.synchronize()
    st = pstats.Stats(pr, stream=io.StringIO())
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _) in st.stats.items():
        rows.append({"fn": f"{Path(file).name}:{line}:{fn}", "calls": nc,
                     "own_ms": tt * 1e3, "cum_ms": ct * 1e3})
    return sorted(rows, key=lambda r: -r["own_ms"])[:top]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["dream-7b", "llada-8b"])
    ap.add_argument("--tokens", default="32x104")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args(argv)
    b, s = (int(v) for v in args.tokens.split("x"))
    for shape in args.shapes:
        lm = shapes.build(shape, device="cuda")
        ids = lg.ids_for(shape, b, s, "cuda")
        groups = lg.block_groups(lm, "cuda")
        for name in ("bf16", "w4a4_fair_calib"):
            if name == "w4a4_fair_calib":
                lg.quantize_fair_calib(lm, groups)
            with torch.no_grad():
                for _ in range(3):
                    lm.model(input_ids=ids)              # compile, cache decisions
            torch.cuda.synchronize()
            rec = {"kind": "host", "shape": shape, "tokens": args.tokens, "model": name,
                   "enqueue_ms": enqueue_ms(lm.model, ids),
                   "launches": launches(lm.model, ids),
                   "layers": len(lm.blocks)}
            triton_launch.DIRECT_LAUNCH = False             # every launch through Triton's path
            rec["enqueue_ms_triton_launch"] = enqueue_ms(lm.model, ids)
            triton_launch.DIRECT_LAUNCH = True
            print(json.dumps(rec), flush=True)
            for r in host_profile(lm.model, ids, args.top):
                print(f"  {r['own_ms']:8.2f} own {r['cum_ms']:8.2f} cum {r['calls']:6d}  {r['fn']}")
        del lm
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
