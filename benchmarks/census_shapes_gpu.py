"""Quantized / bf16 time at the census's heavy shapes: the ratios of fair_calib/budget/cost.py's
QUANT_RATIOS, on random weights at the real LLaDA-8B / Dream-7B shapes, full depth.

    PYTHONPATH=. python benchmarks/census_shapes_gpu.py --shapes llada-8b dream-7b
        [--forward-shapes 1x1984 16x128 ...] [--max-shapes 8]
        [--structures transform hadamard plain] [--decode-steps 16] [--no-decode] [--iters 7]

Shapes: ``DEFAULT_SHAPES`` (per family, those carrying 90% of the paper grid's forwards or GPU
time, heaviest first) or ``--forward-shapes``. Structures, by QUANT_RATIOS' names: ``transform``
(FAIR-Calib), ``hadamard`` (QuaRot), ``plain`` (RTN), W4A4 on the real path, run as the
evaluation stage runs them (replayed from CUDA graphs, codes one a byte). ``forward``: one
forward, LM head on the last 16 positions, median of ``--iters`` replays; ``decode`` (rows 1):
a batch-1 decode of ``--decode-steps`` steps whose forwards are 1 x tokens, timed whole after a
warm-up decode that captures. One JSON line per (model, structure, mode, shape) with its
QUANT_RATIOS entry (also in ``$OUT/census_shapes.jsonl``); at the end the RATIO_SOURCES line
and the entries to paste into QUANT_RATIOS.
"""
from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import shapes  # noqa: E402

FAMILY = {"llada-8b": "llada", "dream-7b": "dream"}
METHOD = {"transform": "fair_calib", "hadamard": "quarot", "plain": "rtn"}   # shapes.STRUCTURES
STRUCTURES = tuple(METHOD)
SOURCE = "census-gpu"            # the source tag of the printed QUANT_RATIOS entries
emit = functools.partial(shapes.emit, name="census_shapes")

# select_shapes of the paper census (fair-calib census --configfile config/paper.yaml,
# 2026-11-27): (request class, rows, tokens bucket), by projected GPU time, 8 at most
# (tests/budget/test_census.py checks it against the census).
DEFAULT_SHAPES = {
    "llada": [("generate", 1, 576), ("generate", 1, 640), ("generate", 1, 1984),
              ("generate", 1, 704), ("mc", 16, 192), ("generate", 1, 1920), ("generate", 1, 960),
              ("generate", 1, 768)],
    "dream": [("mc", 32, 128), ("generate", 1, 1024), ("mc", 32, 192), ("mc", 32, 64),
              ("generate", 1, 1088), ("generate", 1, 640), ("generate", 1, 704), ("generate", 1, 384)],
}


# ----------------------------------------------------------------------------- CPU-side logic
def select_shapes(records, family: str, share: float = 0.9, max_shapes: int = 8) -> list[tuple]:
    """(class, rows, tokens) of ``family``: the union of the shapes carrying ``share`` of the
    forwards and of the GPU time, ordered by GPU time, at most ``max_shapes``."""
    from fair_calib.budget.census import heavy_shapes

    records = list(records)
    by_time = heavy_shapes(records, "gpu_seconds", share, family)
    by_count = heavy_shapes(records, "forwards", share, family)
    weight = {}
    for r in records:
        if r["family"] == family:
            key = (r["request_class"], int(r["rows"]), int(r["tokens"]))
            weight[key] = weight.get(key, 0.0) + r["gpu_seconds"]
    keys = {(s["request_class"], s["rows"], s["tokens"]) for s in by_time + by_count}
    return sorted(keys, key=lambda k: (-weight[k], k))[:max_shapes]


def parse_shape(text: str) -> tuple[str, int, int]:
    """``ROWSxTOKENS`` -> (class, rows, tokens); rows 1 is a generation shape."""
    try:
        rows, tokens = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--forward-shapes {text!r}: give ROWSxTOKENS, e.g. 1x1984") from None
    if rows < 1 or tokens < 1:
        raise SystemExit(f"--forward-shapes {text!r}: rows and tokens must be positive")
    return ("generate" if rows == 1 else "mc", rows, tokens)


def record(model: str, structure: str, mode: str, rows: int, tokens: int, bf16_s: float,
           quant_s: float, **extra) -> dict:
    ratio = quant_s / bf16_s
    return {"kind": "census_shape", "model": model, "family": FAMILY[model],
            "structure": structure, "mode": mode, "rows": rows, "tokens": tokens,
            "bf16_s": bf16_s, "quant_s": quant_s, "ratio": round(ratio, 4),
            "entry": [mode, rows, tokens, round(ratio, 3), SOURCE], **extra}


def entries(records) -> dict[str, list]:
    """QUANT_RATIOS entries per "(family, structure)" from the records."""
    out: dict[str, list] = {}
    for r in records:
        out.setdefault(f"({r['family']!r}, {r['structure']!r})", []).append(tuple(r["entry"]))
    return out


# ----------------------------------------------------------------------------- GPU timing
def time_forward(lm, ids, iters: int, keep_last: int = 16) -> float:
    """GPU seconds of one forward as the pipeline runs an MC request's batches: replayed from
    a CUDA graph (fair_calib.models.graphs; the first call warms up, the second captures),
    LM head on the last ``keep_last`` positions (the targets)."""
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(iters)]
    keep = min(keep_last, ids.shape[1])
    with torch.no_grad():
        for _ in range(3):
            lm.logits(ids, keep_last=keep)
        for start, end in ev:
            start.record()
            lm.logits(ids, keep_last=keep)
            end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev) / 1e3


def time_decode(lm, tokens: int, steps: int) -> float:
    """Seconds per step of a batch-1 decode whose forwards are 1 x ``tokens``."""
    from fair_calib.decoding import decode, make_policy

    gen = min(256, max(steps, (tokens // 2) // steps * steps))
    over = {"gen_length": gen, "steps": steps}
    if lm.adapter.decoding.get("block_length"):
        over["block_length"] = gen
    policy = make_policy(lm.adapter.decoding, over)
    warm = make_policy(lm.adapter.decoding, {**over, "steps": 2})
    prompt = torch.randint(10, lm.model.config.vocab_size - 1000, (tokens - gen,),
                           generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        decode(lm, [prompt], warm, [torch.Generator(device="cuda").manual_seed(100)])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        decode(lm, [prompt], policy, [torch.Generator(device="cuda").manual_seed(100)])
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def measure(model_name: str, lm, shape_list, args) -> dict:
    """{(mode, rows, tokens): seconds} of the model as it is."""
    out = {}
    lm.replay_graphs()                 # as the evaluation stage runs the model
    for cls, rows, tokens in shape_list:
        ids = shapes.ids_for(model_name, rows, tokens, "cuda")
        out[("forward", rows, tokens)] = time_forward(lm, ids, args.iters)
        if cls == "generate" and rows == 1 and not args.no_decode:
            out[("decode", rows, tokens)] = time_decode(lm, tokens, args.decode_steps)
        del ids
        torch.cuda.empty_cache()
    return out


def bench_model(model_name: str, args) -> list[dict]:
    shape_list = ([parse_shape(s) for s in args.forward_shapes] if args.forward_shapes
                  else DEFAULT_SHAPES[FAMILY[model_name]][:args.max_shapes])
    lm = shapes.build(model_name, device="cuda")
    groups = shapes.block_groups(lm, "cuda")
    bf16 = measure(model_name, lm, shape_list, args)
    recs = []
    for i, structure in enumerate(args.structures):
        if i:                                  # the first quantizes the bf16 model in place
            del lm
            gc.collect()
            torch.cuda.empty_cache()
            lm = shapes.build(model_name, device="cuda")
        t0 = time.perf_counter()
        shapes.quantize(lm, groups, METHOD[structure])
        shapes.to_byte_storage(lm)          # codes one per byte, as load_quantized on CUDA
        torch.cuda.synchronize()
        attach_s = time.perf_counter() - t0
        for (mode, rows, tokens), sec in measure(model_name, lm, shape_list, args).items():
            recs.append(record(model_name, structure, mode, rows, tokens,
                               bf16[(mode, rows, tokens)], sec,
                               device=torch.cuda.get_device_name(), torch=torch.__version__,
                               iters=args.iters, attach_s=round(attach_s, 2),
                               decode_steps=args.decode_steps if mode == "decode" else None))
            emit(recs[-1])
    del lm
    torch.cuda.empty_cache()
    return recs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=list(FAMILY), choices=list(FAMILY),
                    help="model shapes (benchmarks/shapes.py)")
    ap.add_argument("--forward-shapes", nargs="+", default=None, metavar="ROWSxTOKENS")
    ap.add_argument("--max-shapes", type=int, default=8)
    ap.add_argument("--structures", nargs="+", default=list(STRUCTURES), choices=STRUCTURES)
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--no-decode", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("FAIR_CALIB_LOWBIT", "real")
    if not torch.cuda.is_available():
        sys.exit("census_shapes_gpu.py: needs a CUDA GPU (the real low-bit path)")
    recs = []
    for model_name in args.shapes:
        t0 = time.perf_counter()
        recs += bench_model(model_name, args)
        emit({"kind": "model_done", "model": model_name,
              "wall_s": round(time.perf_counter() - t0, 1)})
    command = "PYTHONPATH=. python benchmarks/census_shapes_gpu.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    print("# fair_calib/budget/cost.py: RATIO_SOURCES and the QUANT_RATIOS entries measured here")
    print(f"RATIO_SOURCES[{SOURCE!r}] = {command!r} + "
          f"', {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d')}'")
    for key, items in entries(recs).items():
        print(f"{key}: {items},")


if __name__ == "__main__":
    main()
