"""GPU-hours of a config's DAG, per rule and in total, from measured throughputs.

    fair-calib cost --configfile config/paper.yaml [more.yaml ...] [--base config/config.yaml] [--json]

The config is merged over ``--base`` as Snakemake merges ``--configfile`` over the default.
Every number below is a measurement on one H100 80GB (docs/benchmarks.md, random weights at
the real shapes) or an assumption named as such; the projection is as good as they are and
is meant for sizing an allocation, not for reporting.

Evaluation is costed per request with the settings each (task, model) job really runs with
(``by_family``/``by_model`` resolved): MC forwards of ``batch_size`` rows (two with cfg),
``mc_num // rows`` per choice, or exact mode's shared forwards; generation as ``steps``
forwards per batch. A forward of ``n`` tokens in all costs ``FWD_FIXED_S + n * FWD_TOKEN_S``
(fitted to the LLaDA-8B measurements of issues 3, 6 and 14: 102 ms for 32 x 104 tokens,
24 ms for 8 x 54, 47 ms for 8 x 161, 28 ms for 601).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Mapping

from fair_calib.evaluate.task_settings import resolve_task, use_by_model

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
# W8A8 keeps fake quantization under auto (INT8 measured 1.5-1.8x FP).
REAL_QUANT_SCALE = {
    "llada": {"transform": 0.726, "hadamard": 0.791, "plain": 0.681},
    "dream": {"transform": 0.750, "hadamard": 0.739, "plain": 0.720},
}
METHOD_STRUCTURE = {"fair_calib": "transform", "flatquant": "transform", "quarot": "hadamard",
                    "rtn": "plain"}
JOB_OVERHEAD_S = 60.0          # assumption: loading 16 GB of weights from a shared filesystem

# Calibration (issue 5): FAIR-Calib / FlatQuant at 128 x 1024 tokens, 15 epochs: 15.5 min
# (LLaDA-8B) and 14.1 min (Dream-7B) on an H100; scaled by epochs and by tokens.
CALIB_MIN_15EP_1024 = {"llada": 15.5, "dream": 14.1}
CALIB_FIXED_MIN = {"rtn": 2.0, "fp": 0.0, "quarot": 10.0}   # assumptions (no training loop)

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


def eval_cells(cfg: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """(model, method, bits, task) of every evaluation the tables need (as the DAG)."""
    cells = set()
    for t in cfg["tables"].values():
        if "tasks" not in t:
            continue
        methods = list(dict.fromkeys(t["methods"] + [m for m, *_ in t.get("rows", [])]))
        for model in t["models"]:
            for method in methods:
                bits = "fp" if cfg["methods"][method]["type"] == "fp" else t["bits"]
                cells.update((model, method, bits, task) for task in t["tasks"])
    return sorted(cells)


def eval_seconds(cfg: Mapping[str, Any], model: str, method: str, task: str,
                 bits: str = "w4a4") -> float:
    from fair_calib.models.adapters import get_adapter

    family = cfg["models"][model]["family"]
    t = resolve_task(task, cfg["tasks"][task], model, family, by_model=use_by_model(cfg))
    name = t.get("lm_eval_task") or task
    if name not in TASK_SHAPES:
        return 0.0                                  # synthetic tasks: CPU-sized
    mtype = cfg["methods"][method]["type"]
    quant = bits if mtype != "fp" else False
    adapter = get_adapter(family)
    shape = TASK_SHAPES[name]
    if "ctx" in shape:
        sec = mc_task_seconds(t, shape, family, quant, adapter.likelihood, mtype)
    else:
        sec = gen_task_seconds(t, shape, family, quant, adapter.decoding, mtype)
    return sec + int(t.get("shards", 1)) * JOB_OVERHEAD_S


# ----------------------------------------------------------------------------- other rules
def calib_cells(cfg: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    cells = {(m, x, b) for m, x, b, _ in eval_cells(cfg) if b != "fp"}
    for t in cfg["tables"].values():
        if t["kind"] in ("calib_memory", "deploy_memory"):
            methods = t["methods"] + [t[k] for k in ("baseline", "method") if k in t]
            cells.update((m, x, t["bits"]) for m in t["models"] for x in methods
                         if cfg["methods"][x]["type"] != "fp")
    return sorted(cells)


def calib_seconds(cfg: Mapping[str, Any], model: str, method: str) -> float:
    entry, family = cfg["methods"][method], cfg["models"][model]["family"]
    calib = {**cfg["calibration"], **entry.get("calibration", {}),
             **entry.get("calibration_by_family", {}).get(family, {})}
    if entry["type"] in CALIB_FIXED_MIN:
        return CALIB_FIXED_MIN[entry["type"]] * 60 + JOB_OVERHEAD_S
    tokens = int(calib["n_samples"]) * int(calib["seq_len"])
    scale = tokens / (128 * 1024) * float(entry.get("epochs", 15)) / 15
    return CALIB_MIN_15EP_1024.get(family, 15.5) * 60 * scale + JOB_OVERHEAD_S


def probe_cells(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    cells = set()
    for t in cfg["tables"].values():
        for method in t["methods"] + [m for m, *_ in t.get("rows", [])]:
            prior = cfg["methods"][method].get("prior")
            if prior:
                cells.update((m, cfg["priors"][prior]["probe"]) for m in t["models"])
    diag = cfg.get("diagnostics", {})
    if diag.get("enabled", True):
        cells.update((m, diag.get("probe", "default")) for m in diag.get("models", []))
    return sorted(cells)


def probe_seconds(cfg: Mapping[str, Any], model: str, probe: str) -> float:
    p, family = cfg["probes"][probe], cfg["models"][model]["family"]
    batch = int(p.get("batch_size", 32))
    step = PROBE_STEP_S.get(family, 0.4) * batch / 32 * (128 + int(p["gen_length"])) / 384
    return math.ceil(int(p["n_samples"]) / batch) * int(p["steps"]) * step + \
        int(p.get("shards", 1)) * JOB_OVERHEAD_S


def trajectory_seconds(cfg: Mapping[str, Any]) -> tuple[int, float]:
    diag = cfg.get("diagnostics", {})
    if not diag.get("enabled", True) or not diag.get("models"):
        return 0, 0.0
    probe = cfg["probes"][diag.get("probe", "default")]
    jobs, sec = 0, 0.0
    for model in diag["models"]:
        family = cfg["models"][model]["family"]
        for method in ["fp"] + [m for m in diag.get("methods", []) if m != "fp"]:
            quant = method != "fp"
            runs = 2 if quant else 1                      # free-running and teacher-forced
            step = DECODE_STEP_S.get(family, 0.09) * quant_scale(family, quant)
            sec += runs * math.ceil(int(diag.get("n_samples", 16)) / 8) * int(probe["steps"]) * step
            sec += JOB_OVERHEAD_S
            jobs += 1
    return jobs, sec


# ----------------------------------------------------------------------------- projection
def project(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``{rule: {"jobs", "gpu_hours"}, "total_gpu_hours", "evaluate_by_task"}``."""
    ev = eval_cells(cfg)
    by_task: dict[str, float] = {}
    longest = 0.0                                   # the longest evaluation shard (one job)
    for model, method, bits, task in ev:
        sec = eval_seconds(cfg, model, method, task, bits)
        by_task[task] = by_task.get(task, 0.0) + sec
        shards = resolve_task(task, cfg["tasks"][task], model, cfg["models"][model]["family"],
                              by_model=use_by_model(cfg))
        longest = max(longest, sec / int(shards.get("shards", 1)))
    calib = calib_cells(cfg)
    probes = probe_cells(cfg)
    traj_jobs, traj_s = trajectory_seconds(cfg)
    rules = {
        "probe_shard": (sum(int(cfg["probes"][p].get("shards", 1)) for _, p in probes),
                        sum(probe_seconds(cfg, m, p) for m, p in probes)),
        "calibrate": (len(calib), sum(calib_seconds(cfg, m, x) for m, x, _ in calib)),
        "evaluate_shard": (sum(int(resolve_task(t, cfg["tasks"][t], m, cfg["models"][m]["family"],
                                                by_model=use_by_model(cfg)).get("shards", 1))
                               for m, _, _, t in ev), sum(by_task.values())),
        "trajectories": (traj_jobs, traj_s),
    }
    out = {rule: {"jobs": jobs, "gpu_hours": round(sec / 3600, 1)} for rule, (jobs, sec) in rules.items()}
    out["evaluate_shard"]["longest_job_hours"] = round(longest / 3600, 1)
    return {"rules": out, "total_gpu_hours": round(sum(s for _, s in rules.values()) / 3600, 1),
            "evaluate_by_task": {t: round(s / 3600, 1) for t, s in sorted(by_task.items())}}


def load_config(configfiles: list[str | Path], base: str | Path | None = None) -> dict[str, Any]:
    """``base`` (default: the repository's config/config.yaml, wherever this runs from) with
    each of ``configfiles`` merged over it in turn (as Snakemake does), checked as the
    Snakefile checks it before any job. A missing or non-YAML file or an invalid config raises
    a one-line :class:`fair_calib.config.ConfigError` naming the file or key."""
    import copy

    from fair_calib.config import merged_config
    from fair_calib.references import validated

    cfg = merged_config(configfiles, base)
    validated(copy.deepcopy(cfg))       # the projection reads the config as written
    return cfg


def run_cli(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="fair-calib cost", description=__doc__.split("\n")[0])
    ap.add_argument("--configfile", required=True, nargs="+", help="merged in order")
    ap.add_argument("--base", default=None,
                    help="merged under --configfile (default: the repository's config/config.yaml)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from fair_calib.config import ConfigError
    try:
        res = project(load_config(args.configfile, args.base))
    except ConfigError as err:
        sys.exit(f"error: fair-calib cost: {err}")
    if args.json:
        print(json.dumps(res, indent=1))
        return
    print("| rule | jobs | GPU-hours (H100) |\n|---|---|---|")
    for rule, r in res["rules"].items():
        print(f"| {rule} | {r['jobs']} | {r['gpu_hours']} |")
    print(f"| **total** | | **{res['total_gpu_hours']}** |\n")
    print(f"longest evaluation job: {res['rules']['evaluate_shard']['longest_job_hours']} h "
          f"(compare resources.evaluate_shard.runtime)\nevaluate_shard by task (GPU-hours):")
    for task, h in res["evaluate_by_task"].items():
        print(f"  {task:16s} {h}")
