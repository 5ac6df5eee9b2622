"""Figures from small diagnostics / prior Parquets: non-empty PDF and PNG for each."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa

from fair_calib.diagnostics import DIAGNOSTICS_SCHEMA
from fair_calib.io import write_parquet
from fair_calib.report import figures as F

PRIOR_SCHEMA = pa.schema([("position", pa.int32()), ("w_bar", pa.float64())])


def diag_rows(model, method, bits, scale):
    rows = []
    for x in range(6):
        rows.append((model, method, bits, "stability_lag_ccdf", float(x), max(0.0, 0.6 - 0.1 * x * scale), np.nan, 40))
    for t in range(8, 0, -1):
        rows.append((model, method, bits, "mse_prob", float(t), 0.01 * scale * (9 - t), 0.001, 4))
    for metric, v in (("first_false_commit_step", 5.0), ("commit_flips", 2.0 * scale),
                      ("frontier_margin", 1.0 / scale), ("mean_disagree_rate", 0.1 * scale),
                      ("never_agree_rate", 0.05 * scale), ("stability_lag", scale)):
        rows.append((model, method, bits, metric, np.nan, v, 0.3, 4))
    return rows


def test_figures_cli(tmp_path, capsys):
    rows = []
    for model in ("llada", "dream"):
        rows += diag_rows(model, "fp", "fp", 0.5)
        rows += diag_rows(model, "flatquant", "w4a4", 2.0)
        rows += diag_rows(model, "fair-calib", "w4a4", 1.0)
    diag = pd.DataFrame(rows, columns=["model", "method", "bits", "metric", "x", "value", "std", "n"])
    dp = tmp_path / "diagnostics" / "all.parquet"
    write_parquet(diag, dp, DIAGNOSTICS_SCHEMA)
    pos = np.arange(16)
    pa_ = tmp_path / "prior" / "llada" / "gsm8k.parquet"
    pb_ = tmp_path / "prior" / "llada" / "wikitext.parquet"
    write_parquet(pd.DataFrame({"position": pos, "w_bar": 1.0 / (1 + pos)}), pa_, PRIOR_SCHEMA)
    write_parquet(pd.DataFrame({"position": pos, "w_bar": 1.0 / (2 + pos) + 0.01 * (pos % 3)}),
                  pb_, PRIOR_SCHEMA)
    settings = {"methods": ["flatquant", "fair-calib"],
                "labels": {"methods": {"fp": "FP", "flatquant": "FlatQuant",
                                       "fair-calib": "FAIR-Calib"}},
                "cross_corpus": [{"title": "(a)", "a": "llada/gsm8k", "b": "llada/wikitext",
                                  "labels": ["GSM8K-CoT", "WikiText2"]},
                                 {"a": "llada/gsm8k", "b": "dream/absent"}]}
    out = tmp_path / "figures"
    F.run_cli(["--inputs", str(dp), str(pa_), str(pb_), "--out-dir", str(out),
               "--settings", json.dumps(settings)])
    names = ["stability_lag_ccdf_llada", "mse_prob_trace_llada", "commit_flips_llada",
             "post_commit_mismatch_llada", "frontier_margin_dream", "stability_lag_ccdf_models",
             "prior_curve_llada", "prior_cross_corpus"]
    for n in names:
        for ext, magic in (("pdf", b"%PDF"), ("png", b"\x89PNG")):
            p = out / f"{n}.{ext}"
            assert p.exists(), p
            data = p.read_bytes()
            assert data.startswith(magic) and len(data) > 1000
    err = capsys.readouterr().err
    assert "llada/gsm8k / dream/absent not in inputs" in err


def test_missing_data_is_skipped_not_drawn(tmp_path):
    diag = pd.DataFrame([("m", "fp", "fp", "stability_lag_ccdf", 0.0, 0.5, np.nan, 2)],
                        columns=["model", "method", "bits", "metric", "x", "value", "std", "n"])
    written, skipped = F.make_figures(diag, {}, tmp_path)
    assert sorted(p.name for p in written) == ["stability_lag_ccdf_m.pdf", "stability_lag_ccdf_m.png",
                                               "stability_lag_ccdf_m.txt"]
    assert any(s.startswith("mse_prob_trace_m") for s in skipped)
    assert any(s.startswith("stability_lag_ccdf_models") for s in skipped)


def test_every_figure_carries_title_units_legend_and_caption(tmp_path, monkeypatch):
    """Captured at save time: each figure has a title, labelled axes with units in
    parentheses, a legend; its caption is in the PNG metadata, the PDF and the sidecar."""
    from PIL import Image

    rows = []
    for method, bits, scale in (("fp", "fp", 0.5), ("rtn", "w4a4", 3.0), ("fair-calib", "w4a4", 1.0)):
        rows += diag_rows("llada", method, bits, scale)
    diag = pd.DataFrame(rows, columns=["model", "method", "bits", "metric", "x", "value", "std", "n"])
    seen = {}
    real_save = F.save

    def spy(fig, out_dir, name, caption=""):
        seen[name] = [(ax.get_title(), ax.get_xlabel(), ax.get_ylabel(), ax.get_legend(),
                       [t.get_text() for t in ax.get_xticklabels()] if ax.patches else [])
                      for ax in fig.axes]
        return real_save(fig, out_dir, name, caption)

    monkeypatch.setattr(F, "save", spy)
    settings = {"methods": ["rtn", "fair-calib"],
                "labels": {"methods": {"fp": "FP", "rtn": "RTN", "fair-calib": "FAIR-Calib"}}}
    F.make_figures(diag, {}, tmp_path, settings)
    assert {"commit_flips_llada", "post_commit_mismatch_llada", "stability_lag_ccdf_llada",
            "mse_prob_trace_llada"} <= set(seen)
    for name, axes in seen.items():
        for title, xlabel, ylabel, legend, bar_names in axes:
            # a legend names every series; a bar chart's tick labels name its bars, and no
            # legend repeats them (issue 23)
            assert title and (legend is not None) != bool(bar_names), name
            assert "(" in ylabel and ")" in ylabel, (name, ylabel)  # a unit
        side = (tmp_path / f"{name}.txt").read_text()
        png = Image.open(tmp_path / f"{name}.png").text
        assert png["Title"] in side and png["Description"] in side
        assert len(png["Description"]) > 40
        assert b"/Subject" in (tmp_path / f"{name}.pdf").read_bytes()
    flips = (tmp_path / "commit_flips_llada.txt").read_text()
    assert "standard error over 4 sequences" in flips
    # RTN and FAIR-Calib both appear as bars; the FP teacher is the reference, not a bar
    assert seen["commit_flips_llada"][0][4] == ["RTN (W4A4)", "FAIR-Calib (W4A4)"]


def test_all_zero_ccdf_is_said_not_drawn_as_empty_log_axes():
    import numpy as np
    from fair_calib.report.figures import plot_ccdf
    fig = plot_ccdf([("FP", np.arange(3), np.zeros(3)),
                     ("RTN (W4A4)", np.arange(4), np.array([0.5, 0.2, 0.05, 0.0]))], "t")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["FP: every lag is 0", "RTN (W4A4)"] and ax.get_yscale() == "log"
    fig = plot_ccdf([("FP", np.arange(3), np.zeros(3))], "t")
    assert fig.axes[0].get_yscale() == "linear"
    assert any("all lags 0" in t.get_text() for t in fig.axes[0].texts)


# ----------------------------------------------------------------------------- read by eye once
def _ticks_are_integers(axis) -> bool:
    locs = axis.get_majorticklocs()
    return len(locs) > 1 and np.allclose(locs, np.round(locs))


def test_steps_lags_and_positions_get_integer_ticks():
    xs = np.arange(16, 0, -1).astype(float)
    fig = F.plot_mse_trace([("RTN", xs, xs / 100, 5.0)], "t")
    assert _ticks_are_integers(fig.axes[0].xaxis)
    fig = F.plot_curves([("p", np.arange(16), np.linspace(0, 1, 16))], "t")
    assert _ticks_are_integers(fig.axes[0].xaxis)
    fig = F.plot_ccdf([("FP", np.arange(4.0), np.array([0.5, 0.2, 0.1, 0.0]))], "t")
    assert _ticks_are_integers(fig.axes[0].xaxis)


def test_each_runs_first_false_commit_has_its_own_marker_and_legend_entry():
    """Two runs whose first false commits fall on the same step: two distinguishable markers
    (each in its trace's colour), each named in the legend."""
    from matplotlib.colors import to_hex

    xs = np.arange(8, 0, -1).astype(float)
    fig = F.plot_mse_trace([("RTN", xs, xs / 100, 4.0), ("FAIR-Calib", xs, xs / 200, 4.2)], "t")
    ax = fig.axes[0]
    marks = [l for l in ax.get_lines() if l.get_marker() == "X"]
    assert len(marks) == 2
    assert len({to_hex(l.get_markerfacecolor()) for l in marks}) == 2
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert sum("RTN: first false commit" in l for l in labels) == 1
    assert sum("FAIR-Calib: first false commit" in l for l in labels) == 1


def test_count_and_rate_error_bars_stop_at_zero_and_labels_sit_above_them():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    F.plot_bars(ax, ["FP", "RTN"], [0.004, 0.04], [0.0042, 0.01], "rate (fraction)", "t",
                nonnegative=True)
    bottoms = [min(seg[:, 1]) for c in ax.containers if hasattr(c, "lines")
               for seg in c.lines[2][0].get_segments()]
    assert bottoms and min(bottoms) >= 0
    for text, top in zip(ax.texts, (0.004 + 0.0042, 0.04 + 0.01)):
        assert text.xy[1] == top                        # anchored on the error bar's top
    fig, ax = plt.subplots()                             # a logit margin may go below zero
    F.plot_bars(ax, ["RTN"], [0.5], [1.0], "margin (logit)", "t")
    assert min(ax.containers[0].lines[2][0].get_segments()[0][:, 1]) == -0.5


def test_series_styles_are_distinct_for_many_priors():
    styles = [tuple(map(str, F._style(i).values())) for i in range(10)]
    assert len(set(styles)) == 10
    assert len({F._style(i)["color"] for i in range(10)}) == 10


def test_cross_corpus_figure_names_the_model(tmp_path, monkeypatch):
    pos = np.arange(8)
    priors = {("dream", "a"): pd.DataFrame({"position": pos, "w_bar": 1.0 / (1 + pos)}),
              ("dream", "b"): pd.DataFrame({"position": pos, "w_bar": 1.0 / (2 + pos)})}
    seen = {}
    real_save = F.save

    def spy(fig, out_dir, name, caption=""):
        seen[name] = (fig.get_suptitle(), caption)
        return real_save(fig, out_dir, name, caption)

    monkeypatch.setattr(F, "save", spy)
    empty = pd.DataFrame(columns=["model", "method", "bits", "metric", "x", "value", "std", "n"])
    F.make_figures(empty, priors, tmp_path, {
        "labels": {"models": {"dream": "Tiny-Dream"}},
        "cross_corpus": [{"title": "fixed", "a": "dream/a", "b": "dream/b"}]})
    title, caption = seen["prior_cross_corpus"]
    assert "Tiny-Dream" in title and "Tiny-Dream" in caption


def test_a_legend_entry_always_shows_its_series_style():
    fig = F.plot_ccdf([("FP", np.arange(3), np.zeros(3)),
                       ("RTN", np.arange(4), np.array([0.5, 0.2, 0.05, 0.0]))], "t")
    for handle in fig.axes[0].get_legend().legend_handles:
        assert handle.get_linestyle() not in ("None", "none", "") and handle.get_marker() not in ("None", "none", "")
