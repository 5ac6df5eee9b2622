"""The position prior: hand-computed values, schedules, normalisation, window and floor."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from fair_calib.jobs import io
from fair_calib.prior import (PRIOR_SCHEMA, aggregate_prior, cross_corpus, expand_prior,
                              lambda0_schedule, load_prior, run_cli)
from fair_calib.probe import PROBE_SCHEMA

torch.set_num_threads(1)

T = 4


def write_shard(path, rows, steps=T):
    df = pd.DataFrame(rows, columns=["sample_id", "position", "commit_step", "rel_prob",
                                     "rel_negentropy", "rel_margin"])
    io.write_parquet(df, path, PROBE_SCHEMA,
                     provenance=io.provenance({"probe": {"steps": steps, "gen_length": 3}}, seed=0))
    return path


# Two samples, K = 3 window positions, T = 4 steps.
ROWS = [
    # sample_id, position, commit_step, rel_prob, rel_negentropy, rel_margin
    (0, 0, 4, 0.5, 1.0, 0.2),
    (0, 1, 2, 2.0, 0.5, 1.0),
    (0, 2, 1, 3.0, 2.0, 0.0),
    (1, 0, 1, 1.0, 0.0, 0.5),
    (1, 1, 3, 0.0, 1.5, 0.5),
    (1, 2, 4, 1.5, 1.0, 1.5),
]


def early(t, alpha=1.5, rho=0.1):
    return max(((t - 1) / (T - 1)) ** alpha, rho)


def test_schedule_endpoints():
    assert lambda0_schedule(T, T, "early_boost", 2.0, 1.5, 0.1) == pytest.approx(2.0)
    assert lambda0_schedule(1, T, "early_boost", 2.0, 1.5, 0.1) == pytest.approx(0.2)
    assert lambda0_schedule(2, T, "early_boost", 1.0, 1.5, 0.1) == pytest.approx(max((1 / 3) ** 1.5, 0.1))
    assert lambda0_schedule(T, T, "late_boost", 1.0, 1.5, 0.1) == pytest.approx(0.1)
    assert lambda0_schedule(1, T, "late_boost", 1.0, 1.5, 0.1) == pytest.approx(1.0)
    assert np.allclose(lambda0_schedule(np.arange(1, T + 1), T, "uniform", 0.7), 0.7)
    assert np.allclose(lambda0_schedule(np.arange(1, T + 1), T, "none"), 0.0)
    with pytest.raises(ValueError, match="1..4"):
        lambda0_schedule(5, T, "early_boost")


def hand_prior(components, schedule_fn, lambda1, rel_col, n=None):
    curves = {}
    for sid in (0, 1):
        w = []
        for r in ROWS:
            if r[0] != sid:
                continue
            v = 0.0
            if "hit" in components:
                v += schedule_fn(r[2])
            if "rel" in components:
                v += lambda1 * r[3 + rel_col]
            w.append(v)
        w = np.array(w)
        curves[sid] = w / w.max()
    ids = [0, 1][: (n or 2)]
    mean = np.mean([curves[s] for s in ids], axis=0)
    return mean / mean.max()


@pytest.mark.parametrize("prior,components,fn,lambda1,col,n", [
    ({}, ["hit", "rel"], early, 1.0, 0, None),
    ({"lambda1": 0.5, "sharpness": "margin"}, ["hit", "rel"], early, 0.5, 2, None),
    ({"components": ["hit"], "schedule": "late_boost"}, ["hit"],
     lambda t: max(((T - t) / (T - 1)) ** 1.5, 0.1), 1.0, 0, None),
    ({"components": ["rel"], "sharpness": "negentropy"}, ["rel"], early, 1.0, 1, None),
    ({"schedule": "uniform", "lambda0": 2.0, "n_probe": 1}, ["hit", "rel"], lambda t: 2.0, 1.0, 0, 1),
    ({"schedule": "none"}, ["hit", "rel"], lambda t: 0.0, 1.0, 0, None),
])
def test_prior_matches_hand_computation(tmp_path, prior, components, fn, lambda1, col, n):
    a = write_shard(tmp_path / "shard-0.parquet", [r for r in ROWS if r[0] == 0])
    b = write_shard(tmp_path / "shard-1.parquet", [r for r in ROWS if r[0] == 1])
    df = aggregate_prior([b, a], {"prior": prior, "probe": {"steps": T}})
    assert df.position.tolist() == [0, 1, 2]
    assert np.allclose(df.w_bar.to_numpy(), hand_prior(components, fn, lambda1, col, n))
    assert df.w_bar.max() == pytest.approx(1.0)
    assert df.attrs["K"] == 3 and df.attrs["T"] == T and df.attrs["floor"] == 0.05


def test_prior_errors(tmp_path):
    a = write_shard(tmp_path / "a.parquet", ROWS)
    with pytest.raises(ValueError, match="identically zero"):
        aggregate_prior([a], {"prior": {"components": ["hit"], "schedule": "none"}})
    with pytest.raises(ValueError, match="n_probe=5 but the probe holds only 2"):
        aggregate_prior([a], {"prior": {"n_probe": 5}})
    with pytest.raises(ValueError, match="probe.steps=8 but the shards were probed with 4"):
        aggregate_prior([a], {"prior": {}, "probe": {"steps": 8}})
    with pytest.raises(ValueError, match="overlap"):
        aggregate_prior([a, a], {"prior": {}})
    with pytest.raises(ValueError, match="prior.schedule='weird'"):
        aggregate_prior([a], {"prior": {"schedule": "weird"}})
    b = write_shard(tmp_path / "b.parquet", ROWS[:5])
    with pytest.raises(ValueError, match="all 3 window positions"):
        aggregate_prior([b], {"prior": {}})


def test_prior_cli_and_metadata(tmp_path):
    a = write_shard(tmp_path / "a.parquet", ROWS)
    settings = {"seed": 0, "prior": {"floor": 0.2, "sharpness": "margin"}, "probe": {"steps": T}}
    out = tmp_path / "prior" / "default.parquet"
    run_cli(["--settings", json.dumps(settings), "--inputs", str(a), "--out", str(out)])
    df, prov = io.read_parquet(out)
    assert list(df.columns) == [f.name for f in PRIOR_SCHEMA]
    assert prov["floor"] == 0.2 and prov["K"] == 3 and prov["prior"]["sharpness"] == "margin"
    assert prov["config"] == settings
    assert np.allclose(df.w_bar, aggregate_prior([a], settings).w_bar)
    assert load_prior(out).attrs["floor"] == 0.2


def test_expand_prior_window_and_floor():
    prior = pd.DataFrame({"position": [2, 0, 1], "w_bar": [1.0, 0.25, 0.5]})
    w = expand_prior(prior, 0.05, 6)
    assert w.dtype == torch.float32 and w.shape == (6,)
    assert torch.allclose(w, torch.tensor([0.05, 0.05, 0.05, 0.25, 0.5, 1.0]))
    assert torch.allclose(expand_prior(prior, 0.05, 3), torch.tensor([0.25, 0.5, 1.0]))
    assert torch.allclose(expand_prior(prior, 0.05, 2), torch.tensor([0.5, 1.0]))   # last positions


def test_cross_corpus():
    a = np.array([0.1, 0.4, 0.2, 0.9])
    r = cross_corpus(a, 2 * a + 1)
    assert r["spearman"] == pytest.approx(1.0) and r["pearson"] == pytest.approx(1.0)
    r = cross_corpus(pd.DataFrame({"position": [0, 1, 2, 3], "w_bar": a}), -a)
    assert r["spearman"] == pytest.approx(-1.0)
    r = cross_corpus(a, np.array([0.2, 0.1, 0.9, 0.4]))      # ranks 1324 vs 2143
    assert r["spearman"] == pytest.approx(0.0, abs=1e-12)
    assert r["pearson"] == pytest.approx(-0.04 / 0.38)
    with pytest.raises(ValueError, match="same length"):
        cross_corpus(a, a[:3])


def test_prior_carries_the_across_sample_spread(tmp_path):
    """w_std: the std (ddof 0) over samples of the per-sample curves, on w_bar's scale (the
    cross-corpus figure's variability bands, issue 23)."""
    a = write_shard(tmp_path / "a.parquet", ROWS)
    df = aggregate_prior([a], {"prior": {}, "probe": {"steps": T}})
    curves = []
    for sid in (0, 1):
        w = np.array([early(r[2]) + r[3] for r in ROWS if r[0] == sid])
        curves.append(w / w.max())
    mean = np.mean(curves, axis=0)
    assert np.allclose(df.w_std.to_numpy(), np.std(curves, axis=0) / mean.max())
    assert np.allclose(df.w_bar.to_numpy(), mean / mean.max())
