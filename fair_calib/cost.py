"""GPU-hours of a config's DAG, per rule and in total, from measured throughputs.

    fair-calib cost --configfile config/paper.yaml [more.yaml ...] [--base config/config.yaml]
                    [--data-dir DIR] [--no-census] [--json]

The config is the one Snakemake runs in this checkout: ``--base`` (default
``./config/config.yaml`` of the current directory) with the ``--configfile`` files merged over
it, validated and the schema's defaults filled. The jobs are the plan's (fair_calib/plan.py:
seeds, shards, tables, priors, probes, trajectories; tests/test_cost.py checks every rule's
count against ``snakemake -n``). Every number below is a measurement on one H100 80GB
(docs/benchmarks.md, random weights at the real shapes) or an assumption named as such; the
projection is as good as they are and is meant for sizing an allocation, not for reporting.

Evaluation is priced twice, and both are printed:

* before (the old model): per request with the settings each (task, model) job runs with
  (``by_family``/``by_model`` resolved) and task shapes assumed in ``TASK_SHAPES``: MC forwards
  of ``batch_size`` rows (two with cfg), ``mc_num // rows`` per choice, or exact mode's shared
  forwards; generation as ``steps`` forwards per batch; quantized forwards at one ratio per
  structure (``REAL_QUANT_SCALE``, measured at 3,328-4,096 tokens a forward);
* after (census): the forwards fair_calib/census.py counts from the task data, each shape
  priced in its execution mode at the nearest measured ratio of ``QUANT_RATIOS`` (batch-1
  generation at decode ratios, MC and exact forwards at forward ratios); needs the offline data
  (``FAIR_CALIB_DATA_DIR``), else it says why it is not computed.

A bf16 forward of ``n`` tokens in all costs ``FWD_FIXED_S + n * FWD_TOKEN_S`` (fitted to the
LLaDA-8B measurements of issues 3, 6 and 14: 102 ms for 32 x 104 tokens, 24 ms for 8 x 54,
47 ms for 8 x 161, 28 ms for 601).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Mapping

from fair_calib.evaluate.task_settings import resolve_task, use_by_model
from fair_calib.plan import base_method

FWD_FIXED_S = 0.012            # per forward: launches, host work (LLaDA-8B, H100, bf16)
FWD_TOKEN_S = 27e-6            # per token of the forward (same fit)
FAMILY_SCALE = {"llada": 1.0, "dream": 0.9}    # Dream-7B forward / LLaDA-8B forward (issue 3)
QUANT_SCALE = 1.26             # fake-quant W4A4 forward / FP forward (issue 6: 2.07 / 1.64 s)
# Real low-bit forward / bf16 FP forward (issue 20, benchmarks/lowbit_gpu.py, full depth, H100
# 80GB, random weights; docs/benchmarks.md): codes of <= 5 bits run on FP8 tensor cores
# (FAIR_CALIB_LOWBIT=auto), RMSNorms and SwiGLU products fused, split-kernel settings per tile.
# Per family and quantized structure, the slower token shape (8 x 512 or 32 x 104) of the median
# over the GPU-bound measurements of the current code (host enqueue < 0.9 x wall; 2026-11-27
# calls 5-7 for the transforms, 1-3 for QuaRot and RTN, whose kernels did not change since).
# "transform": FlatQuant-style online Kronecker transforms (fair_calib, flatquant);
# "hadamard": QuaRot's online Hadamards; "plain": per-token quantization alone (rtn).
# W8A8 was on fake quantization under auto then (cuBLAS's INT8 measured 1.5-1.8x FP); this
# "before" projection keeps pricing it so. The census projection follows lowbit.kinds_for.
REAL_QUANT_SCALE = {
    "llada": {"transform": 0.726, "hadamard": 0.791, "plain": 0.681},
    "dream": {"transform": 0.750, "hadamard": 0.739, "plain": 0.720},
}
METHOD_STRUCTURE = {"fair_calib": "transform", "flatquant": "transform", "quarot": "hadamard",
                    "rtn": "plain"}

# THE ratio table of the census-based projection: quantized (W4A4, FAIR_CALIB_LOWBIT=real/auto,
# the int8 Triton GEMM) time / bf16 time, per (family, structure), at measured shapes. An entry is
# (mode, rows, tokens, ratio, source): mode "forward" is one forward / one bf16 forward (prices MC
# and exact-mode forwards); "decode" is a whole batch-1 decode / the bf16 decode, host work
# included (prices generation, the grid's batch-1 execution mode). A census shape is priced at
# the nearest entry of its mode (generation: decode entries first), distance
# |ln(rows / r)| + |ln(tokens / t)| (ties: the larger ratio). Sources (RATIO_SOURCES):
#   "i20": REAL_QUANT_SCALE above (the slower of 8 x 512 and 32 x 104; one value for both);
#   "census-gpu": benchmarks/census_shapes_gpu.py (lent H100, 2026-11-27, after the int8 GEMM of
#     fair_calib.quant.lowbit_gemm replaced cuBLAS's FP8 GEMM) at the paper census's
#     heavy shapes, as the evaluation stage now runs them: repeated forwards replayed from CUDA
#     graphs (fair_calib.models.graphs), 4-bit codes one per byte; bf16 replayed alike. The
#     eager batch-1 ratios of issue 30 ("i30f", "i30d": 1.1-2.4) described the host-bound eager
#     path, which the evaluation no longer takes on CUDA; they are kept in RATIO_SOURCES for
#     the record only.
#   "census-gpu-2": the same script for LLaDA's transform structure (lent H100, 2026-11-28),
#     after its down_proj input kernel changed setting (lowbit_triton.SPLIT_TUNED).
# W8A8 rows (real under auto on the int8 Triton GEMM: lowbit.kinds_for) are priced at their
# structure's W4A4 entries: 8-bit codes run the same kernels on the same int8 operands (4-bit
# codes are stored one per byte on CUDA), and W8A8 forwards measured within 0.03 of W4A4's
# ratios at five census shapes (docs/benchmarks.md, "W8A8 on the int8 GEMM").
QUANT_RATIOS: dict[tuple[str, str], list[tuple[str, int, int, float, str]]] = {
    ('llada', 'transform'): [
        ('forward', 8, 512, 0.726, 'i20'),
        ('forward', 32, 104, 0.726, 'i20'),
        ('forward', 1, 576, 0.703, 'census-gpu-2'),
        ('decode', 1, 576, 0.726, 'census-gpu-2'),
        ('forward', 1, 640, 0.697, 'census-gpu-2'),
        ('decode', 1, 640, 0.714, 'census-gpu-2'),
        ('forward', 1, 1984, 0.661, 'census-gpu-2'),
        ('decode', 1, 1984, 0.651, 'census-gpu-2'),
        ('forward', 1, 704, 0.719, 'census-gpu-2'),
        ('decode', 1, 704, 0.738, 'census-gpu-2'),
        ('forward', 16, 192, 0.632, 'census-gpu-2'),
        ('forward', 1, 1920, 0.656, 'census-gpu-2'),
        ('decode', 1, 1920, 0.646, 'census-gpu-2'),
        ('forward', 1, 960, 0.648, 'census-gpu-2'),
        ('decode', 1, 960, 0.669, 'census-gpu-2'),
        ('forward', 1, 768, 0.727, 'census-gpu-2'),
        ('decode', 1, 768, 0.733, 'census-gpu-2'),
    ],
    ('llada', 'hadamard'): [
        ('forward', 8, 512, 0.791, 'i20'),
        ('forward', 32, 104, 0.791, 'i20'),
        ('forward', 1, 576, 0.774, 'census-gpu'),
        ('decode', 1, 576, 0.8, 'census-gpu'),
        ('forward', 1, 640, 0.782, 'census-gpu'),
        ('decode', 1, 640, 0.784, 'census-gpu'),
        ('forward', 1, 704, 0.788, 'census-gpu'),
        ('decode', 1, 704, 0.797, 'census-gpu'),
        ('forward', 1, 1984, 0.739, 'census-gpu'),
        ('decode', 1, 1984, 0.726, 'census-gpu'),
        ('forward', 16, 192, 0.716, 'census-gpu'),
        ('forward', 1, 960, 0.729, 'census-gpu'),
        ('decode', 1, 960, 0.751, 'census-gpu'),
        ('forward', 1, 896, 0.726, 'census-gpu'),
        ('decode', 1, 896, 0.731, 'census-gpu'),
        ('forward', 1, 1920, 0.745, 'census-gpu'),
        ('decode', 1, 1920, 0.728, 'census-gpu'),
    ],
    ('llada', 'plain'): [
        ('forward', 8, 512, 0.681, 'i20'),
        ('forward', 32, 104, 0.681, 'i20'),
        ('forward', 1, 576, 0.663, 'census-gpu'),
        ('decode', 1, 576, 0.688, 'census-gpu'),
        ('forward', 1, 640, 0.669, 'census-gpu'),
        ('decode', 1, 640, 0.672, 'census-gpu'),
        ('forward', 1, 704, 0.679, 'census-gpu'),
        ('decode', 1, 704, 0.695, 'census-gpu'),
        ('forward', 1, 1984, 0.624, 'census-gpu'),
        ('decode', 1, 1984, 0.619, 'census-gpu'),
        ('forward', 16, 192, 0.599, 'census-gpu'),
        ('forward', 1, 960, 0.613, 'census-gpu'),
        ('decode', 1, 960, 0.624, 'census-gpu'),
        ('forward', 1, 896, 0.611, 'census-gpu'),
        ('decode', 1, 896, 0.623, 'census-gpu'),
        ('forward', 1, 1920, 0.625, 'census-gpu'),
        ('decode', 1, 1920, 0.624, 'census-gpu'),
    ],
    ('dream', 'transform'): [
        ('forward', 8, 512, 0.75, 'i20'),
        ('forward', 32, 104, 0.75, 'i20'),
        ('forward', 32, 128, 0.737, 'census-gpu'),
        ('forward', 1, 1024, 0.75, 'census-gpu'),
        ('decode', 1, 1024, 0.759, 'census-gpu'),
        ('forward', 32, 192, 0.736, 'census-gpu'),
        ('forward', 32, 64, 0.73, 'census-gpu'),
        ('forward', 1, 1088, 0.802, 'census-gpu'),
        ('decode', 1, 1088, 0.807, 'census-gpu'),
        ('forward', 1, 640, 0.787, 'census-gpu'),
        ('decode', 1, 640, 0.816, 'census-gpu'),
        ('forward', 1, 704, 0.808, 'census-gpu'),
        ('decode', 1, 704, 0.818, 'census-gpu'),
        ('forward', 1, 384, 0.869, 'census-gpu'),
        ('decode', 1, 384, 0.871, 'census-gpu'),
    ],
    ('dream', 'hadamard'): [
        ('forward', 8, 512, 0.739, 'i20'),
        ('forward', 32, 104, 0.739, 'i20'),
        ('forward', 32, 128, 0.72, 'census-gpu'),
        ('forward', 1, 1024, 0.721, 'census-gpu'),
        ('decode', 1, 1024, 0.732, 'census-gpu'),
        ('forward', 32, 192, 0.708, 'census-gpu'),
        ('forward', 32, 64, 0.712, 'census-gpu'),
        ('forward', 1, 1088, 0.772, 'census-gpu'),
        ('decode', 1, 1088, 0.781, 'census-gpu'),
        ('forward', 1, 640, 0.754, 'census-gpu'),
        ('decode', 1, 640, 0.782, 'census-gpu'),
        ('forward', 1, 704, 0.759, 'census-gpu'),
        ('decode', 1, 704, 0.77, 'census-gpu'),
        ('forward', 1, 384, 0.801, 'census-gpu'),
        ('decode', 1, 384, 0.809, 'census-gpu'),
    ],
    ('dream', 'plain'): [
        ('forward', 8, 512, 0.72, 'i20'),
        ('forward', 32, 104, 0.72, 'i20'),
        ('forward', 32, 128, 0.688, 'census-gpu'),
        ('forward', 1, 1024, 0.693, 'census-gpu'),
        ('decode', 1, 1024, 0.705, 'census-gpu'),
        ('forward', 32, 192, 0.686, 'census-gpu'),
        ('forward', 32, 64, 0.68, 'census-gpu'),
        ('forward', 1, 1088, 0.752, 'census-gpu'),
        ('decode', 1, 1088, 0.761, 'census-gpu'),
        ('forward', 1, 640, 0.727, 'census-gpu'),
        ('decode', 1, 640, 0.755, 'census-gpu'),
        ('forward', 1, 704, 0.735, 'census-gpu'),
        ('decode', 1, 704, 0.747, 'census-gpu'),
        ('forward', 1, 384, 0.8, 'census-gpu'),
        ('decode', 1, 384, 0.813, 'census-gpu'),
    ],
}
RATIO_SOURCES = {
    "i20": "benchmarks/lowbit_gpu.py, H100 80GB, 2026-11-27 (issue 20; docs/benchmarks.md)",
    "i30f": "issue 30: batch-1 forward, lent H100 80GB HBM3, torch 2.11, 903acc8",
    "i30d": "issue 30: batch-1 decode (fair_calib decode), lent H100 80GB HBM3, torch 2.11, "
            "903acc8",
    "census-gpu": "PYTHONPATH=. python benchmarks/census_shapes_gpu.py --shapes llada-8b "
                  "dream-7b, lent NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, 2026-11-27 "
                  "(forwards and decodes replayed from CUDA graphs, codes one per byte, "
                  "the int8 Triton GEMM; 20:00 UTC call)",
    "census-gpu-2": "PYTHONPATH=. python benchmarks/census_shapes_gpu.py --shapes llada-8b "
                    "--structures transform, lent NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, "
                    "2026-11-28 (as census-gpu, after LLaDA's down_proj split kernel took "
                    "128 registers a thread: lowbit_triton.SPLIT_TUNED)",
}
JOB_OVERHEAD_S = 60.0          # assumption: loading 16 GB of weights from a shared filesystem

# Calibration (issue 5): FAIR-Calib / FlatQuant at 128 x 1024 tokens, 15 epochs: 15.5 min
# (LLaDA-8B) and 14.1 min (Dream-7B) on an H100; scaled by epochs and by tokens.
CALIB_MIN_15EP_1024 = {"llada": 15.5, "dream": 14.1}
CALIB_FIXED_MIN = {"rtn": 2.0, "fp": 0.0, "quarot": 10.0}   # assumptions (no training loop)
# QDLM's baselines (issue 31), measured: benchmarks/baseline_calibration_gpu.py (lent H100,
# 2026-11-27; random weights at the real widths, 2 blocks, config/qdlm.yaml's calibration
# sizes, projected to all blocks; the larger of LLaDA-8B and Dream-7B): GPTQ 6.0-6.1 min, AWQ
# 7.2-8.1, SmoothQuant 0.9, DuQuant 1.3-1.4. DuQuant's greedy search stops early or runs its
# 256 steps depending on the activations: real weights may take longer than random ones.
CALIB_FIXED_MIN.update({"gptq": 6.1, "awq": 8.1, "smoothquant": 0.9, "duquant": 1.4})

# Stage I probing (issue 4): one random-commit step at batch 32, prompt 128 + window 256.
PROBE_STEP_S = {"llada": 0.406, "dream": 0.376}
# Decoding trajectories (issue 3): one step at batch 8, prompt 128 + window 256.
DECODE_STEP_S = {"llada": 0.094, "dream": 0.088}

# Request shapes of the benchmarks: documents, choices, context tokens at 0-shot, tokens per
# few-shot example, target tokens (assumption: about 4 characters a token, from the data).
TASK_SHAPES = {
    "piqa": dict(docs=1838, choices=2, ctx=40, shot=60, target=25),
    "boolq": dict(docs=3270, choices=2, ctx=150, shot=150, target=1),
    "winogrande": dict(docs=1267, choices=2, ctx=20, shot=30, target=8),
    "arc_easy": dict(docs=2376, choices=4, ctx=30, shot=40, target=5),
    "arc_challenge": dict(docs=1172, choices=4, ctx=35, shot=45, target=6),
    "hellaswag": dict(docs=10042, choices=4, ctx=50, shot=80, target=25),
    "truthfulqa_mc2": dict(docs=817, choices=8, ctx=130, shot=0, target=12),
    "mmlu": dict(docs=14042, choices=4, ctx=110, shot=100, target=1),
    "gsm8k_cot": dict(docs=1319, prompt=70, shot=110, default_shots=8),
    "gsm8k": dict(docs=1319, prompt=70, shot=110, default_shots=5),
    "humaneval": dict(docs=164, prompt=150, shot=0, default_shots=0),
    "humaneval_instruct": dict(docs=164, prompt=170, shot=0, default_shots=0),
    # the Instruct models' recipes (issue 33; prompt tokens with the chat template, estimated)
    "oc_arc_c_gen": dict(docs=295, prompt=70, shot=0, default_shots=0),
    "oc_arc_e_gen": dict(docs=567, prompt=60, shot=0, default_shots=0),
    "oc_piqa_gen": dict(docs=1838, prompt=60, shot=0, default_shots=0),
    "oc_boolq_gen": dict(docs=3270, prompt=170, shot=0, default_shots=0),
    "oc_winogrande_gen": dict(docs=1267, prompt=50, shot=0, default_shots=0),
    "oc_hellaswag_gen": dict(docs=10042, prompt=140, shot=0, default_shots=0),
    "oc_mmlu_gen": dict(docs=14042, prompt=140, shot=140, default_shots=5),
    "oc_gsm8k_gen": dict(docs=1319, prompt=80, shot=260, default_shots=4),
    "oc_humaneval_gen": dict(docs=164, prompt=170, shot=0, default_shots=0),
    "dream_mmlu_generative": dict(docs=14042, prompt=140, shot=100, default_shots=4),
    "dream_humaneval_instruct": dict(docs=164, prompt=330, shot=0, default_shots=0),
}


def quant_scale(family: str, quant: bool | str, method_type: str | None = None) -> float:
    """Quantized forward / FP forward: ``quant`` False (FP), True (W4A4) or the bits string;
    on the FP8 path, that of ``method_type``'s structure (None or a type without a measured
    structure: the family's slowest)."""
    if not quant:
        return 1.0
    from fair_calib.quant.lowbit import gemm_kind

    bits = "w4a4" if quant is True else str(quant).lower()
    w, a = (int(v) for v in bits.removeprefix("w").split("a"))
    if gemm_kind(w, a) != "fp8":
        return QUANT_SCALE
    fam = family.removeprefix("tiny-")
    by_structure = REAL_QUANT_SCALE.get(fam) or max(REAL_QUANT_SCALE.values(),
                                                    key=lambda v: max(v.values()))
    structure = METHOD_STRUCTURE.get(method_type or "")
    return by_structure[structure] if structure else max(by_structure.values())


def forward_s(tokens: int, family: str, quant: bool | str, method_type: str | None = None) -> float:
    scale = (FAMILY_SCALE.get(family.removeprefix("tiny-"), 1.0)
             * quant_scale(family, quant, method_type))
    return (FWD_FIXED_S + tokens * FWD_TOKEN_S) * scale


def quant_ratio(family: str, structure: str, request_class: str, rows: int,
                tokens: int) -> tuple[float, tuple | None]:
    """(quantized / bf16 time, the QUANT_RATIOS entry used) of a census shape: ``structure``
    ``fp`` (1.0), ``fake`` (QUANT_SCALE), ``unmeasured`` (the family's slowest structure at
    this shape), else the nearest entry of the request's mode."""
    if structure == "fp":
        return 1.0, None
    if structure == "fake":
        return QUANT_SCALE, None
    fam = family.removeprefix("tiny-")
    if structure == "unmeasured" or (fam, structure) not in QUANT_RATIOS:
        cands = [quant_ratio(f, s, request_class, rows, tokens) for f, s in QUANT_RATIOS
                 if f == fam and (structure == "unmeasured" or s == structure)]
        cands = cands or [quant_ratio(f, s, request_class, rows, tokens) for f, s in QUANT_RATIOS
                          if structure in ("unmeasured", s)]
        return max(cands, key=lambda c: c[0])
    entries = QUANT_RATIOS[(fam, structure)]
    if request_class == "generate" and any(e[0] == "decode" for e in entries):
        entries = [e for e in entries if e[0] == "decode"]
    else:
        entries = [e for e in entries if e[0] == "forward"]
    best = min(entries, key=lambda e: (abs(math.log(rows / e[1])) + abs(math.log(tokens / e[2])),
                                       -e[3]))
    return best[3], best


def bf16_forward_s(rows: int, tokens: float, family: str) -> float:
    """One bf16 forward of ``rows`` x ``tokens`` (the FWD_* fit, FAMILY_SCALE)."""
    return (FWD_FIXED_S + rows * tokens * FWD_TOKEN_S) * FAMILY_SCALE.get(
        family.removeprefix("tiny-"), 1.0)


# A bf16 forward replayed from a CUDA graph, as the evaluation stage runs repeated forwards
# (fair_calib.models.graphs): fitted to the bf16 replays of benchmarks/census_shapes_gpu.py
# (lent H100 80GB HBM3, 2026-11-27; LLaDA-8B: 8 shapes of 576-3,072 tokens, 2.5 ms + 26.3 us a
# token, residuals <= 6%; Dream-7B 2.3 ms + 24.6 us, i.e. FAMILY_SCALE 0.9 within 7%; the
# H200's fit was 3.0 ms + 25.1 us), and a generation step's own work (sampling, commits) on
# top: 1.2-2.3 ms (LLaDA), 0.9-1.0 ms (Dream) in the decodes of benchmarks/decode_graphs_gpu.py.
# Every forward is priced at replay speed: the first call of a shape runs eagerly and the
# second captures it, which the projection leaves out (a generation's 2 of 256 steps; an MC
# request of Dream's 4 forwards per choice pays it on half of them: an underestimate there).
REPLAY_FIXED_S = 0.0025
REPLAY_TOKEN_S = 26.3e-6
DECODE_STEP_S_EXTRA = {"llada": 0.002, "dream": 0.001}


def bf16_replay_s(rows: int, tokens: float, family: str, request_class: str) -> float:
    """One replayed bf16 forward of ``rows`` x ``tokens`` (a generation step's work included)."""
    fam = family.removeprefix("tiny-")
    s = (REPLAY_FIXED_S + rows * tokens * REPLAY_TOKEN_S) * FAMILY_SCALE.get(fam, 1.0)
    return s + (DECODE_STEP_S_EXTRA.get(fam, 0.002) if request_class == "generate" else 0.0)


def census_seconds(family: str, structure: str, request_class: str, rows: int,
                   tokens: float) -> float:
    """GPU seconds of one forward of a census shape in its execution mode (replayed)."""
    ratio, _ = quant_ratio(family, structure, request_class, rows, max(int(tokens), 1))
    return bf16_replay_s(rows, tokens, family, request_class) * ratio


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Snakemake's --configfile merge: dictionaries key by key, everything else replaced."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(base[k], v) if isinstance(v, Mapping) and isinstance(base.get(k), Mapping) else v
    return out


# ----------------------------------------------------------------------------- evaluation
def mc_task_seconds(t: Mapping[str, Any], shape: Mapping[str, Any], family: str, quant: bool,
                    adapter_lik: Mapping[str, Any], method_type: str | None = None) -> float:
    """One likelihood task on one model: every document's forwards."""
    lik = {**adapter_lik, **{k: t[k] for k in ("mc_num", "batch_size", "cfg_scale", "exact_below")
                             if t.get(k) is not None}}
    rows, mc_num = int(lik["batch_size"]), int(lik["mc_num"])
    guided = 2 if float(lik.get("cfg_scale", 0.0)) > 0 else 1
    dream = lik["estimator"] == "dream"
    ctx = shape["ctx"] + shape["shot"] * int(t.get("num_fewshot") or 0)
    tokens = ctx + shape["target"] + int(dream)                  # Dream appends EOS
    maskable = shape["target"]
    if 0 < maskable < int(lik.get("exact_below", 0)):
        if maskable == 1:                                       # choices share one forward
            return shape["docs"] * forward_s(guided * tokens, family, quant, method_type)
        patterns = 2 ** maskable - 1
        n_fwd = math.ceil(shape["choices"] * patterns / max(rows, 32))
        return shape["docs"] * n_fwd * forward_s(guided * max(rows, 32) * tokens, family, quant,
                                                 method_type)
    per_choice = max(mc_num // rows, 1) * forward_s(guided * rows * tokens, family, quant,
                                                     method_type)
    return shape["docs"] * shape["choices"] * per_choice


def gen_task_seconds(t: Mapping[str, Any], shape: Mapping[str, Any], family: str, quant: bool,
                     adapter_dec: Mapping[str, Any], method_type: str | None = None) -> float:
    shots = t.get("num_fewshot")
    shots = shape["default_shots"] if shots is None else int(shots)
    gen = int(t.get("gen_length") or adapter_dec.get("gen_length", 256))
    steps = int(t.get("steps") or adapter_dec.get("steps", gen))
    bs = int(t.get("batch_size") or 1)
    tokens = bs * (shape["prompt"] + shots * shape["shot"] + gen)
    return math.ceil(shape["docs"] / bs) * steps * forward_s(tokens, family, quant, method_type)


def eval_seconds(cfg: Mapping[str, Any], model: str, method: str, task: str,
                 bits: str = "w4a4") -> float:
    """The old model (``TASK_SHAPES``, one ratio per structure): one evaluation's seconds."""
    from fair_calib.models.adapters import get_adapter

    family = cfg["models"][model]["family"]
    t = resolve_task(task, cfg["tasks"][task], model, family, by_model=use_by_model(cfg))
    name = t.get("lm_eval_task") or task
    if name not in TASK_SHAPES:
        return 0.0                                  # synthetic tasks: CPU-sized
    mtype = cfg["methods"][base_method(method)]["type"]
    quant = bits if mtype != "fp" else False
    adapter = get_adapter(family)
    shape = TASK_SHAPES[name]
    if "ctx" in shape:
        sec = mc_task_seconds(t, shape, family, quant, adapter.likelihood, mtype)
    else:
        sec = gen_task_seconds(t, shape, family, quant, adapter.decoding, mtype)
    return sec + int(t.get("shards", 1)) * JOB_OVERHEAD_S


# ----------------------------------------------------------------------------- other rules
def calib_seconds(cfg: Mapping[str, Any], model: str, method: str) -> float:
    entry, family = cfg["methods"][base_method(method)], cfg["models"][model]["family"]
    calib = {**cfg["calibration"], **entry.get("calibration", {}),
             **entry.get("calibration_by_family", {}).get(family, {})}
    if entry["type"] in CALIB_FIXED_MIN:
        return CALIB_FIXED_MIN[entry["type"]] * 60 + JOB_OVERHEAD_S
    tokens = int(calib["n_samples"]) * int(calib["seq_len"])
    scale = tokens / (128 * 1024) * float(entry.get("epochs", 15)) / 15
    return CALIB_MIN_15EP_1024.get(family, 15.5) * 60 * scale + JOB_OVERHEAD_S


def probe_seconds(cfg: Mapping[str, Any], model: str, probe: str) -> float:
    p, family = cfg["probes"][probe], cfg["models"][model]["family"]
    batch = int(p.get("batch_size", 8))
    step = PROBE_STEP_S.get(family, 0.4) * batch / 32 * (128 + int(p["gen_length"])) / 384
    return math.ceil(int(p["n_samples"]) / batch) * int(p["steps"]) * step + \
        int(p.get("shards", 1)) * JOB_OVERHEAD_S


def trajectory_seconds(cfg: Mapping[str, Any], model: str, method: str) -> float:
    diag = cfg["diagnostics"]
    probe = cfg["probes"][diag.get("probe", "default")]
    family = cfg["models"][model]["family"]
    quant = cfg["methods"][base_method(method)]["type"] != "fp"
    runs = 2 if quant else 1                          # free-running and teacher-forced
    step = DECODE_STEP_S.get(family, 0.09) * quant_scale(family, quant)
    return (runs * math.ceil(int(diag.get("n_samples", 16)) / 8) * int(probe["steps"]) * step
            + JOB_OVERHEAD_S)


# ----------------------------------------------------------------------------- projection
def project(cfg: Mapping[str, Any], census: list[dict] | None = None,
            per_cell: Mapping[tuple, float] | None = None) -> dict[str, Any]:
    """``{"rules": {rule: {"jobs", "gpu_hours"}}, "total_gpu_hours", "evaluate_by_task"}`` over
    the plan's jobs (fair_calib.plan). Evaluation is priced by the old model (``TASK_SHAPES``,
    one ratio per structure); with ``census`` (fair_calib.census records of this config, and
    ``per_cell``, its seconds per evaluation) also by the census (each shape in its execution
    mode, QUANT_RATIOS), under ``"census"``."""
    from fair_calib import plan

    ev = plan.eval_cells(cfg)
    by_task: dict[str, float] = {}
    longest = 0.0                                   # the longest evaluation shard (one job)
    for model, method, bits, task in ev:
        sec = eval_seconds(cfg, model, method, task, bits)
        by_task[task] = by_task.get(task, 0.0) + sec
        longest = max(longest, sec / plan.task_shards(cfg, model, task))
    jobs = plan.job_counts(cfg)
    rules = {
        "probe_shard": sum(probe_seconds(cfg, m, p) for m, p in plan.probe_cells(cfg)),
        "calibrate": sum(calib_seconds(cfg, m, x) for m, x, _ in plan.calib_cells(cfg)),
        "evaluate_shard": sum(by_task.values()),
        "trajectories": sum(trajectory_seconds(cfg, m, x)
                            for m, x, _ in plan.trajectory_cells(cfg)),
    }
    out = {rule: {"jobs": jobs.get(rule, 0), "gpu_hours": round(sec / 3600, 1)}
           for rule, sec in rules.items()}
    out["evaluate_shard"]["longest_job_hours"] = round(longest / 3600, 1)
    res = {"rules": out, "total_gpu_hours": round(sum(rules.values()) / 3600, 1),
           "evaluate_by_task": {t: round(s / 3600, 1) for t, s in sorted(by_task.items())},
           "cpu_jobs": {r: n for r, n in jobs.items() if r not in rules}}
    if census is not None:
        res["census"] = census_projection(cfg, census, rules, per_cell or {})
    return res


def census_projection(cfg: Mapping[str, Any], census: list[dict], rules: Mapping[str, float],
                      per_cell: Mapping[tuple, float]) -> dict[str, Any]:
    """Evaluation from the census (forwards priced per shape, plus each shard's start), the
    other rules as in the old model."""
    from fair_calib import plan

    by_task: dict[str, float] = {}
    for r in census:
        by_task[r["task"]] = by_task.get(r["task"], 0.0) + r["gpu_seconds"]
    by_class: dict[str, float] = {}
    for r in census:
        key = f"{r['request_class']} {r['structure']}"
        by_class[key] = by_class.get(key, 0.0) + r["gpu_seconds"]
    overhead = sum(plan.task_shards(cfg, m, t) * JOB_OVERHEAD_S
                   for m, _, _, t in plan.eval_cells(cfg) if cfg["tasks"][t]["kind"] == "lm_eval")
    evaluate = sum(by_task.values()) + overhead
    longest = max((sec / plan.task_shards(cfg, m, t) + JOB_OVERHEAD_S
                   for (m, _, _, t), sec in per_cell.items()), default=0.0)
    other = sum(s for r, s in rules.items() if r != "evaluate_shard")
    return {"evaluate_gpu_hours": round(evaluate / 3600, 1),
            "total_gpu_hours": round((evaluate + other) / 3600, 1),
            "evaluate_by_task": {t: round(s / 3600, 1) for t, s in sorted(by_task.items())},
            "evaluate_by_class": {k: round(s / 3600, 1) for k, s in sorted(by_class.items())},
            "job_starts_gpu_hours": round(overhead / 3600, 1),
            "longest_job_hours": round(longest / 3600, 1)}


def load_config(configfiles: list[str | Path], base: str | Path | None = None) -> dict[str, Any]:
    """The config Snakemake runs: ``base`` (default: ``config/config.yaml`` of the checkout
    this runs in, the current directory) with each of ``configfiles`` merged over it in turn,
    checked as the Snakefile checks it before any job, the schema's defaults filled. A missing
    or non-YAML file or an invalid config raises a one-line
    :class:`fair_calib.config.ConfigError` naming the file or key."""
    from fair_calib.config import merged_config
    from fair_calib.references import validated

    return validated(merged_config(configfiles, base))


def run_cli(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="fair-calib cost", description=__doc__.split("\n")[0])
    ap.add_argument("--configfile", required=True, nargs="+", help="merged in order")
    ap.add_argument("--base", default=None,
                    help="merged under --configfile (default: ./config/config.yaml, the "
                         "checkout in the current directory)")
    ap.add_argument("--data-dir", default=None,
                    help="offline data for the census (default FAIR_CALIB_DATA_DIR)")
    ap.add_argument("--no-census", action="store_true",
                    help="the old per-task model only (no census-based projection)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from fair_calib.config import ConfigError
    try:
        cfg = load_config(args.configfile, args.base)
    except ConfigError as err:
        sys.exit(f"error: fair-calib cost: {err}")
    per_cell: dict = {}
    records, why = ((None, "--no-census") if args.no_census
                    else _census_or_reason(cfg, args.data_dir, per_cell))
    res = project(cfg, records, per_cell)
    if args.json:
        print(json.dumps(res, indent=1))
        return
    _print_projection(res, why)


def _census_or_reason(cfg: Mapping[str, Any], data_dir: str | None, per_cell: dict):
    from fair_calib import census

    try:
        return census.census(cfg, data_dir, per_cell=per_cell), None
    except FileNotFoundError as err:
        return None, str(err)


def _print_projection(res: Mapping[str, Any], why: str | None) -> None:
    print("| rule | jobs | GPU-hours (H100) |\n|---|---|---|")
    for rule, r in res["rules"].items():
        print(f"| {rule} | {r['jobs']} | {r['gpu_hours']} |")
    print(f"| **total** | | **{res['total_gpu_hours']}** |\n")
    print("CPU jobs: " + ", ".join(f"{r} {n}" for r, n in res["cpu_jobs"].items()))
    print(f"longest evaluation job: {res['rules']['evaluate_shard']['longest_job_hours']} h "
          f"(compare resources.evaluate_shard.runtime)\nevaluate_shard by task (GPU-hours):")
    cen = res.get("census")
    print(f"  {'task':16s} {'before':>8s} {'after':>8s}")
    for task, h in res["evaluate_by_task"].items():
        after = cen["evaluate_by_task"].get(task, 0.0) if cen else "-"
        print(f"  {task:16s} {h:8} {after:>8}")
    print(f"\nbefore (one ratio per structure, TASK_SHAPES): {res['total_gpu_hours']} GPU-hours, "
          f"evaluation {res['rules']['evaluate_shard']['gpu_hours']}")
    if cen is None:
        print(f"after (census, each request class at its measured ratio): not computed ({why})")
        return
    print(f"after (census, each request class at its measured ratio, QUANT_RATIOS): "
          f"{cen['total_gpu_hours']} GPU-hours, evaluation {cen['evaluate_gpu_hours']} "
          f"(job starts {cen['job_starts_gpu_hours']}); longest evaluation job "
          f"{cen['longest_job_hours']} h")
    print("  evaluation by request class and structure (GPU-hours): " + ", ".join(
        f"{k} {h}" for k, h in sorted(cen["evaluate_by_class"].items(), key=lambda kv: -kv[1])))
