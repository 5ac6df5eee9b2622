"""The generated tables compile with the documented preamble (README, "Tables in a paper"):

    \\usepackage{booktabs}  \\usepackage{multirow}  \\usepackage[table]{xcolor}
    \\usepackage{graphicx}

With ``pdflatex`` installed every table is compiled in a minimal document with exactly that
preamble; without it a strict structural check runs instead: environments nest and close,
braces balance, and every command is LaTeX's own or one of those four packages'."""
from __future__ import annotations

import re
import shutil
import subprocess

import pandas as pd
import pytest

from fair_calib.report import tables as T

PREAMBLE = ("\\usepackage{booktabs}\n\\usepackage{multirow}\n\\usepackage[table]{xcolor}\n"
            "\\usepackage{graphicx}\n")

# Commands of LaTeX itself (the article class) and of the four documented packages.
LATEX = {"begin", "end", "centering", "caption", "label", "textbf", "textit", "emph", "small",
         "footnotesize", "scriptsize", "tiny", "normalsize", "multicolumn", "hline",
         "textwidth", "linewidth", "columnwidth", "times", "pm", "uparrow", "downarrow", "quad",
         "qquad", "hspace", "vspace", "noindent", "par", "ldots", "dots", "mathrm", "mathbf",
         "text", "lambda", "alpha", "rho", "le", "ge", "cdot", "textsuperscript", "dag",
         "ddag", "S", "P", "rule", "setlength", "tabcolsep", "arraystretch", "renewcommand",
         "raggedright", "raggedleft", "parbox", "makebox", "mbox", "footnote", "item",
         "protect", "newline", "and", "sim", "approx", "infty", "geq", "leq", "Delta", "ast",
         "star", "bullet", "circ", "checkmark", "cline", "vline", "relax", "phantom", "null",
         "N", "textsc", "textrm", "texttt", "rightarrow", "leftarrow", "to", "mid", "lvert",
         "rvert", "vert", "colon", "tablenotes", "noalign", "smallskip", "medskip", "bigskip",
         "sqrt", "sigma", "frac", "textbackslash", "textasciitilde", "textasciicircum"}
BOOKTABS = {"toprule", "midrule", "bottomrule", "cmidrule", "addlinespace", "specialrule"}
MULTIROW = {"multirow"}
XCOLOR = {"rowcolor", "cellcolor", "color", "textcolor", "definecolor", "colorbox"}
GRAPHICX = {"resizebox", "scalebox"}     # not LaTeX's own: pdflatex refuses it without graphicx
ALLOWED = LATEX | BOOKTABS | MULTIROW | XCOLOR | GRAPHICX
ENVIRONMENTS = {"table", "table*", "tabular", "tabular*", "center", "minipage", "threeparttable",
                "tablenotes", "footnotesize", "small"}


def _tables() -> dict[str, str]:
    rows = [("m1", "fp", "fp", "t1", 0.8), ("m1", "fp", "fp", "t2", 0.6),
            ("m1", "rtn", "w4a4", "t1", 0.7), ("m1", "rtn", "w4a4", "t2", 0.5),
            ("m1", "fair", "w4a4", "t1", 0.72), ("m2", "fp", "fp", "t1", 0.9),
            ("m2", "rtn", "w4a4", "t1", 0.6), ("m2", "fair", "w4a4", "t1", 0.65),
            ("m1", "rtn", "w3a4", "t1", 0.3), ("m1", "rtn", "w3a4", "t2", 0.3)]
    ev = pd.DataFrame(rows, columns=["model", "method", "bits", "task", "value"])
    ev["metric"], ev["stderr"], ev["n"] = "acc", 0.01, 100
    ev["chance"] = ev["task"].map({"t1": 0.25, "t2": 0.5})
    ev["settings"] = "{}"
    labels = {"models": {"m1": {"label": "M-One", "family": "A"},
                         "m2": {"label": "M-Two", "family": "B"}},
              "methods": {"fp": {"label": "FP"}, "rtn": {"label": "RTN"},
                          "fair": {"label": "FAIR-Calib", "latex_label": "\\textbf{FAIR-Calib}"}},
              # plain-text labels: every LaTeX special is escaped (issue 23)
              "tasks": {"t1": {"label": "T1"}, "t2": {"label": "T2 (%) a_b #1 & $x$ {~^\\}"}}}
    stats = pd.DataFrame({"model": ["m1", "m1"], "method": ["rtn", "fair"], "bits": ["w4a4"] * 2,
                          "peak_mem_mb": [1000.0, 1200.0], "peak_mem_kind": ["cpu_rss_added"] * 2})
    mem = pd.DataFrame({"model": ["m1"], "method": ["fair"], "bits": ["w4a4"],
                        "export_bytes": [4.9e9], "fp_bytes": [15.89e9]})
    return {
        "main": T.main_table(ev, ["m1", "m2"], ["fp", "rtn", "fair"], ["t1", "t2", "synth_mc"], labels,
                             bits="w4a4"),
        "ablation": T.average_table(ev, "m1", [("rtn", "baseline"), ("fair", "FAIR-Calib")],
                                    ["t1", "t2"], labels, bits="w4a4", header="Method"),
        "w3a4": T.flat_table(ev, "m1", ["rtn"], ["t1", "t2"], labels, bits="w3a4"),
        "calib_memory": T.calib_memory_table(stats, ["m1", "m2"], "rtn", "fair", labels,
                                             bits="w4a4"),
        "deploy_memory": T.deploy_memory_table(mem, ["m1"], "fair", labels, bits="w4a4"),
    }


def structural_errors(tex: str) -> list[str]:
    errors = []
    body = re.sub(r"(?<!\\)%.*", "", tex)                      # comments
    stack = []
    for m in re.finditer(r"\\(begin|end)\{([^}]*)\}", body):
        kind, env = m.groups()
        if env not in ENVIRONMENTS:
            errors.append(f"environment {env!r} is not LaTeX's or a documented package's")
        if kind == "begin":
            stack.append(env)
        elif not stack or stack.pop() != env:
            errors.append(f"\\end{{{env}}} closes nothing open")
    errors += [f"\\begin{{{env}}} never closed" for env in stack]
    depth = 0
    for i, ch in enumerate(body):
        if ch in "{}" and (i == 0 or body[i - 1] != "\\"):
            depth += 1 if ch == "{" else -1
            if depth < 0:
                errors.append("unbalanced '}'")
                depth = 0
    if depth:
        errors.append(f"{depth} unclosed '{{'")
    for cmd in sorted(set(re.findall(r"\\([A-Za-z]+)\*?", body)) - ALLOWED):
        errors.append(f"\\{cmd} is not a command of LaTeX, booktabs, multirow or xcolor")
    text = re.sub(r"\\label\{[^}]*\}", "", body)       # a key may hold _ (tab:main_llada)
    for m in re.finditer(r"(?<!\\)[_^#&$%]", re.sub(r"\$[^$]*\$", "", text)):
        if m.group() in "_^#":
            errors.append(f"unescaped {m.group()!r} outside math")
    return errors


def test_structural_check_catches_what_latex_would_refuse():
    assert structural_errors("\\begin{tabular}{l}a\\\\") == ["\\begin{tabular} never closed"]
    assert any("siunitx" in e or "\\sisetup" in e for e in structural_errors("\\sisetup{x}"))
    assert any("unclosed" in e for e in structural_errors("\\textbf{a"))
    assert any("'_'" in e for e in structural_errors("a_b"))


@pytest.mark.parametrize("name", ["main", "ablation", "w3a4", "calib_memory", "deploy_memory"])
def test_table_passes_the_strict_structural_check(name):
    tex = _tables()[name]
    assert structural_errors(tex) == [], tex


@pytest.mark.skipif(shutil.which("pdflatex") is None,
                    reason="pdflatex not installed: the strict structural check above stands in")
def test_tables_compile_with_the_documented_preamble(tmp_path):
    doc = ("\\documentclass{article}\n" + PREAMBLE + "\\begin{document}\n"
           + "\n\\clearpage\n".join(_tables().values()) + "\n\\end{document}\n")
    (tmp_path / "t.tex").write_text(doc)
    res = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:]


def _paper_tables() -> dict[str, str]:
    """Every table of config/paper.yaml, with the settings the workflow's table rule passes
    (fair_calib.report.labels) and a value in every cell it asks for."""
    import itertools
    from pathlib import Path

    import yaml

    from fair_calib.report.labels import display_labels

    cfg = yaml.safe_load((Path(__file__).parents[1] / "config/paper.yaml").read_text())
    cfg["bits"] = sorted({t["bits"] for t in cfg["tables"].values()})   # paper.yaml merges over config.yaml's
    rows = [(m, x, "fp" if x == "fp" else b, t, 0.5)
            for m, x, b, t in itertools.product(cfg["models"], cfg["methods"], cfg["bits"],
                                                cfg["tasks"])]
    ev = pd.DataFrame(rows, columns=["model", "method", "bits", "task", "value"])
    ev = ev.drop_duplicates(["model", "method", "bits", "task"])
    ev["metric"], ev["stderr"], ev["n"], ev["chance"] = "acc", 0.01, 100, 0.25
    keys = pd.DataFrame(list(itertools.product(cfg["models"], cfg["methods"], cfg["bits"])),
                        columns=["model", "method", "bits"])
    data = {"eval": ev,
            "stats": keys.assign(peak_mem_mb=1000.0, peak_mem_kind="cuda_max_allocated"),
            "memory": keys.assign(export_bytes=4.9e9, fp_bytes=15.9e9)}
    return {name: T.build_table(None,
                                {"table": {"name": name, **t}, "labels": display_labels(cfg),
                                 "fp_method": "fp"}, data)
            for name, t in cfg["tables"].items()}


def test_paper_tables_pass_the_strict_check_and_look_like_the_paper():
    """paper.yaml's labels and captions (issue 23: `\\textbf{FAIR-Calib}` and `w/o $\\lambda_0$`
    are latex_label now; `N_probe` in a caption broke LaTeX)."""
    tables = _paper_tables()
    for name, tex in tables.items():
        assert structural_errors(tex) == [], (name, structural_errors(tex))
    assert "& \\textbf{FAIR-Calib} & " in tables["main"]
    assert "\nw/o $\\lambda_0$ & " in tables["schedule"]
    assert "\nearly-boost & " in tables["schedule"]
    assert "\nFAIR-Calib & " in tables["components"]
