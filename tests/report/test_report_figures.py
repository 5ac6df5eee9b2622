"""Figures from small diagnostics / prior Parquets: non-empty PDF and PNG for each."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from fair_calib.diagnostics import DIAGNOSTICS_SCHEMA
from fair_calib.jobs.io import write_parquet
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


# ----------------------------------------------------------------------------- issue 23
def _spy_figures(monkeypatch, diag, priors, settings, tmp_path):
    """Run make_figures and keep each figure (not closed) with its caption, by name."""
    import matplotlib.pyplot as plt

    plt.close("all")
    seen = {}

    def spy(fig, out_dir, name, caption=""):
        seen[name] = (fig, caption)
        return [Path(out_dir) / f"{name}.png"]

    monkeypatch.setattr(F, "save", spy)
    F.make_figures(diag, priors, tmp_path, settings)
    return seen


def _three_methods():
    rows = []
    for method, bits, scale in (("fp", "fp", 0.5), ("rtn", "w4a4", 3.0),
                                ("flatquant", "w4a4", 2.0), ("fair-calib", "w4a4", 1.0)):
        rows += diag_rows("llada", method, bits, scale)
    return pd.DataFrame(rows, columns=["model", "method", "bits", "metric", "x", "value", "std", "n"])


SETTINGS = {"methods": ["rtn", "flatquant", "fair-calib"],
            "labels": {"methods": {"fp": "FP", "rtn": "RTN $x$", "flatquant": "FlatQuant",
                                   "fair-calib": "FAIR-Calib"}}}


def test_a_method_has_one_colour_marker_and_hatch_in_every_figure(tmp_path, monkeypatch):
    """Issue 23: RTN was blue, black or grey depending on the figure; FP now always black."""
    from matplotlib.colors import to_hex

    seen = _spy_figures(monkeypatch, _three_methods(), {}, SETTINGS, tmp_path)
    styles = F.method_styles(SETTINGS)
    assert styles["fp"] == F.FP_STYLE and F.FP_STYLE["color"] == "#000000"
    by_label = {"FP": "fp", "RTN \\$x\\$ (W4A4)": "rtn", "FlatQuant (W4A4)": "flatquant",
                "FAIR-Calib (W4A4)": "fair-calib"}
    checked = 0
    for name in ("stability_lag_ccdf_llada", "mse_prob_trace_llada"):
        for line in seen[name][0].axes[0].get_lines():
            m = by_label.get(line.get_label())
            if m:
                assert to_hex(line.get_color()) == styles[m]["color"], (name, m)
                assert line.get_marker() == styles[m]["marker"], (name, m)
                checked += 1
    for name in ("commit_flips_llada", "frontier_margin_llada", "post_commit_mismatch_llada"):
        for ax in seen[name][0].axes:
            names = [t.get_text() for t in ax.get_xticklabels()]
            for patch, lab in zip(ax.patches, names):
                m = by_label[lab]
                assert to_hex(patch.get_facecolor()[:3]) == styles[m]["color"], (name, m)
                assert patch.get_hatch() in (styles[m]["hatch"], None) and \
                    (patch.get_hatch() or "") == styles[m]["hatch"], (name, m)
                checked += 1
    assert checked >= 4 + 3 + 3 + 3 + 8
    assert len({s["color"] for s in styles.values()}) == len(styles)


def test_labels_are_plain_text_in_figures(tmp_path, monkeypatch):
    """A `$` in a label is printed, not mathtext (paper.yaml's \\textbf{...} printed literally
    was the symptom; labels are plain text and latex_label never reaches the figures)."""
    seen = _spy_figures(monkeypatch, _three_methods(), {}, SETTINGS, tmp_path)
    ax = seen["stability_lag_ccdf_llada"][0].axes[0]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "RTN \\$x\\$ (W4A4)" in texts
    assert ax.get_legend().get_texts()[texts.index("RTN \\$x\\$ (W4A4)")]._preprocess_math(
        "RTN \\$x\\$ (W4A4)") == ("RTN $x$ (W4A4)", False)


def test_first_false_commit_marker_sits_at_the_mean_step_the_legend_gives(tmp_path, monkeypatch):
    """Issue 23: markers sat on the nearest recorded step while the legend gave the mean, and
    the caption spoke of "the red X"."""
    diag = _three_methods()
    diag.loc[diag.metric == "first_false_commit_step", "value"] = 4.37
    seen = _spy_figures(monkeypatch, diag, {}, SETTINGS, tmp_path)
    fig, caption = seen["mse_prob_trace_llada"]
    ax = fig.axes[0]
    marks = [ln for ln in ax.get_lines() if ln.get_marker() == "X"]
    assert len(marks) == 3
    for mark in marks:
        assert mark.get_xdata()[0] == pytest.approx(4.37)
        assert "mean step 4.4" in mark.get_label()
        trace = next(ln for ln in ax.get_lines() if ln.get_label() == mark.get_label().split(":")[0])
        xs, ys = np.asarray(trace.get_xdata()), np.asarray(trace.get_ydata())
        o = np.argsort(xs)
        assert mark.get_ydata()[0] == pytest.approx(np.interp(4.37, xs[o], ys[o]))
        assert mark.get_markerfacecolor() == trace.get_color()
    assert "the red X" not in caption and "X in the run's colour" in caption
    diag.loc[diag.metric == "first_false_commit_step", "value"] = np.nan   # none happened
    caption = _spy_figures(monkeypatch, diag, {}, SETTINGS, tmp_path)["mse_prob_trace_llada"][1]
    assert "X in the run's colour" not in caption and "no first false commit" in caption


def test_bar_value_labels_share_one_precision():
    import re

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    F.plot_bars(ax, ["A", "B", "C"], [0.004, 0.04123, 1.5], [0.0042, 0.01, 0.2], "rate (x)")
    decimals = {len(d) for t in ax.texts for d in re.findall(r"\d+\.(\d+)", t.get_text())}
    assert decimals == {3}
    assert ax.get_legend() is None       # the tick labels name the bars
    plt.close(fig)


def _prior(shift, std=True):
    pos = np.arange(8)
    df = pd.DataFrame({"position": pos, "w_bar": 1.0 / (1 + abs(pos - shift))})
    if std:
        df["w_std"] = 0.1
    df.attrs["n_probe"] = 16
    return df


def test_cross_corpus_panels_share_axes_and_show_bands(tmp_path, monkeypatch):
    priors = {("dream", k): _prior(i) for i, k in enumerate(("a", "b", "c", "d"))}
    seen = _spy_figures(monkeypatch, _three_methods().iloc[:0], priors, {
        "cross_corpus": [{"title": "one", "a": "dream/a", "b": "dream/b", "labels": ["x", "y"]},
                         {"title": "two", "a": "dream/c", "b": "dream/d", "labels": ["x", "y"]}]},
        tmp_path)
    fig, caption = seen["prior_cross_corpus"]
    a0, a1 = fig.axes
    assert a0.get_shared_y_axes().joined(a0, a1) and a0.get_shared_x_axes().joined(a0, a1)
    for ax in (a0, a1):
        bands = ax.collections
        assert len(bands) == 2          # one band per curve
        top = bands[0].get_paths()[0].vertices[:, 1].max()
        assert top == pytest.approx(1.0)    # w_bar 1 + std 0.1, clipped to the range (0, 1]
    assert "standard deviation" in caption and "16 probed samples" in caption
    # the same two corpora in both panels: one legend, not two
    assert a0.get_legend() is not None and a1.get_legend() is None
    seen = _spy_figures(monkeypatch, _three_methods().iloc[:0],
                        {("dream", "a"): _prior(0, std=False), ("dream", "b"): _prior(1)},
                        {"cross_corpus": [{"a": "dream/a", "b": "dream/b"}]}, tmp_path)
    assert "No bands" in seen["prior_cross_corpus"][1]


def test_prior_curve_shows_the_methods_priors_by_label(tmp_path, monkeypatch):
    """Issue 23: seven overlapping priors hid "default", and the legend said `prior default`."""
    priors = {("dream", k): _prior(i) for i, k in enumerate(
        ("default", "cc-a", "cc-b", "cc-c", "cc-d", "cc-e", "cc-f"))}
    seen = _spy_figures(monkeypatch, _three_methods().iloc[:0], priors, {
        "priors": ["default"], "labels": {"priors": {"default": "prior of FAIR-Calib"}}},
        tmp_path)
    ax = seen["prior_curve_dream"][0].axes[0]
    assert [ln.get_label() for ln in ax.get_lines()] == ["prior of FAIR-Calib"]
    # without a `priors` list (the CLI used alone): every prior of the model
    seen = _spy_figures(monkeypatch, _three_methods().iloc[:0], priors,
                        {"labels": {"priors": {"default": "prior of FAIR-Calib"}}}, tmp_path)
    lines = seen["prior_curve_dream"][0].axes[0].get_lines()
    assert [ln.get_label() for ln in lines][:2] == ["prior of FAIR-Calib", "cc-a"]
    assert len(lines) == 7


def test_figure_settings_name_priors_by_the_methods_that_use_them():
    from fair_calib.report.labels import plain_labels, prior_labels

    cfg = {"methods": {"fp": {"type": "fp", "label": "FP"},
                       "fc": {"type": "fair_calib", "label": "FAIR-Calib",
                              "latex_label": "\\textbf{FAIR-Calib}", "prior": "default"},
                       "q": {"type": "qdrop", "label": "QDrop", "prior": "default"}}}
    assert prior_labels(cfg, ["fc", "q"]) == {"default": "prior of FAIR-Calib / QDrop"}
    assert plain_labels(cfg)["methods"]["fc"] == "FAIR-Calib"


@pytest.mark.parametrize("name", ["config.yaml", "paper.yaml", "smoke.yaml"])
def test_shipped_cross_corpus_pairs_name_their_corpora(name):
    """Without `labels`, the legend would show config keys (`dream-7b-base/cc-fixed-gsm8k`)."""
    import yaml

    cfg = yaml.safe_load((Path(__file__).parents[2] / "config" / name).read_text())
    for pair in (cfg.get("diagnostics") or {}).get("cross_corpus") or []:
        assert len(pair.get("labels") or []) == 2, pair


def _cielab(hex_colour: str) -> np.ndarray:
    """sRGB (D65) -> CIELAB, the textbook formulas."""
    rgb = np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722],
                    [0.0193, 0.1192, 0.9505]]) @ lin / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_model_colours_are_far_from_every_method_colour():
    """Issue 32: a model's colour (and a prior's, a corpus's) is never read as a method's: at
    least 30 CIELAB units (Delta E 1976) from every method colour, FP's black, and each other."""
    methods = [_cielab(c) for c in F.METHOD_COLORS + [F.FP_STYLE["color"]]]
    others = [_cielab(c) for c in F.COLORS]
    assert min(np.linalg.norm(o - m) for o in others for m in methods) >= 30
    assert min(np.linalg.norm(a - b) for i, a in enumerate(others) for b in others[i + 1:]) >= 30


def test_floor_sweep_is_on_a_log_axis_with_the_floors_as_ticks(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(F, "save", lambda fig, out_dir, name, caption="": seen.update(fig=fig) or [])
    points = pd.DataFrame({"model": "m", "floor": [0.01, 0.05, 1.0], "mean": [40.0, 50.0, 45.0],
                           "std": [2.0, 3.0, 1.0], "n_seeds": 3})
    F.floor_sweep(points, tmp_path, {"task": "gen", "bits": "w2a4"})
    ax = seen["fig"].axes[0]
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.01", "0.05", "1"]


def test_prior_bands_stay_within_the_priors_range():
    """w_bar ± std past 1 (or below 0) is a weight no prior can have: the band is clipped."""
    import matplotlib.pyplot as plt

    fig = F.plot_curves([("a", np.arange(3), np.array([0.2, 0.9, 1.0]), None,
                          np.array([0.5, 0.3, 0.3]))], "t")
    band = fig.axes[0].collections[0].get_paths()[0].vertices[:, 1]
    assert band.max() == pytest.approx(1.0) and band.min() == pytest.approx(0.0)
    plt.close(fig)
