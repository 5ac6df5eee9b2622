"""What does W4A16 execution cost, and how exact is it, at the grid's shapes? (issue 31, item 3)

Weight-only ``gptq``/``awq`` models hold 4- and 3-bit group codes (group 128, zero points).
``fair_calib.quant.w4a16`` runs them on torch's tinygemm kernel (``aten._weight_int4pack_mm``)
up to ``KERNEL_MAX_ROWS`` rows and dequantizes the codes above (bit for bit the fake quant).
This script measures, on random weights at the real LLaDA-8B / Dream-7B linear shapes (AWQ's
round-to-nearest grid, ``groupwise.awq_params``), at batch-1 generation row counts and the MC
shapes (8x512, 32x128 = 4,096 rows):

- ``linears``: per linear group (q/k/v, o, gate/up, down), the time of bf16 ``F.linear`` on the
  FP weight, fake quant (``F.linear`` on the dequantized bf16 weight), the kernel, and the
  dequantizing path (dequantize + ``F.linear``, what the layer runs above the threshold); the
  kernel's error against the fake quant (max abs, max abs / max |fake|) at W4 and W3;
- ``block``: one transformer block's forward (1-layer model, the pipeline's own modules:
  ``quantize_block``, ``fold_block`` for fake, ``w4a16.attach_block`` for the kernel) at each
  (batch, seq): bf16, fake, kernel on every row count, dequantizing path; the block output's
  error against fake; ``x layers`` gives the forward's linear+attention time without the head;
- ``threshold``: the largest row count up to which the kernel is no slower than fake quant in
  every linear group (what ``KERNEL_MAX_ROWS`` should be on this GPU).

One JSON line per measurement (``--out`` appends them to a file too), then a summary table.

    PYTHONPATH=. python benchmarks/weight_only_gpu.py [--shapes llada-8b dream-7b] [--out f]
    PYTHONPATH=. python benchmarks/weight_only_gpu.py --cpu-smoke    # tiny shapes, CPU op
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import shapes, structures  # noqa: E402
from benchmarks.structures import block_groups, emit  # noqa: E402
from fair_calib.methods import make_method  # noqa: E402
from fair_calib.methods.base import fold_block  # noqa: E402
from fair_calib.methods.weight_only import GroupCodesMethod  # noqa: E402
from fair_calib.quant import w4a16  # noqa: E402
from fair_calib.quant.blockio import call_block, capture_block_inputs  # noqa: E402
from fair_calib.quant.groupwise import awq_params, group_codes  # noqa: E402
from fair_calib.quant.qlinear import QuantLinear  # noqa: E402

ROWS = [1, 16, 32, 64, 128, 256, 408, 856, 1280, 2048, 4096]
BLOCK_SHAPES = [(1, 1), (1, 32), (1, 256), (1, 408), (1, 856), (1, 1280), (1, 2048),
                (8, 512), (32, 128)]
GROUP = 128
ALWAYS = 10 ** 9          # max_rows: the kernel on every row count
SMOKE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=1, vocab_size=64)


def timer(dev: str, iters: int, warmup: int):
    """fn -> mean seconds per call (synchronised on CUDA)."""
    return lambda fn: shapes.call_time(fn, dev, warmup, iters)


def linear_dims(spec: dict) -> dict[str, list[tuple[int, int]]]:
    """(out, in) of every linear of one block, by group."""
    h, i = spec["hidden_size"], spec["intermediate_size"]
    kv = h * spec["num_key_value_heads"] // spec["num_attention_heads"]
    return {"qkv": [(h, h), (kv, h), (kv, h)], "o": [(h, h)], "gate_up": [(i, h), (i, h)],
            "down": [(h, i)]}


def make_linear(n: int, k: int, bits: int, dev: str, seed: int):
    g = torch.Generator(device=dev).manual_seed(seed)
    w = (torch.randn(n, k, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    gc = group_codes(w.float(), bits, GROUP, awq_params)
    layer = w4a16.WeightOnlyLinear(gc, None, torch.bfloat16, torch.device(dev), ALWAYS)
    return w, gc.dequantize().to(torch.bfloat16), layer


def errors(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    d = float((got.float() - ref.float()).abs().max())
    return d, d / max(float(ref.float().abs().max()), 1e-30)


@torch.no_grad()
def bench_linears(shape: str, spec: dict, dev: str, rows_list, time_fn) -> list[dict]:
    recs = []
    for group, dims in linear_dims(spec).items():
        lins = {b: [make_linear(n, k, b, dev, j) for j, (n, k) in enumerate(dims)] for b in (4, 3)}
        for rows in rows_list:
            xs = [torch.randn(rows, k, device=dev).to(torch.bfloat16) for _, k in dims]
            rec = dict(kind="linears", shape=shape, group=group, rows=rows,
                       dims=[list(d) for d in dims])
            for b in (4, 3):
                errs = [errors(L.kernel(x), F.linear(x, fw)) for x, (_, fw, L) in zip(xs, lins[b])]
                rec[f"w{b}_max_abs"] = max(e[0] for e in errs)
                rec[f"w{b}_max_rel"] = max(e[1] for e in errs)
            four = list(zip(xs, lins[4]))
            variants = {"bf16": lambda: [F.linear(x, w) for x, (w, _, _) in four],
                        "fake": lambda: [F.linear(x, fw) for x, (_, fw, _) in four],
                        "kernel": lambda: [L.kernel(x) for x, (_, _, L) in four],
                        "dequant": lambda: [F.linear(x, L.dequantized()) for x, (_, _, L) in four]}
            for name, fn in variants.items():
                rec[f"{name}_ms"] = time_fn(fn) * 1e3
            emit(rec)
            recs.append(rec)
        del lins
    return recs


def build_model(shape: str, dev: str):
    if shape == "smoke":
        from fair_calib.quant.toy import tiny_random_loaded
        lm = tiny_random_loaded("qwen2", hidden=SMOKE["hidden_size"],
                                intermediate=SMOKE["intermediate_size"],
                                heads=SMOKE["num_attention_heads"],
                                kv_heads=SMOKE["num_key_value_heads"], layers=1)
        lm.model.to(torch.bfloat16)
        return lm
    return shapes.build(shape, layers=1, device=dev)


def set_max_rows(block, rows: int) -> None:
    for m in block.modules():
        if isinstance(m, w4a16.WeightOnlyLinear):
            m.max_rows = rows


@torch.no_grad()
def bench_block(shape: str, dev: str, block_shapes, time_fn, layers: int) -> list[dict]:
    """One block's forward: bf16, then (the same weights) fake quant, then the kernel and the
    dequantizing path after ``w4a16.attach_block``."""
    lm = build_model(shape, dev)
    block = lm.blocks[0]
    vocab = lm.embed.weight.shape[0]
    inputs = {}
    for b, s in block_shapes:
        ids = torch.randint(0, vocab - 2, (b, s), generator=torch.Generator().manual_seed(1))
        inputs[(b, s)] = capture_block_inputs(lm.model, block, ids.to(dev), b, device=dev,
                                              hidden_dtype=torch.bfloat16)
    recs = {k: dict(kind="block", shape=shape, batch=k[0], seq=k[1], rows=k[0] * k[1],
                    layers=layers) for k in inputs}

    def measure(name):
        outs = {}
        for k, inp in inputs.items():
            outs[k] = call_block(block, inp, 0)
            recs[k][f"{name}_ms"] = time_fn(lambda: call_block(block, inp, 0)) * 1e3
        return outs
    measure("bf16")
    groups = block_groups(lm, dev)
    method = make_method({"type": "awq"}, 4, 16)
    method.quantize_block(block, groups, None, 0)
    for m in block.modules():
        if isinstance(m, QuantLinear):
            GroupCodesMethod.set_codes(m, group_codes(m.linear.weight.float(), 4, GROUP,
                                                      awq_params))
    fold_block(block)
    fake = measure("fake")
    report = w4a16.attach_block(block, "kernel", ALWAYS)
    kern = measure("kernel")
    set_max_rows(block, 0)
    measure("dequant")
    for k, rec in recs.items():
        upd = (fake[k].float() - inputs[k].hidden[0].float()).norm()
        rec["n_kernel_linears"] = sum(v == "kernel" for v in report.values())
        rec["update_rel_err"] = float((kern[k].float() - fake[k].float()).norm() / upd)
        rec["max_abs_err"] = float((kern[k].float() - fake[k].float()).abs().max())
        emit(rec)
    return list(recs.values())


def threshold(lin: list[dict]) -> int:
    """The largest tested row count r with kernel <= fake in every linear group at every
    tested row count <= r (0: none)."""
    best = 0
    for rows in sorted({r["rows"] for r in lin}):
        at = [r for r in lin if r["rows"] == rows]
        if any(r["kernel_ms"] > r["fake_ms"] for r in at):
            break
        best = rows
    return best


def summary(shape: str, lin: list[dict], blk: list[dict]) -> None:
    print(f"\n== {shape}: per block's linears (sum of q/k/v, o, gate/up, down), ms ==")
    print(f"{'rows':>6} {'bf16':>8} {'fake':>8} {'kernel':>8} {'dequant':>8} "
          f"{'kern/fake':>9} {'W4 rel':>9} {'W3 rel':>9}")
    for rows in sorted({r["rows"] for r in lin}):
        at = [r for r in lin if r["rows"] == rows]
        t = {v: sum(r[f"{v}_ms"] for r in at) for v in ("bf16", "fake", "kernel", "dequant")}
        print(f"{rows:>6} {t['bf16']:>8.3f} {t['fake']:>8.3f} {t['kernel']:>8.3f} "
              f"{t['dequant']:>8.3f} {t['kernel'] / t['fake']:>9.2f} "
              f"{max(r['w4_max_rel'] for r in at):>9.2e} {max(r['w3_max_rel'] for r in at):>9.2e}")
    print(f"-- {shape}: one block's forward (x {blk[0]['layers']} layers, no head), ms --")
    print(f"{'batch x seq':>12} {'bf16':>8} {'fake':>8} {'kernel':>8} {'dequant':>8} "
          f"{'upd err':>9}")
    for r in blk:
        print(f"{r['batch']:>5} x {r['seq']:<5} {r['bf16_ms']:>8.3f} {r['fake_ms']:>8.3f} "
              f"{r['kernel_ms']:>8.3f} {r['dequant_ms']:>8.3f} {r['update_rel_err']:>9.2e}")
    t = threshold(lin)
    emit(dict(kind="threshold", shape=shape, kernel_max_rows=t,
              current=w4a16.KERNEL_MAX_ROWS))
    print(f"-- {shape}: the kernel is no slower than fake quant up to {t} rows "
          f"(KERNEL_MAX_ROWS is {w4a16.KERNEL_MAX_ROWS})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["llada-8b", "dream-7b"])
    ap.add_argument("--rows", nargs="+", type=int, default=ROWS)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-block", action="store_true")
    ap.add_argument("--out", default=None, help="also append the JSON lines to this file")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny shapes on CPU (the CPU int4pack op): checks the script runs")
    a = ap.parse_args(argv)
    structures.OUT = a.out
    torch.manual_seed(0)
    if a.cpu_smoke:
        dev, specs, rows, blocks = "cpu", {"smoke": SMOKE}, [1, 8, 33], [(1, 8), (2, 16)]
        time_fn = timer(dev, 1, 0)
    else:
        dev, rows, blocks = "cuda", a.rows, BLOCK_SHAPES
        specs = {s: shapes.SHAPES[s] for s in a.shapes}
        time_fn = timer(dev, a.iters, 3)
        emit(dict(kind="device", name=torch.cuda.get_device_name(), torch=torch.__version__,
                  cuda=torch.version.cuda))
    problem = w4a16.kernel_problem(torch.device(dev), torch.bfloat16)
    if problem:
        sys.exit(f"error: weight-only kernel unavailable: {problem}")
    all_lin = []
    for shape, spec in specs.items():
        lin = bench_linears(shape, spec, dev, rows, time_fn)
        blk = [] if a.no_block else bench_block(shape, dev, blocks, time_fn,
                                                spec["num_hidden_layers"])
        if blk:
            summary(shape, lin, blk)
        all_lin += lin
        if dev == "cuda":
            torch.cuda.empty_cache()
    t = threshold(all_lin)
    emit(dict(kind="threshold", shape="all", kernel_max_rows=t, current=w4a16.KERNEL_MAX_ROWS))
    print(f"\nthe data supports KERNEL_MAX_ROWS = {t} (all shapes; now {w4a16.KERNEL_MAX_ROWS})")


if __name__ == "__main__":
    main()
