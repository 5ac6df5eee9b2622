"""Table generation from a small hand-written eval Parquet: exact LaTeX lines."""
from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pytest

from fair_calib.io import write_json, write_parquet
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
                      "fair": {"label": "\\textbf{FAIR}"}},
          "tasks": {"t1": {"label": "T1"}, "t2": {"label": "T2"}}}


def lines_of(tex):
    return [ln.strip() for ln in tex.splitlines()]


def test_main_table_exact_lines():
    tex = T.main_table(eval_df(), ["m1", "m2"], ["fp", "rtn", "fair"], ["t1", "t2"], LABELS,
                       bits="w4a4", caption="Cap", label="tab:x")
    L = lines_of(tex)
    assert L[0] == "\\begin{table*}[t]" and L[-1] == "\\end{table*}"
    assert "\\begin{tabular}{llccc}" in L
    assert ("\\textbf{Model} & \\textbf{Method} & \\textbf{T1} & \\textbf{T2} & "
            "\\textbf{Avg.} \\\\") in L
    i = L.index("\\multirow{4}{*}{\\textbf{M-One}}")
    assert L[i + 1] == ("& \\cellcolor{gray!20}FP & \\cellcolor{gray!20}80.00 & "
                        "\\cellcolor{gray!20}60.00 & \\cellcolor{gray!20}70.00 \\\\")
    assert L[i + 2] == "& Chance & 25.00 & 50.00 & 37.50 \\\\"
    # tie on T1 -> both bold; FP (80.00) never bold
    assert L[i + 3] == "& RTN & \\textbf{70.00} & 55.00 & 62.50 \\\\"
    assert L[i + 4] == "& \\textbf{FAIR} & \\textbf{70.00} & \\textbf{58.00} & \\textbf{64.00} \\\\"
    j = L.index("\\multirow{4}{*}{\\textbf{M-Two}}")
    assert L[j - 1] == "\\midrule"
    assert L[j + 1] == ("& \\cellcolor{gray!20}FP & \\cellcolor{gray!20}90.00 & "
                        "\\cellcolor{gray!20}-- & \\cellcolor{gray!20}-- \\\\")
    assert L[j + 3] == "& RTN & \\textbf{50.00} & 50.00 & \\textbf{50.00} \\\\"
    assert L[j + 4] == "& \\textbf{FAIR} & -- & \\textbf{60.00} & -- \\\\"
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
    assert "80.00" in tex and "99.00" not in tex  # acc preferred over unknown f1
    lab = {**LABELS, "tasks": {"t1": {"label": "T1", "metric": "f1"}, "t2": {"label": "T2"}}}
    assert "99.00" in T.main_table(df2, ["m1"], ["fp"], ["t1", "t2"], lab)
    df3 = pd.concat([df, extra.assign(metric="f1")]).query("metric != 'acc' or task != 't1'")
    df3 = pd.concat([df3, extra.assign(metric="bleu")])
    with pytest.raises(ValueError, match="name one"):
        T.main_table(df3, ["m1"], ["fp"], ["t1"], LABELS)


def test_ablation_table():
    tex = T.average_table(eval_df(), "m1", [("rtn", "baseline"), ("hit", "frontier-hit only"),
                                             ("rel", "reliability only"), ("fair", "FAIR-Calib")],
                          ["t1", "t2"], LABELS, bits="w4a4", header="Method")
    L = lines_of(tex)
    assert "baseline & 62.50 \\\\" in L
    assert "frontier-hit only & 63.00 \\\\" in L
    assert "reliability only & -- \\\\" in L
    assert "FAIR-Calib & \\textbf{64.00} \\\\" in L
    assert any(ln.endswith("m1 / rel / w4a4 / t2.}") for ln in L)


def test_ablation_bold_is_the_best():
    tex = T.average_table(eval_df(), "m1", [("rtn", "baseline"), ("fair", "FAIR-Calib")],
                          ["t1", "t2"], LABELS, bits="w4a4")
    L = lines_of(tex)
    assert "baseline & 62.50 \\\\" in L and "FAIR-Calib & \\textbf{64.00} \\\\" in L
    assert "Missing" not in tex


def test_flat_table_w3a4():
    tex = T.flat_table(eval_df(), "m1", ["rtn"], ["t1", "t2"], LABELS, bits="w3a4")
    L = lines_of(tex)
    assert "Real-valued & 80.00 & 60.00 & 70.00 \\\\" in L
    assert "RTN & \\textbf{10.00} & \\textbf{10.00} & \\textbf{10.00} \\\\" in L


def test_memory_tables():
    stats = pd.DataFrame({"model": ["m1"] * 3, "method": ["flat", "flat", "fair"],
                          "bits": ["w4a4"] * 3, "peak_mem_mb": [1000.0, 3000.0, 1200.0]})
    tex = T.calib_memory_table(stats, ["m1", "m2"], "flat", "fair",
                               {"models": {"m1": "M-One"}}, bits="w4a4")
    L = lines_of(tex)
    assert "M-One & 3000 & 1200 & 2.50$\\times$ \\\\" in L
    assert "m2 & -- & -- & -- \\\\" in L and "m2 / flat / w4a4" in tex
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
    assert "& Chance & 25.00 & 50.00 & 37.50 \\\\" in tex
    out2 = tmp_path / "mem.tex"
    T.run_cli(["--settings", json.dumps({**settings, "table": {"method": "fair"}}), "--inputs",
               str(meta), "--table", "deploy_memory", "--out", str(out2)])
    assert "M-One & 4.00 & 1.00 & 4.00$\\times$ \\\\" in out2.read_text()
    out3 = tmp_path / "comp.tex"
    T.run_cli(["--settings", json.dumps({**settings, "table": {
        "model": "m1", "rows": [["rtn", "baseline"], ["fair", "FAIR-Calib"]]}}),
        "--inputs", *paths, "--table", "components", "--out", str(out3)])
    assert "FAIR-Calib & \\textbf{64.00} \\\\" in out3.read_text()


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
    assert "\\caption{W4A4 results (accuracy, \\%).}" in L
    assert "\\label{tab:main_tiny}" in L
    assert "& RTN & \\textbf{70.00} & 55.00 & 62.50 \\\\" in L
    assert "\\multirow{4}{*}{\\textbf{M-Two}}" in L
    settings["table"].update(name="abl", layout="average", model="m1", methods=["rtn", "hit"])
    T.run_cli(["--settings", json.dumps(settings), "--inputs", str(p), "--out", str(out)])
    L = lines_of(out.read_text())
    assert "RTN & 62.50 \\\\" in L and "hit & \\textbf{63.00} \\\\" in L


def test_pick_metric_with_lm_eval_filters():
    df = pd.DataFrame({"task": ["g"] * 3 + ["h"] * 2,
                       "metric": ["exact_match,flexible-extract", "exact_match,strict-match",
                                  "acc_norm,none", "acc,none", "acc_norm,none"]})
    assert T.pick_metric(df, "g", {}) == "exact_match,strict-match"
    assert T.pick_metric(df, "h", {}) == "acc,none"
    amb = pd.DataFrame({"task": ["k", "k"], "metric": ["acc,a", "acc,b"]})
    with pytest.raises(ValueError, match="name one"):
        T.pick_metric(amb, "k", {})
