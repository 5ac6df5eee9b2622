"""Early exit on a GPU: the same tokens as the full run, and the steps and time it saves.

    PYTHONPATH=. python benchmarks/early_exit_gpu.py [--layers 4] [--batch 16]

At the LLaDA-8B (low_confidence, blocks of 32) and Dream-7B (entropy) shapes with random
weights in bf16: a full run (every row every step, commit steps recorded), then a run with
early exit whose stop tokens are taken from the full run's output (row r's token at position
8 (r mod 8) + 3, so rows end at different steps). Per shape one JSON line: rows whose cut
output differs from the full run's (a forward of fewer rows may round differently on a GPU:
this counts it; the default on a GPU keeps the batch's shape and stops once every row is
final, and ``rows_leaving`` reports the rows-leave-the-batch mode), the steps each row ran against the step that made it final (+1: on CUDA the
check reads the window one step late), and the wall times. ``--smoke`` runs a small shape on
the CPU (a check of the script, no measurement).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.shapes import SHAPES, build  # noqa: E402


def timed(fn, device):
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def final_steps(tokens, commit_t, steps, stop_ids):
    """Per row: the step after which everything up to its first stop token is committed."""
    out = []
    for row, cs in zip(tokens.tolist(), commit_t.tolist()):
        n = next((i + 1 for i, t in enumerate(row) if t in stop_ids), len(row))
        out.append(max(steps - t + 1 for t in cs[:n]))
    return out


def cut(row, stop_ids):
    return next((row[:i + 1] for i, t in enumerate(row) if t in stop_ids), row)


def run_shape(shape, policy_over, args, device):
    from fair_calib.decoding import StopRule, decode, make_policy
    from fair_calib.decoding.trajectory import CommitRecorder

    torch.manual_seed(0)
    loaded = build(shape, layers=args.layers, device=device,
                   dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    policy = make_policy(loaded.adapter.decoding, policy_over)
    g = torch.Generator().manual_seed(1)
    vocab = SHAPES[shape]["vocab_size"]
    prompts = [torch.randint(10, vocab - 1000, (args.prompt - (r % 4) * 8,), generator=g).tolist()
               for r in range(args.batch)]          # unequal lengths: left padding as in lm-eval

    def gens():
        return [torch.Generator(device=device).manual_seed(100 + r) for r in range(args.batch)]

    decode(loaded, prompts, policy, gens())            # warm-up
    rec = CommitRecorder()
    full, t_full_rec = timed(lambda: decode(loaded, prompts, policy, gens(), recorder=rec), device)
    _, t_full = timed(lambda: decode(loaded, prompts, policy, gens()), device)
    tokens = full.tokens.cpu()
    stop_ids = {int(tokens[r, 8 * (r % 8) + 3]) for r in range(args.batch)}
    early, t_early = timed(lambda: decode(loaded, prompts, policy, gens(),
                                          stop=StopRule(frozenset(stop_ids))), device)
    # rows leaving the batch (the CPU's default; a forward of fewer rows on the GPU)
    dropped, t_dropped = timed(lambda: decode(loaded, prompts, policy, gens(),
                                              stop=StopRule(frozenset(stop_ids), drop_rows=True)),
                               device)

    def differing(run):
        return [r for r in range(args.batch)
                if run.tokens[r].tolist()[:len(cut(tokens[r].tolist(), stop_ids))]
                != cut(tokens[r].tolist(), stop_ids)]
    differ = differing(early)
    want = final_steps(tokens, rec.commit_steps, policy.steps, stop_ids)
    lag = 1 if device == "cuda" else 0
    print(json.dumps({
        "shape": shape, "layers": args.layers, "policy": policy.name, "batch": args.batch,
        "gen_length": policy.gen_length, "steps": policy.steps, "device": device,
        "card": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "rows_differing_from_full_run": differ,
        "steps_run": early.steps, "final_at_step": want,
        "steps_as_expected": early.steps == [min(max(want) + lag, policy.steps)] * args.batch
        if device == "cuda" else early.steps == want,
        "steps_saved": round(1 - sum(early.steps) / (policy.steps * args.batch), 3),
        "full_s": round(t_full, 3), "early_s": round(t_early, 3),
        "rows_leaving": {"rows_differing_from_full_run": differing(dropped),
                         "steps_run": dropped.steps, "s": round(t_dropped, 3),
                         "steps_saved": round(1 - sum(dropped.steps) / (policy.steps * args.batch), 3)},
        "full_with_recorder_s": round(t_full_rec, 3)}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=96)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    device = "cuda"
    if args.smoke:
        device, args.layers, args.batch, args.prompt = "cpu", 1, 8, 40
        for spec in SHAPES.values():
            spec.update(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                        num_key_value_heads=2 if spec["cls"] == "qwen2" else 4,
                        vocab_size=3000, mask_id=2999)
    run_shape("llada-8b", {"name": "low_confidence", "steps": 64, "gen_length": 128,
                           "block_length": 32}, args, device)
    run_shape("dream-7b", {"name": "entropy", "steps": 64, "gen_length": 128}, args, device)


if __name__ == "__main__":
    main()
