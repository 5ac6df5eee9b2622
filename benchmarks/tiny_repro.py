"""Does tiny-model training give the same bits whatever the CPU's kernels? (issue 22)

Trains one tiny model (the embedded default's settings, ``--steps`` overridden) through the
pipeline's own CLI, once per variant, each in a fresh process whose environment emulates a
different CPU: ATen's kernel set (``ATEN_CPU_CAPABILITY`` default/avx2/avx512), MKL's widest
instruction set (``MKL_ENABLE_INSTRUCTIONS`` AVX2/AVX512) and the thread count. Prints one JSON
line per variant: sha256 of model.safetensors, the training wall seconds and the process's CPU
seconds (user + system, import included). In pinned mode every
hash must be the same; in native mode they show what pinning removes.

    PYTHONPATH=. python benchmarks/tiny_repro.py --data resources/data --steps 60 \
        --mode pinned native --model tiny-llada
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
# (label, extra environment, threads): CPUs with AVX-512, with AVX2 only, no vector kernels
VARIANTS = [
    ("avx512 mkl-avx512 1t", {"ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512"}, 1),
    ("avx2 mkl-avx2 1t", {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}, 1),
    ("default mkl-avx2 1t", {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}, 1),
    ("avx512 mkl-avx512 2t", {"ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512"}, 2),
    ("default mkl-avx2 2t", {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}, 2),
    # MKL alone: its AVX-512 GEMM path (what it picks on an Intel AVX-512 CPU; on AMD it does
    # not by itself) and its baseline SSE path, with ATen's kernels fixed
    ("avx2 mkl-cbwr-avx512 1t", {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX512"}, 1),
    ("avx2 mkl-cbwr-compatible 1t", {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"}, 1),
]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def train_once(model: str, steps: int | None, data: Path, mode: str, env_extra: dict,
               threads: int) -> dict:
    cfg = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    entry = {"name": model, **cfg["models"][model]}
    entry["train"] = {k: v for k, v in entry["train"].items() if k != "threads"}
    if steps:
        entry["train"]["steps"] = steps
    settings = {"seed": cfg["seed"], "device": "cpu", "dtype": cfg["dtype"],
                "synthetic_dir": str(data), "model": entry}
    env = {k: v for k, v in os.environ.items()
           if k not in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")}
    env.update(env_extra)
    env.update(FAIR_CALIB_CPU_NUMERICS=mode, OMP_NUM_THREADS=str(threads),
               PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / model
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        res = subprocess.run([sys.executable, "-m", "fair_calib.cli", "train-tiny", "--threads",
                              str(threads), "--no-progress", "--settings", json.dumps(settings),
                              "--data", str(data), "--out", str(out)],
                             env=env, capture_output=True, text=True)
        if res.returncode:
            raise SystemExit(f"train-tiny failed:\n{res.stderr[-2000:]}")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        summary = json.loads(res.stdout.strip().splitlines()[-1])
        # CPU seconds of the whole process (import included): on a shared machine the wall
        # time measures the other users' load, the CPU time much less so
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return {"sha256": sha256(out / "model.safetensors"),
                "train_seconds": round(summary["train_seconds"], 2),
                "process_cpu_seconds": round(cpu, 2),
                "final_loss": summary["final_loss"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, type=Path, help="folder written by make-data")
    ap.add_argument("--model", default="tiny-llada")
    ap.add_argument("--steps", type=int, default=None, help="default: the config's")
    ap.add_argument("--mode", nargs="+", default=["pinned", "native"], choices=["pinned", "native"])
    ap.add_argument("--variants", nargs="+", type=int, default=None,
                    help="indices into VARIANTS (default: all)")
    ap.add_argument("--repeat", type=int, default=1, help="alternate the modes this many times")
    args = ap.parse_args()
    chosen = [VARIANTS[i] for i in (args.variants or range(len(VARIANTS)))]
    for mode in [m for _ in range(args.repeat) for m in args.mode]:
        for label, env, threads in chosen:
            row = train_once(args.model, args.steps, args.data.resolve(), mode, env, threads)
            print(json.dumps({"mode": mode, "variant": label, "model": args.model,
                              "steps": args.steps, **row}), flush=True)


if __name__ == "__main__":
    main()
