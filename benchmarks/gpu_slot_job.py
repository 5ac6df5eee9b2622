"""One GPU job as the pipeline runs it on a machine of several cards: it takes a GPU slot the
way every stage does (``fair_calib.cli._take_gpu_slot``: a card of its own, before torch
starts CUDA), then decodes with the project's sampler at the LLaDA-8B shapes (random weights).

    PYTHONPATH=. python benchmarks/gpu_slot_job.py [--layers 8] [--rounds 25]

Run several at once (``benchmarks/gpu_slots_pair.sh``): each lands on its own card. Prints
the slot line (stderr) and one JSON line: the card, its PCI bus id, the seconds of the job
(process start to end) and of the decoding work.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

START = time.time()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="llada-8b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=25, help="generate() calls of 64 steps each")
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()

    from fair_calib import cli

    cli._take_gpu_slot(["--settings", json.dumps({"device": "cuda"})])

    import torch

    from benchmarks.shapes import SHAPES, build
    from fair_calib.decoding import generate, make_policy

    torch.manual_seed(0)
    loaded = build(args.shape, layers=args.layers)
    policy = make_policy(loaded.adapter.decoding, {"name": "low_confidence", "steps": 64,
                                                   "gen_length": 256, "block_length": 32})
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, SHAPES[args.shape]["vocab_size"] - 1000, (args.batch, 128),
                            generator=g).tolist()
    generate(loaded, prompts, policy)             # warm-up (kernels, allocator)
    torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(args.rounds):
        generate(loaded, prompts, policy)
    torch.cuda.synchronize()
    work = time.time() - t0
    props = torch.cuda.get_device_properties(0)
    print(json.dumps({"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
                      "device": torch.cuda.get_device_name(0),
                      "pci_bus_id": getattr(props, "pci_bus_id", None),
                      "work_s": round(work, 2), "job_s": round(time.time() - START, 2),
                      "steps": args.rounds * policy.steps, "layers": args.layers,
                      "batch": args.batch}), flush=True)


if __name__ == "__main__":
    main()
