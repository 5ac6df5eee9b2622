"""Figures of the mechanistic diagnostics and the position priors (PDF and PNG each).

``fair-calib figures --inputs FILES... --out-dir results/figures [--settings JSON]``

Inputs are sorted by their columns: diagnostics Parquet (``metric`` column, written by
``fair-calib diagnose``) and prior Parquet (``position, w_bar`` at
``results/prior/{model}/{prior}.parquet``). Every figure is drawn to be legible in grayscale:
each series has its own line style and marker (bars: hatch), not only its own colour.

Figures (``{name}.pdf``, ``{name}.png`` and the caption sidecar ``{name}.txt``; a figure whose
data are absent is skipped and reported, never drawn empty). Each is readable on its own: a
title, axes labelled with their units, a legend naming every series, and a caption saying what
is plotted, over how many sequences and what the error bars are, stored in the PDF (Subject)
and PNG (Description) metadata and in the sidecar. Bars show mean ± standard error over
sequences (std / sqrt(n)): the error bars are for comparing methods, not the spread; for counts
and rates the lower bar stops at 0. Steps, lags and positions get integer ticks; every series
has its own colour, line style and marker (up to ten series).

* ``stability_lag_ccdf_{model}``   CCDF of the stability lag per method (FP, baseline, FAIR-Calib)
* ``mse_prob_trace_{model}``       mean mse_prob vs diffusion step, each run's first false commit
                                   marked in its own colour and named in the legend
* ``commit_flips_{model}``         teacher-forced commit-step flips, mean +- std
* ``post_commit_mismatch_{model}`` never_agree_rate (a), mean_disagree_rate (b)
* ``frontier_margin_{model}``      average frontier margin at commit steps, mean +- std
* ``stability_lag_ccdf_models``    FP stability-lag CCDF of every model (Dream vs LLaDA)
* ``prior_curve_{model}``          each probed prior w_bar of the model over the window
* ``prior_cross_corpus``           pairs of priors, the model in the title, Spearman / Pearson in
                                   subplot titles

Settings (all optional): ``{"fp": "fp", "methods": [...order/selection...],
"labels": {"models": {name: label}, "methods": {name: label}, "priors": {name: label}},
"cross_corpus": [{"title": str, "a": "model/prior", "b": "model/prior",
"labels": ["GSM8K-CoT", "WikiText2"]}, ...]}``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

LINESTYLES = ["-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3))]
MARKERS = ["o", "s", "^", "D", "v", "P", "*", "X"]
HATCHES = ["", "//", "..", "xx", "\\\\", "--"]
COLORS = ["#000000", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf"]


def _style(i: int) -> dict[str, Any]:
    """The i-th series' style. The three cycles have different lengths (6, 8, 10), so no two of
    the first 10 series share a colour and no two of the first 24 share line style and marker
    (a figure with seven priors once drew the first and the seventh alike)."""
    return {"linestyle": LINESTYLES[i % len(LINESTYLES)], "marker": MARKERS[i % len(MARKERS)],
            "color": COLORS[i % len(COLORS)]}


def _integer_ticks(axis) -> None:
    """Steps, lags and positions are integers: no 2.5 ticks."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _label(settings: Mapping[str, Any], kind: str, name: str) -> str:
    return str(((settings.get("labels") or {}).get(kind) or {}).get(name, name))


def save(fig, out_dir: str | Path, name: str, caption: str = "") -> list[Path]:
    """Write ``name.pdf``, ``name.png`` (caption in their metadata) and ``name.txt`` (title and
    caption) atomically; closes the figure."""
    from fair_calib.io import atomic_path, write_text

    title = _figure_title(fig) or name
    meta = {"pdf": {"Title": title, "Subject": caption, "Creator": "fair-calib figures"},
            "png": {"Title": title, "Description": caption, "Software": "fair-calib figures"}}
    paths = []
    for ext in ("pdf", "png"):
        p = Path(out_dir) / f"{name}.{ext}"
        with atomic_path(p) as tmp:
            fig.savefig(tmp, format=ext, dpi=150, bbox_inches="tight", metadata=meta[ext])
        paths.append(p)
    side = Path(out_dir) / f"{name}.txt"
    write_text(side, f"{title}\n\n{caption}\n")
    paths.append(side)
    plt.close(fig)
    return paths


def _figure_title(fig) -> str:
    """The suptitle, else the axes titles joined (what a reader sees as the figure's title)."""
    if fig.get_suptitle():
        return fig.get_suptitle()
    return "; ".join(t for t in (ax.get_title() for ax in fig.axes) if t)


def _n_of(d: pd.DataFrame, metric: str) -> int:
    r = d[d["metric"] == metric]["n"]
    return int(r.max()) if len(r) else 0


def _series(diag: pd.DataFrame, metric: str) -> pd.DataFrame:
    return diag[diag["metric"] == metric].sort_values("x")


def _scalar(diag: pd.DataFrame, metric: str) -> tuple[float, float] | None:
    """(mean, standard error over sequences = std / sqrt(n)) of a scalar metric."""
    r = diag[diag["metric"] == metric]
    if r.empty or np.isnan(r["value"].iloc[0]):
        return None
    std, n = r["std"].iloc[0], int(r["n"].iloc[0])
    se = 0.0 if (np.isnan(std) or n < 1) else float(std) / np.sqrt(n)
    return float(r["value"].iloc[0]), se


def _runs(diag: pd.DataFrame, model: str, settings: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(method, bits) runs of ``model`` in plotting order: FP first, then settings order."""
    runs = diag.loc[diag["model"] == model, ["method", "bits"]].drop_duplicates()
    runs = [tuple(r) for r in runs.itertuples(index=False)]
    order = list(settings.get("methods") or [])
    fp = settings.get("fp", "fp")
    if order:
        runs = [r for r in runs if r[0] in order or r[0] == fp]

    def key(r):
        return (r[0] != fp, order.index(r[0]) if r[0] in order else len(order), r[0], r[1])

    return sorted(runs, key=key)


def _run_label(settings, method, bits, fp):
    lab = _label(settings, "methods", method)
    return lab if method == fp else f"{lab} ({bits.upper()})"


# ----------------------------------------------------------------------------- plots
def plot_ccdf(curves: Sequence[tuple[str, np.ndarray, np.ndarray]], title: str):
    """Step-plot CCDFs P(lag > x) on a log y axis; curves: (label, xs, ccdf). Each curve is one
    line with its style and markers, so its legend entry shows both."""
    fig, ax = plt.subplots(figsize=(4.2, 3.2))
    drawn = 0
    for i, (lab, xs, ys) in enumerate(curves):
        st = _style(i)
        if not (np.asarray(ys) > 0).any():
            # P(lag > x) is 0 everywhere: nothing to draw on a log axis; the legend says so,
            # with the curve's own style so the entry is not a bare label.
            ax.plot([], [], label=f"{lab}: every lag is 0", markersize=3, **st)
            continue
        y = np.where(np.asarray(ys) > 0, ys, np.nan)
        ax.plot(xs, y, drawstyle="steps-post", label=lab, markersize=3,
                markevery=max(1, len(xs) // 10), **st)
        drawn += 1
    if drawn:
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, 1)
        right = max([float(np.max(xs)) for _, xs, _ in curves if len(xs)] + [1.0])
        ax.set_xlim(-0.5, right + 0.5)
        ax.text(0.5, 0.5, "no position changed its prediction\nafter its commit (all lags 0)",
                ha="center", va="center", transform=ax.transAxes, fontsize=8)
    _integer_ticks(ax.xaxis)
    ax.set_xlabel(r"stability lag $\delta_{\mathrm{lag}}$ (steps)")
    ax.set_ylabel(r"CCDF $P(\delta_{\mathrm{lag}} > x)$ (fraction of positions)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def plot_mse_trace(traces: Sequence[tuple[str, np.ndarray, np.ndarray, float | None]], title: str):
    """traces: (label, steps, mean mse_prob, mean first-false-commit step or None). Each run's
    first false commit is marked on its own trace, at the recorded step nearest the mean, by a
    large X in the trace's colour and a vertical line in its line style, with its own legend
    entry: two runs' markers never look alike, even where they fall on the same step."""
    fig, ax = plt.subplots(figsize=(4.2, 3.2))
    for i, (lab, xs, ys, ffc) in enumerate(traces):
        st = _style(i)
        ax.plot(xs, ys, label=lab, markersize=3, markevery=max(1, len(xs) // 10), **st)
        if ffc is not None and len(xs):
            k = int(np.argmin(np.abs(np.asarray(xs) - ffc)))
            ax.axvline(xs[k], color=st["color"], linestyle=st["linestyle"], linewidth=0.8,
                       alpha=0.6)
            ax.plot([xs[k]], [ys[k]], marker="X", markersize=10, color=st["color"],
                    markeredgecolor="black", linestyle="none",
                    label=f"{lab}: first false commit (mean step {ffc:.1f})")
    ax.invert_xaxis()  # decoding runs from step T down to 1
    _integer_ticks(ax.xaxis)
    ax.set_xlabel("diffusion step $t$ (T $\\rightarrow$ 1)")
    ax.set_ylabel(r"$\mathrm{mse\_prob}$ w.r.t. FP (probability$^2$)")
    ax.set_title(title, fontsize=9)
    # below the axes: six entries inside would cover the traces
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    ax.grid(alpha=0.3)
    return fig


def plot_bars(ax, labels: Sequence[str], means: Sequence[float], errs: Sequence[float],
              ylabel: str, title: str | None = None, nonnegative: bool = False) -> None:
    """One bar per run with its error bar (mean ± SE), value printed above the error bar, and
    a legend. ``nonnegative`` (counts, rates): the lower error bar stops at 0, where the
    quantity does."""
    x = np.arange(len(labels))
    for i in range(len(labels)):
        low = min(errs[i], max(means[i], 0.0)) if nonnegative else errs[i]
        ax.bar(x[i], means[i], yerr=[[low], [errs[i]]], capsize=4, color=COLORS[i % len(COLORS)],
               alpha=0.45 if i else 0.25, edgecolor="black", hatch=HATCHES[i % len(HATCHES)],
               label=labels[i])
        # two short lines, above the error bar: one line ran into the neighbours' error bars
        ax.annotate(f"{means[i]:.3g}\n$\\pm${errs[i]:.2g}", (x[i], means[i] + errs[i]),
                    ha="center", va="bottom", fontsize=6, xytext=(0, 2),
                    textcoords="offset points", linespacing=1.0)
    ax.set_xticks(x, labels, rotation=15, fontsize=7)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    # headroom above the tallest error bar keeps the legend off the bars
    top = max([m + e for m, e in zip(means, errs)] + [0.0])
    ax.set_ylim(min(0.0, min(means, default=0.0)), top * 1.6 if top > 0 else 1.0)
    ax.legend(fontsize=6, title="mean $\\pm$ SE", title_fontsize=6, loc="upper center",
              ncol=2)
    ax.grid(axis="y", alpha=0.3)


def plot_curves(curves: Sequence[tuple[str, np.ndarray, np.ndarray]], title: str, ax=None,
                ylabel: str = r"prior $\bar{w}$ (unitless)"):
    """Prior curves over window positions, each in its own line style, marker and colour."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(4.6, 3.0))
    for i, (lab, xs, ys) in enumerate(curves):
        ax.plot(xs, ys, label=lab, markersize=3, markevery=max(1, len(xs) // 12), **_style(i))
    _integer_ticks(ax.xaxis)
    ax.set_xlabel("position in generation window (tokens)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    if len(curves) > 3:     # beside the axes: inside, many entries cover the curves
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    else:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig


# ----------------------------------------------------------------------------- driver
def make_figures(diag: pd.DataFrame, priors: Mapping[tuple[str, str], pd.DataFrame],
                 out_dir: str | Path, settings: Mapping[str, Any] | None = None
                 ) -> tuple[list[Path], list[str]]:
    """Draw every figure the inputs support. Returns (written paths, skipped figure notes)."""
    from fair_calib.diagnostics import prior_correlation

    settings = dict(settings or {})
    fp = settings.get("fp", "fp")
    written: list[Path] = []
    skipped: list[str] = []
    models = list(dict.fromkeys(diag["model"])) if len(diag) else []
    for model in models:
        d = diag[diag["model"] == model]
        runs = _runs(diag, model, settings)
        mlab = _label(settings, "models", model)
        sel = lambda m, b: d[(d["method"] == m) & (d["bits"] == b)]  # noqa: E731

        curves = []
        for m, b in runs:
            s = _series(sel(m, b), "stability_lag_ccdf")
            if len(s):
                curves.append((_run_label(settings, m, b, fp), s["x"].to_numpy(), s["value"].to_numpy()))
        if curves:
            n = _n_of(d, "stability_lag_ccdf")
            cap = (f"{mlab}: share of committed positions whose top-1 prediction still changes more "
                   "than x steps after the commit (the stability lag, in diffusion steps), for "
                   "each model decoding freely with its default policy; log scale, "
                   f"{n} committed positions of the FP run. Curves further right: later "
                   "stabilisation.")
            written += save(plot_ccdf(curves, f"Stability lag CCDF: {mlab}"), out_dir,
                            f"stability_lag_ccdf_{model}", cap)
        else:
            skipped.append(f"stability_lag_ccdf_{model}: no stability_lag_ccdf rows")

        traces = []
        for m, b in runs:
            if m == fp:
                continue
            s = _series(sel(m, b), "mse_prob")
            if len(s):
                ffc = _scalar(sel(m, b), "first_false_commit_step")
                traces.append((_run_label(settings, m, b, fp), s["x"].to_numpy(),
                               s["value"].to_numpy(), None if ffc is None else ffc[0]))
        if traces:
            cap = (f"{mlab}: mean squared difference between the quantized and the FP model's "
                   "probability of the FP model's final token, over the window positions, at "
                   "each diffusion step of each model's own decoding (step T first); the red X "
                   "marks the mean step of the first commit that differs from FP's final "
                   f"token. Mean over {_n_of(d, 'mse_prob')} sequences. Lower is closer to FP.")
            written += save(plot_mse_trace(traces, f"Decode divergence w.r.t. FP: {mlab}"),
                            out_dir, f"mse_prob_trace_{model}", cap)
        else:
            skipped.append(f"mse_prob_trace_{model}: no mse_prob rows of a quantized run")

        for metric, name, ylabel, title, what in (
                ("commit_flips", "commit_flips", "flips per sequence (count)",
                 f"Teacher-forced commit-step flips: {mlab}",
                 "positions where the quantized model, fed the FP model's decoding states, "
                 "predicts a different token than FP at FP's commit step (lower is better)"),
                ("frontier_margin", "frontier_margin", "frontier margin (logit)",
                 f"Average frontier margin at commit steps: {mlab}",
                 "the quantized model's logit margin of FP's final token over its strongest "
                 "alternative at FP's commit steps, on FP's states (higher is better)")):
            bars = [(_run_label(settings, m, b, fp), _scalar(sel(m, b), metric))
                    for m, b in runs if m != fp]
            bars = [(lab, v) for lab, v in bars if v is not None]
            if bars:
                fig, ax = plt.subplots(figsize=(3.6, 3.0))
                plot_bars(ax, [b[0] for b in bars], [b[1][0] for b in bars],
                          [b[1][1] for b in bars], ylabel, title,
                          nonnegative=metric == "commit_flips")   # a margin may be negative
                cap = (f"{mlab}: {what}. Bars: mean, error bars: standard error over "
                       f"{_n_of(d, metric)} sequences.")
                written += save(fig, out_dir, f"{name}_{model}", cap)
            else:
                skipped.append(f"{name}_{model}: no {metric} rows of a quantized run")

        fig, axes = plt.subplots(1, 2, figsize=(7.6, 3.2), gridspec_kw={"wspace": 0.45})
        drawn = 0
        for ax, metric, sub in zip(axes, ("never_agree_rate", "mean_disagree_rate"),
                                   ("(a) committed positions never re-agreeing",
                                    "(b) post-commit steps disagreeing")):
            bars = [(_run_label(settings, m, b, fp), _scalar(sel(m, b), metric)) for m, b in runs]
            bars = [(lab, v) for lab, v in bars if v is not None]
            if bars:
                drawn += 1
                plot_bars(ax, [b[0] for b in bars], [b[1][0] for b in bars],
                          [b[1][1] for b in bars], "rate (fraction of committed positions)"
                          if metric == "never_agree_rate" else "rate (fraction of steps)", sub,
                          nonnegative=True)
        if drawn:
            fig.suptitle(f"Post-commit mismatch: {mlab}", fontsize=9)
            cap = (f"{mlab}, each model decoding freely: (a), the share of committed positions "
                   "whose top-1 prediction never again equals the committed token; (b), the "
                   "mean share of post-commit steps at which it differs. Bars: mean, error "
                   f"bars: standard error over {_n_of(d, 'never_agree_rate')} sequences. "
                   "Lower is better.")
            written += save(fig, out_dir, f"post_commit_mismatch_{model}", cap)
        else:
            plt.close(fig)
            skipped.append(f"post_commit_mismatch_{model}: no post-commit rows")

    fam_curves = []
    for model in models:
        s = _series(diag[(diag["model"] == model) & (diag["method"] == fp)], "stability_lag_ccdf")
        if len(s):
            fam_curves.append((_label(settings, "models", model), s["x"].to_numpy(),
                               s["value"].to_numpy()))
    if len(fam_curves) >= 2:
        written += save(plot_ccdf(fam_curves, "Stability lag of the FP models"), out_dir,
                        "stability_lag_ccdf_models",
                        "Stability-lag CCDF (diffusion steps) of each FP model decoding freely "
                        "with its own default policy: how long committed predictions keep "
                        "changing in each family.")
    else:
        skipped.append("stability_lag_ccdf_models: FP lag CCDF of fewer than two models")

    for model in dict.fromkeys(m for m, _ in priors):
        curves = [(f"prior {_label(settings, 'priors', p)}", df["position"].to_numpy(),
                   df["w_bar"].to_numpy()) for (m, p), df in priors.items() if m == model]
        written += save(plot_curves(curves, f"Position prior: {_label(settings, 'models', model)}"),
                        out_dir, f"prior_curve_{model}",
                        "Stage I position prior w_bar (unitless weight in (0, 1], maximum 1) "
                        "of each probed prior of the model, by position in the generation "
                        "window; FAIR-Calib weights its calibration loss with it.")

    pairs = list(settings.get("cross_corpus") or [])
    pairs = [p for p in pairs if _key(p["a"]) in priors and _key(p["b"]) in priors]
    for p in settings.get("cross_corpus") or []:
        if p not in pairs:
            skipped.append(f"prior_cross_corpus: pair {p.get('a')} / {p.get('b')} not in inputs")
    if pairs:
        fig, axes = plt.subplots(len(pairs), 1, figsize=(5.6, 2.6 * len(pairs)), squeeze=False)
        models_of = [" vs ".join(dict.fromkeys(_label(settings, "models", _key(p[k])[0])
                                               for k in ("a", "b"))) for p in pairs]
        models_shown = ", ".join(dict.fromkeys(models_of))
        for ax, p, mlab in zip(axes[:, 0], pairs, models_of):
            a, b = priors[_key(p["a"])], priors[_key(p["b"])]
            sp, pe = prior_correlation(a, b)
            la, lb = p.get("labels") or [p["a"], p["b"]]
            # the suptitle names the model; a panel names it only where the panels differ
            head = ", ".join(x for x in (p.get("title"), mlab if len(set(models_of)) > 1 else "")
                             if x) or mlab
            plot_curves([(la, a["position"].to_numpy(), a["w_bar"].to_numpy()),
                         (lb, b["position"].to_numpy(), b["w_bar"].to_numpy())],
                        f"{head}: Spearman {sp:.3f}, Pearson {pe:.3f}", ax=ax)
        fig.suptitle(f"Position priors probed on two corpora: {models_shown}", fontsize=10)
        fig.tight_layout()
        written += save(fig, out_dir, "prior_cross_corpus",
                        f"Position priors w_bar of {models_shown}, probed on two corpora, one "
                        "panel per probing variant; panel titles give their Spearman and Pearson "
                        "correlation over positions.")
    return written, skipped


def _key(ref: str) -> tuple[str, str]:
    model, _, prior = str(ref).partition("/")
    return model, prior


def load_inputs(paths: Sequence[str | Path]) -> tuple[pd.DataFrame, dict[tuple[str, str], pd.DataFrame]]:
    from fair_calib.io import read_parquet

    diags, priors = [], {}
    for p in map(Path, paths):
        df, _ = read_parquet(p)
        if "metric" in df.columns and "x" in df.columns:
            diags.append(df)
        elif {"position", "w_bar"} <= set(df.columns):
            priors[(p.parent.name, p.stem)] = df.sort_values("position")
        else:
            raise ValueError(f"{p}: neither a diagnostics nor a prior Parquet")
    diag = pd.concat(diags, ignore_index=True) if diags else pd.DataFrame(
        columns=["model", "method", "bits", "metric", "x", "value", "std", "n"])
    return diag, priors


def run_cli(argv: Sequence[str]) -> None:
    ap = argparse.ArgumentParser(prog="fair-calib figures")
    ap.add_argument("--inputs", nargs="+", required=True,
                    help="diagnostics parquets and prior parquets")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--settings", default="{}", help="JSON (module docstring)")
    a = ap.parse_args(list(argv))
    diag, priors = load_inputs(a.inputs)
    Path(a.out_dir).mkdir(parents=True, exist_ok=True)
    written, skipped = make_figures(diag, priors, a.out_dir, json.loads(a.settings))
    for p in written:
        print(f"wrote {p}")
    for s in skipped:
        print(f"skipped {s}", file=sys.stderr)


def floor_sweep(points: pd.DataFrame, out_dir: str | Path, settings: Mapping[str, Any],
                reference: pd.DataFrame | None = None) -> list[Path]:
    """``floor_sweep``: accuracy vs the prior's floor, one line per model, error bars = sample
    std over calibration seeds. ``points``: model, floor, mean, std, n_seeds (percent);
    ``reference`` (optional): model, mean, std, n_seeds of one unswept method, drawn as a
    dashed line with a shaded ± std band in the model's colour."""
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    models = list(dict.fromkeys(points["model"]))
    ref_label = _label(settings, "methods", settings.get("reference") or "")
    for i, model in enumerate(models):
        d = points[points["model"] == model].sort_values("floor")
        style = _style(i)
        ax.errorbar(d["floor"], d["mean"], yerr=d["std"].fillna(0.0), capsize=3,
                    label=_label(settings, "models", model), **style)
        if reference is not None and model in set(reference["model"]):
            r = reference[reference["model"] == model].iloc[0]
            ax.axhline(r["mean"], color=style["color"], linestyle="--", linewidth=1,
                       label=f"{_label(settings, 'models', model)}: {ref_label}")
            ax.axhspan(r["mean"] - r["std"], r["mean"] + r["std"], color=style["color"],
                       alpha=0.12, linewidth=0)
    task = _label(settings, "tasks", settings.get("task", ""))
    ax.set_xlabel("prior floor (weight of calibration positions outside the window)")
    ax.set_ylabel(f"{task} accuracy (%)")
    ax.set_title(f"FAIR-Calib at {str(settings.get('bits', '')).upper()}: accuracy vs the "
                 "prior's floor", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    n = int(points["n_seeds"].min()) if len(points) else 0
    caption = (f"{task} accuracy (%) of FAIR-Calib against the floor of its position prior "
               f"(the weight the calibration loss gives the positions before the generation "
               f"window; the window's weights are the prior w_bar, maximum 1), per model. Points: "
               f"mean over {n} or more calibration seeds; error bars: sample standard deviation "
               "over the seeds (the spread, not the standard error).")
    if reference is not None and len(reference):
        caption += (f" Dashed line and band: {ref_label}, mean ± standard deviation over its "
                    "seeds.")
    return save(fig, out_dir, "floor_sweep", caption)
