"""The jobs Snakemake plans for a config, without Snakemake (torch-free).

``fair-calib cost`` prices these jobs, so its job counts are the plan's: the same expansion as
workflow/rules/*.smk -- calibration seeds (a method with ``seeds`` runs as ``name@s<k>``, one
calibration and one evaluation per seed; memory tables read the first seed's calibration; the
diagnostics read the method's own name), task shards resolved per model (``by_family`` /
``by_model``), priors and their probe shards (for calibrations, the diagnostics' figures, the
cross-corpus pairs and the prior ablation), trajectories and the tiny models' jobs. The config
must be the one Snakemake reads: merged and validated with the schema's defaults filled
(:func:`fair_calib.checks.references.load_config`). tests/budget/test_cost.py compares every rule's count with
``snakemake -n`` on config/paper.yaml, with and without seeds.
"""
from __future__ import annotations

from typing import Any, Mapping

from fair_calib.evaluate.task_settings import resolve_task, use_by_model

SEED_SEP = "@s"     # as workflow/rules/common.smk


def base_method(run: str) -> str:
    return run.split(SEED_SEP, 1)[0]


def method_runs(cfg: Mapping[str, Any], method: str) -> list[str]:
    seeds = cfg["methods"][base_method(method)].get("seeds")
    return [f"{method}{SEED_SEP}{s}" for s in seeds] if seeds else [method]


def is_fp(cfg: Mapping[str, Any], method: str) -> bool:
    return cfg["methods"][base_method(method)]["type"] == "fp"


def table_methods(t: Mapping[str, Any]) -> list[str]:
    extra = [t[k] for k in ("baseline", "method") if k in t] + [m for m, *_ in t.get("rows", [])]
    return list(dict.fromkeys(t["methods"] + extra))


def _ablation(cfg: Mapping[str, Any]) -> Mapping[str, Any] | None:
    abl = cfg.get("prior_ablation", {})
    return abl if abl.get("enabled", True) and abl.get("models") else None


def tables(cfg: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The configured tables, plus the prior ablation's (common.smk's ablation_table)."""
    out = dict(cfg["tables"])
    abl = _ablation(cfg)
    if abl:
        fp = [m for m in cfg["methods"] if cfg["methods"][m]["type"] == "fp"][:1]
        methods = list(dict.fromkeys(fp + abl.get("methods", []) + abl["floors"]))
        out["prior_ablation"] = {"kind": "main", "models": abl["models"], "methods": methods,
                                 "bits": abl["bits"], "tasks": [abl["task"]]}
    return out


def _diag(cfg: Mapping[str, Any]) -> Mapping[str, Any] | None:
    diag = cfg.get("diagnostics", {})
    return diag if diag.get("enabled", True) and diag.get("models") else None


def eval_cells(cfg: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """(model, method run, bits, task) of every gathered evaluation (gather_eval)."""
    cells = set()
    for t in tables(cfg).values():
        if t["kind"] in ("calib_memory", "deploy_memory"):
            continue
        models = list(dict.fromkeys(t["models"] + ([t["model"]] if "model" in t else [])))
        # a main table's ``method_bits`` runs a method at its own bits (common.smk)
        cells |= {(m, run, "fp" if is_fp(cfg, x) else t.get("method_bits", {}).get(x, t["bits"]),
                   task)
                  for m in models for x in table_methods(t) for run in method_runs(cfg, x)
                  for task in t["tasks"]}
    abl = _ablation(cfg)
    if abl:
        reference = [abl["reference"]] if abl.get("reference") else []
        swept = list(dict.fromkeys(abl["floors"] + reference))
        cells |= {(m, run, abl["bits"], abl["task"]) for m in abl["models"] for x in swept
                  for run in method_runs(cfg, x)}
    return sorted(cells)


def task_shards(cfg: Mapping[str, Any], model: str, task: str) -> int:
    family = cfg["models"][model]["family"]
    return int(resolve_task(task, cfg["tasks"][task], model, family,
                            by_model=use_by_model(cfg)).get("shards", 1))


def calib_cells(cfg: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(model, method run, bits) of every calibration: evaluations, memory tables (the first
    seed stands for the method), the diagnostics' students (the method's own name)."""
    cells = {(m, x, b) for m, x, b, _ in eval_cells(cfg) if b != "fp"}
    for t in tables(cfg).values():
        if t["kind"] in ("calib_memory", "deploy_memory"):
            models = list(dict.fromkeys(t["models"] + ([t["model"]] if "model" in t else [])))
            cells |= {(m, method_runs(cfg, x)[0], t["bits"]) for m in models
                      for x in table_methods(t) if not is_fp(cfg, x)}
    diag = _diag(cfg)
    if diag:
        cells |= {(m, x, diag["bits"]) for m in diag["models"] for x in diag.get("methods", [])
                  if not is_fp(cfg, x)}
    return sorted(cells)


def trajectory_cells(cfg: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    diag = _diag(cfg)
    if not diag:
        return []
    fp = next(m for m in cfg["methods"] if cfg["methods"][m]["type"] == "fp")
    return sorted({(m, fp, "fp") for m in diag["models"]}
                  | {(m, x, "fp" if is_fp(cfg, x) else diag["bits"]) for m in diag["models"]
                     for x in diag.get("methods", [])})


def prior_cells(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(model, prior) of every prior job."""
    prior_of = lambda run: cfg["methods"][base_method(run)].get("prior")  # noqa: E731
    cells = {(m, prior_of(x)) for m, x, _ in calib_cells(cfg) if prior_of(x)}
    diag = _diag(cfg)
    if diag:
        priors = {prior_of(x) for x in diag.get("methods", [])} - {None}
        cells |= {(m, p) for m in diag["models"] for p in priors}
        for pair in diag.get("cross_corpus", []):
            cells |= {tuple(pair[k].split("/", 1)) for k in ("a", "b")}
    abl = _ablation(cfg)
    if abl:
        cells |= {(m, prior_of(x)) for m in abl["models"] for x in abl["floors"] if prior_of(x)}
    return sorted(cells)


def probe_cells(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(model, probe) of every probe the priors read (each runs its ``shards`` jobs)."""
    return sorted({(m, cfg["priors"][p]["probe"]) for m, p in prior_cells(cfg)})


def _models_used(cfg: Mapping[str, Any]) -> set[str]:
    used = {m for m, *_ in eval_cells(cfg)} | {m for m, *_ in calib_cells(cfg)}
    used |= {m for m, _ in probe_cells(cfg)} | {m for m, *_ in trajectory_cells(cfg)}
    return used


def model_jobs(cfg: Mapping[str, Any]) -> dict[str, int]:
    """make_data / train_tiny / convert_hub: the tiny models the jobs above read."""
    used = _models_used(cfg)
    convert = {m for m in used if cfg["models"][m]["source"] == "convert"}
    train = {m for m in used if cfg["models"][m]["source"] == "train"}
    train |= {cfg["models"][m]["convert_from"] for m in convert}
    return {"make_data": int(bool(train) or _synthetic_used(cfg)), "train_tiny": len(train),
            "convert_hub": len(convert)}


def _synthetic_used(cfg: Mapping[str, Any]) -> bool:
    """common.smk's uses_synthetic_data: a probe, calibration set or task reads the corpus."""
    probes = {p for _, p in probe_cells(cfg)}
    methods = {base_method(x) for _, x, _ in calib_cells(cfg)}
    calib = {cfg["methods"][m].get("calibration", {}).get("dataset",
                                                          cfg["calibration"]["dataset"])
             for m in methods}
    tasks = {t for *_, t in eval_cells(cfg)}
    return (any(cfg["probes"][p]["dataset"] in ("synthetic", "facts") for p in probes)
            or "synthetic" in calib
            or any(cfg["tasks"][t]["kind"].startswith("synthetic") for t in tasks))


def job_counts(cfg: Mapping[str, Any]) -> dict[str, int]:
    """Jobs per rule, as ``snakemake -n`` counts them for rule ``all`` on an empty results/."""
    ev = eval_cells(cfg)
    diag = _diag(cfg)
    counts = {
        "probe_shard": sum(int(cfg["probes"][p].get("shards", 1)) for _, p in probe_cells(cfg)),
        "prior": len(prior_cells(cfg)),
        "calibrate": len(calib_cells(cfg)),
        "evaluate_shard": sum(task_shards(cfg, m, t) for m, _, _, t in ev),
        "gather_eval": len(ev),
        "trajectories": len(trajectory_cells(cfg)),
        "diagnose": len(diag["models"]) if diag else 0,
        "diagnostic_figures": int(bool(diag)),
        "floor_sweep": int(bool(_ablation(cfg))),
        "table": len(tables(cfg)),
        "all": 1,
        **model_jobs(cfg),
    }
    return {rule: n for rule, n in counts.items() if n}
