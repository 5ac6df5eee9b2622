"""Table generation from a small hand-written eval Parquet: exact LaTeX lines."""
from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pytest

from fair_calib.jobs.io import write_json, write_parquet
from fair_calib.report import tables as T

EVAL_SCHEMA = pa.schema([
    ("model", pa.string()), ("method", pa.string()), ("bits", pa.string()),
    ("task", pa.string()), ("metric", pa.string()), ("value", pa.float64()),
    ("stderr", pa.float64()), ("n", pa.int64()), ("chance", pa.float64()),
    ("settings", pa.string()),
])

CHANCE = {"t1": 0.25, "t2": 0.5}
ROWS = [  # model, method, bits, task, value
    ("m1", "fp", "fp", "t1", 0.80), ("m1", "fp", "fp", "t2", 0.60),
    ("m1", "rtn", "w4a4", "t1", 0.70), ("m1", "rtn", "w4a4", "t2", 0.55),
    ("m1", "fair", "w4a4", "t1", 0.70), ("m1", "fair", "w4a4", "t2", 0.58),
    ("m1", "rtn", "w3a4", "t1", 0.10), ("m1", "rtn", "w3a4", "t2", 0.10),
    ("m2", "fp", "fp", "t1", 0.90),
    ("m2", "rtn", "w4a4", "t1", 0.50), ("m2", "rtn", "w4a4", "t2", 0.50),
    ("m2", "fair", "w4a4", "t2", 0.60),
    # ablation methods on m1
    ("m1", "hit", "w4a4", "t1", 0.65), ("m1", "hit", "w4a4", "t2", 0.61),
    ("m1", "rel", "w4a4", "t1", 0.66),
]


def eval_df():
    df = pd.DataFrame(ROWS, columns=["model", "method", "bits", "task", "value"])
    df["metric"] = "acc"
    df["stderr"] = 0.01
    df["n"] = 100
    df["chance"] = df["task"].map(CHANCE)
    df["settings"] = "{}"
    return df


LABELS = {"models": {"m1": {"label": "M-One", "family": "A"}, "m2": {"label": "M-Two", "family": "A"}},
          "methods": {"fp": {"label": "FP"}, "rtn": {"label": "RTN"},
                      "fair": {"label": "FAIR", "latex_label": "\\textbf{FAIR}"}},
          "tasks": {"t1": {"label": "T1"}, "t2": {"label": "T2"}}}


def lines_of(tex):
    return [ln.strip() for ln in tex.splitlines()]


def c(value, err="1.0", bold=False):
    """A printed cell: value (bold or not) and its small ± (None: no ±)."""
    s = f"\\textbf{{{value}}}" if bold else value
    return s if err is None else s + f"{{\\scriptsize$\\pm${err}}}"


SH = "\\cellcolor{gray!20}"


def test_main_table_exact_lines():
    tex = T.main_table(eval_df(), ["m1", "m2"], ["fp", "rtn", "fair"], ["t1", "t2"], LABELS,
                       bits="w4a4", caption="Cap", label="tab:x")
    L = lines_of(tex)
    assert L[0] == "\\begin{table*}[t]" and L[-1] == "\\end{table*}"
    assert "\\begin{tabular}{llccc}" in L
    assert ("\\textbf{Model} & \\textbf{Method} & \\textbf{T1} & \\textbf{T2} & "
            "\\textbf{Avg.} \\\\") in L
    i = L.index("\\multirow{4}{*}{\\textbf{M-One}}")
    # stderr 0.01 -> ±1.0 points; Avg. of two: sqrt(1 + 1) / 2 = 0.7
    assert L[i + 1] == (f"& {SH}FP & {SH}{c('80.0')} & {SH}{c('60.0')} & "
                        f"{SH}{c('70.0', '0.7')} \\\\")
    assert L[i + 2] == "& Chance & 25.0 & 50.0 & 37.5 \\\\"
    # T1: tie -> nobody bold; T2: 58 - 55 = 3 > 1.96 * sqrt(2) -> FAIR bold;
    # Avg.: 64 - 62.5 = 1.5 < 1.96 * sqrt(0.5) * sqrt(2) -> nobody bold. FP (80) never bold.
    assert L[i + 3] == f"& RTN & {c('70.0')} & {c('55.0')} & {c('62.5', '0.7')} \\\\"
    assert L[i + 4] == (f"& \\textbf{{FAIR}} & {c('70.0')} & {c('58.0', bold=True)} & "
                        f"{c('64.0', '0.7')} \\\\")
    j = L.index("\\multirow{4}{*}{\\textbf{M-Two}}")
    assert L[j - 1] == "\\midrule"
    assert L[j + 1] == f"& {SH}FP & {SH}{c('90.0')} & {SH}-- & {SH}-- \\\\"
    # a column with a single quantized value has nothing to be best against
    assert L[j + 3] == f"& RTN & {c('50.0')} & {c('50.0')} & {c('50.0', '0.7')} \\\\"
    assert L[j + 4] == f"& \\textbf{{FAIR}} & -- & {c('60.0', bold=True)} & -- \\\\"
    assert T.CONVENTION in tex and "standard error" in tex and "1.96" in tex
    assert ("\\par\\smallskip{\\footnotesize Missing results (shown as --): "
            "m2 / fp / t2; m2 / fair / w4a4 / t1.}") in L
    assert L.index("\\bottomrule") < L.index("\\end{tabular}}")


def test_main_table_without_chance_and_complete():
    df = eval_df()
    df = df[df.model == "m1"].assign(chance=float("nan"))
    tex = T.main_table(df, ["m1"], ["fp", "rtn", "fair"], ["t1", "t2"], LABELS, bits="w4a4",
                       env=None)
    assert "Chance" not in tex and "Missing" not in tex
    assert "\\multirow{3}{*}{\\textbf{M-One}}" in lines_of(tex)
    assert not tex.startswith("\\begin{table")


def test_ambiguous_metric_raises_and_named_metric_used():
    df = eval_df()
    extra = df[df.task == "t1"].assign(metric="f1", value=0.99)
    df2 = pd.concat([df, extra])
    tex = T.main_table(df2, ["m1"], ["fp", "rtn"], ["t1", "t2"], LABELS, bits="w4a4")
    assert "80.0" in tex and "99.0" not in tex  # acc preferred over unknown f1
    lab = {**LABELS, "tasks": {"t1": {"label": "T1", "metric": "f1"}, "t2": {"label": "T2"}}}
    assert "99.0" in T.main_table(df2, ["m1"], ["fp"], ["t1", "t2"], lab)
    df3 = pd.concat([df, extra.assign(metric="f1")]).query("metric != 'acc' or task != 't1'")
    df3 = pd.concat([df3, extra.assign(metric="bleu")])
    with pytest.raises(ValueError, match="name one"):
        T.main_table(df3, ["m1"], ["fp"], ["t1"], LABELS)


def test_ablation_table():
    tex = T.average_table(eval_df(), "m1", [("rtn", "baseline"), ("hit", "frontier-hit only"),
                                             ("rel", "reliability only"), ("fair", "FAIR-Calib")],
                          ["t1", "t2"], LABELS, bits="w4a4", header="Method")
    L = lines_of(tex)
    assert f"baseline & {c('62.5', '0.7')} \\\\" in L
    assert f"frontier-hit only & {c('63.0', '0.7')} \\\\" in L
    assert "reliability only & -- \\\\" in L
    # 64.00 vs 63.00 / 62.50, each ±0.7: within the noise, so nothing is bold
    assert f"FAIR-Calib & {c('64.0', '0.7')} \\\\" in L
    assert any(ln.endswith("m1 / rel / w4a4 / t2.}") for ln in L)


def test_ablation_bold_is_the_best():
    df = eval_df().assign(stderr=0.002)  # ±0.2 per task, ±0.1 on the average
    tex = T.average_table(df, "m1", [("rtn", "baseline"), ("fair", "FAIR-Calib")],
                          ["t1", "t2"], LABELS, bits="w4a4")
    L = lines_of(tex)
    assert f"baseline & {c('62.5', '0.1')} \\\\" in L
    assert f"FAIR-Calib & {c('64.0', '0.1', bold=True)} \\\\" in L
    assert "Missing" not in tex


def test_flat_table_w3a4():
    tex = T.flat_table(eval_df(), "m1", ["rtn"], ["t1", "t2"], LABELS, bits="w3a4")
    L = lines_of(tex)
    assert f"Real-valued & {c('80.0')} & {c('60.0')} & {c('70.0', '0.7')} \\\\" in L
    assert f"RTN & {c('10.0')} & {c('10.0')} & {c('10.0', '0.7')} \\\\" in L


def test_memory_tables():
    stats = pd.DataFrame({"model": ["m1"] * 3, "method": ["flat", "flat", "fair"],
                          "bits": ["w4a4"] * 3, "peak_mem_mb": [1000.0, 3000.0, 1200.0],
                          "peak_mem_kind": ["cpu_rss_added"] * 3})
    tex = T.calib_memory_table(stats, ["m1", "m2"], "flat", "fair",
                               {"models": {"m1": "M-One"}}, bits="w4a4", caption="Peak.")
    L = lines_of(tex)
    assert "\\textbf{Model} & \\textbf{flat (MB)} & \\textbf{fair (MB)} & \\textbf{Reduction} \\\\" in L
    assert "M-One & 3000 & 1200 & 2.50$\\times$ \\\\" in L
    assert "m2 & -- & -- & -- \\\\" in L and "m2 / flat / w4a4" in tex
    assert ("\\caption{Peak. Peak memory in MB (2$^{20}$ bytes), measured as CPU: peak resident "
            "memory added during calibration") in tex and "process" not in tex


def test_calib_memory_never_compares_two_different_measures():
    """A run measured on the GPU against one measured on the CPU (or by an older version that
    did not record its measure): the cells print, the reduction does not, and the caption
    names every measure used."""
    stats = pd.DataFrame({"model": ["m1", "m1", "m2", "m2"], "method": ["flat", "fair"] * 2,
                          "bits": ["w4a4"] * 4, "peak_mem_mb": [3000.0, 1200.0, 900.0, 800.0],
                          "peak_mem_kind": ["cuda_max_allocated", "cpu_rss_added", None,
                                            None]})
    tex = T.calib_memory_table(stats, ["m1", "m2"], "flat", "fair", {}, bits="w4a4")
    L = lines_of(tex)
    assert "m1 & 3000 & 1200 & -- \\\\" in L and "m2 & 900 & 800 & -- \\\\" in L
    assert "torch.cuda.max\\_memory\\_allocated" in tex and "resident memory added" in tex
    assert "not recorded" in tex
    mem = pd.DataFrame({"model": ["m1"], "method": ["fair"], "bits": ["w4a4"],
                        "export_bytes": [4.9e9], "fp_bytes": [15.89e9]})
    L = lines_of(T.deploy_memory_table(mem, ["m1"], "fair", {}, bits="w4a4"))
    assert "\\textbf{Model} & \\textbf{FP (GB)} & \\textbf{fair (GB)} & \\textbf{Memory saving} \\\\" in L
    assert "m1 & 15.89 & 4.90 & 3.24$\\times$ \\\\" in L
    mem2 = mem.assign(export_bytes=[2.0e6], fp_bytes=[8.0e6])
    assert "m1 & 8.00 & 2.00 & 4.00$\\times$ \\\\" in lines_of(T.deploy_memory_table(mem2, ["m1"], "fair", {}))


def test_report_cli(tmp_path):
    df = eval_df()
    paths = []
    for (m, x, b, t), g in df.groupby(["model", "method", "bits", "task"]):
        p = tmp_path / "eval" / m / x / b / f"{t}.parquet"
        write_parquet(g, p, EVAL_SCHEMA)
        paths.append(str(p))
    stats = tmp_path / "calib" / "m1" / "fair" / "w4a4" / "stats.parquet"
    write_parquet(pd.DataFrame({"block": [0], "epoch": [0], "loss": [0.1], "seconds": [1.0],
                                "peak_mem_mb": [512.0]}), stats,
                  pa.schema([("block", pa.int32()), ("epoch", pa.int32()), ("loss", pa.float64()),
                             ("seconds", pa.float64()), ("peak_mem_mb", pa.float64())]))
    meta = tmp_path / "calib" / "m1" / "fair" / "w4a4" / "meta.json"
    write_json(meta, {"export_bytes": 1.0e6, "fp_bytes": 4.0e6})
    settings = {"models": [{"name": "m1", "label": "M-One", "family": "A"},
                           {"name": "m2", "label": "M-Two", "family": "B"}],
                "methods": LABELS["methods"], "tasks": LABELS["tasks"], "bits": "w4a4"}
    out = tmp_path / "main.tex"
    T.run_cli(["--settings", json.dumps(settings), "--inputs", *paths, str(stats), str(meta),
               "--out", str(out)])
    tex = out.read_text()
    assert tex.count("\\begin{table*}") == 2  # one table per family
    assert "\\label{tab:main_a}" in tex and "\\label{tab:main_b}" in tex
    assert "& Chance & 25.0 & 50.0 & 37.5 \\\\" in tex
    out2 = tmp_path / "mem.tex"
    T.run_cli(["--settings", json.dumps({**settings, "table": {"method": "fair"}}), "--inputs",
               str(meta), "--table", "deploy_memory", "--out", str(out2)])
    assert "M-One & 4.00 & 1.00 & 4.00$\\times$ \\\\" in out2.read_text()
    out3 = tmp_path / "comp.tex"
    T.run_cli(["--settings", json.dumps({**settings, "table": {
        "model": "m1", "rows": [["rtn", "baseline"], ["fair", "FAIR-Calib"]]}}),
        "--inputs", *paths, "--table", "components", "--out", str(out3)])
    assert f"FAIR-Calib & {c('64.0', '0.7')} \\\\" in out3.read_text()


def test_report_cli_workflow_settings(tmp_path):
    """Settings as the workflow's table rule builds them: table section + labels/groups."""
    df = eval_df()
    p = tmp_path / "all.parquet"
    write_parquet(df, p, EVAL_SCHEMA)
    settings = {"table": {"name": "main", "layout": "family", "models": ["m1", "m2"],
                          "methods": ["fp", "rtn", "fair"], "bits": "w4a4", "tasks": ["t1", "t2"],
                          "caption": "W4A4 results (accuracy, %)."},
                "labels": {"models": {"m1": "M-One", "m2": "M-Two"},
                           "groups": {"m1": "Tiny", "m2": "Tiny"},
                           "methods": {"fp": "FP", "rtn": "RTN", "fair": "FAIR"},
                           "tasks": {"t1": "T1", "t2": "T2"}}}
    out = tmp_path / "main.tex"
    T.run_cli(["--settings", json.dumps(settings), "--inputs", str(p), "--out", str(out)])
    L = lines_of(out.read_text())
    assert L[0] == "% generated by fair-calib report (table main); do not edit"
    assert f"\\caption{{W4A4 results (accuracy, \\%). {T.CONVENTION} {T.CHANCE_NOTE}}}" in L
    assert "\\label{tab:main_tiny}" in L
    # another table of kind main (prior_ablation) gets a label of its own (issue 32)
    abl = {**settings, "table": {**settings["table"], "name": "prior_ablation", "kind": "main"}}
    T.run_cli(["--settings", json.dumps(abl), "--inputs", str(p), "--out", str(out)])
    assert "\\label{tab:prior_ablation_tiny}" in lines_of(out.read_text())
    assert f"& RTN & {c('70.0')} & {c('55.0')} & {c('62.5', '0.7')} \\\\" in L
    assert "\\multirow{4}{*}{\\textbf{M-Two}}" in L
    settings["table"].update(name="abl", layout="average", model="m1", methods=["rtn", "hit"])
    T.run_cli(["--settings", json.dumps(settings), "--inputs", str(p), "--out", str(out)])
    L = lines_of(out.read_text())
    assert f"RTN & {c('62.5', '0.7')} \\\\" in L and f"hit & {c('63.0', '0.7')} \\\\" in L


def test_pick_metric_with_lm_eval_filters():
    df = pd.DataFrame({"task": ["g"] * 3 + ["h"] * 2,
                       "metric": ["exact_match,flexible-extract", "exact_match,strict-match",
                                  "acc_norm,none", "acc,none", "acc_norm,none"]})
    assert T.pick_metric(df, "g", {}) == "exact_match,strict-match"
    assert T.pick_metric(df, "h", {}) == "acc,none"
    amb = pd.DataFrame({"task": ["k", "k"], "metric": ["acc,a", "acc,b"]})
    with pytest.raises(ValueError, match="name one"):
        T.pick_metric(amb, "k", {})


def test_each_model_reports_its_recipes_metric_and_the_other_filter_beside_it():
    """One column, three recipes: OpenCompass's ``acc`` (an Instruct model), lm-eval's GSM8K
    ``exact_match`` under strict-match and flexible-extract (the others). Each model's cells
    show its own metric (strict-match first); the flexible-extract values, which the authors'
    harness computes too, are printed under the table per model and method."""
    rows = [("oc", "fp", "fp", "acc,none", 0.70), ("oc", "rtn", "w4a4", "acc,none", 0.60),
            ("lm", "fp", "fp", "exact_match,strict-match", 0.50),
            ("lm", "fp", "fp", "exact_match,flexible-extract", 0.55),
            ("lm", "rtn", "w4a4", "exact_match,strict-match", 0.30),
            ("lm", "rtn", "w4a4", "exact_match,flexible-extract", 0.40)]
    df = pd.DataFrame(rows, columns=["model", "method", "bits", "metric", "value"])
    df["task"], df["stderr"], df["n"], df["chance"], df["settings"] = "g", 0.01, 100, 0.0, "{}"
    labels = {"models": {"oc": "OC", "lm": "LM"}, "methods": {"fp": "FP", "rtn": "RTN"},
              "tasks": {"g": "GSM8K"}}
    records = []
    tex = T.main_table(df, ["oc", "lm"], ["fp", "rtn"], ["g"], labels, bits="w4a4",
                       chance=False, records=records)
    L = lines_of(tex)
    got = {(r["model"], r["method"]): r["value"] for r in records}
    assert got == {("oc", "fp"): pytest.approx(70.0), ("oc", "rtn"): pytest.approx(60.0),
                   ("lm", "fp"): pytest.approx(50.0), ("lm", "rtn"): pytest.approx(30.0)}
    assert "Missing results" not in tex
    assert ("\\par\\smallskip{\\footnotesize Also computed by the authors' harness, beside the "
            f"metric shown: GSM8K, LM, exact\\_match flexible-extract: FP {c('55.0')}, "
            f"RTN {c('40.0')}.}}") in L
    # the column's metric chosen over all models at once would have been acc: LM missing
    assert T.pick_metric(df, "g", {}) == "acc,none"
    assert T.pick_metric(df, "g", {}, model="lm") == "exact_match,strict-match"


def _seed_rows():
    """m1 x {rtn, fair} at w4a4 on t1, three calibration seeds each (told apart by `seed`)."""
    rows = [("rtn", 0, 0.50), ("rtn", 1, 0.52), ("rtn", 2, 0.54),
            ("fair", 0, 0.70), ("fair", 1, 0.71), ("fair", 2, 0.72)]
    df = pd.DataFrame([{"model": "m1", "method": m, "bits": "w4a4", "task": "t1", "metric": "acc",
                        "value": v, "stderr": 0.03, "n": 100, "chance": 0.25, "seed": s}
                       for m, s, v in rows])
    fp = eval_df().query("model == 'm1' and method == 'fp' and task == 't1'").assign(seed=0)
    return pd.concat([fp, df], ignore_index=True)


def test_seeds_give_mean_and_std_over_seeds():
    records = []
    tex = T.main_table(_seed_rows(), ["m1"], ["fp", "rtn", "fair"], ["t1"], LABELS,
                       bits="w4a4", records=records)
    L = lines_of(tex)
    # mean of 50/52/54 = 52, std (ddof=1) = 2.0; 70/71/72 -> 71 +- 1.0; not the items' 3.0
    # (one task: no Avg. column repeating it)
    assert f"& RTN & {c('52.0', '2.0')} \\\\" in L
    assert "\\textbf{Avg.}" not in tex
    # 71 - 52 = 19 > 1.96 * sqrt(4 + 1): bold
    assert f"& \\textbf{{FAIR}} & {c('71.0', bold=True)} \\\\" in L
    cells = T.cells_frame(records)
    r = cells[(cells.method == "rtn") & (cells.column == "t1")].iloc[0]
    assert (r.value, r.err, r.err_kind, r.n_seeds, r.n_items) == (52.0, 2.0, "sd", 3, 100)
    fp = cells[(cells.method == "fp") & (cells.column == "t1")].iloc[0]
    assert (fp.value, fp.err_kind, fp.n_seeds) == (80.0, "se", 1)
    assert cells.loc[cells.method == "fair", "bold"].all()
    assert not cells.loc[cells.method != "fair", "bold"].any()


def test_duplicate_rows_without_seeds_raise():
    df = pd.concat([eval_df(), eval_df().iloc[:1]], ignore_index=True)
    with pytest.raises(ValueError, match="one per calibration seed"):
        T.main_table(df, ["m1"], ["fp"], ["t1"], LABELS)


@pytest.mark.parametrize("gap,bold", [(2.80, True), (2.75, False)])
def test_bold_only_beyond_the_noise(gap, bold):
    """Two methods with ±1.0 each: the threshold is 1.96 * sqrt(2) = 2.772 points."""
    df = pd.DataFrame({"model": "m1", "method": ["rtn", "fair"], "bits": "w4a4", "task": "t1",
                       "metric": "acc", "value": [0.50, 0.50 + gap / 100], "stderr": 0.01,
                       "n": 100, "chance": float("nan")})
    records = []
    T.main_table(df, ["m1"], ["rtn", "fair"], ["t1"], LABELS, bits="w4a4", records=records)
    cells = T.cells_frame(records)
    assert cells.loc[(cells.method == "fair") & (cells.column == "t1"), "bold"].item() is bold
    assert not cells.loc[cells.method == "rtn", "bold"].any()


def test_missing_stderr_prints_no_pm_and_bolds_on_value():
    df = eval_df().assign(stderr=float("nan"))
    L = lines_of(T.main_table(df, ["m1"], ["fp", "rtn", "fair"], ["t1", "t2"], LABELS,
                              bits="w4a4"))
    assert "& RTN & 70.0 & 55.0 & 62.5 \\\\" in L
    assert "& \\textbf{FAIR} & 70.0 & \\textbf{58.0} & \\textbf{64.0} \\\\" in L


def test_report_cli_writes_cells_parquet(tmp_path):
    from fair_calib.jobs.io import read_parquet

    p = tmp_path / "all.parquet"
    write_parquet(eval_df(), p, EVAL_SCHEMA)
    settings = {"table": {"name": "main", "kind": "main", "models": ["m1"],
                          "methods": ["fp", "rtn", "fair"], "bits": "w4a4", "tasks": ["t1", "t2"]},
                "labels": {"methods": {"fp": "FP", "rtn": "RTN", "fair": "FAIR"}}}
    out, cells_out = tmp_path / "main.tex", tmp_path / "main.parquet"
    T.run_cli(["--settings", json.dumps(settings), "--inputs", str(p), "--out", str(out),
               "--cells-out", str(cells_out)])
    cells, _ = read_parquet(cells_out)
    assert list(cells.columns) == list(T.CELL_COLUMNS)
    fair_t2 = cells[(cells.method == "fair") & (cells.column == "t2")].iloc[0]
    assert fair_t2.value == pytest.approx(58.0) and fair_t2.err == pytest.approx(1.0)
    assert fair_t2.bold
    assert set(cells.method) == {"fp", "chance", "rtn", "fair"}
    assert len(cells) == 4 * 3  # rows x (two tasks + avg)


def test_seeded_runs_from_the_workflow_are_aggregated(tmp_path):
    """The workflow names seed runs `fair@s<k>`; load_inputs splits them into method + seed."""
    paths = []
    for k, v in ((0, 0.60), (1, 0.64)):
        p = tmp_path / f"fair@s{k}.parquet"
        row = eval_df().query("model == 'm1' and method == 'fair' and task == 't1'")
        write_parquet(row.assign(method=f"fair@s{k}", value=v), p, EVAL_SCHEMA)
        paths.append(p)
    ev = T.load_inputs(paths)["eval"]
    assert sorted(ev["seed"]) == [0, 1] and set(ev["method"]) == {"fair"}
    records = []
    T.main_table(ev, ["m1"], ["fair"], ["t1"], LABELS, bits="w4a4", records=records)
    cells = T.cells_frame(records)
    r = cells[(cells.method == "fair") & (cells.column == "t1")].iloc[0]
    assert r.value == pytest.approx(62.0) and r.err == pytest.approx(2.0 ** 1.5)  # std of 60, 64
    assert (r.err_kind, r.n_seeds) == ("sd", 2)


# ----------------------------------------------------------------------------- issue 23
NASTY = "RTN→ü 量化 50%_#&"


def test_plain_labels_are_escaped_in_every_table():
    """A plain-text label with LaTeX specials neither comments out the row (%) nor adds cells
    (&): it is escaped in the main, ablation and flat tables' rows and headers."""
    labels = {"models": {"m1": {"label": "M_1 #1", "family": "F&G"}},
              "methods": {"fp": {"label": "FP"}, "rtn": {"label": NASTY},
                          "fair": {"label": "x$^{~}\\y"}},
              "tasks": {"t1": {"label": "T_1 50%"}, "t2": {"label": "T2"}}}
    esc = "RTN→ü 量化 50\\%\\_\\#\\&"
    main = T.main_table(eval_df(), ["m1"], ["fp", "rtn", "fair"], ["t1", "t2"], labels,
                        bits="w4a4", env=None)
    L = lines_of(main)
    assert f"& {esc} & {c('70.0')} & {c('55.0')} & {c('62.5', '0.7')} \\\\" in L
    assert any(ln.startswith("& x\\$\\textasciicircum{}\\{\\textasciitilde{}\\}"
                             "\\textbackslash{}y & ") for ln in L), main
    assert "\\multirow{4}{*}{\\textbf{M\\_1 \\#1}}" in L
    assert "\\textbf{T\\_1 50\\%}" in main
    flat = lines_of(T.flat_table(eval_df(), "m1", ["rtn"], ["t1", "t2"], labels, bits="w4a4",
                                 fp_label="FP 100%"))
    assert f"{esc} & {c('70.0')} & {c('55.0')} & {c('62.5', '0.7')} \\\\" in flat
    assert any(ln.startswith("FP 100\\% & ") for ln in flat)
    abl = lines_of(T.build_table("components", {"table": {
        "models": ["m1"], "methods": ["rtn", "hit"], "tasks": ["t1", "t2"], "bits": "w4a4",
        "rows": [["rtn", "base_line 1%"], ["hit", "h"]], "header": "Method_"}, **labels},
        {"eval": eval_df()}))
    assert "\\textbf{Method\\_} & \\textbf{Avg.} \\\\" in abl
    assert f"base\\_line 1\\% & {c('62.5', '0.7')} \\\\" in abl
    # the family name in the default caption
    tex = T.build_table("main", {"table": {"models": ["m1"], "methods": ["fp", "rtn"],
                                           "tasks": ["t1"], "bits": "w4a4"}, **labels},
                        {"eval": eval_df()})
    assert "results on the F\\&G family." in tex


def test_latex_label_is_printed_verbatim_and_rows_may_name_only_the_method():
    labels = {"methods": {"fp": {"label": "FP"},
                          "fair": {"label": "FAIR", "latex_label": "\\textbf{FAIR}"},
                          "hit": {"label": "w/o lambda", "latex_label": "w/o $\\lambda_0$"}}}
    settings = {"table": {"kind": "schedule", "models": ["m1"], "methods": ["hit", "fair"],
                          "tasks": ["t1", "t2"], "bits": "w4a4",
                          "rows": [["hit"], ["fair", "early_boost"]]}, **labels}
    L = lines_of(T.build_table(None, settings, {"eval": eval_df()}))
    assert any(ln.startswith("w/o $\\lambda_0$ & ") for ln in L), L
    assert any(ln.startswith("early\\_boost & ") for ln in L), L


def test_chance_row_is_explained_and_printed_like_every_cell():
    tex = T.main_table(eval_df(), ["m1"], ["fp", "rtn"], ["t1", "t2"], LABELS, bits="w4a4")
    assert T.CHANCE_NOTE in tex and "exact-match" in T.CHANCE_NOTE
    assert "& Chance & 25.0 & 50.0 & 37.5 \\\\" in lines_of(tex)
    no_chance = T.main_table(eval_df().assign(chance=float("nan")), ["m1"], ["fp", "rtn"],
                             ["t1", "t2"], LABELS, bits="w4a4")
    assert T.CHANCE_NOTE not in no_chance


def test_value_and_its_pm_have_the_same_decimals():
    """One rule for every accuracy cell: as many decimals as its ± (issue 23: 2 vs 1)."""
    import re

    tex = T.main_table(eval_df(), ["m1", "m2"], ["fp", "rtn", "fair"], ["t1", "t2"], LABELS,
                       bits="w4a4", env=None)
    cells = re.findall(r"(\d+\.(\d+))\}?\{\\scriptsize\$\\pm\$\d+\.(\d+)\}", tex)
    assert cells and all(len(v) == len(e) == T.DIGITS for _, v, e in cells), cells


def test_main_table_method_bits_give_a_row_its_own_bits():
    """``method_bits``: one row of a W4A4 table read at W3A4 (QDLM's grid: weight-only rows
    next to W4A4 ones), its cells recorded under those bits."""
    records = []
    tex = T.main_table(eval_df(), ["m1"], ["fp", "rtn", "fair"], ["t1", "t2"], LABELS,
                       bits="w4a4", method_bits={"rtn": "w3a4"}, records=records)
    rtn_line = next(l for l in tex.splitlines() if l.startswith("& RTN"))
    assert "10.0" in rtn_line and "70.0" not in rtn_line
    assert {r["bits"] for r in records if r["method"] == "rtn"} == {"w3a4"}
    assert {r["bits"] for r in records if r["method"] == "fair"} == {"w4a4"}


def test_cells_on_integer_codes_are_marked_and_the_caption_says_so():
    """The evaluation records its arithmetic (evaluate/run.py): a quantized row computed on
    integer codes (the real low-bit kernels) carries a dagger on every cell, the caption
    explains it and the cells frame records it; fake quantization is unmarked, so a table
    computed entirely by fake quantization keeps its bytes."""
    labels = {"models": {"m1": "M1"}, "methods": {"fp": "FP", "rtn": "RTN", "fair": "FAIR"},
              "tasks": {"t1": "T1", "t2": "T2"}}
    df = eval_df()
    plain = T.main_table(df, ["m1"], ["fp", "rtn", "fair"], ["t1", "t2"], labels, bits="w4a4")
    fake = T.main_table(df.assign(arithmetic="fake"), ["m1"], ["fp", "rtn", "fair"],
                        ["t1", "t2"], labels, bits="w4a4")
    assert fake == plain and "dagger" not in plain
    df = df.assign(arithmetic=["integer" if m == "rtn" else "fake" for m in df["method"]])
    records: list = []
    tex = T.main_table(df, ["m1"], ["fp", "rtn", "fair"], ["t1", "t2"], labels, bits="w4a4",
                       records=records)
    rtn_line = next(line for line in tex.splitlines() if line.startswith("& RTN"))
    fair_line = next(line for line in tex.splitlines() if line.startswith("& FAIR"))
    assert rtn_line.count("$^\\dagger$") == 3 and "dagger" not in fair_line
    assert T.ARITH_NOTE in tex
    arith = {(r["method"], r["column"]): r["arithmetic"] for r in records}
    assert arith[("rtn", "t1")] == "integer" and arith[("fair", "avg")] == "fake"


def test_a_row_of_two_arithmetics_is_mixed():
    df = pd.DataFrame({"model": ["m"] * 3, "method": ["rtn"] * 3, "bits": ["w4a4"] * 3,
                       "arithmetic": ["integer", "fake", ""]})
    assert T.arithmetic_of_row(df, "m", "rtn", "w4a4") == "mixed"
    assert T.arithmetic_of_row(df.iloc[[0, 2]], "m", "rtn", "w4a4") == "integer"
    assert T.arithmetic_of_row(df.drop(columns="arithmetic"), "m", "rtn", "w4a4") == ""
