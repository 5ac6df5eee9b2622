"""The prior-floor sweep (fair-calib floor-sweep): points from eval rows of every seed and the
floor from each prior file's provenance, drawn by figures.floor_sweep."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fair_calib.jobs import io
from fair_calib.evaluate.run import EVAL_SCHEMA
from fair_calib.prior import PRIOR_SCHEMA
from fair_calib.report import sweep

SETTINGS = {"models": ["m"], "floors": ["fc-f0", "fc"], "priors": {"fc-f0": "p0", "fc": "p5"},
            "reference": "fc-uni", "task": "gen", "bits": "w2a4",
            "labels": {"methods": {"fc-uni": "FAIR-Calib, uniform weights"}}}
VALUES = {"fc-f0": [0.40, 0.50, 0.60], "fc": [0.70, 0.72, 0.74], "fc-uni": [0.80, 0.90, 0.85]}


def _eval_files(tmp_path):
    paths = []
    for method, vals in VALUES.items():
        for seed, v in enumerate(vals):
            df = pd.DataFrame([{"model": "m", "method": f"{method}@s{seed}", "bits": "w2a4",
                                "task": "gen", "metric": "exact_match", "value": v,
                                "stderr": 0.03, "n": 200, "chance": 0.19, "settings": "{}",
                                "decode_steps": 0, "decode_steps_full": 0}])
            p = tmp_path / "eval" / method / f"s{seed}.parquet"
            io.write_parquet(df, p, EVAL_SCHEMA, {})
            paths.append(p)
    return paths


def _prior_files(tmp_path):
    paths = []
    for name, floor in (("p0", 0.0), ("p5", 0.05)):
        p = tmp_path / "prior" / "m" / f"{name}.parquet"
        df = pd.DataFrame({"position": np.arange(4, dtype=np.int32), "w_bar": [1.0, .5, .2, .1]})
        for field in PRIOR_SCHEMA:          # any further columns of the schema (w_std, ...)
            if field.name not in df:
                df[field.name] = 0.0
        io.write_parquet(df, p, PRIOR_SCHEMA, {"floor": floor})
        paths.append(p)
    return paths


def test_points_are_mean_and_sample_std_over_seeds_at_the_priors_floor(tmp_path):
    evals = pd.concat([sweep.split_seed_frame(p) for p in _eval_files(tmp_path)])
    points, ref = sweep.sweep_points(evals, {("m", "p0"): 0.0, ("m", "p5"): 0.05}, SETTINGS)
    assert list(points["floor"]) == [0.0, 0.05]
    for (_, row), method in zip(points.iterrows(), SETTINGS["floors"]):
        v = np.array(VALUES[method]) * 100
        assert row["mean"] == pytest.approx(v.mean()) and row["n_seeds"] == 3
        assert row["std"] == pytest.approx(np.sqrt(((v - v.mean()) ** 2).sum() / 2))
    assert ref["mean"].iloc[0] == pytest.approx(85.0)
    with pytest.raises(ValueError, match="m/p5"):
        sweep.sweep_points(evals, {("m", "p0"): 0.0}, SETTINGS)


def test_cli_writes_the_figure_with_its_caption(tmp_path):
    out = tmp_path / "fig"
    sweep.run_cli(["--settings", json.dumps(SETTINGS), "--evals", *map(str, _eval_files(tmp_path)),
                   "--priors", *map(str, _prior_files(tmp_path)), "--out-dir", str(out)])
    for ext in ("pdf", "png", "txt"):
        assert (out / f"floor_sweep.{ext}").stat().st_size > 0
    caption = (out / "floor_sweep.txt").read_text()
    assert "standard deviation" in caption and "FAIR-Calib, uniform weights" in caption
