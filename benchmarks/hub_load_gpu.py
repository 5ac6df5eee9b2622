"""GPU benchmark for issue 12: an 8B-shaped checkpoint in the hub's layout, loaded natively.

1. ``write``: random bf16 weights at the real LLaDA-8B / Dream-7B shapes
   (``benchmarks/shapes.py``) saved as the hub ships them: config.json with the authors'
   field names, ~5 GB safetensors shards under the authors' key names, the index
   (``fair_calib.models.hub.save_hub_layout``'s naming, written shard by shard so the writer
   never holds the model twice).
2. ``measure`` (a fresh process, so its memory high-water mark is the load's own): load through
   ``fair_calib.models.hub.load_native_model`` in bf16, time it, and compare the peak host
   memory with the bf16 weight bytes (the bar: <= 1.2x, i.e. no float32 copy); then one decode
   step on the GPU (``generate``, the family's policy, 256-token window) and one calibration
   block (FAIR-Calib W4A4, model kept on the host, the block moved to the GPU), with peak GPU
   memory.

Usage (device machine):  PYTHONPATH=. python benchmarks/hub_load_gpu.py --family llada --dir /tmp/llada
Smoke test on CPU:        PYTHONPATH=. python benchmarks/hub_load_gpu.py --family llada --dir /tmp/x --smoke
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import shapes  # noqa: E402
from fair_calib.models.hub import LAYOUTS, native_config  # noqa: E402

FAMILY_SHAPE = {"llada": "llada-8b", "dream": "dream-7b"}
SMOKE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             vocab_size=512)


def emit(rec: dict) -> None:
    print(json.dumps(rec), flush=True)


def rss_gb() -> float:
    """Current resident set size (GB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def hub_config(family: str, smoke: bool) -> dict:
    """The hub config.json of the family at the real shape (toy shape with ``smoke``)."""
    spec = dict(shapes.SHAPES[FAMILY_SHAPE[family]])
    mask_id = spec.pop("mask_id")
    spec.pop("cls"), spec.pop("adapter")
    if smoke:
        spec.update(SMOKE, num_key_value_heads=min(spec["num_key_value_heads"], 4))
        mask_id = SMOKE["vocab_size"] - 1
    theta = spec.pop("rope_theta")
    from transformers import LlamaConfig, Qwen2Config
    cls = LlamaConfig if family == "llada" else Qwen2Config
    native = cls(**spec, rope_parameters={"rope_type": "default", "rope_theta": theta},
                 tie_word_embeddings=False, pad_token_id=0, eos_token_id=1)
    return {**LAYOUTS[family].to_hub(native), "mask_token_id": mask_id, "torch_dtype": "bfloat16"}


def write(family: str, folder: Path, smoke: bool, shard_gb: float = 5.0) -> None:
    """Random bf16 tensors under the hub's names, one shard in memory at a time."""
    from safetensors.torch import save_file

    layout = LAYOUTS[family]
    cfg = hub_config(family, smoke)
    native = native_config(layout, cfg)
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM
    cls = LlamaForCausalLM if layout.native_arch == "llama" else Qwen2ForCausalLM
    with torch.device("meta"):
        skeleton = cls(native)
    folder.mkdir(parents=True, exist_ok=True)
    gen_dev = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    shards, current, size, limit = [], {}, 0, shard_gb * 2**30
    for name, p in skeleton.state_dict().items():
        t = (torch.ones(p.shape, dtype=torch.bfloat16, device=gen_dev) if name.endswith("norm.weight")
             else torch.randn(p.shape, dtype=torch.bfloat16, device=gen_dev) * 0.02)
        current[layout.hub_key(name)] = t.cpu()
        size += t.numel() * 2
        if size >= limit:
            shards.append(current)
            _flush(folder, shards, save_file)
            current, size = {}, 0
    shards.append(current)
    _flush(folder, shards, save_file, last=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    emit({"kind": "write", "family": family, "seconds": time.perf_counter() - t0,
          "files": sorted(p.name for p in folder.iterdir())})


_WEIGHT_MAP: dict[str, str] = {}


def _flush(folder: Path, shards: list, save_file, last: bool = False) -> None:
    """Save the newest shard under a temporary name; at the end, name all n of them."""
    k = len(shards)
    tmp = folder / f"shard-{k:05d}.tmp"
    if shards[-1]:
        save_file(shards[-1], str(tmp), metadata={"format": "pt"})
        _WEIGHT_MAP.update({key: tmp.name for key in shards[-1]})
    shards[-1] = list(shards[-1])        # keep the names, free the tensors
    if not last:
        return
    n = sum(1 for s in shards if s)
    rename = {}
    for i in range(1, n + 1):
        final = f"model-{i:05d}-of-{n:05d}.safetensors"
        (folder / f"shard-{i:05d}.tmp").rename(folder / final)
        rename[f"shard-{i:05d}.tmp"] = final
    index = {"metadata": {}, "weight_map": {k: rename[v] for k, v in _WEIGHT_MAP.items()}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def measure(family: str, folder: Path, smoke: bool, skip_calibration: bool = False) -> None:
    from fair_calib.models.hub import load_native_model

    from transformers import LlamaForCausalLM, Qwen2ForCausalLM  # noqa: F401  (imports not timed)

    layout = LAYOUTS[family]
    weight_bytes = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    before = rss_gb()
    t0 = time.perf_counter()
    model = load_native_model(layout, str(folder), torch.bfloat16).eval()
    load_s = time.perf_counter() - t0
    lazy = {"rss_gb": rss_gb(), "peak_rss_gb": peak_rss_gb()}
    # transformers may leave the tensors memory-mapped: reading every byte once is what makes
    # the weights resident, so the load is timed and measured up to that point.
    touched = sum(_checksum(p) for p in model.parameters())
    read_s = time.perf_counter() - t0
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    gb = weight_bytes / 2**30
    emit({"kind": "load", "family": family, "from_pretrained_s": load_s,
          "with_every_byte_read_s": read_s, "weights_gb": gb, "rss_before_gb": before,
          "after_from_pretrained": lazy, "rss_after_read_gb": rss_gb(),
          "peak_rss_gb": peak_rss_gb(), "peak_over_weights": (peak_rss_gb() - before) / gb,
          "param_dtypes": dtypes, "checksum": touched,
          "n_params_b": sum(p.numel() for p in model.parameters()) / 1e9})
    cfg = json.loads((folder / "config.json").read_text())
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    decode_step(family, model, cfg["mask_token_id"], dev, smoke)
    if skip_calibration:
        return
    calibration_block(family, model, cfg["mask_token_id"], dev, smoke,
                      vocab=int(cfg["vocab_size"]))


def _checksum(p: torch.Tensor, chunk: int = 1 << 24) -> int:
    """Reads every byte of ``p``; in chunks, so the int64 accumulation of a 4 GB embedding
    does not allocate a 4 GB temporary (which would count as load memory)."""
    flat = p.detach().reshape(-1).view(torch.int16)
    return sum(int(flat[i:i + chunk].sum()) for i in range(0, flat.numel(), chunk))


def _loaded(family, model, mask_id):
    from fair_calib.models.adapters import LoadedModel, get_adapter
    return LoadedModel(model=model, tokenizer=None, adapter=get_adapter(family), mask_id=mask_id,
                       pad_id=0, eos_id=1)


def decode_step(family, model, mask_id, dev, smoke) -> None:
    from fair_calib.decoding import generate, make_policy

    lm = _loaded(family, model.to(dev), mask_id)
    gen = 16 if smoke else 256
    pol = make_policy(lm, steps=2, gen_length=gen,
                      block_length=gen if family == "llada" else None)
    prompt = [list(range(2, 66))]
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    generate(lm, prompt, pol)                                   # warm-up (kernels, allocator)
    if dev == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    generate(lm, prompt, pol)
    if dev == "cuda":
        torch.cuda.synchronize()
    emit({"kind": "decode_step", "family": family, "policy": pol.name,
          "seconds_per_step": (time.perf_counter() - t0) / pol.steps, "tokens": 64 + gen,
          "peak_gpu_gb": torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else None})
    model.to("cpu")
    if dev == "cuda":
        torch.cuda.empty_cache()


def calibration_block(family, model, mask_id, dev, smoke, vocab: int) -> None:
    from fair_calib.calibrate import calibrate
    from fair_calib.methods import make_method

    lm = _loaded(family, model, mask_id)
    blocks = lm.blocks
    del blocks[1:]                                   # one block is what is measured
    n, seq = (4, 32) if smoke else (32, 1024)
    ids = torch.randint(2, min(vocab, 30000), (n, seq), generator=torch.Generator().manual_seed(0))
    method = make_method({"type": "fair_calib", "epochs": 1}, 4, 4, seed=0)
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    meta = calibrate(lm, method, ids, "/nonexistent-not-written", weights=torch.rand(seq) + 0.05,
                     batch_size=4, log=lambda s: None, device=dev, write_outputs=False)
    emit({"kind": "calibration_block", "family": family, "seconds": time.perf_counter() - t0,
          "n_samples": n, "seq_len": seq, "epochs": 1, "peak_gpu_gb": meta["peak_mem_mb"] / 1024,
          "peak_rss_gb": peak_rss_gb()})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=sorted(FAMILY_SHAPE), required=True)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true", help="toy shape, CPU")
    ap.add_argument("--step", choices=["all", "write", "measure"], default="all")
    ap.add_argument("--skip-calibration", action="store_true")
    args = ap.parse_args(argv)
    if args.step in ("all", "write") and not (args.dir / "config.json").exists():
        write(args.family, args.dir, args.smoke)
    if args.step == "all":       # measure in a fresh process: its peak RSS is the load's own
        cmd = [sys.executable, __file__, "--family", args.family, "--dir", str(args.dir),
               "--step", "measure"] + (["--smoke"] if args.smoke else []) + \
            (["--skip-calibration"] if args.skip_calibration else [])
        subprocess.run(cmd, check=True)
    elif args.step == "measure":
        measure(args.family, args.dir, args.smoke, args.skip_calibration)


if __name__ == "__main__":
    main()
