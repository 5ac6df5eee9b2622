"""Stage I: aggregate the probe into the static position prior ``w_bar``.

Per probed sample and window position ``i`` (commit step ``t_i``, reliability sums ``rel``):

    w_i = lambda0(t_i) * [hit in components] + lambda1 * rel_{sharpness, i} * [rel in components]

with ``lambda0(t)`` one of

* ``early_boost``: ``lambda0 * max(((t - 1) / (T - 1)) ** alpha, rho)`` (t = T -> lambda0,
  t = 1 -> lambda0 * rho),
* ``uniform``: ``lambda0``,
* ``late_boost``: ``lambda0 * max(((T - t) / (T - 1)) ** alpha, rho)``,
* ``none``: 0.

Each sample's ``w`` is divided by its maximum, the curves of the first ``n_probe`` samples (by
sample id; all when ``n_probe`` is null) are averaged, and the mean curve is divided by its
maximum, so ``w_bar`` lies in (0, 1] with maximum exactly 1. ``w_std`` is the standard
deviation (ddof 0) of the per-sample curves over the same samples, divided by the same maximum:
the across-sample variability the cross-corpus figure draws as a band. The ``floor`` (weight of positions
outside the window in calibration) is therefore relative to the most important window position.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from fair_calib.jobs import io
from fair_calib.names.registry import PRIOR_COMPONENTS, PRIOR_SCHEDULES, SHARPNESS_SCORES

log = logging.getLogger(__name__)

# w_std: the across-sample spread of the per-sample curves (the figures' variability bands);
# calibration reads only w_bar
PRIOR_SCHEMA = pa.schema([("position", pa.int32()), ("w_bar", pa.float64()),
                          ("w_std", pa.float64())])

PRIOR_DEFAULTS: dict[str, Any] = {"components": ["hit", "rel"], "schedule": "early_boost",
                                  "lambda0": 1.0, "alpha": 1.5, "rho": 0.1, "lambda1": 1.0,
                                  "sharpness": "prob", "n_probe": None, "floor": 0.05}
_REL_COLUMN = {"prob": "rel_prob", "negentropy": "rel_negentropy", "margin": "rel_margin"}


def prior_section(prior_settings: Mapping[str, Any]) -> dict[str, Any]:
    """The validated prior section (defaults filled in) of full settings or of the section."""
    sec = dict(prior_settings.get("prior", prior_settings))
    for key in ("name", "probe"):        # which variant / which probe: identify, do not compute
        sec.pop(key, None)
    unknown = sorted(set(sec) - set(PRIOR_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown prior settings {unknown}; known: {sorted(PRIOR_DEFAULTS)}")
    out = {**PRIOR_DEFAULTS, **sec}
    comps = list(out["components"])
    if not comps or any(c not in PRIOR_COMPONENTS for c in comps):
        raise ValueError(f"prior.components={comps!r}: choose a non-empty subset of {list(PRIOR_COMPONENTS)}")
    if out["schedule"] not in PRIOR_SCHEDULES:
        raise ValueError(f"prior.schedule={out['schedule']!r}: valid schedules {list(PRIOR_SCHEDULES)}")
    if out["sharpness"] not in SHARPNESS_SCORES:
        raise ValueError(f"prior.sharpness={out['sharpness']!r}: valid scores {list(SHARPNESS_SCORES)}")
    for key in ("lambda0", "lambda1", "alpha", "rho", "floor"):
        if not float(out[key]) >= 0:
            raise ValueError(f"prior.{key} must be >= 0, got {out[key]!r}")
    if out["n_probe"] is not None and int(out["n_probe"]) < 1:
        raise ValueError(f"prior.n_probe must be null or >= 1, got {out['n_probe']!r}")
    out["components"] = comps
    return out


def lambda0_schedule(t: np.ndarray | int, T: int, schedule: str, lambda0: float = 1.0,
                     alpha: float = 1.5, rho: float = 0.1) -> np.ndarray:
    """Frontier-hit weight of a commit at step ``t`` (``T`` = first step, ``1`` = last)."""
    t = np.asarray(t, dtype=np.float64)
    if np.any(t < 1) or np.any(t > T):
        raise ValueError(f"commit steps must lie in 1..{T}, got {t.min():g}..{t.max():g}")
    if schedule == "none":
        return np.zeros_like(t)
    if schedule == "uniform":
        return np.full_like(t, float(lambda0))
    if T == 1:
        frac = np.ones_like(t)          # the only step is both first and last
    elif schedule == "early_boost":
        frac = (t - 1) / (T - 1)
    elif schedule == "late_boost":
        frac = (T - t) / (T - 1)
    else:
        raise ValueError(f"unknown schedule {schedule!r}; valid: {list(PRIOR_SCHEDULES)}")
    return float(lambda0) * np.maximum(frac ** float(alpha), float(rho))


def read_probe(shard_paths: Sequence[str | Path]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Gather probe shards; returns (rows sorted by sample_id, position; probe config)."""
    frames, configs = [], []
    for path in shard_paths:
        df, prov = io.read_parquet(path)
        frames.append(df)
        configs.append((prov.get("config") or {}).get("probe"))
    if not frames:
        raise ValueError("no probe shards given")
    known = [c for c in configs if c is not None]
    if any(io.config_hash(c) != io.config_hash(known[0]) for c in known):
        raise ValueError("probe shards were written with different probe settings")
    df = pd.concat(frames, ignore_index=True).sort_values(["sample_id", "position"], kind="stable")
    if df.duplicated(["sample_id", "position"]).any():
        raise ValueError("probe shards overlap: a (sample_id, position) appears twice")
    return df.reset_index(drop=True), (known[0] if known else {})


def sample_weights(probe_df: pd.DataFrame, prior_settings: Mapping[str, Any], T: int) -> pd.DataFrame:
    """Per-sample normalised weights ``[sample_id, position, w]`` (each sample's max is 1)."""
    pr = prior_section(prior_settings)
    w = np.zeros(len(probe_df), dtype=np.float64)
    if "hit" in pr["components"]:
        w += lambda0_schedule(probe_df["commit_step"].to_numpy(), T, pr["schedule"],
                              pr["lambda0"], pr["alpha"], pr["rho"])
    if "rel" in pr["components"]:
        w += float(pr["lambda1"]) * probe_df[_REL_COLUMN[pr["sharpness"]]].to_numpy(dtype=np.float64)
    out = pd.DataFrame({"sample_id": probe_df["sample_id"].to_numpy(),
                        "position": probe_df["position"].to_numpy(), "w": w})
    peak = out.groupby("sample_id")["w"].transform("max").to_numpy()
    if np.any(peak <= 0):
        bad = out.loc[peak <= 0, "sample_id"].iloc[0]
        raise ValueError(f"prior weights are identically zero for sample {bad} "
                         f"(components={pr['components']}, schedule={pr['schedule']!r}, "
                         f"lambda0={pr['lambda0']}, lambda1={pr['lambda1']})")
    out["w"] = w / peak
    return out


def aggregate_prior(shard_paths: Sequence[str | Path], prior_settings: Mapping[str, Any]) -> pd.DataFrame:
    """The prior ``DataFrame[position, w_bar]`` over the ``K``-token window.

    ``prior_settings`` is the full stage settings (``{"prior": ..., "probe": ...}``) or the
    prior section alone; ``T`` is ``probe.steps`` from the settings, else from the shards'
    provenance. ``df.attrs`` carries ``floor``, ``K``, ``T``, ``n_probe`` (used) and ``prior``.
    """
    pr = prior_section(prior_settings)
    df, probe_cfg = read_probe(shard_paths)
    given = prior_settings.get("probe") if "prior" in prior_settings else None
    T = (given or {}).get("steps", probe_cfg.get("steps"))
    if T is None:
        raise ValueError("number of probe steps T unknown: pass settings with probe.steps")
    T = int(T)
    if probe_cfg.get("steps") is not None and int(probe_cfg["steps"]) != T:
        raise ValueError(f"settings say probe.steps={T} but the shards were probed with "
                         f"{probe_cfg['steps']} steps")
    K = int(df["position"].max()) + 1
    per_sample = df.groupby("sample_id")["position"].agg(["count", "min", "max"])
    if not ((per_sample["count"] == K) & (per_sample["min"] == 0) & (per_sample["max"] == K - 1)).all():
        raise ValueError(f"probe shards do not hold all {K} window positions for every sample")
    ids = np.sort(df["sample_id"].unique())
    n_probe = len(ids) if pr["n_probe"] is None else int(pr["n_probe"])
    if n_probe > len(ids):
        raise ValueError(f"prior.n_probe={n_probe} but the probe holds only {len(ids)} samples")
    use = df[df["sample_id"].isin(ids[:n_probe])]
    w = sample_weights(use, pr, T)
    by_pos = w.groupby("position")["w"]
    mean = by_pos.mean().reindex(range(K)).to_numpy()
    std = by_pos.std(ddof=0).reindex(range(K)).to_numpy()
    out = pd.DataFrame({"position": np.arange(K, dtype=np.int32), "w_bar": mean / mean.max(),
                        "w_std": std / mean.max()})
    out.attrs.update({"floor": float(pr["floor"]), "K": K, "T": T, "n_probe": n_probe, "prior": pr})
    return out


def expand_prior(prior_df: pd.DataFrame, floor: float, seq_len: int):
    """Per-token weights ``torch.Tensor[seq_len]`` (float32) for a calibration sequence.

    The ``K``-token window is aligned to the LAST ``K`` positions of the sequence; earlier
    positions get ``floor``. If ``seq_len < K`` the sequence is covered by the last ``seq_len``
    window positions.
    """
    import torch

    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    w_bar = prior_df.sort_values("position")["w_bar"].to_numpy(dtype=np.float64)
    out = np.full(int(seq_len), float(floor), dtype=np.float64)
    k = min(len(w_bar), int(seq_len))
    out[seq_len - k:] = w_bar[len(w_bar) - k:]
    return torch.tensor(out, dtype=torch.float32)


def load_prior(path: str | Path) -> pd.DataFrame:
    """Read a prior file; ``df.attrs`` gets ``floor``, ``K``, ``T``, ``n_probe`` and ``prior``
    back from its provenance."""
    df, prov = io.read_parquet(path)
    df.attrs.update({k: prov[k] for k in ("floor", "K", "T", "n_probe", "prior") if k in prov})
    return df


def cross_corpus(a: Any, b: Any) -> dict[str, float]:
    """Spearman and Pearson correlation between two prior curves (arrays or prior DataFrames)."""
    from scipy import stats

    def curve(x: Any) -> np.ndarray:
        if isinstance(x, pd.DataFrame):
            return x.sort_values("position")["w_bar"].to_numpy(dtype=np.float64)
        return np.asarray(x, dtype=np.float64).reshape(-1)

    ca, cb = curve(a), curve(b)
    if ca.shape != cb.shape or len(ca) < 2:
        raise ValueError(f"prior curves must have the same length >= 2, got {len(ca)} and {len(cb)}")
    return {"spearman": float(stats.spearmanr(ca, cb).statistic),
            "pearson": float(stats.pearsonr(ca, cb).statistic)}


def run_cli(argv: Sequence[str] | None = None) -> None:
    from fair_calib.probe import load_settings

    ap = argparse.ArgumentParser(prog="fair-calib prior",
                                 description="Stage I: aggregate probe shards into a position prior")
    ap.add_argument("--settings", required=True, help="settings JSON (or @file.json)")
    ap.add_argument("--inputs", nargs="+", required=True, help="probe shard Parquet files")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = load_settings(args.settings)
    df = aggregate_prior(args.inputs, settings)
    meta = dict(df.attrs)
    prov = io.provenance(settings, seed=settings.get("seed"), stage="prior",
                         inputs=[Path(p).name for p in args.inputs], **meta)
    io.write_parquet(df, args.out, PRIOR_SCHEMA, provenance=prov)
    log.info("wrote %s (K=%d, T=%d, n_probe=%d)", args.out, meta["K"], meta["T"], meta["n_probe"])


if __name__ == "__main__":
    run_cli()
