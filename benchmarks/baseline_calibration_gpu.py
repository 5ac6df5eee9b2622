"""How long does each of QDLM's baselines take to calibrate an 8B model? (issue 31: the
calibration times ``fair_calib/cost.py`` prices them at are assumptions until measured)

Random weights at the real LLaDA-8B / Dream-7B widths, ``--layers`` blocks (default 2), the
model on the GPU; each method as ``config/qdlm.yaml`` runs it (GPTQ W4 and AWQ W4 group 128,
SmoothQuant W8A8 alpha 0.5, DuQuant W8A8 and W4A4 block 128 / 256 rotation steps), on random
token ids of the config's calibration size (128 x 2,048; AWQ 128 x 512). One JSON line per
(model, method): seconds per block after the first (the first carries the capture of the
inputs), the projection for all blocks, and ``cost.py``'s assumption beside it.

    PYTHONPATH=. python benchmarks/baseline_calibration_gpu.py [--shapes llada-8b dream-7b]
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
from fair_calib import cost  # noqa: E402
from fair_calib.calibrate import calibrate  # noqa: E402
from fair_calib.methods import make_method  # noqa: E402

METHODS = {   # name: (method config, w_bits, a_bits, calibration seq_len), as config/qdlm.yaml
    "gptq-w4": ({"type": "gptq", "group_size": 128}, 4, 16, 2048),
    "awq-w4": ({"type": "awq", "group_size": 128}, 4, 16, 512),
    "smoothquant": ({"type": "smoothquant", "alpha": 0.5}, 8, 8, 2048),
    "duquant-w8a8": ({"type": "duquant", "alpha": 0.5, "block_size": 128,
                      "max_rotation_step": 256}, 8, 8, 2048),
    "duquant": ({"type": "duquant", "alpha": 0.5, "block_size": 128,
                 "max_rotation_step": 256}, 4, 4, 2048),
}


def emit(rec: dict) -> None:
    print(json.dumps(rec), flush=True)


def time_method(shape: str, name: str, layers: int, n_samples: int, device: str) -> dict:
    mcfg, wb, ab, seq = METHODS[name]
    lm = shapes.build(shape, layers=layers, device=device)
    vocab = shapes.SHAPES[shape]["vocab_size"]
    ids = torch.randint(0, vocab - 2, (n_samples, seq),
                        generator=torch.Generator().manual_seed(0))
    stamps = [time.perf_counter()]

    def done(i: int) -> None:
        if device == "cuda":
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    calibrate(lm, make_method(dict(mcfg), wb, ab, seed=0), ids, "/nonexistent-not-written",
              batch_size=4, on_block_done=done, log=lambda s: None, write_outputs=False)
    per_block = [b - a for a, b in zip(stamps, stamps[1:])]
    steady = statistics.median(per_block[1:]) if len(per_block) > 1 else per_block[0]
    blocks = shapes.SHAPES[shape]["num_hidden_layers"]
    fam = "llada" if shape.startswith("llada") else "dream"
    return {"kind": "baseline_calibration", "shape": shape, "method": name,
            "tokens": n_samples * seq, "block_s": [round(s, 1) for s in per_block],
            "projected_min": round((per_block[0] + steady * (blocks - 1)) / 60, 1),
            "cost_py_assumed_min": cost.CALIB_FIXED_MIN.get(mcfg["type"]),
            "peak_gpu_gb": (round(torch.cuda.max_memory_allocated() / 2**30, 1)
                            if device == "cuda" else None), "family": fam}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["llada-8b", "dream-7b"])
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--n-samples", type=int, default=128)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script only")
    args = ap.parse_args(argv)
    emit({"kind": "env", "torch": torch.__version__,
          "gpu": torch.cuda.get_device_name() if args.device == "cuda" else args.device})
    for shape in args.shapes:
        for name in args.methods:
            emit(time_method(shape, name, args.layers, args.n_samples, args.device))
            if args.device == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
