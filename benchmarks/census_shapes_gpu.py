"""Quantized / bf16 time at the census's heavy shapes (the ratios of fair_calib/cost.py's
QUANT_RATIOS), on random weights at the real LLaDA-8B / Dream-7B shapes, full depth.

    PYTHONPATH=. python benchmarks/census_shapes_gpu.py --shapes llada-8b dream-7b
        [--census results/census.parquet] [--forward-shapes 1x1984 16x128 ...] [--max-shapes 8]
        [--decode-steps 16] [--no-decode] [--iters 7]

Shapes: per model, the census's heaviest (rows x tokens-bucket) shapes of its family -- those
that carry 90% of the paper grid's forwards or of its projected GPU time, ordered by GPU time,
at most ``--max-shapes`` -- read from ``--census`` (``fair-calib census --configfile
config/paper.yaml --out results/census.parquet``, priced by fair_calib.cost.priced), else
``DEFAULT_SHAPES`` (that selection on the paper census of 2026-11-27), or
``--forward-shapes`` for every model.

For each shape, bf16 and each W4A4 structure (FAIR_CALIB_LOWBIT=real: ``transform``, the
FAIR-Calib/FlatQuant online Kronecker transforms; ``hadamard``, QuaRot's online Hadamards;
``plain``, RTN), built by benchmarks/structures.py:

As the evaluation stage runs them (``LoadedModel.replay_graphs``: repeated forwards replayed
from CUDA graphs; 4-bit codes one per byte on CUDA):

* ``forward``: one forward of rows x tokens (LM head on the last 16 positions, an MC target),
  median of ``--iters`` CUDA-event timings of the replay after the warm-up and capture calls;
* ``decode`` (generation shapes, rows 1): fair_calib's own batch-1 decode of ``--decode-steps``
  steps over a prompt of tokens - gen_length and gen_length = min(256, tokens / 2) (LLaDA:
  low_confidence, one block; Dream: entropy), timed whole after a 2-step warm-up decode
  (which captures the step's graph): the grid's execution mode, host work included (the cost
  prices generation at decode ratios).

One JSON line per (model, structure, mode, shape): times, the ratio to bf16 and the
QUANT_RATIOS entry it gives; appended to ``$OUT/census_shapes.jsonl`` when ``OUT`` is set.
The last lines print the RATIO_SOURCES line (command, card, torch, date) and the entries to
paste into QUANT_RATIOS. Both models with the defaults took 76 s on a lent H200 (2026-11-27,
docs/benchmarks.md); not timed on an H100.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FAMILY = {"llada-8b": "llada", "dream-7b": "dream"}
STRUCTURES = ("transform", "hadamard", "plain")
SOURCE = "census-gpu"            # the source tag of the printed QUANT_RATIOS entries

# select_shapes of the paper census (fair-calib census --configfile config/paper.yaml,
# 2026-11-27, priced at bf16 replay speed, the Instruct models on their authors' generation
# recipes, W8A8 on the int8 GEMM): (request class, rows, tokens bucket), by projected GPU time,
# 8 at most. QUANT_RATIOS' "census-gpu" entries were measured at the selection before W8A8 ran
# real under auto, which had LLaDA 1 x 896 where this has 1 x 768 (docs/benchmarks.md).
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
    from fair_calib.census import heavy_shapes

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


def shapes_for(model: str, args) -> list[tuple]:
    if args.forward_shapes:
        return [parse_shape(s) for s in args.forward_shapes]
    family = FAMILY[model]
    if args.census:
        from fair_calib.io import read_parquet

        from fair_calib.cost import priced

        df, _ = read_parquet(args.census)
        return select_shapes(priced(df.to_dict("records")), family, max_shapes=args.max_shapes)
    return DEFAULT_SHAPES[family][:args.max_shapes]


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


def emit(rec: dict) -> None:
    line = json.dumps(rec)
    print(line, flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(Path(out) / "census_shapes.jsonl", "a") as f:
            f.write(line + "\n")


# ----------------------------------------------------------------------------- GPU timing
def time_forward(lm, ids, iters: int, keep_last: int = 16) -> float:
    """GPU seconds of one forward as the pipeline runs an MC request's batches: replayed from
    a CUDA graph (fair_calib.models.graphs; the first call warms up, the second captures),
    LM head on the last ``keep_last`` positions (the targets)."""
    import torch

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
    import torch

    from fair_calib.decoding import decode, make_policy

    gen = min(256, max(steps, (tokens // 2) // steps * steps))
    over = {"gen_length": gen, "steps": steps}
    if lm.adapter.decoding.get("block_length"):
        over["block_length"] = gen
    policy = make_policy(lm.adapter.decoding, over)
    warm = make_policy(lm.adapter.decoding, {**over, "steps": 2})
    vocab = lm.model.config.vocab_size
    prompt = torch.randint(10, vocab - 1000, (tokens - gen,),
                           generator=torch.Generator().manual_seed(1)).tolist()
    gens = lambda: [torch.Generator(device="cuda").manual_seed(100)]  # noqa: E731
    with torch.no_grad():
        decode(lm, [prompt], warm, gens())
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        decode(lm, [prompt], policy, gens())
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def measure(model_name: str, lm, shape_list, args) -> dict:
    """{(mode, rows, tokens): seconds} of the model as it is."""
    import torch

    from benchmarks import structures

    out = {}
    lm.replay_graphs()                 # as the evaluation stage runs the model
    for cls, rows, tokens in shape_list:
        ids = structures.ids_for(model_name, rows, tokens, "cuda")
        out[("forward", rows, tokens)] = time_forward(lm, ids, args.iters)
        if cls == "generate" and rows == 1 and not args.no_decode:
            out[("decode", rows, tokens)] = time_decode(lm, tokens, args.decode_steps)
        del ids
        torch.cuda.empty_cache()
    return out


def bench_model(model_name: str, args) -> list[dict]:
    import torch

    from benchmarks import shapes
    from benchmarks import structures

    shape_list = shapes_for(model_name, args)
    spec = shapes.SHAPES[model_name]
    hd = spec["hidden_size"] // spec["num_attention_heads"]
    quantize = {"transform": lambda lm, g: structures.quantize_fair_calib(lm, g),
                "hadamard": lambda lm, g: structures.quantize_quarot(lm, g, hd),
                "plain": lambda lm, g: structures.quantize_rtn(lm, g)}
    device = torch.cuda.get_device_name()
    lm = shapes.build(model_name, device="cuda")
    groups = structures.block_groups(lm, "cuda")
    bf16 = measure(model_name, lm, shape_list, args)
    recs = []
    for i, structure in enumerate(args.structures):
        if i:                                  # the first quantizes the bf16 model in place
            del lm
            gc.collect()
            torch.cuda.empty_cache()
            lm = shapes.build(model_name, device="cuda")
        t0 = time.perf_counter()
        quantize[structure](lm, groups)
        structures.to_byte_storage(lm)          # codes one per byte, as load_quantized on CUDA
        torch.cuda.synchronize()
        attach_s = time.perf_counter() - t0
        q = measure(model_name, lm, shape_list, args)
        for (mode, rows, tokens), sec in q.items():
            rec = record(model_name, structure, mode, rows, tokens, bf16[(mode, rows, tokens)], sec,
                         device=device, torch=torch.__version__, iters=args.iters,
                         decode_steps=args.decode_steps if mode == "decode" else None,
                         attach_s=round(attach_s, 2))
            emit(rec)
            recs.append(rec)
    del lm
    torch.cuda.empty_cache()
    return recs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=list(FAMILY), choices=list(FAMILY),
                    help="model shapes (benchmarks/shapes.py)")
    ap.add_argument("--census", default=None, help="census Parquet (fair-calib census --out)")
    ap.add_argument("--forward-shapes", nargs="+", default=None, metavar="ROWSxTOKENS")
    ap.add_argument("--max-shapes", type=int, default=8)
    ap.add_argument("--structures", nargs="+", default=list(STRUCTURES), choices=STRUCTURES)
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--no-decode", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("FAIR_CALIB_LOWBIT", "real")
    import torch

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
    print("# fair_calib/cost.py: RATIO_SOURCES and the QUANT_RATIOS entries measured here")
    print(f"RATIO_SOURCES[{SOURCE!r}] = {command!r} + "
          f"', {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d')}'")
    for key, items in entries(recs).items():
        print(f"{key}: {items},")


if __name__ == "__main__":
    main()
