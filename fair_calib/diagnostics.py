"""Mechanistic diagnostics over decoding trajectories (paper Sec. "Mechanistic Diagnostics" and
Appendix "More Mechanistic Diagnostics").

All metric functions are pure functions over trajectory DataFrames with the schema of
``docs/design.md``::

    sample_id:int64, step:int32 (T..1; T = first, fully-masked step), position:int32,
    committed:bool (committed at this step), token:int64 (token committed, -1 if not),
    top1:int64, p_commit:float64, p_ref:float64, margin:float64, entropy:float64,
    p_alt:float64

One row per (sample_id, step, position) of the generation window. ``top1`` / ``p_*`` /
``margin`` / ``entropy`` are the model's prediction from the state *before* the commit of that
step (the prediction that the commit decision at that step is made from). After a position is
committed its row keeps being recorded: ``top1`` is the model's re-evaluated prediction at the
position while the committed token stays fixed in the state.

Two kinds of frames are used:

* a *free-running* trajectory: the model decodes with its own default policy;
* a *teacher-forced* frame: the student is evaluated on the teacher trajectory's states
  (``fair_calib.decoding.teacher_force``), so its ``step``/``position`` index the teacher's
  states. Files written by ``fair-calib trajectories`` hold both, told apart by an additional
  ``mode`` column (``"free"`` / ``"forced"``); a file without ``mode`` is all free-running.

Two subcommands live here: ``fair-calib trajectories`` (record) and ``fair-calib diagnose``
(compute metric rows). The diagnostics Parquet is long-format::

    model:string, method:string, bits:string, metric:string, x:float64, value:float64,
    std:float64, n:int64

``x`` is NaN for scalar metrics; curve metrics (``stability_lag_ccdf``, ``mse_prob``) have one
row per x (lag value, diffusion step).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

TRAJ_COLUMNS = ("sample_id", "step", "position", "committed", "token", "top1", "p_commit",
                "p_ref", "margin", "entropy", "p_alt")

TRAJECTORY_SCHEMA = pa.schema([
    ("sample_id", pa.int64()), ("step", pa.int32()), ("position", pa.int32()),
    ("committed", pa.bool_()), ("token", pa.int64()), ("top1", pa.int64()),
    ("p_commit", pa.float64()), ("p_ref", pa.float64()), ("margin", pa.float64()),
    ("entropy", pa.float64()), ("p_alt", pa.float64()), ("mode", pa.string()),
])

DIAGNOSTICS_SCHEMA = pa.schema([
    ("model", pa.string()), ("method", pa.string()), ("bits", pa.string()),
    ("metric", pa.string()), ("x", pa.float64()), ("value", pa.float64()),
    ("std", pa.float64()), ("n", pa.int64()),
])


# ----------------------------------------------------------------------------- helpers
def _check(df: pd.DataFrame, cols: Sequence[str], what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{what}: trajectory frame lacks columns {missing}")


def split_modes(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split a recorded file into (free-running rows, teacher-forced rows)."""
    if "mode" not in df.columns:
        return df, df.iloc[0:0]
    return (df[df["mode"] == "free"].drop(columns="mode"),
            df[df["mode"] == "forced"].drop(columns="mode"))


def commits(df: pd.DataFrame) -> pd.DataFrame:
    """One row per committed (sample_id, position): its commit step ``t_commit`` and ``token``.

    A position committed at more than one step is an error in the recording (commits are
    irreversible), and raises.
    """
    _check(df, ("sample_id", "step", "position", "committed", "token"), "commits")
    c = df.loc[df["committed"].astype(bool), ["sample_id", "position", "step", "token"]]
    dup = c.duplicated(["sample_id", "position"])
    if dup.any():
        bad = c.loc[dup, ["sample_id", "position"]].head(3).values.tolist()
        raise ValueError(f"positions committed more than once (sample_id, position): {bad}")
    return c.rename(columns={"step": "t_commit"}).reset_index(drop=True)


def _mean_std(values: Sequence[float]) -> tuple[float, float, int]:
    """Mean, sample standard deviation (ddof=1; 0 for a single value), count. NaNs dropped."""
    v = np.asarray([x for x in values if not (x is None or (isinstance(x, float) and math.isnan(x)))],
                   dtype=np.float64)
    if v.size == 0:
        return float("nan"), float("nan"), 0
    std = float(v.std(ddof=1)) if v.size > 1 else 0.0
    return float(v.mean()), std, int(v.size)


# ----------------------------------------------------------------------------- stability lag
def stability_lag(df: pd.DataFrame) -> pd.DataFrame:
    """Stability lag delta_lag of every committed position of a free-running trajectory.

    For position i committed at step t_c with token x (the final decoded token), look at the
    model's top-1 prediction at steps t_c, t_c - 1, ..., 1 (the commit step itself, whose
    prediction the commit was made from, then every post-commit step). Index them j = 0..R with
    R = t_c - 1 (step t_c - j). The lag is the smallest k in {0..R} such that top1 == x at every
    step j >= k, i.e. the number of steps after the commit until the top-1 prediction agrees
    with the final token for all subsequent steps (0: agrees from the commit step on).

    A position whose top-1 disagrees at the last recorded step (step 1) never stabilises within
    the trajectory; its lag is censored and set to R + 1 (= t_c, one more than any observable
    lag), with ``stable = False``. Steps missing from the recording are skipped.

    Returns columns ``sample_id, position, t_commit, lag, stable``.
    """
    _check(df, ("sample_id", "step", "position", "committed", "token", "top1"), "stability_lag")
    c = commits(df)
    m = df[["sample_id", "step", "position", "top1"]].merge(c, on=["sample_id", "position"])
    m = m[m["step"] <= m["t_commit"]]
    m = m.assign(disagree=m["top1"] != m["token"])
    # last disagreeing step (smallest step number with disagreement) -> lag = t_c - step + 1
    dis = m[m["disagree"]].groupby(["sample_id", "position"])["step"].min()
    out = c.set_index(["sample_id", "position"]).copy()
    out["last_bad"] = dis
    out["lag"] = np.where(out["last_bad"].isna(), 0,
                          out["t_commit"] - out["last_bad"].fillna(0) + 1).astype(np.int64)
    # disagreement at step 1 -> never stable; lag = t_c - 1 + 1 = t_c = R + 1 already
    out["stable"] = ~(out["last_bad"] == 1)
    out = out.reset_index()
    return out[["sample_id", "position", "t_commit", "lag", "stable"]]


def ccdf(values: Sequence[float] | np.ndarray, xs: Sequence[float] | None = None
         ) -> tuple[np.ndarray, np.ndarray]:
    """Empirical complementary CDF P(X > x) at ``xs`` (default: 0..max(values) for integer data).

    Returns ``(xs, ccdf)``; with no values every entry is NaN.
    """
    v = np.sort(np.asarray(values, dtype=np.float64))
    if xs is None:
        top = int(v.max()) if v.size else 0
        xs = np.arange(0, top + 1, dtype=np.float64)
    xs = np.asarray(xs, dtype=np.float64)
    if v.size == 0:
        return xs, np.full(xs.shape, np.nan)
    return xs, 1.0 - np.searchsorted(v, xs, side="right") / v.size


# ----------------------------------------------------------------------------- mse_prob
def _teacher_final(teacher: pd.DataFrame) -> pd.DataFrame:
    c = commits(teacher)
    return c.rename(columns={"token": "x_fin", "t_commit": "t_commit_teacher"})


def mse_prob_trace(student: pd.DataFrame, teacher: pd.DataFrame) -> pd.DataFrame:
    """Per-sample, per-step probability MSE of a free-running student w.r.t. the FP teacher.

    mse_prob(t) = mean over window positions i of (p_student(t, i) - p_teacher(t, i))^2, where
    both are the probability of the teacher's final token x_fin(i) at step t of each model's own
    trajectory: the teacher's ``p_commit`` (its own final token) and the student's ``p_ref``
    (the student is recorded with the teacher's final tokens as reference tokens, as
    ``fair-calib trajectories --teacher`` does). Only (sample, step, position) present in both
    frames count. Returns columns ``sample_id, step, mse_prob`` (steps descending).
    """
    _check(student, ("sample_id", "step", "position", "p_ref"), "mse_prob_trace (student)")
    _check(teacher, ("sample_id", "step", "position", "p_commit"), "mse_prob_trace (teacher)")
    s = student[["sample_id", "step", "position", "p_ref"]]
    t = teacher[["sample_id", "step", "position", "p_commit"]]
    m = s.merge(t, on=["sample_id", "step", "position"], how="inner")
    if m["p_ref"].isna().all() and len(m):
        raise ValueError("student trajectory has no p_ref values: record it with the teacher's "
                         "final tokens as reference (fair-calib trajectories --teacher)")
    m = m.assign(se=(m["p_ref"] - m["p_commit"]) ** 2)
    out = m.groupby(["sample_id", "step"], as_index=False)["se"].mean()
    out = out.rename(columns={"se": "mse_prob"})
    return out.sort_values(["sample_id", "step"], ascending=[True, False]).reset_index(drop=True)


def first_false_commit(student: pd.DataFrame, teacher: pd.DataFrame) -> pd.Series:
    """First false-commit step of each student sample (index sample_id; NaN if none).

    A false commit is a commit of the student at (t, i) whose token differs from the teacher's
    final token x_fin(i). Decoding runs from step T down to 1, so the first one is the largest
    such step t.
    """
    sc = commits(student)
    tf = _teacher_final(teacher)
    m = sc.merge(tf[["sample_id", "position", "x_fin"]], on=["sample_id", "position"], how="left")
    false = m[m["token"] != m["x_fin"]]
    first = false.groupby("sample_id")["t_commit"].max()
    idx = pd.Index(sorted(sc["sample_id"].unique()), name="sample_id")
    return first.reindex(idx).astype("float64").rename("first_false_commit")


# ----------------------------------------------------------------------------- flips
def commit_step_flips(forced: pd.DataFrame, teacher: pd.DataFrame) -> pd.Series:
    """Teacher-forced commit-step flips per sample.

    For every teacher commit (t, i) with token x, a flip is ``student_top1(t, i) != x``, where
    the student's top-1 is read from the teacher-forced frame (student evaluated on the
    teacher's state S_t). Returns the flip count per sample (index sample_id). A teacher commit
    missing from the forced frame raises.
    """
    _check(forced, ("sample_id", "step", "position", "top1"), "commit_step_flips (forced)")
    tc = commits(teacher).rename(columns={"t_commit": "step"})
    m = tc.merge(forced[["sample_id", "step", "position", "top1"]],
                 on=["sample_id", "step", "position"], how="left")
    if m["top1"].isna().any():
        n = int(m["top1"].isna().sum())
        raise ValueError(f"teacher-forced frame misses {n} teacher commit (step, position) rows")
    m = m.assign(flip=(m["top1"].astype(np.int64) != m["token"]).astype(np.int64))
    return m.groupby("sample_id")["flip"].sum().rename("flips")


# ----------------------------------------------------------------------------- post-commit
def post_commit_mismatch(df: pd.DataFrame) -> pd.DataFrame:
    """Post-commit self-consistency per sample (paper App. "Post-commit mismatch").

    For each position i first written at step t_c with token x_hat, the post-commit steps are
    the recorded steps t < t_c (committed token fixed in the state). Per position:
    disagree = fraction of post-commit steps with top1 != x_hat; never_agree = 1 if top1 != x_hat
    at every post-commit step. Positions committed at the last step (no post-commit step) are
    excluded. Per sample, ``mean_disagree_rate`` is the mean of ``disagree`` over its positions
    and ``never_agree_rate`` the fraction of its positions with ``never_agree``.

    Returns columns ``sample_id, mean_disagree_rate, never_agree_rate, n_positions``.
    """
    _check(df, ("sample_id", "step", "position", "committed", "token", "top1"),
           "post_commit_mismatch")
    c = commits(df)
    m = df[["sample_id", "step", "position", "top1"]].merge(c, on=["sample_id", "position"])
    m = m[m["step"] < m["t_commit"]]
    m = m.assign(dis=(m["top1"] != m["token"]).astype(np.float64))
    per_pos = m.groupby(["sample_id", "position"])["dis"].agg(["mean", "min"])
    per_pos["never"] = (per_pos["min"] == 1.0).astype(np.float64)
    g = per_pos.groupby("sample_id")
    out = pd.DataFrame({"mean_disagree_rate": g["mean"].mean(),
                        "never_agree_rate": g["never"].mean(),
                        "n_positions": g.size().astype(np.int64)})
    return out.reset_index()


# ----------------------------------------------------------------------------- margin
def frontier_margin(forced: pd.DataFrame, teacher: pd.DataFrame, kind: str = "logit"
                    ) -> pd.DataFrame:
    """Student decision margin of the teacher's final token at the teacher's commit steps
    (paper App. "Decision-Margin Preservation").

    At each teacher commit (t, i) the student, on the teacher's state S_t (teacher-forced
    frame), ranks the teacher's final token x = x_fin(i) against its strongest alternative:

    * ``kind="logit"`` (the paper): logit(x) - max_{v != x} logit(v) = log p(x) - log p(v*),
      the softmax normaliser cancelling;
    * ``kind="prob"``: p(x) - max_{v != x} p(v).

    The frame records ``p_ref`` = p(x) (reference = teacher's final tokens) and ``p_alt`` =
    max_{v != x} p(v) (``fair_calib.decoding.step_stats``), so the margin is exact wherever x
    ranks in the student's distribution. A column ``margin_ref`` (same ``kind``), if the frame
    has one, is used as is. Probabilities are floored at 1e-300 for the logarithm. A frame with
    neither column (recorded before ``p_alt`` existed) is refused: ``top1``/``margin`` alone
    give the best alternative only when x is the student's first or second choice.

    Returns columns ``sample_id, frontier_margin, n_commits`` (mean over the sample's commits).
    """
    if kind not in ("logit", "prob"):
        raise ValueError(f"kind must be 'logit' or 'prob', not {kind!r}")
    exact = "margin_ref" if "margin_ref" in forced.columns else "p_alt"
    _check(forced, ("sample_id", "step", "position", "p_ref", exact), "frontier_margin")
    tc = commits(teacher).rename(columns={"t_commit": "step", "token": "x_fin"})
    cols = ["sample_id", "step", "position", "p_ref", exact]
    m = tc.merge(forced[cols], on=["sample_id", "step", "position"], how="inner")
    if exact == "margin_ref":
        mr = m["margin_ref"].to_numpy(np.float64)
    else:
        px = m["p_ref"].to_numpy(np.float64)
        other = m["p_alt"].to_numpy(np.float64)
        if kind == "prob":
            mr = px - other
        else:
            floor = 1e-300
            mr = np.log(np.maximum(px, floor)) - np.log(np.maximum(other, floor))
    m = m.assign(mr=mr)
    g = m.groupby("sample_id")["mr"]
    return pd.DataFrame({"frontier_margin": g.mean(), "n_commits": g.size()}).reset_index()


# ----------------------------------------------------------------------------- curves
def curve_correlation(a: Sequence[float] | pd.Series, b: Sequence[float] | pd.Series
                      ) -> tuple[float, float]:
    """(Spearman rho, Pearson r) between two mean curves over the same positions.

    ``pd.Series`` inputs are aligned on their index (positions); plain sequences must have equal
    length. NaN entries (in either) are dropped pairwise; fewer than 3 pairs or a constant curve
    give NaN.
    """
    from scipy import stats

    if isinstance(a, pd.Series) and isinstance(b, pd.Series):
        a, b = a.align(b, join="inner")
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"curves differ in length: {a.shape} vs {b.shape}")
    ok = ~(np.isnan(a) | np.isnan(b))
    a, b = a[ok], b[ok]
    if a.size < 3 or np.all(a == a[0]) or np.all(b == b[0]):
        return float("nan"), float("nan")
    return float(stats.spearmanr(a, b).statistic), float(stats.pearsonr(a, b).statistic)


def prior_correlation(prior_a: pd.DataFrame, prior_b: pd.DataFrame) -> tuple[float, float]:
    """Spearman/Pearson between two prior files' ``w_bar`` curves (aligned on ``position``)."""
    return curve_correlation(prior_a.set_index("position")["w_bar"],
                             prior_b.set_index("position")["w_bar"])


# ----------------------------------------------------------------------------- metric rows
def diagnostic_rows(traj: pd.DataFrame, teacher: pd.DataFrame | None = None,
                    max_lag: int | None = None) -> list[dict[str, Any]]:
    """All metric rows (metric, x, value, std, n) for one recorded file.

    ``traj`` may carry a ``mode`` column (free / forced rows). Metrics needing the teacher
    (mse_prob, false commits, flips, frontier margin) are produced only when ``teacher`` (the
    FP teacher's free-running trajectory) is given; flips and margin need forced rows.
    """
    nan = float("nan")
    free, forced = split_modes(traj)
    rows: list[dict[str, Any]] = []

    def scalar(metric, values):
        mean, std, n = _mean_std(list(values))
        rows.append({"metric": metric, "x": nan, "value": mean, "std": std, "n": n})

    if len(free):
        lag = stability_lag(free)
        scalar("stability_lag", lag["lag"].astype(float))
        scalar("never_stable_rate", (~lag["stable"]).astype(float))
        xs = None if max_lag is None else np.arange(0, max_lag + 1)
        xs, cc = ccdf(lag["lag"].to_numpy(), xs)
        for x, v in zip(xs, cc):
            rows.append({"metric": "stability_lag_ccdf", "x": float(x), "value": float(v),
                         "std": nan, "n": int(len(lag))})
        pcm = post_commit_mismatch(free)
        scalar("mean_disagree_rate", pcm["mean_disagree_rate"])
        scalar("never_agree_rate", pcm["never_agree_rate"])
        if teacher is not None:
            teacher_free, _ = split_modes(teacher)
            tr = mse_prob_trace(free, teacher_free)
            scalar("mse_prob_mean", tr.groupby("sample_id")["mse_prob"].mean())
            for step, g in tr.groupby("step", sort=False):
                mean, std, n = _mean_std(g["mse_prob"])
                rows.append({"metric": "mse_prob", "x": float(step), "value": mean, "std": std,
                             "n": n})
            ffc = first_false_commit(free, teacher_free)
            scalar("first_false_commit_step", ffc)
            scalar("false_commit_rate", ffc.notna().astype(float))
    if teacher is not None and len(forced):
        teacher_free, _ = split_modes(teacher)
        scalar("commit_flips", commit_step_flips(forced, teacher_free).astype(float))
        scalar("frontier_margin", frontier_margin(forced, teacher_free)["frontier_margin"])
    return rows


def key_from_path(path: str | Path) -> tuple[str, str, str]:
    """(model, method, bits) from ``results/traj/{model}/{method}/{bits}.parquet``."""
    p = Path(path)
    if len(p.parts) < 3:
        raise ValueError(f"{path}: expected .../{{model}}/{{method}}/{{bits}}.parquet")
    return p.parent.parent.name, p.parent.name, p.stem


def diagnose(inputs: Sequence[str | Path], teacher: str | Path | None = None,
             max_lag: int | None = None) -> pd.DataFrame:
    """Long-format diagnostics of every trajectory file in ``inputs`` and of the teacher (added
    as a run of its own when not among ``inputs``); see the module docstring for the columns."""
    from fair_calib.jobs.io import read_parquet

    tdf = read_parquet(teacher)[0] if teacher else None
    paths = [Path(p) for p in inputs]
    if teacher and Path(teacher).resolve() not in {p.resolve() for p in paths}:
        paths.insert(0, Path(teacher))   # the FP teacher is a run of its own (lag, mismatch)
    frames = []
    for path in paths:
        model, method, bits = key_from_path(path)
        df, _ = read_parquet(path)
        rows = diagnostic_rows(df, tdf, max_lag=max_lag)
        f = pd.DataFrame(rows, columns=["metric", "x", "value", "std", "n"])
        f.insert(0, "bits", bits)
        f.insert(0, "method", method)
        f.insert(0, "model", model)
        frames.append(f)
    if not frames:
        return pd.DataFrame(columns=[f.name for f in DIAGNOSTICS_SCHEMA])
    out = pd.concat(frames, ignore_index=True)
    out["n"] = out["n"].astype(np.int64)
    return out


# ----------------------------------------------------------------------------- trajectories
def encode_prompt(loaded: Any, text: str, instruct: bool = False) -> list[int]:
    """Prompt ids as evaluation encodes them: the chat template for instruct models of a
    family that uses one, else the text with the tokenizer's special prefix."""
    tok = loaded.tokenizer
    if instruct and loaded.adapter.chat_template:
        text = tok.apply_chat_template([{"role": "user", "content": text}],
                                       add_generation_prompt=True, tokenize=False)
        return list(tok(text, add_special_tokens=False)["input_ids"])
    return list(tok(text, add_special_tokens=True)["input_ids"])


def trajectory_tensors(traj: pd.DataFrame, n_samples: int):
    """(final_tokens, commit_steps) ``[n_samples, K]`` LongTensors of a free-running trajectory;
    every window position of every sample must be committed exactly once."""
    import torch

    c = commits(traj)
    k = int(traj["position"].max()) + 1
    if sorted(c["sample_id"].unique().tolist()) != list(range(n_samples)) or len(c) != n_samples * k:
        raise ValueError(f"teacher trajectory does not cover samples 0..{n_samples - 1} x {k} "
                         f"positions ({len(c)} commits)")
    final = torch.full((n_samples, k), -1, dtype=torch.long)
    steps = torch.zeros((n_samples, k), dtype=torch.long)
    sid = torch.tensor(c["sample_id"].to_numpy(), dtype=torch.long)
    pos = torch.tensor(c["position"].to_numpy(), dtype=torch.long)
    final[sid, pos] = torch.tensor(c["token"].to_numpy(), dtype=torch.long)
    steps[sid, pos] = torch.tensor(c["t_commit"].to_numpy(), dtype=torch.long)
    return final, steps


def record_trajectories(settings: dict[str, Any], model_dir: str, calib_dir: str | None = None,
                        teacher_path: str | None = None) -> pd.DataFrame:
    """Decode the first ``n_samples`` probe prompts with the model's default policy and record
    every step (``fair_calib.decoding.record_trajectory``); with a teacher trajectory, the
    teacher's final tokens are the reference tokens (``p_ref``) and the model is also
    teacher-forced on the teacher's states (``fair_calib.decoding.teacher_force``).

    Settings: common keys plus ``model`` (config entry: ``family``, ``instruct``, optional
    ``decoding`` overrides, ``trust_remote_code``), ``probe`` (``dataset``, ``instruction``),
    ``n_samples``. Returns the frame with a ``mode`` column (``free`` / ``forced``).
    """
    import torch

    from fair_calib import data
    from fair_calib.decoding import make_policy, record_trajectory, teacher_force
    from fair_calib.jobs.io import read_parquet
    from fair_calib.models.adapters import load_model

    mcfg = dict(settings.get("model") or {})
    family = mcfg.get("family") or _family_of(model_dir)
    if calib_dir:    # before the model loads: a calibration of other weights is refused
        from fair_calib.jobs.model_identity import check_calibration_content

        check_calibration_content(calib_dir, model_dir)
    loaded = load_model(model_dir, family, settings.get("dtype") or "float32",
                        settings.get("device") or "cpu",
                        trust_remote_code=mcfg.get("trust_remote_code"),
                        loader=mcfg.get("loader"))
    if calib_dir:
        from fair_calib.methods import load_quantized
        loaded = load_quantized(loaded, calib_dir)
    loaded.replay_graphs()        # the model is final: repeated forwards replay on CUDA
    probe = dict(settings.get("probe") or {})
    n = int(settings.get("n_samples") or 16)
    texts = data.probe_prompts(probe.get("dataset", "synthetic"), settings.get("data_dir"),
                               settings.get("synthetic_dir"), n, probe.get("instruction"),
                               source=settings.get("data_source") or "local")
    prompts = [encode_prompt(loaded, t, bool(mcfg.get("instruct"))) for t in texts]
    policy = make_policy(loaded, mcfg.get("decoding"))
    gen = torch.Generator().manual_seed(int(settings.get("seed") or 0))

    final = steps = None
    if teacher_path:
        teacher = split_modes(read_parquet(teacher_path)[0])[0]
        final, steps = trajectory_tensors(teacher, n)
        if final.shape[1] != policy.gen_length:
            raise ValueError(f"teacher window {final.shape[1]} != gen_length {policy.gen_length}")
    _, _, free = record_trajectory(loaded, prompts, policy, generator=gen, reference=final)
    frames = [free.assign(mode="free")]
    if teacher_path:
        forced = teacher_force(loaded, prompts, final, steps, cfg_scale=policy.cfg_scale,
                               steps=policy.steps)
        frames.append(forced.assign(mode="forced"))
    return pd.concat(frames, ignore_index=True)


def _family_of(model_dir: str) -> str:
    meta = Path(model_dir) / "fair_calib.json"
    if not meta.exists():
        raise ValueError(f"{model_dir}: no fair_calib.json; pass model.family in --settings")
    return json.loads(meta.read_text())["family"]


# ----------------------------------------------------------------------------- CLI
def _diagnose_or_exit(inputs: Sequence[str], teacher: str | None, max_lag: int | None):
    """:func:`diagnose`, with a missing or unreadable trajectory file as one line naming it."""
    import os
    import sys

    from fair_calib.jobs.io import CorruptFileError

    for path in [*inputs, *([teacher] if teacher else [])]:
        if not os.path.isfile(path):
            sys.exit(f"error: fair-calib diagnose: {path}: no such file (relative paths are "
                     f"read from the current directory, {os.getcwd()}; the trajectories are "
                     "results/traj/<model>/<method>/<bits>.parquet)")
    try:
        return diagnose(inputs, teacher, max_lag=max_lag)
    except CorruptFileError as err:
        sys.exit(f"error: fair-calib diagnose: {err}")


def run_cli(argv: Sequence[str]) -> None:
    """``argv[0]`` is the subcommand: ``trajectories`` or ``diagnose``."""
    from fair_calib.jobs.io import provenance, write_parquet

    argv = list(argv)
    if not argv or argv[0] not in ("trajectories", "diagnose"):
        raise SystemExit("usage: fair-calib {trajectories,diagnose} ...")
    cmd, rest = argv[0], argv[1:]
    if cmd == "diagnose":
        ap = argparse.ArgumentParser(prog="fair-calib diagnose")
        ap.add_argument("--inputs", nargs="+", required=True,
                        help="trajectory parquets results/traj/{model}/{method}/{bits}.parquet")
        ap.add_argument("--teacher", default=None, help="the FP teacher's trajectory parquet")
        ap.add_argument("--settings", default="{}", help="JSON; optional key max_lag")
        ap.add_argument("--out", required=True)
        a = ap.parse_args(rest)
        settings = json.loads(a.settings)
        out = _diagnose_or_exit(a.inputs, a.teacher, settings.get("max_lag"))
        write_parquet(out, a.out, DIAGNOSTICS_SCHEMA,
                      provenance(settings, settings.get("seed"), inputs=list(a.inputs),
                                 teacher=a.teacher))
        return
    ap = argparse.ArgumentParser(prog="fair-calib trajectories")
    ap.add_argument("--settings", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--calib-dir", default=None)
    ap.add_argument("--teacher", default=None)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(rest)
    settings = json.loads(a.settings)
    df = record_trajectories(settings, a.model_dir, a.calib_dir, a.teacher)
    write_parquet(df, a.out, TRAJECTORY_SCHEMA,
                  provenance(settings, settings.get("seed"), model_dir=a.model_dir,
                             calib_dir=a.calib_dir, teacher=a.teacher))
