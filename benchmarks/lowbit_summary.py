"""Short table of a ``benchmarks/lowbit_gpu.py --out FILE`` run: forward ratios to the bf16
forward, host enqueue times, code checks, the rotary kernel and the split-kernel sweep.

    python benchmarks/lowbit_summary.py FILE [FILE ...]
"""
from __future__ import annotations

import json
import sys


def main(path: str) -> None:
    recs = [json.loads(line) for line in open(path) if line.strip()]
    for r in recs:
        k = r["kind"]
        if k == "forward":
            names = sorted(n[:-6] for n in r if n.endswith("_ratio") and "peak" not in n)
            rot = " (authors' float32 rotary)" if r.get("authors_rotary") else ""
            print(f"forward {r['shape']} {r['tokens']}{rot} bf16 {r['bf16_s'] * 1e3:.1f} ms "
                  f"(enqueue {r['bf16_enqueue_s'] * 1e3:.0f} / wall {r['bf16_wall_s'] * 1e3:.0f})")
            same = {n: v for n, v in r.items() if n.endswith("_same_logits")}
            if same:
                print("  logits equal to the module settings':", same)
            for n in names:
                print(f"  {n}: {r[n + '_ratio']:.3f}x  {r[n + '_s'] * 1e3:.1f} ms  peak "
                      f"{r[n + '_peak_ratio']:.2f}x  enqueue {r[n + '_enqueue_s'] * 1e3:.0f} / "
                      f"wall {r[n + '_wall_s'] * 1e3:.0f} ms")
        elif k in ("codes", "codes_gated"):
            tok = " ".join(f"{n}={v:.1e}" for n, v in r.items() if n.startswith("tok"))
            print(f"{k} {r['shape']} {r['variant']} {r['group']}: "
                  f"{r['code_mismatch_frac']:.2e} scale {r['scale_max_rel_diff']:.1e} {tok}")
        elif k == "layer_error":
            print(f"layer_error {r['shape']} {r['variant']} {r['linear']}: real "
                  f"{r['real_rel_err']:.3e} fake {r['fake_bf16_rel_err']:.3e}")
        elif k == "rotary":
            print(f"rotary {r['shape']} {r['tokens']} cos {r['cos_dtype']}: transformers "
                  f"{r['native_us']:.0f} us, fused {r['fused_us']:.0f} us "
                  f"({r['fused_tb_s']:.2f} TB/s), same bits {r['same_bits']}")
        elif k == "profile":
            print(f"profile {r['shape']} {r['tokens']}")
            for row in r["top"]:
                print(f"  {row['ms']:8.2f} ms {row['calls']:5d}  {row['name']}")
        elif k in ("split_sweep", "split_choice", "inputs_fused", "env", "error", "stage_time",
                   "micro"):
            print(json.dumps(r))


if __name__ == "__main__":
    for path in sys.argv[1:]:
        main(path)
