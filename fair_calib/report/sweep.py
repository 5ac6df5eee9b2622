"""The prior-floor sweep figure from eval rows and priors (``fair-calib floor-sweep``).

``fair-calib floor-sweep --settings JSON --evals EVAL.parquet... --priors PRIOR.parquet...
--out-dir DIR`` writes ``DIR/floor_sweep.{pdf,png,txt}`` (``figures.floor_sweep``). Settings:
``{"models": [...], "floors": [method, ...], "priors": {method: prior}, "reference": method or
null, "task": name, "bits": name, "labels": {...}}``. Each swept method's floor is read from its
prior file's provenance (the value calibration used), not from the config.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd


def seed_stats(evals: pd.DataFrame, model: str, method: str, task: str, bits: str) -> dict:
    """Mean, sample std (ddof=1; NaN for one seed) and seed count of one method's accuracy (%)."""
    d = evals[(evals["model"] == model) & (evals["method"] == method) & (evals["task"] == task)
              & (evals["bits"] == bits)]
    if d.empty:
        raise ValueError(f"floor-sweep: no eval rows for {model}/{method}/{bits}/{task}")
    metric = d["metric"].iloc[0]
    v = d.loc[d["metric"] == metric, "value"].to_numpy(dtype=np.float64) * 100.0
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if len(v) > 1 else float("nan"),
            "n_seeds": len(v)}


def sweep_points(evals: pd.DataFrame, floors: Mapping[tuple[str, str], float],
                 settings: Mapping[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(points, reference) frames of :func:`fair_calib.report.figures.floor_sweep`."""
    task, bits = settings["task"], settings["bits"]
    points = []
    for model in settings["models"]:
        for method in settings["floors"]:
            key = (model, settings["priors"][method])
            if key not in floors:
                raise ValueError(f"floor-sweep: no prior file for {model}/{key[1]} in --priors")
            points.append({"model": model, "method": method, "floor": floors[key],
                           **seed_stats(evals, model, method, task, bits)})
    ref = settings.get("reference")
    reference = None if not ref else pd.DataFrame(
        [{"model": m, **seed_stats(evals, m, ref, task, bits)} for m in settings["models"]])
    return pd.DataFrame(points), reference


def split_seed_frame(path) -> pd.DataFrame:
    """An eval file's rows, the method's ``@s<k>`` split into method and seed."""
    from fair_calib.jobs.io import read_parquet
    from fair_calib.report.tables import split_seed

    return split_seed(read_parquet(path)[0])


def run_cli(argv: Sequence[str]) -> None:
    from fair_calib.jobs.io import read_parquet
    from fair_calib.report.figures import floor_sweep

    ap = argparse.ArgumentParser(prog="fair-calib floor-sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--settings", required=True, help="JSON (module docstring)")
    ap.add_argument("--evals", nargs="+", required=True, help="results/eval/M/X/B/T.parquet")
    ap.add_argument("--priors", nargs="+", required=True, help="results/prior/M/P.parquet")
    ap.add_argument("--out-dir", required=True)
    a = ap.parse_args(list(argv))
    settings = json.loads(a.settings)
    evals = pd.concat([split_seed_frame(p) for p in a.evals], ignore_index=True)
    floors = {}
    for p in map(Path, a.priors):
        prov = read_parquet(p)[1]
        if "floor" not in prov:
            raise ValueError(f"{p}: provenance lacks 'floor'")
        floors[(p.parent.name, p.stem)] = float(prov["floor"])
    points, reference = sweep_points(evals, floors, settings)
    Path(a.out_dir).mkdir(parents=True, exist_ok=True)
    for path in floor_sweep(points, a.out_dir, settings, reference):
        print(f"wrote {path}")
    print(points.to_string(index=False))
