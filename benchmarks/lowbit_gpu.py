"""GPU benchmark of the real low-bit backend (issue 20): kernels, layer error, full forward.

Random weights at the real LLaDA-8B / Dream-7B shapes (``benchmarks/shapes.py``). One JSON
line per measurement:

- ``codes``: per input group of one block (FAIR-Calib/FlatQuant: Kronecker factors, the o_proj
  head factor; QuaRot: online Hadamards), the fused Triton kernel's codes against the torch
  arithmetic of the emulation on the same input (fraction of codes that differ: a bf16
  transform summed in another order can land a value on the other side of a rounding point);
- ``layer_error``: per linear, ||y - y64|| / ||y64|| with y64 the float64 evaluation of the
  real path's own integer codes and scales: the real path (FP8 GEMM) and the bf16 fake quant
  of the same codes (bf16 operands, bf16 out);
- ``forward``: full depth, bf16 FP forward vs the real W4A4 forward (FAIR-Calib/FlatQuant
  structure with 4-bit packed and with FP8 weights; QuaRot structure with online Hadamards),
  at each ``--tokens`` shape, with peak GPU memory of the forward (model included);
- ``rotary``: one layer's rotary, transformers' function against the fused kernel
  (``fair_calib.models.rotary``), bit for bit; the forward stage also times the bf16 and the
  FAIR-Calib forwards with transformers' rotary (``*_native_rotary``) and compares logits;
- ``profile``: the real forward's top CUDA kernels (LLaDA-8B, first token shape);
- ``decode_batch``: item 4, greedy bf16 decoding of the same prompts one at a time and in
  padded batches: rows whose tokens differ, and whether the first step's logits are bitwise
  equal.

    PYTHONPATH=. python benchmarks/lowbit_gpu.py [--shapes llada-8b dream-7b] [--skip ...]
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import shapes  # noqa: E402
from fair_calib.methods import make_method  # noqa: E402
from fair_calib.models import rotary  # noqa: E402
from fair_calib.quant import lowbit  # noqa: E402
from fair_calib.quant.blockio import call_block, capture_block_inputs  # noqa: E402
from fair_calib.quant.discovery import discover_groups  # noqa: E402
from fair_calib.quant.hadamard import KronRotation  # noqa: E402
from fair_calib.quant.qlinear import InputQuant, QuantLinear  # noqa: E402
from fair_calib.quant.quantizers import ActQuantizer, WeightQuantizer  # noqa: E402

OUT = None
COMPARE: dict = {}  # --compare: {name: lowbit_triton settings} of extra measurements per model
EXTRA = False      # --extra: also FP8-stored weights and W8A8 on INT8 in the forward stage
AUTHORS_ROTARY = False  # --authors-rotary: forward-stage models rotate as their hub loading does


def emit(rec: dict) -> None:
    line = json.dumps(rec)
    print(line, flush=True)
    if OUT:
        with open(OUT, "a") as f:
            f.write(line + "\n")


def block_groups(lm, dev):
    model = lm.model
    ids = torch.arange(64, device=dev).unsqueeze(0)
    probe = capture_block_inputs(model, lm.blocks[0], ids, 1, device=dev,
                                 hidden_dtype=next(model.parameters()).dtype)
    with torch.no_grad():
        return discover_groups(lm.blocks[0], lambda: call_block(lm.blocks[0], probe, 0))


def quantize_method(lm, groups, method_type, mode="real", bits=4):
    """A method's structure at its initialisation with the integer backend: "fair_calib"
    (FlatQuant's: random orthogonal Kronecker factors, clip logits 4, o_proj's head_dim factor
    folded into v_proj) or "rtn" (per-token activation quantization, no transform)."""
    method = make_method({"type": method_type}, bits, bits, seed=0)
    method.prepare_model(lm)
    for i, block in enumerate(lm.blocks):
        method.quantize_block(block, groups, None, i)
        lowbit.attach_block(block, mode)
    fuse(lm)
    lm.model.eval()


def quantize_fair_calib(lm, groups, mode="real", bits=4):
    quantize_method(lm, groups, "fair_calib", mode, bits)


def quantize_rtn(lm, groups, mode="real"):
    quantize_method(lm, groups, "rtn", mode)


def fuse(lm):
    """Each norm read only by one low-bit group, and each SwiGLU product, into the kernel of
    the group that reads it (as load_quantized)."""
    n = lowbit.fuse_inputs(lm)
    emit({"kind": "inputs_fused", **n, "blocks": len(lm.blocks)})


def quantize_quarot(lm, groups, hd, mode="real"):
    """QuaRot's online part (no model rotation needed for speed): exact Hadamards online on the
    o_proj input (across heads) and the down_proj input (full width), per-token clip 1.0."""
    for block in lm.blocks:
        for g in groups:
            name = g.names[0]
            rot = None
            if name.endswith("o_proj"):
                rot = KronRotation(g.in_features, None, signs=False,
                                   split=(g.in_features // hd, hd), right=False)
            elif name.endswith("down_proj"):
                rot = KronRotation(g.in_features, None, signs=False)
            dev = block.get_submodule(name).weight.device
            inq = InputQuant(g.in_features, ActQuantizer(4), online_rotation=rot).to(dev)
            inq.n_users = len(g.names)
            for k, n in enumerate(g.names):
                lin = block.get_submodule(n)
                ql = QuantLinear(lin, inq, WeightQuantizer(lin.out_features, 4).to(dev), user=k)
                parent, _, leaf = n.rpartition(".")
                setattr(block.get_submodule(parent), leaf, ql)
        lowbit.attach_block(block, mode)
    fuse(lm)
    lm.model.eval()


def to_fp8_storage(lm):
    from fair_calib.quant import lowbit_triton
    for m in lm.model.modules():
        if isinstance(m, lowbit.LowBitLinear) and m.packed:
            m.qweight = lowbit_triton.unpack_int4(m.qweight, m.in_features, torch.float8_e4m3fn)
            m.packed = False


def ids_for(shape, batch, seq, dev, seed=1):
    vocab = shapes.SHAPES[shape]["vocab_size"]
    return torch.randint(0, vocab - 2, (batch, seq), generator=torch.Generator().manual_seed(seed)).to(dev)


HOST: dict[str, float] = {}     # the last time_forward's host-side numbers (see there)


def time_forward(model, ids):
    """(median s, peak GB) of the forward; HOST gets the median host time to enqueue one
    forward against its wall time (a forward whose enqueue takes its whole wall time waits on
    the host, not the GPU)."""
    def fwd():
        with torch.no_grad():
            return model(input_ids=ids).logits
    import triton.testing
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    # median of about 20 forwards after 0.5 s of warm-up (means of 10 moved by up to 15%)
    t = triton.testing.do_bench(fwd, warmup=500, rep=2500, return_mode="median") / 1e3
    peak = torch.cuda.max_memory_allocated() / 2**30
    HOST.clear()
    HOST.update(zip(("enqueue_s", "wall_s"), host_times(fwd)))
    return t, peak


def host_times(fwd, n: int = 7) -> tuple[float, float]:
    """Medians over n calls of ``fwd`` from an idle GPU: the host's time to enqueue it and
    the wall time until the GPU has finished it (s)."""
    enq, wall = [], []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fwd()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        enq.append(t1 - t0)
        wall.append(time.perf_counter() - t0)
    return sorted(enq)[n // 2], sorted(wall)[n // 2]


# ------------------------------------------------------------------------- codes and error
@torch.no_grad()
def check_layers(shape, tokens, dev):
    hd = shapes.SHAPES[shape]["hidden_size"] // shapes.SHAPES[shape]["num_attention_heads"]
    for variant in ("fair_calib", "quarot"):
        lm = shapes.build(shape, layers=1, device=dev)
        groups = block_groups(lm, dev)
        if variant == "fair_calib":
            quantize_fair_calib(lm, groups)
        else:
            quantize_quarot(lm, groups, hd)
        rec, outs = {}, {}

        def hook(m, a, y, n):
            rec[n], outs[n] = a[0], y
        # unfused SwiGLU products: every linear, down_proj included, sees its own input
        lowbit.set_gated_fusion(lm.model, False)
        hooks = [m.register_forward_hook(lambda m, a, y, n=n: hook(m, a, y, n))
                 for n, m in lm.model.named_modules() if isinstance(m, QuantLinear)]
        lm.model(input_ids=ids_for(shape, 1, tokens, dev))
        for h in hooks:
            h.remove()
        check_gated_codes(lm, outs, shape, variant)
        seen = set()
        for n, x in rec.items():
            be = lm.model.get_submodule(n).backend
            x2 = x.reshape(-1, x.shape[-1])
            xc, xs = be.inp.quantize(x2)
            if id(be.inp) not in seen:
                seen.add(id(be.inp))
                ref_c, ref_s = be.inp.scales_and_codes(be.inp.transform(x2))
                diff = (xc.float() != ref_c).float().mean().item()
                emit({"kind": "codes", "shape": shape, "variant": variant, "group": n,
                      "tokens": x2.shape[0], "dim": x2.shape[1], "readers": be.inp.n_readers,
                      "norm_fused": be.inp.norm is not None,
                      "code_mismatch_frac": diff,
                      "scale_max_rel_diff": ((xs - ref_s).abs() / ref_s).max().item()})
            k = min(be.user, be.inp.n_readers - 1)
            xc, xs = xc[k], xs[k]
            from fair_calib.quant import lowbit_triton
            wc = lowbit_triton.weight_codes(be).float()
            y_real = lowbit_triton.gemm(be, xc, xs, torch.bfloat16).double()
            b64 = None if be.bias is None else be.bias.double()
            y64 = (xc.double() @ wc.double().T) * xs.double()[:, None] * be.w_scale.double()[None, :]
            if b64 is not None:
                y64 = y64 + b64
            xq = (xc.float() * xs[:, None]).bfloat16()
            wq = (wc * be.w_scale[:, None]).bfloat16()
            y_fake = F.linear(xq, wq, None if be.bias is None else be.bias.bfloat16()).double()
            nrm = y64.norm()
            emit({"kind": "layer_error", "shape": shape, "variant": variant, "linear": n,
                  "real_rel_err": ((y_real - y64).norm() / nrm).item(),
                  "fake_bf16_rel_err": ((y_fake - y64).norm() / nrm).item()})
        del lm
        torch.cuda.empty_cache()


def check_gated_codes(lm, outs, shape, variant):
    """Each fused SwiGLU MLP's down_proj codes formed in the kernel from gate's and up's
    outputs against the emulation of torch's product (CUDA SiLU, bf16 product)."""
    for mname, m in lm.model.named_modules():
        if not isinstance(m, lowbit._GatedForward):
            continue
        gate, up, down = (f"{mname}.{n}" for n in m._gated[0])
        inp = lm.model.get_submodule(down).backend.inp
        g2, u2 = (outs[n].reshape(-1, inp.dim) for n in (gate, up))
        c, sc = inp.quantize(g2, u2)
        ref_c, ref_s = inp.scales_and_codes(inp.transform(lowbit.silu_mul(g2, u2)))
        emit({"kind": "codes_gated", "shape": shape, "variant": variant, "group": down,
              "tokens": g2.shape[0], "dim": inp.dim,
              "code_mismatch_frac": (c.float() != ref_c).float().mean().item(),
              "scale_max_rel_diff": ((sc - ref_s).abs() / ref_s).max().item()})


# --------------------------------------------------------------------------------- forward
@torch.no_grad()
def bench_forward(shape, token_shapes, dev, profile, split_best=None, kernel_tuned=None):
    """bf16 FP forward against the real W4A4 forward of each structure (FAIR-Calib/FlatQuant,
    QuaRot, RTN), at each token shape; FAIR-Calib also with
    ``split_best`` (split-kernel settings per tile shape, from the sweep) where given, and with
    --extra unfused SwiGLU products, FP8-stored weights and W8A8 on INT8; each structure also
    with ``kernel_tuned`` ({"tile": ..., "split": ...} from :func:`time_groups`; the
    split settings applied over the module's table) where given."""
    from fair_calib.quant import lowbit_triton as lt
    hd = shapes.SHAPES[shape]["hidden_size"] // shapes.SHAPES[shape]["num_attention_heads"]
    res = {f"{b}x{s}": {} for b, s in token_shapes}
    same = {}

    def timed(name, model):
        for b, s in token_shapes:
            t, peak = time_forward(model, ids_for(shape, b, s, dev))
            res[f"{b}x{s}"][name] = (t, peak, dict(HOST))

    def measure(name, model):
        timed(name, model)
        # the same model otherwise run: with transformers' own rotary (bf16, FAIR-Calib), and
        # under each --compare's kernel settings (quantized structures); timed, and its
        # logits compared bit for bit with the default's at the first token shape (held on
        # the host, out of the peak-memory measurements)
        variants = {}
        if name in ("bf16", "w4a4_fair_calib"):
            variants["native_rotary"] = native_rotary
        if name in ("w4a4_fair_calib", "w4a4_quarot", "w4a4_rtn"):
            variants.update({c: functools.partial(kernel_settings, st)
                             for c, st in COMPARE.items()})
        if variants:
            ids = ids_for(shape, *token_shapes[0], dev)
            ref = model(input_ids=ids).logits.cpu()
            for vname, context in variants.items():
                with context():
                    timed(f"{name}_{vname}", model)
                    same[f"{name}_{vname}_same_logits"] = bool(
                        torch.equal(model(input_ids=ids).logits.cpu(), ref))
            del ref
        if kernel_tuned and kernel_tuned.get("split") and name in (
                "w4a4_fair_calib", "w4a4_quarot", "w4a4_rtn"):
            with kernel_settings({"SPLIT_TUNED": {**lt.SPLIT_TUNED, **kernel_tuned["split"]}}):
                timed(name + "_kernels_tuned", model)

    lm = shapes.build(shape, device=dev, authors_rotary=AUTHORS_ROTARY)
    groups = block_groups(lm, dev)
    measure("bf16", lm.model)
    t0 = time.perf_counter()
    quantize_fair_calib(lm, groups)
    torch.cuda.synchronize()
    attach_s = time.perf_counter() - t0
    measure("w4a4_fair_calib", lm.model)
    if profile:
        profile_forward(lm.model, ids_for(shape, *token_shapes[0], dev), shape)
    if split_best:
        with kernel_settings({"SPLIT_TUNED": split_best}):
            measure("w4a4_fair_calib_split_swept", lm.model)
            tile = (kernel_tuned or {}).get("tile") or {}
            if tile:                                 # the one-tile kernel's swept setting
                with kernel_settings(tile):
                    measure("w4a4_fair_calib_split_swept_tile", lm.model)
    if EXTRA:
        lowbit.set_gated_fusion(lm.model, False)
        measure("w4a4_fair_calib_ungated", lm.model)
        lowbit.set_gated_fusion(lm.model, True)
        to_fp8_storage(lm)
        measure("w4a4_fair_calib_fp8w", lm.model)
    del lm
    torch.cuda.empty_cache()
    for name, build in (("w4a4_quarot", lambda lm: quantize_quarot(lm, groups, hd)),
                        ("w4a4_rtn", lambda lm: quantize_rtn(lm, groups))):
        lm = shapes.build(shape, device=dev, authors_rotary=AUTHORS_ROTARY)
        build(lm)
        measure(name, lm.model)
        del lm
        torch.cuda.empty_cache()
    if EXTRA:
        lm = shapes.build(shape, device=dev, authors_rotary=AUTHORS_ROTARY)
        quantize_fair_calib(lm, groups, bits=8)          # INT8 tensor cores
        measure("w8a8_fair_calib_int8", lm.model)
        del lm
        torch.cuda.empty_cache()
    for key, r in res.items():
        fp_t, fp_m, fp_h = r["bf16"]
        emit({"kind": "forward", "shape": shape, "tokens": key,
              "device": torch.cuda.get_device_name(), "split": split_best,
              "authors_rotary": AUTHORS_ROTARY and bool(shapes.AUTHORS_ROTARY.get(shape)),
              "attach_s": attach_s, "bf16_s": fp_t, "bf16_peak_gb": fp_m,
              "bf16_enqueue_s": fp_h["enqueue_s"], "bf16_wall_s": fp_h["wall_s"],
              **{f"{k}_s": v[0] for k, v in r.items() if k != "bf16"},
              **{f"{k}_ratio": v[0] / fp_t for k, v in r.items() if k != "bf16"},
              **{f"{k}_peak_ratio": v[1] / fp_m for k, v in r.items() if k != "bf16"},
              **{f"{k}_enqueue_s": v[2]["enqueue_s"] for k, v in r.items() if k != "bf16"},
              **{f"{k}_wall_s": v[2]["wall_s"] for k, v in r.items() if k != "bf16"},
              **same})


@contextlib.contextmanager
def native_rotary():
    """transformers' own ``apply_rotary_pos_emb`` for the block (fair_calib.models.rotary)."""
    saved, rotary.FORCE = rotary.FORCE, False
    try:
        yield
    finally:
        rotary.FORCE = saved


@torch.no_grad()
def bench_rotary(shape, token_shapes, dev):
    """One layer's rotary at the shape's q/k heads: transformers' function against the fused
    kernel (median of do_bench), with sin/cos in the model dtype (Dream, transformers) and in
    float32 (LLaDA's authors' rotary); outputs compared bit for bit, strides included."""
    import triton.testing
    from transformers.models.llama import modeling_llama as ml
    spec = shapes.SHAPES[shape]
    hq, hk = spec["num_attention_heads"], spec["num_key_value_heads"]
    d = spec["hidden_size"] // hq
    rotary.install()
    fused = ml.apply_rotary_pos_emb
    native = fused.fair_calib_native
    g = torch.Generator(device=dev).manual_seed(0)
    for b, s in token_shapes:
        q = torch.randn(b, s, hq * d, device=dev, generator=g, dtype=torch.bfloat16)
        k = torch.randn(b, s, hk * d, device=dev, generator=g, dtype=torch.bfloat16)
        q, k = (x.view(b, s, -1, d).transpose(1, 2) for x in (q, k))
        for cdt in (torch.bfloat16, torch.float32):
            cos = torch.randn(b, s, d, device=dev, generator=g).to(cdt)
            sin = torch.randn(b, s, d, device=dev, generator=g).to(cdt)
            ref, out = native(q, k, cos, sin), fused(q, k, cos, sin)
            same = all(torch.equal(r, o) and r.stride() == o.stride() and r.dtype == o.dtype
                       for r, o in zip(ref, out))
            t_nat = triton.testing.do_bench(lambda: native(q, k, cos, sin), return_mode="median")
            t_fus = triton.testing.do_bench(lambda: fused(q, k, cos, sin), return_mode="median")
            nbytes = sum(x.numel() * (x.element_size() + o.element_size())
                         for x, o in zip((q, k), out))
            emit({"kind": "rotary", "shape": shape, "tokens": f"{b}x{s}",
                  "cos_dtype": str(cdt), "native_us": t_nat * 1e3, "fused_us": t_fus * 1e3,
                  "fused_tb_s": nbytes / (t_fus * 1e-3) / 1e12, "same_bits": same})


def _tile_key(key) -> tuple[int, int]:
    return key if isinstance(key, tuple) else tuple(int(n) for n in key.split("x"))


@contextlib.contextmanager
def kernel_settings(settings: dict):
    """lowbit_triton's module settings (and triton_launch's DIRECT_LAUNCH) replaced for the
    block ("SPLIT_TUNED" keyed by (n1, n2) or "n1xn2")."""
    from fair_calib import triton_launch
    from fair_calib.quant import lowbit_triton as lt
    home = {k: triton_launch if k == "DIRECT_LAUNCH" else lt for k in settings}
    saved = {k: getattr(home[k], k) for k in settings}
    for k, v in settings.items():
        setattr(home[k], k, {_tile_key(key): st for key, st in v.items()}
                if k == "SPLIT_TUNED" else v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(home[k], k, v)


def profile_forward(model, ids, shape):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(input_ids=ids)
        torch.cuda.synchronize()
    rows = []
    for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:14]:
        rows.append({"name": e.key[:90], "ms": round(e.device_time_total / 1e3, 3), "calls": e.count})
    emit({"kind": "profile", "shape": shape, "tokens": list(ids.shape), "top": rows})


def split_group(inp) -> bool:
    return inp.p1 is not None and max(inp.n1, inp.n2) > 64


def sweep_configs(inp):
    """(name, module settings) of the activation kernel variants timed per group: the one-tile
    kernel with IEEE division, at 2 or 8 warps, with a register cap; for
    a split-kernel group cuBLAS first and each of SPLIT_SETTINGS (the per-shape table cleared,
    so that the module's settings apply)."""
    out = [("default", {}), ("divide", {"FAST_DIV": False}), ("w2", {"NUM_WARPS": 2}),
           ("w8", {"NUM_WARPS": 8}), ("r128", {"TILE_MAXNREG": 128})]
    if inp is not None and split_group(inp):
        out.append(("cublas_first", {"WIDE": False, "MAX_FACTOR": 32, "MAX_TILE": 32 * 32}))
        for st in SPLIT_SETTINGS:
            out.append((f"split_{setting_name(st)}", {"SPLIT_TUNED": {}, **st}))
    return out


@torch.no_grad()
def time_groups(shape, tokens, dev):
    """The activation kernel per input group (one block, ``tokens`` tokens, each structure):
    median time of each of :func:`sweep_configs`, codes against the emulation's, the bytes it
    must move over that time, and the torch operations for comparison. Returns the settings
    that beat the defaults by 3%: (the one-tile kernel's setting of least summed time over the
    FAIR-Calib groups that take it (its settings are one for all groups), and {(n1, n2): split
    settings})."""
    import triton.testing

    from fair_calib.quant import lowbit_triton
    defaults = {a: getattr(lowbit_triton, a) for a in
                ("NUM_WARPS", "MAX_FACTOR", "MAX_TILE", "WIDE", "SPLIT_TUNED", "TILE_MAXNREG",
                 *SPLIT_SETTINGS[0])}
    tile_sum, split_tuned = {}, {}
    hd = shapes.SHAPES[shape]["hidden_size"] // shapes.SHAPES[shape]["num_attention_heads"]
    for variant in ("fair_calib", "quarot", "rtn"):
        lm = shapes.build(shape, layers=1, device=dev)
        groups = block_groups(lm, dev)
        if variant == "fair_calib":
            quantize_fair_calib(lm, groups)
        elif variant == "quarot":
            quantize_quarot(lm, groups, hd)
        else:
            quantize_rtn(lm, groups)
        for g in groups:
            inp = lm.blocks[0].get_submodule(g.names[0]).backend.inp
            x2 = torch.randn(tokens, g.in_features, device=dev, dtype=torch.bfloat16)
            x2[:, :8] *= 20
            nbytes = x2.numel() * 2 + inp.n_readers * (x2.numel() + tokens * 4)
            rec = {"kind": "act_kernel", "shape": shape, "variant": variant, "group": g.names[0],
                   "tokens": tokens, "dim": g.in_features, "readers": inp.n_readers,
                   "tile": [inp.n1, inp.n2], "ideal_us_at_3TBs": nbytes / 3e12 * 1e6}
            ref_c, _ = inp.scales_and_codes(inp.transform(x2))
            for key, cfg in sweep_configs(inp):
                for attr, val in cfg.items():
                    setattr(lowbit_triton, attr, val)
                try:
                    c, _ = inp.quantize(x2)
                    bad = (c.float() != ref_c).float().mean().item()
                    t = triton.testing.do_bench(lambda: inp.quantize(x2), return_mode="median")
                    rec[key] = [round(t * 1e3, 1), bad]
                except Exception as err:  # noqa: BLE001 - e.g. out of resources
                    rec[key] = repr(err)[:80]
                for attr, val in defaults.items():
                    setattr(lowbit_triton, attr, val)
            ok = {k: v[0] for k, v in rec.items() if isinstance(v, list) and v[1] < 2e-3}
            best = rec["best"] = min(ok, key=ok.get) if ok else None
            if best and best != "default" and ok[best] < 0.97 * ok["default"]:
                if best.startswith("split_"):
                    st = next(st for st in SPLIT_SETTINGS if best == f"split_{setting_name(st)}")
                    split_tuned[(inp.n1, inp.n2)] = st
            if variant == "fair_calib" and not split_group(inp):
                for k, v in ok.items():
                    tile_sum[k] = tile_sum.get(k, 0.0) + v
            t = triton.testing.do_bench(lambda: inp.scales_and_codes(inp.transform(x2)),
                                        return_mode="median")
            rec["torch_ops_us"] = t * 1e3
            emit(rec)
        del lm
        torch.cuda.empty_cache()
    configs = dict(sweep_configs(None))
    best = min(tile_sum, key=tile_sum.get) if tile_sum else "default"
    tile = configs[best] if tile_sum and tile_sum[best] < 0.97 * tile_sum["default"] else {}
    emit({"kind": "kernel_choice", "shape": shape, "tile_sums": tile_sum, "tile": tile,
          "split": {f"{k[0]}x{k[1]}": v for k, v in split_tuned.items()}})
    return tile, split_tuned


# ----------------------------------------------------------------------- split kernel sweep
class SyntheticInput:
    """A low-bit input group of random orthogonal Kronecker factors (n1 x n2), diagonal,
    fused RMSNorm and K readers, with :class:`lowbit.LowBitInput`'s own emulation methods."""

    apply_norm = lowbit.LowBitInput.apply_norm
    transform = lowbit.LowBitInput.transform
    scales_and_codes = lowbit.LowBitInput.scales_and_codes

    def __init__(self, n1, n2, dev, k=1, norm=False, diag=True, p2=True, dtype=torch.bfloat16):
        g = torch.Generator().manual_seed(n1 * 1000 + n2)
        self.dim, self.n1, self.n2, self.bits, self.kind, self.static = n1 * n2, n1, n2, 4, "fp8", False
        q1 = torch.linalg.qr(torch.randn(n1, n1, generator=g))[0]
        q2 = torch.linalg.qr(torch.randn(n2, n2, generator=g))[0]
        # contiguous: QR's factors are column-major, the kernels read row-major buffers (as
        # LowBitInput stores them)
        self.p1 = (q1 * 1.3).to(dev, dtype).contiguous()
        self.p2t = q2.to(dev, dtype).contiguous() if p2 else None
        self.d = (torch.rand(self.dim, generator=g) + 0.5).to(dev, dtype) if diag else None
        self.norm = ((torch.rand(self.dim, generator=g) + 0.5).to(dev, dtype), 1e-6) if norm else None
        self.r_max = (torch.rand(k, generator=g) * 0.5 + 0.5).to(dev)
        self.r_min = (torch.rand(k, generator=g) * 0.5 + 0.5).to(dev)
        self.floor = torch.zeros(k, device=dev)
        self.static_scale = None
        self.n_readers = k


def _split(br, w, unroll=False, regs=False, gated=False, fast=False, bc=64):
    return {"SPLIT_BR": br, "SPLIT_BC": bc, "SPLIT_WARPS": w, "SPLIT_UNROLL": unroll,
            "SPLIT_REGS": regs, "SPLIT_GATED": gated, "FAST_DIV": fast, "SPLIT_MAXNREG": None}


# the module's default, the previous table's two, then: codes by the reciprocal (FAST_DIV),
# the SwiGLU product in the kernel (GATED), the transformed token in registers (REGS).
# Measured and dropped: 16 warps, register caps (on the scratch-row form, 128 registers a
# thread on Triton 3.6), one two-valued max/min reduction: docs/benchmarks.md
SPLIT_SETTINGS = [
    _split(64, 4, unroll=True), _split(128, 8), _split(128, 8, unroll=True),
    _split(128, 8, fast=True), _split(64, 4, unroll=True, fast=True),
    _split(128, 8, regs=True, gated=True, fast=True), _split(128, 8, regs=True, fast=True),
    _split(128, 8, unroll=True, gated=True, fast=True)]


def setting_name(st: dict) -> str:
    flags = "".join(f"_{k}" for k, on in (("regs", st["SPLIT_REGS"]), ("gated", st["SPLIT_GATED"]),
                                           ("fast", st["FAST_DIV"])) if on)
    return (f"br{st['SPLIT_BR']}_bc{st['SPLIT_BC']}_w{st['SPLIT_WARPS']}_"
            f"{'unroll' if st['SPLIT_UNROLL'] else 'loop'}{flags}")


@torch.no_grad()
def split_sweep(dev, tokens=4096):
    """The split kernel at a few settings (rows per chunk, warps) on down_proj inputs
    (a SwiGLU product, diagonal, Kronecker factors: Dream's 128 x 148, LLaDA's 96 x 128, Dream
    QuaRot's 148 x 128): codes against the emulation's (cuBLAS's transform) and median time;
    the one-pass SwiGLU product against torch's (bits and time). Returns the setting fastest over all cases whose codes agree to 1e-5; the module's
    defaults stay in place."""
    import triton.testing

    from fair_calib.quant import lowbit_triton as lt
    cases = [(128, 148, {}), (96, 128, {}), (148, 128, {"diag": False})]
    defaults = {k: getattr(lt, k) for k in (*SPLIT_SETTINGS[0], "SPLIT_TUNED")}
    lt.SPLIT_TUNED = {}                # the module's settings apply while sweeping
    tuned = {}
    for n1, n2, kw in cases:
        inp = SyntheticInput(n1, n2, dev, **kw)
        x = (torch.randn(tokens, n1 * n2, device=dev) * 3).to(torch.bfloat16)
        up = torch.randn(tokens, n1 * n2, device=dev).to(torch.bfloat16)
        up[:, :5] *= 30
        prod = lowbit.silu_mul(x, up)
        ref, ref_s = inp.scales_and_codes(inp.transform(prod))
        rec = {"kind": "split_sweep", "tile": [n1, n2], **kw, "tokens": tokens,
               "pieces": [lt.split_pow2(n1), lt.split_pow2(n2)],
               "silu_mul_equal": bool(torch.equal(lt.silu_mul(x, up), prod)),
               "silu_mul_us": triton.testing.do_bench(lambda: lt.silu_mul(x, up),
                                                      return_mode="median") * 1e3,
               "torch_silu_mul_us": triton.testing.do_bench(lambda: lowbit.silu_mul(x, up),
                                                            return_mode="median") * 1e3}
        for st in SPLIT_SETTINGS:
            for k, v in st.items():
                setattr(lt, k, v)
            lt.SPLIT_TUNED = {}
            name = setting_name(st)
            try:       # gate and up in: every setting's time includes the SwiGLU product
                c, sc = lt.quantize_input(inp, x, up)
                bad = (c.float() != ref.float()).float().mean().item()
                srel = ((sc - ref_s).abs() / ref_s).max().item()
                t = triton.testing.do_bench(lambda: lt.quantize_input(inp, x, up),
                                            return_mode="median") * 1e3
            except Exception as err:  # noqa: BLE001 - e.g. out of resources
                bad, srel, t = 1.0, 1.0, float("inf")
                rec[f"{name}_error"] = repr(err)[:160]
            rec[name] = [round(t, 1), bad, srel]
        for k, v in defaults.items():
            setattr(lt, k, v)
        ok = [i for i in range(len(SPLIT_SETTINGS))
              if isinstance(rec[setting_name(SPLIT_SETTINGS[i])][0], float)
              and rec[setting_name(SPLIT_SETTINGS[i])][1] < 1e-5]
        if ok:
            i = min(ok, key=lambda i: rec[setting_name(SPLIT_SETTINGS[i])][0])
            tuned[f"{n1}x{n2}"] = SPLIT_SETTINGS[i]
        emit(rec)
    emit({"kind": "split_choice", "tuned": tuned})
    return tuned


def split_sweep_subprocess():
    """:func:`split_sweep` in a child process (a faulting setting poisons its CUDA context,
    not this one's); its records are re-emitted here. Returns the chosen setting or None."""
    import subprocess
    r = subprocess.run([sys.executable, __file__, "--split-only"], capture_output=True,
                       text=True, timeout=400)
    best = None
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            emit(rec)
            if rec.get("kind") == "split_choice":
                best = rec["tuned"] or None
    if r.returncode:
        emit({"kind": "error", "stage": "split", "rc": r.returncode, "stderr": r.stderr[-800:]})
    return best


def _time_groups_into(tuned: dict, shape: str, dev) -> None:
    tile, split = time_groups(shape, 4096, dev)
    tuned.update(tile={**tuned.get("tile", {}), **tile}, split=split)


# ------------------------------------------------------------------------ decode batching
@torch.no_grad()
def decode_batch(shape, layers, dev, n_prompts=16, gen=64):
    from fair_calib.decoding.generate import generate
    from fair_calib.decoding.policies import make_policy

    lm = shapes.build(shape, layers=layers, device=dev)
    vocab = shapes.SHAPES[shape]["vocab_size"]
    g = torch.Generator().manual_seed(5)
    lens = torch.randint(40, 120, (n_prompts,), generator=g).tolist()
    prompts = [torch.randint(10, vocab - 1000, (n,), generator=g).tolist() for n in lens]
    over = {"gen_length": gen, "steps": gen}
    if lm.adapter.decoding.get("policy") == "low_confidence":
        over["block_length"] = 32
    pol = make_policy(lm.adapter.decoding, {**over, "temperature": 0.0})
    one = torch.cat([generate(lm, [p], pol) for p in prompts])
    for bs in (8, 16):
        batched = torch.cat([generate(lm, prompts[i:i + bs], pol) for i in range(0, n_prompts, bs)])
        rows = (batched != one).any(1)
        emit({"kind": "decode_batch", "shape": shape, "layers": layers, "batch": bs,
              "policy": pol.name, "gen_length": gen, "prompts": n_prompts,
              "rows_differing": int(rows.sum()), "tokens_differing": int((batched != one).sum()),
              "tokens": one.numel()})
    # first forward: one prompt alone vs inside a padded batch (same padded length for both)
    from fair_calib.decoding.generate import pad_left
    ids, attn, lp = pad_left(prompts[:8], gen, lm.mask_id, lm.pad_id, lm.device)
    full = lm.logits(ids, attn)
    single = torch.cat([lm.logits(ids[i:i + 1], attn[i:i + 1]) for i in range(8)])
    emit({"kind": "decode_batch_logits", "shape": shape, "layers": layers, "batch": 8,
          "bitwise_equal": bool(torch.equal(full, single)),
          "max_abs_diff": (full.float() - single.float()).abs().max().item(),
          "logit_std": full.float().std().item()})
    del lm
    torch.cuda.empty_cache()


def parse_compare(items: list[str]) -> dict:
    """{name: settings} of the --compare arguments ("NAME=JSON" or "JSON")."""
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or name.lstrip().startswith("{"):
            name, text = "compare", item
        try:
            out[name.strip()] = json.loads(text)
        except json.JSONDecodeError as err:
            raise SystemExit(f"--compare {item!r}: not [NAME=]JSON ({err})") from err
    return out


def main(argv=None):
    global OUT, EXTRA, AUTHORS_ROTARY
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["llada-8b", "dream-7b"])
    ap.add_argument("--tokens", nargs="+", default=["8x512", "32x104"])
    ap.add_argument("--skip", default="",
                    help="comma list of: split,micro,rotary,layers,kernels,forward,decode")
    ap.add_argument("--decode-layers", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1, help="run the forward stage this often")
    ap.add_argument("--out", default=None)
    ap.add_argument("--split-only", action="store_true",
                    help="run the split-kernel sweep alone (the full run starts it as a child)")
    ap.add_argument("--extra", action="store_true",
                    help="forward stage: also FP8-stored weights and W8A8 (INT8)")
    ap.add_argument("--compare", action="append", default=[],
                    help='[NAME=]JSON of lowbit_triton settings for another measurement of each '
                         'quantized model (FAIR-Calib, QuaRot, RTN), recorded as '
                         '"<structure>_NAME" (default name "compare"); repeatable, e.g. '
                         '\'div={"FAST_DIV": false, "SPLIT_TUNED": {"128x148": '
                         '{"SPLIT_BR": 128}}}\'')
    ap.add_argument("--authors-rotary", action="store_true",
                    help="forward stage: LLaDA rotates q and k in float32, as its hub "
                         "checkpoints do (benchmarks/shapes.py)")
    args = ap.parse_args(argv)
    OUT, EXTRA, AUTHORS_ROTARY = args.out, args.extra, args.authors_rotary
    COMPARE.update(parse_compare(args.compare))
    dev = "cuda"
    skip = set(filter(None, args.skip.split(",")))
    if args.split_only:
        split_sweep(dev)
        return
    split_best = None
    if "split" not in skip:
        try:
            split_best = split_sweep_subprocess()
        except Exception as err:  # noqa: BLE001 - report and go on
            import traceback
            traceback.print_exc()
            emit({"kind": "error", "stage": "split", "error": repr(err)[:500]})
    emit({"kind": "env", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
          "cc": list(torch.cuda.get_device_capability()),
          "mode": lowbit.resolve_mode(torch.device("cuda"), "real")})
    token_shapes = [tuple(int(v) for v in t.split("x")) for t in args.tokens]
    module_best = {}
    if "micro" not in skip:
        from benchmarks.lowbit_micro import micro_kernels
        module_best = micro_kernels(dev, emit)
    for shape in args.shapes:
        tuned = {"tile": dict(module_best)}
        for stage, fn in (("rotary", lambda: bench_rotary(shape, token_shapes, dev)),
                          ("layers", lambda: check_layers(shape, 2048, dev)),
                          ("kernels", lambda: _time_groups_into(tuned, shape, dev)),
                          ("forward", lambda: [bench_forward(shape, token_shapes, dev, r == 0,
                                                             split_best, tuned or None)
                                               for r in range(args.repeat)]),
                          ("decode", lambda: decode_batch(shape, args.decode_layers, dev))):
            if stage in skip:
                continue
            t0 = time.perf_counter()
            try:
                fn()
            except Exception as err:  # noqa: BLE001 - report and go on to the next stage
                import traceback
                traceback.print_exc()
                emit({"kind": "error", "shape": shape, "stage": stage, "error": repr(err)[:500]})
            emit({"kind": "stage_time", "shape": shape, "stage": stage, "s": time.perf_counter() - t0})
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
