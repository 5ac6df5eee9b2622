"""Figures of the mechanistic diagnostics and the position priors (PDF and PNG each).

``fair-calib figures --inputs FILES... --out-dir results/figures [--settings JSON]``

Inputs are sorted by their columns: diagnostics Parquet (``metric`` column, written by
``fair-calib diagnose``) and prior Parquet (``position, w_bar[, w_std]`` at
``results/prior/{model}/{prior}.parquet``). Every figure is drawn to be legible in grayscale:
each series has its own line style and marker (bars: hatch), not only its own colour.

Figures (``{name}.pdf``, ``{name}.png`` and the caption sidecar ``{name}.txt``; a figure whose
data are absent is skipped and reported, never drawn empty). Each is readable on its own: a
title, axes labelled with their units, a legend naming every series (bar charts: the tick
labels name the bars, no legend repeats them), and a caption saying what is plotted, over how
many sequences and what the error bars are, stored in the PDF (Subject) and PNG (Description)
metadata and in the sidecar. Bars show mean ± standard error over sequences (std / sqrt(n)):
the error bars are for comparing methods, not the spread; for counts and rates the lower bar
stops at 0; the value labels of a figure share one precision (:func:`decimals`). Steps, lags
and positions get integer ticks.

Styles: a method has one colour, line style, marker and hatch in every figure
(:func:`method_styles`; FP always black, solid, circles, no hatch); models, priors and corpora
take a palette no method uses. Labels are plain text (``$`` is printed, not mathtext).

* ``stability_lag_ccdf_{model}``   CCDF of the stability lag per method (FP, baseline, FAIR-Calib)
* ``mse_prob_trace_{model}``       mean mse_prob vs diffusion step, each run's first false commit
                                   marked at its mean step in its own colour, named in the legend
* ``commit_flips_{model}``         teacher-forced commit-step flips, mean ± SE
* ``post_commit_mismatch_{model}`` never_agree_rate (a), mean_disagree_rate (b)
* ``frontier_margin_{model}``      average frontier margin at commit steps, mean ± SE
* ``stability_lag_ccdf_models``    FP stability-lag CCDF of every model (Dream vs LLaDA)
* ``prior_curve_{model}``          the priors the calibration methods use (settings ``priors``)
* ``prior_cross_corpus``           pairs of priors on shared axes with across-sample bands
                                   (``w_std``), the model in the title, Spearman / Pearson in
                                   subplot titles

Settings (all optional): ``{"fp": "fp", "methods": [...order/selection...],
"priors": [priors of the methods], "labels": {"models": {name: label}, "methods": {name:
label}, "priors": {name: label}}, "cross_corpus": [{"title": str, "a": "model/prior",
"b": "model/prior", "labels": ["GSM8K-CoT", "WikiText2"]}, ...]}``.
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
HATCHES = ["", "//", "..", "xx", "\\\\", "--", "++", "oo"]
# Methods: FP is always black, solid, circles, no hatch; every other method keeps its own
# colour, line style, marker and hatch (by its place in the settings' method list) in every
# figure. Other series (models, priors, corpora) take a palette no method uses.
FP_STYLE = {"linestyle": "-", "marker": "o", "color": "#000000", "hatch": ""}
METHOD_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                 "#17becf", "#bcbd22", "#7f7f7f"]
# Models, priors, corpora: ten colours each at least 31 CIELAB units (Delta E 1976) from every
# method colour, from FP's black and from each other (the previous palette had Dark2's orange
# 14 units from the methods' orange and a grey 10 from theirs: a model read as a method).
# Picked greedily from the xkcd colour names for the largest such distance, lightness 28..65
# (legible on white), chroma over 35; tests/report/test_report_figures.py measures it.
COLORS = ["#920a4e", "#3c4d03", "#9a6200", "#11875d", "#0804f9", "#ff08e8", "#a00498",
          "#ff0789", "#0165fc", "#c760ff"]


def _style(i: int) -> dict[str, Any]:
    """The i-th non-method series' style. The three cycles have different lengths (6, 8, 10), so
    no two of the first 10 series share a colour and no two of the first 24 share line style
    and marker (a figure with seven priors once drew the first and the seventh alike)."""
    return {"linestyle": LINESTYLES[i % len(LINESTYLES)], "marker": MARKERS[i % len(MARKERS)],
            "color": COLORS[i % len(COLORS)]}


def method_styles(settings: Mapping[str, Any], methods: Sequence[str] = ()) -> dict[str, dict]:
    """Style (colour, line style, marker, hatch) of every method: FP's is :data:`FP_STYLE`, the
    others' follow the settings' ``methods`` order, then any other method of ``methods`` in
    sorted order. One table for every figure of a run, so a method looks the same throughout."""
    fp = settings.get("fp", "fp")
    order = [m for m in dict.fromkeys(list(settings.get("methods") or []) + sorted(methods))
             if m != fp]
    styles = {fp: dict(FP_STYLE)}
    for i, m in enumerate(order):
        styles[m] = {"linestyle": LINESTYLES[(i + 1) % len(LINESTYLES)],
                     "marker": MARKERS[(i + 1) % len(MARKERS)],
                     "color": METHOD_COLORS[i % len(METHOD_COLORS)],
                     "hatch": HATCHES[(i + 1) % len(HATCHES)]}
    return styles


def _line(style: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords of ``Axes.plot`` in a style (bars also use its ``hatch``)."""
    return {k: style[k] for k in ("linestyle", "marker", "color")}


def plain(text: Any) -> str:
    """A label as plain text in matplotlib: ``$`` would start mathtext (labels are plain text,
    config/README.md)."""
    return str(text).replace("$", r"\$")


def _integer_ticks(axis) -> None:
    """Steps, lags and positions are integers: no 2.5 ticks."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _label(settings: Mapping[str, Any], kind: str, name: str) -> str:
    """A name's plain-text label from the settings (a string or ``{"label": ...}``), else the
    name; ``$`` escaped for matplotlib."""
    entry = ((settings.get("labels") or {}).get(kind) or {}).get(name, name)
    if isinstance(entry, Mapping):
        entry = entry.get("label", name)
    return plain(entry)


def decimals(errs: Sequence[float], means: Sequence[float] = ()) -> int:
    """Decimals of every value label of one figure: one significant digit of its smallest
    positive error (values then carry as many), else three significant digits of its largest
    value; 0 to 4."""
    pos = [e for e in errs if e and np.isfinite(e) and e > 0]
    if pos:
        d = -int(np.floor(np.log10(min(pos))))
    else:
        top = max([abs(m) for m in means if np.isfinite(m)] + [0.0])
        d = 2 - int(np.floor(np.log10(top))) if top > 0 else 0
    return int(min(max(d, 0), 4))


def save(fig, out_dir: str | Path, name: str, caption: str = "") -> list[Path]:
    """Write ``name.pdf``, ``name.png`` (caption in their metadata) and ``name.txt`` (title and
    caption) atomically; closes the figure."""
    from fair_calib.jobs.io import atomic_path, write_text

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
def _curve_style(curve: Sequence[Any], i: int, at: int = 3) -> dict[str, Any]:
    """A curve tuple's own style (its item ``at``, from :func:`method_styles`), else series
    i's."""
    return dict(curve[at]) if len(curve) > at and curve[at] else _style(i)


def plot_ccdf(curves: Sequence[tuple], title: str):
    """Step-plot CCDFs P(lag > x) on a log y axis; curves: (label, xs, ccdf[, style]). Each
    curve is one line with its style and markers, so its legend entry shows both."""
    fig, ax = plt.subplots(figsize=(4.2, 3.2))
    drawn = 0
    for i, (lab, xs, ys, *_) in enumerate(curves):
        st = _line(_curve_style(curves[i], i))
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
        right = max([float(np.max(c[1])) for c in curves if len(c[1])] + [1.0])
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


def _at_step(xs: np.ndarray, ys: np.ndarray, step: float) -> float:
    """The trace's value at ``step`` (linear between recorded steps): where the mean first false
    commit falls, which is rarely a recorded step."""
    order = np.argsort(xs)
    return float(np.interp(step, np.asarray(xs, dtype=float)[order],
                           np.asarray(ys, dtype=float)[order]))


def plot_mse_trace(traces: Sequence[tuple], title: str):
    """traces: (label, steps, mean mse_prob, mean first-false-commit step or None[, style]).
    Each run's first false commit is marked on its own trace at exactly that mean step (the
    number its legend entry gives), by a large X in the trace's colour and a vertical line in
    its line style: two runs' markers never look alike, even where they fall on the same step."""
    fig, ax = plt.subplots(figsize=(4.2, 3.2))
    for i, (lab, xs, ys, ffc, *_) in enumerate(traces):
        st = _line(_curve_style(traces[i], i, at=4))
        ax.plot(xs, ys, label=lab, markersize=3, markevery=max(1, len(xs) // 10), **st)
        if ffc is not None and len(xs):
            ax.axvline(ffc, color=st["color"], linestyle=st["linestyle"], linewidth=0.8, alpha=0.6)
            ax.plot([ffc], [_at_step(xs, ys, ffc)], marker="X", markersize=10, color=st["color"],
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
              ylabel: str, title: str | None = None, nonnegative: bool = False,
              styles: Sequence[Mapping[str, Any]] | None = None, digits: int | None = None) -> None:
    """One bar per run (its method's colour and hatch) with its error bar (mean ± SE) and its
    value above the error bar, every value with the same ``digits`` (default
    :func:`decimals`). The tick labels name the bars, so there is no legend repeating them.
    ``nonnegative`` (counts, rates): the lower error bar stops at 0, where the quantity does."""
    x = np.arange(len(labels))
    digits = decimals(errs, means) if digits is None else digits
    for i in range(len(labels)):
        st = styles[i] if styles else {"color": _style(i)["color"], "hatch": HATCHES[i % len(HATCHES)]}
        low = min(errs[i], max(means[i], 0.0)) if nonnegative else errs[i]
        ax.bar(x[i], means[i], yerr=[[low], [errs[i]]], capsize=4, color=st["color"],
               alpha=0.45, edgecolor="black", hatch=st.get("hatch", ""))
        # two short lines, above the error bar: one line ran into the neighbours' error bars
        ax.annotate(f"{means[i]:.{digits}f}\n$\\pm${errs[i]:.{digits}f}", (x[i], means[i] + errs[i]),
                    ha="center", va="bottom", fontsize=6, xytext=(0, 2),
                    textcoords="offset points", linespacing=1.0)
    ax.set_xticks(x, labels, rotation=15, fontsize=7)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    # headroom above the tallest error bar keeps the value labels inside the axes
    top = max([m + e for m, e in zip(means, errs)] + [0.0])
    ax.set_ylim(min(0.0, min(means, default=0.0)), top * 1.35 if top > 0 else 1.0)
    ax.grid(axis="y", alpha=0.3)


def plot_curves(curves: Sequence[tuple], title: str, ax=None,
                ylabel: str = r"prior $\bar{w}$ (unitless)", legend: bool = True,
                within: tuple[float, float] = (0.0, 1.0)):
    """Prior curves over window positions: (label, xs, ys[, style[, band]]), each in its own
    line style, marker and colour; ``band`` (an array) is drawn as a shaded ys ± band, clipped
    to ``within`` (a prior lies in (0, 1]: a band past it would show weights none can have)."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(4.6, 3.0))
    for i, curve in enumerate(curves):
        lab, xs, ys = curve[:3]
        st = _line(_curve_style(curve, i))
        ax.plot(xs, ys, label=lab, markersize=3, markevery=max(1, len(xs) // 12), zorder=2, **st)
        band = curve[4] if len(curve) > 4 else None
        if band is not None:
            low, high = within
            ax.fill_between(xs, np.clip(np.asarray(ys) - band, low, high),
                            np.clip(np.asarray(ys) + band, low, high), color=st["color"],
                            alpha=0.18, linewidth=0, zorder=1)
    _integer_ticks(ax.xaxis)
    ax.set_xlabel("position in generation window (tokens)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    if legend and len(curves) > 3:     # beside the axes: inside, many entries cover the curves
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    elif legend:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig


# ----------------------------------------------------------------------------- driver
class _Run:
    """What the figure steps share: settings, the FP method, method styles, where to write,
    and the written paths / skipped notes."""

    def __init__(self, diag: pd.DataFrame, out_dir: str | Path, settings: Mapping[str, Any]):
        self.settings = dict(settings)
        self.fp = self.settings.get("fp", "fp")
        self.styles = method_styles(self.settings, list(dict.fromkeys(diag["method"]))
                                    if len(diag) else [])
        self.out_dir = out_dir
        self.written: list[Path] = []
        self.skipped: list[str] = []

    def save(self, fig, name: str, caption: str) -> None:
        self.written += save(fig, self.out_dir, name, caption)

    def label(self, kind: str, name: str) -> str:
        return _label(self.settings, kind, name)

    def run_label(self, method: str, bits: str) -> str:
        return _run_label(self.settings, method, bits, self.fp)


def _lag_ccdf_figure(r: _Run, model: str, d: pd.DataFrame, runs, mlab: str) -> None:
    curves = []
    for m, b in runs:
        s = _series(_sel(d, m, b), "stability_lag_ccdf")
        if len(s):
            curves.append((r.run_label(m, b), s["x"].to_numpy(), s["value"].to_numpy(),
                           r.styles[m]))
    if not curves:
        r.skipped.append(f"stability_lag_ccdf_{model}: no stability_lag_ccdf rows")
        return
    n = _n_of(d, "stability_lag_ccdf")
    cap = (f"{mlab}: share of committed positions whose top-1 prediction still changes more "
           "than x steps after the commit (the stability lag, in diffusion steps), for "
           "each model decoding freely with its default policy; log scale, "
           f"{n} committed positions of the FP run. Curves further right: later "
           "stabilisation.")
    r.save(plot_ccdf(curves, f"Stability lag CCDF: {mlab}"), f"stability_lag_ccdf_{model}", cap)


def _mse_trace_figure(r: _Run, model: str, d: pd.DataFrame, runs, mlab: str) -> None:
    traces = []
    for m, b in runs:
        s = _series(_sel(d, m, b), "mse_prob")
        if m != r.fp and len(s):
            ffc = _scalar(_sel(d, m, b), "first_false_commit_step")
            traces.append((r.run_label(m, b), s["x"].to_numpy(), s["value"].to_numpy(),
                           None if ffc is None else ffc[0], r.styles[m]))
    if not traces:
        r.skipped.append(f"mse_prob_trace_{model}: no mse_prob rows of a quantized run")
        return
    marked = sum(t[3] is not None for t in traces)
    marks = ("Each run's first false commit (its first commit that differs from FP's final "
             "token) is marked by an X in the run's colour, on its trace at the mean step over "
             "the sequences (the step its legend entry gives), and a vertical line in the run's "
             "line style" + ("; a run without an X made no false commit. " if marked < len(traces)
                             else ". ")) if marked else (
        "No run committed a token that differs from FP's final token: no first false commit "
        "to mark. ")
    cap = (f"{mlab}: mean squared difference between the quantized and the FP model's "
           "probability of the FP model's final token, over the window positions, at each "
           "diffusion step of each model's own decoding (step T first); mean over "
           f"{_n_of(d, 'mse_prob')} sequences. {marks}Lower is closer to FP.")
    r.save(plot_mse_trace(traces, f"Decode divergence w.r.t. FP: {mlab}"),
           f"mse_prob_trace_{model}", cap)


BAR_FIGURES = (
    ("commit_flips", "flips per sequence (count)", "Teacher-forced commit-step flips",
     "positions where the quantized model, fed the FP model's decoding states, predicts a "
     "different token than FP at FP's commit step (lower is better)", True),
    ("frontier_margin", "frontier margin (logit)", "Average frontier margin at commit steps",
     "the quantized model's logit margin of FP's final token over its strongest alternative at "
     "FP's commit steps, on FP's states (higher is better)", False),   # a margin may be negative
)


def _bars_of(r: _Run, d: pd.DataFrame, runs, metric: str, with_fp: bool):
    bars = [(r.run_label(m, b), _scalar(_sel(d, m, b), metric), r.styles[m])
            for m, b in runs if with_fp or m != r.fp]
    return [(lab, v, st) for lab, v, st in bars if v is not None]


def _draw_bars(ax, bars, ylabel, title, nonnegative, digits=None) -> None:
    plot_bars(ax, [b[0] for b in bars], [b[1][0] for b in bars], [b[1][1] for b in bars],
              ylabel, title, nonnegative=nonnegative, styles=[b[2] for b in bars], digits=digits)


def _bar_figures(r: _Run, model: str, d: pd.DataFrame, runs, mlab: str) -> None:
    for metric, ylabel, title, what, nonneg in BAR_FIGURES:
        bars = _bars_of(r, d, runs, metric, with_fp=False)
        if not bars:
            r.skipped.append(f"{metric}_{model}: no {metric} rows of a quantized run")
            continue
        fig, ax = plt.subplots(figsize=(3.6, 3.0))
        _draw_bars(ax, bars, ylabel, f"{title}: {mlab}", nonneg)
        cap = (f"{mlab}: {what}. Bars: mean, error bars: standard error over "
               f"{_n_of(d, metric)} sequences.")
        r.save(fig, f"{metric}_{model}", cap)


def _mismatch_figure(r: _Run, model: str, d: pd.DataFrame, runs, mlab: str) -> None:
    panels = [(metric, sub, ylabel, _bars_of(r, d, runs, metric, with_fp=True))
              for metric, sub, ylabel in (
                  ("never_agree_rate", "(a) committed positions never re-agreeing",
                   "rate (fraction of committed positions)"),
                  ("mean_disagree_rate", "(b) post-commit steps disagreeing",
                   "rate (fraction of steps)"))]
    panels = [p for p in panels if p[3]]
    if not panels:
        r.skipped.append(f"post_commit_mismatch_{model}: no post-commit rows")
        return
    fig, axes = plt.subplots(1, 2, figsize=(7.6, 3.2), gridspec_kw={"wspace": 0.45})
    # one precision for both panels' value labels
    digits = decimals([b[1][1] for p in panels for b in p[3]], [b[1][0] for p in panels for b in p[3]])
    for ax, (metric, sub, ylabel, bars) in zip(axes, panels):
        _draw_bars(ax, bars, ylabel, sub, True, digits)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(f"Post-commit mismatch: {mlab}", fontsize=9)
    cap = (f"{mlab}, each model decoding freely: (a), the share of committed positions "
           "whose top-1 prediction never again equals the committed token; (b), the "
           "mean share of post-commit steps at which it differs. Bars: mean, error "
           f"bars: standard error over {_n_of(d, 'never_agree_rate')} sequences. "
           "Lower is better.")
    r.save(fig, f"post_commit_mismatch_{model}", cap)


def _models_lag_figure(r: _Run, diag: pd.DataFrame, models: Sequence[str]) -> None:
    """FP lag CCDF of every model: the series are models, in the palette no method uses."""
    curves = []
    for model in models:
        s = _series(diag[(diag["model"] == model) & (diag["method"] == r.fp)], "stability_lag_ccdf")
        if len(s):
            curves.append((r.label("models", model), s["x"].to_numpy(), s["value"].to_numpy(),
                           _style(len(curves))))
    if len(curves) < 2:
        r.skipped.append("stability_lag_ccdf_models: FP lag CCDF of fewer than two models")
        return
    r.save(plot_ccdf(curves, "Stability lag of the FP models"), "stability_lag_ccdf_models",
           "Stability-lag CCDF (diffusion steps) of each FP model decoding freely with its own "
           "default policy: how long committed predictions keep changing in each family.")


def _prior_figures(r: _Run, priors: Mapping[tuple[str, str], pd.DataFrame]) -> None:
    """prior_curve_{model}: the priors the calibration methods use (settings ``priors``; all
    of the model's priors when not given). The cross-corpus priors have their own figure:
    drawn here too, seven overlapping curves hid the methods' one."""
    used = list(r.settings.get("priors") or [])
    for model in dict.fromkeys(m for m, _ in priors):
        names = [p for (m, p) in priors if m == model and (not used or p in used)]
        if not names:
            continue
        labels = {p: r.label("priors", p) for p in names}
        curves = [(labels[p], priors[(model, p)]["position"].to_numpy(),
                   priors[(model, p)]["w_bar"].to_numpy(), _style(i)) for i, p in enumerate(names)]
        fig = plot_curves(curves, f"Position prior: {r.label('models', model)}")
        r.save(fig, f"prior_curve_{model}",
               "Stage I position prior w_bar (unitless weight in (0, 1], maximum 1) of each "
               "prior a calibration method of the diagnostics uses, by position in the "
               "generation window; FAIR-Calib weights its calibration loss with it.")


def _cross_corpus_figure(r: _Run, priors: Mapping[tuple[str, str], pd.DataFrame]) -> None:
    """One panel per pair of priors, on shared axes; each curve with its across-sample band
    (the prior file's ``w_std``, where it has one)."""
    from fair_calib.diagnostics import prior_correlation

    given = list(r.settings.get("cross_corpus") or [])
    pairs = [p for p in given if _key(p["a"]) in priors and _key(p["b"]) in priors]
    r.skipped += [f"prior_cross_corpus: pair {p.get('a')} / {p.get('b')} not in inputs"
                  for p in given if p not in pairs]
    if not pairs:
        return
    fig, axes = plt.subplots(len(pairs), 1, figsize=(5.6, 2.6 * len(pairs)), squeeze=False,
                             sharex=True, sharey=True)
    models_of = [" vs ".join(dict.fromkeys(r.label("models", _key(p[k])[0]) for k in ("a", "b")))
                 for p in pairs]
    models_shown = ", ".join(dict.fromkeys(models_of))
    corpus_labels = [tuple(plain(x) for x in (p.get("labels") or [p["a"], p["b"]])) for p in pairs]
    one_legend = len(set(corpus_labels)) == 1    # same two corpora in every panel: one legend
    banded, n_samples = True, set()
    for i, (ax, p, mlab, (la, lb)) in enumerate(zip(axes[:, 0], pairs, models_of, corpus_labels)):
        a, b = priors[_key(p["a"])], priors[_key(p["b"])]
        sp, pe = prior_correlation(a, b)
        banded &= "w_std" in a.columns and "w_std" in b.columns
        n_samples |= {df.attrs.get("n_probe") for df in (a, b)}
        # the suptitle names the model; a panel names it only where the panels differ
        head = ", ".join(x for x in (plain(p.get("title") or ""),
                                     mlab if len(set(models_of)) > 1 else "") if x) or mlab
        curves = [(lab, df["position"].to_numpy(), df["w_bar"].to_numpy(), _style(k),
                   df["w_std"].to_numpy() if "w_std" in df.columns else None)
                  for k, (lab, df) in enumerate(((la, a), (lb, b)))]
        plot_curves(curves, f"{head}: Spearman {sp:.3f}, Pearson {pe:.3f}", ax=ax,
                    legend=not one_legend or i == 0)
        if i < len(pairs) - 1:
            ax.set_xlabel("")
    fig.suptitle(f"Position priors probed on two corpora: {models_shown}", fontsize=10)
    fig.tight_layout()
    n_txt = ", ".join(str(n) for n in sorted(n for n in n_samples if n is not None))
    band = (f"Shaded bands: w_bar ± one standard deviation of the per-sample curves "
            f"(across-sample variability{', over ' + n_txt + ' probed samples' if n_txt else ''}), "
            "clipped to the prior's range [0, 1]."
            if banded else "No bands: a prior file without w_std (written before it was "
            "recorded; rerun its prior job to get them).")
    r.save(fig, "prior_cross_corpus",
           f"Position priors w_bar of {models_shown}, probed on two corpora, one panel per "
           "probing variant, on shared axes; panel titles give their Spearman and Pearson "
           f"correlation over positions. {band}")


def _sel(d: pd.DataFrame, method: str, bits: str) -> pd.DataFrame:
    return d[(d["method"] == method) & (d["bits"] == bits)]


def make_figures(diag: pd.DataFrame, priors: Mapping[tuple[str, str], pd.DataFrame],
                 out_dir: str | Path, settings: Mapping[str, Any] | None = None
                 ) -> tuple[list[Path], list[str]]:
    """Draw every figure the inputs support. Returns (written paths, skipped figure notes)."""
    r = _Run(diag, out_dir, settings or {})
    models = list(dict.fromkeys(diag["model"])) if len(diag) else []
    for model in models:
        d = diag[diag["model"] == model]
        runs, mlab = _runs(diag, model, r.settings), r.label("models", model)
        for step in (_lag_ccdf_figure, _mse_trace_figure, _bar_figures, _mismatch_figure):
            step(r, model, d, runs, mlab)
    _models_lag_figure(r, diag, models)
    _prior_figures(r, priors)
    _cross_corpus_figure(r, priors)
    return r.written, r.skipped


def _key(ref: str) -> tuple[str, str]:
    model, _, prior = str(ref).partition("/")
    return model, prior


def load_inputs(paths: Sequence[str | Path]) -> tuple[pd.DataFrame, dict[tuple[str, str], pd.DataFrame]]:
    from fair_calib.jobs.io import read_parquet

    diags, priors = [], {}
    for p in map(Path, paths):
        df, prov = read_parquet(p)
        if "metric" in df.columns and "x" in df.columns:
            diags.append(df)
        elif {"position", "w_bar"} <= set(df.columns):
            prior = df.sort_values("position")
            prior.attrs["n_probe"] = prov.get("n_probe")    # samples behind w_bar and w_std
            priors[(p.parent.name, p.stem)] = prior
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
    # floors span decades (0.01, 0.05, 1): on a linear axis the small ones collapse into one
    floors = sorted(set(points["floor"])) if len(points) else []
    if floors and min(floors) > 0:
        ax.set_xscale("log")
        ax.set_xticks(floors, [f"{f:g}" for f in floors])
        ax.minorticks_off()
    ax.set_xlabel("prior floor (weight of calibration positions outside the window; log scale)")
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
