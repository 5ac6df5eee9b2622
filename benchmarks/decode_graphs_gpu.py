"""How long does the grid's batch-1 decoding take, eager against CUDA-graph replay, bf16 and
quantized, and does replay give eager's tokens and logits?

The project's ``decode`` at the real LLaDA-8B / Dream-7B shapes (random weights, full depth
unless ``--layers``): batch 1, gen_length 256, 256 steps, prompts of 600 and 152 tokens, LLaDA
low_confidence in blocks of 32 (float32 rotary, as its hub checkpoints load), Dream entropy.
bf16 and each structure (``benchmarks/shapes.py`` at W4A4 or W8A8 on the integer GEMM, codes
one a byte as on CUDA) decode eagerly and through :mod:`fair_calib.models.graphs` (capture
included); one JSON line each: wall time, peak memory, capture cost, and whether the tokens and
every step's logits (a 64-bit fingerprint of their bits) equal the eager decode's.

    PYTHONPATH=. python benchmarks/decode_graphs_gpu.py [--shapes llada-8b dream-7b] [--layers N]
        [--structures fair_calib quarot rtn] [--bits 4|8]
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import shapes  # noqa: E402
from benchmarks.shapes import STRUCTURES, emit  # noqa: E402
from fair_calib.decoding import decode, make_policy  # noqa: E402

PROMPTS = (600, 152)
POLICY = {"llada-8b": {"name": "low_confidence", "gen_length": 256, "steps": 256,
                       "block_length": 32, "temperature": 0.0, "cfg_scale": 0.0},
          "dream-7b": {"name": "entropy", "gen_length": 256, "steps": 256, "temperature": 0.0,
                       "alg_temp": 0.0, "eps": 1e-3}}


class Fingerprints:
    """A decoding recorder keeping a fingerprint of each step's logits on the GPU (no sync):
    the sum of their bits read as int32 (one pass over the logits): equal fingerprints over
    256 steps mean bit-identical logits in practice. The timed runs use it too (eager and
    replay alike)."""

    def __init__(self):
        self.prints: list[torch.Tensor] = []

    def start(self, batch, gen_length, steps):
        self.prints.clear()

    def step(self, t, logits, masked, committed, window):
        self.prints.append(logits.contiguous().view(torch.int32).sum(dtype=torch.int64))

    def finish(self, tokens):
        pass


def prompt(shape: str, n: int) -> list[int]:
    vocab = shapes.SHAPES[shape]["vocab_size"]
    g = torch.Generator().manual_seed(n)
    return torch.randint(10, vocab - 1000, (n,), generator=g).tolist()


def run_decode(lm, shape: str, n: int, graphs: bool) -> dict:
    policy = make_policy(lm.adapter.decoding, POLICY[shape])
    lm.replay_graphs(graphs)
    rec = Fingerprints()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = decode(lm, [prompt(shape, n)], policy, recorder=rec)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    st = lm.graphs.stats if graphs else None
    return {"seconds": secs, "peak_gb": torch.cuda.max_memory_allocated() / 2**30,
            "tokens": out.tokens.tolist(), "prints": torch.stack(rec.prints).tolist(),
            "captures": st.captures if st else 0, "replays": st.replays if st else 0,
            "capture_s": st.capture_s if st else 0.0}


def warm_up(lm, shape: str, n: int) -> None:
    """A short eager decode at the prompt's shape first: Triton compiles a structure's kernels
    on their first call, which no timed decode should include."""
    pol = dict(POLICY[shape], steps=8)
    lm.replay_graphs(False)
    decode(lm, [prompt(shape, n)], make_policy(lm.adapter.decoding, pol))
    torch.cuda.synchronize()


def measure(lm, shape: str, variant: str, eager: bool) -> None:
    """Decode each prompt (eagerly where ``eager``, then through graphs); one line per run, the
    replay compared with the eager decode where it ran."""
    for n in PROMPTS:
        warm_up(lm, shape, n)
        runs = {}
        if eager:
            runs["eager"] = run_decode(lm, shape, n, False)
        runs["graphs"] = run_decode(lm, shape, n, True)
        base = runs.get("eager")
        for mode, r in runs.items():
            rec = {"kind": "decode", "shape": shape, "variant": variant, "mode": mode,
                   "prompt": n, **{k: r[k] for k in ("seconds", "peak_gb", "captures",
                                                     "replays", "capture_s")}}
            if base is not None and mode == "graphs":
                rec["tokens_equal_eager"] = r["tokens"] == base["tokens"]
                rec["logits_equal_eager"] = r["prints"] == base["prints"]
            emit(rec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["llada-8b", "dream-7b"])
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--structures", nargs="+", default=list(STRUCTURES), choices=STRUCTURES)
    ap.add_argument("--bits", type=int, default=4, choices=[4, 8],
                    help="W4A4 (default) or W8A8, both on the int8 GEMM")
    args = ap.parse_args(argv)
    emit({"kind": "env", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__})
    for shape in args.shapes:
        lm = shapes.build(shape, layers=args.layers, authors_rotary=True)
        measure(lm, shape, "bf16", True)
        for name in args.structures:
            del lm
            gc.collect()
            torch.cuda.empty_cache()
            lm = shapes.build(shape, layers=args.layers, authors_rotary=True)
            t0 = time.perf_counter()
            shapes.quantize(lm, shapes.block_groups(lm, "cuda"), name, args.bits)
            shapes.to_byte_storage(lm)          # what FAIR_CALIB_LOWBIT_STORAGE=auto runs on CUDA
            emit({"kind": "quantized", "shape": shape, "structure": name,
                  "seconds": round(time.perf_counter() - t0, 1)})
            # eager quantized decodes are slow (13-17 s): W4A4 compares FAIR-Calib's only
            measure(lm, shape, f"w{args.bits}a{args.bits}_{name}",
                    name == "fair_calib" or args.bits == 8)
        del lm
        gc.collect()
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
