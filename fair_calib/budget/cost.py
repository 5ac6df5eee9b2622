"""GPU-hours of a config's DAG, per rule and in total: the census's forwards, priced.

    fair-calib cost --configfile config/paper.yaml [more.yaml ...] [--base config/config.yaml]
                    [--data-dir DIR] [--tokenizer MODEL_OR_FAMILY=FOLDER] [--json]

The config is the one Snakemake runs in this checkout: ``--base`` (default
``./config/config.yaml`` of the current directory) with the ``--configfile`` files merged over
it, validated and the schema's defaults filled. The jobs are the plan's (fair_calib/checks/plan.py:
seeds, shards, tables, priors, probes, trajectories; tests/budget/test_cost.py checks every rule's
count against ``snakemake -n``). Every number below is a measurement on one H100 80GB
(docs/benchmarks.md, random weights at the real shapes) or an assumption named as such; the
projection is as good as they are and is meant for sizing an allocation, not for reporting.

Evaluation is priced from the census (:mod:`fair_calib.budget.census`: the forwards the evaluation
stage's own lm-eval requests make, per shape): each forward at bf16 replay speed
(``bf16_replay_s``) times the nearest measured quantized / bf16 ratio of its structure and
execution mode (``QUANT_RATIOS``: batch-1 generation at decode ratios, MC and exact forwards at
forward ratios), plus ``JOB_OVERHEAD_S`` a shard. The tiny families are priced as the family
they imitate. The census needs the offline data (``FAIR_CALIB_DATA_DIR`` or ``--data-dir``);
without it, or with a task it cannot count, the command stops saying which.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Mapping

from fair_calib.budget.census import METHOD_STRUCTURE
from fair_calib.checks.plan import base_method
from fair_calib.checks.references import load_config  # noqa: F401  (fair-calib cost's config)

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
# They are QUANT_RATIOS' "i20" entries, and price the diagnostics' quantized decodes.
REAL_QUANT_SCALE = {
    "llada": {"transform": 0.726, "hadamard": 0.791, "plain": 0.681},
    "dream": {"transform": 0.750, "hadamard": 0.739, "plain": 0.720},
}
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

def quant_scale(family: str, quant: bool | str, method_type: str | None = None) -> float:
    """Quantized forward / FP forward (the diagnostics' decodes): ``quant`` False (FP), True
    (W4A4) or the bits string; on a real low-bit path, that of ``method_type``'s structure
    (None or a type without a measured structure: the family's slowest)."""
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




# ----------------------------------------------------------------------------- evaluation
def priced(records) -> list[dict]:
    """Census records (``fair_calib.budget.census.CENSUS_COLUMNS``) with ``gpu_seconds``: their
    forwards at ``census_seconds`` of the record's mean tokens (for ranking shapes; the
    projection prices every forward at its own tokens)."""
    return [{**r, "gpu_seconds": r["forwards"] * census_seconds(
        r["family"], r["structure"], r["request_class"], int(r["rows"]), r["tokens_mean"])}
        for r in records]


def hours(seconds: float) -> float:
    """GPU-hours to three significant digits: a small config's tasks are not printed as 0."""
    return float(f"{seconds / 3600:.3g}")


def evaluation_projection(cfg: Mapping[str, Any], cen) -> dict[str, Any]:
    """Evaluation from the census: per task, per request class and structure, the shards'
    starts, and the longest shard (one job)."""
    from fair_calib.checks import plan
    from fair_calib.budget.census import structure

    by_task: dict[str, float] = {}
    by_class: dict[str, float] = {}
    longest = 0.0
    for (model, run, bits, task), fwd in cen.cells.items():
        family, struct = cfg["models"][model]["family"], structure(cfg, run, bits)
        cell = 0.0
        for (cls, rows, tokens), n in fwd.items():
            sec = n * census_seconds(family, struct, cls, rows, tokens)
            by_class[f"{cls} {struct}"] = by_class.get(f"{cls} {struct}", 0.0) + sec
            cell += sec
        by_task[task] = by_task.get(task, 0.0) + cell
        longest = max(longest, cell / plan.task_shards(cfg, model, task) + JOB_OVERHEAD_S)
    starts = sum(plan.task_shards(cfg, m, t) * JOB_OVERHEAD_S for m, _, _, t in cen.cells)
    return {"seconds": sum(by_task.values()) + starts,
            "by_task": {t: hours(s) for t, s in sorted(by_task.items())},
            "by_class": {k: hours(s) for k, s in sorted(by_class.items())},
            "job_starts_gpu_hours": round(starts / 3600, 1),
            "longest_job_hours": round(longest / 3600, 1)}


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
def project(cfg: Mapping[str, Any], cen) -> dict[str, Any]:
    """``{"rules": {rule: {"jobs", "gpu_hours"}}, "total_gpu_hours", "evaluate_by_task",
    "evaluate_by_class", ...}`` over the plan's jobs (fair_calib.checks.plan); evaluation priced from
    ``cen``, the config's census (:func:`fair_calib.budget.census.census`)."""
    from fair_calib.checks import plan

    ev = evaluation_projection(cfg, cen)
    jobs = plan.job_counts(cfg)
    seconds = {
        "probe_shard": sum(probe_seconds(cfg, m, p) for m, p in plan.probe_cells(cfg)),
        "calibrate": sum(calib_seconds(cfg, m, x) for m, x, _ in plan.calib_cells(cfg)),
        "evaluate_shard": ev["seconds"],
        "trajectories": sum(trajectory_seconds(cfg, m, x)
                            for m, x, _ in plan.trajectory_cells(cfg)),
    }
    rules = {rule: {"jobs": jobs.get(rule, 0), "gpu_hours": round(sec / 3600, 1)}
             for rule, sec in seconds.items()}
    rules["evaluate_shard"]["longest_job_hours"] = ev["longest_job_hours"]
    return {"rules": rules, "total_gpu_hours": round(sum(seconds.values()) / 3600, 1),
            "evaluate_by_task": ev["by_task"], "evaluate_by_class": ev["by_class"],
            "job_starts_gpu_hours": ev["job_starts_gpu_hours"],
            "cpu_jobs": {r: n for r, n in jobs.items() if r not in seconds},
            "tokens_counted_by": dict(cen.tokenizers), "stand_ins": dict(cen.stand_ins)}


def run_cli(argv: list[str]) -> None:
    from fair_calib.budget import census

    ap = argparse.ArgumentParser(prog="fair-calib cost", description=__doc__.split("\n")[0])
    census.add_census_args(ap)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from fair_calib.checks.config import ConfigError
    try:
        cfg = load_config(args.configfile, args.base)
    except ConfigError as err:
        sys.exit(f"error: fair-calib cost: {err}")
    try:
        cen = census.census(cfg, args.data_dir, census.tokenizer_args(args.tokenizer))
    except (FileNotFoundError, census.CensusError) as err:
        sys.exit(f"error: fair-calib cost: the census: {err}")
    res = project(cfg, cen)
    if args.json:
        print(json.dumps(res, indent=1))
        return
    print_projection(res)


def print_projection(res: Mapping[str, Any]) -> None:
    print("| rule | jobs | GPU-hours (H100) |\n|---|---|---|")
    for rule, r in res["rules"].items():
        print(f"| {rule} | {r['jobs']} | {r['gpu_hours']} |")
    print(f"| **total** | | **{res['total_gpu_hours']}** |\n")
    print("CPU jobs: " + ", ".join(f"{r} {n}" for r, n in res["cpu_jobs"].items()))
    print(f"longest evaluation job: {res['rules']['evaluate_shard']['longest_job_hours']} h "
          f"(compare resources.evaluate_shard.runtime); evaluation's job starts: "
          f"{res['job_starts_gpu_hours']} h")
    print("evaluate_shard by task (GPU-hours): " + ", ".join(
        f"{t} {h}" for t, h in res["evaluate_by_task"].items()))
    print("evaluate_shard by request class and structure (GPU-hours): " + ", ".join(
        f"{k} {h}" for k, h in sorted(res["evaluate_by_class"].items(), key=lambda kv: -kv[1])))
    print("tokens counted by: " + ", ".join(
        f"{m} {w}" for m, w in res["tokens_counted_by"].items()))
    for task, note in res["stand_ins"].items():
        print(f"stand-in: {task}: {note}")
