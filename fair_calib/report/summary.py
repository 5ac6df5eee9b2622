"""What a finished run prints last: where the results are and the main table in plain text.

Called by the Snakefile's ``onsuccess`` (the main process only; never in a dry run or a
cluster job step). Reads only ``results/tables/<name>.tex`` / ``.parquet`` and the figure
folder: pyarrow, no pandas, matplotlib or torch, so it adds no noticeable time.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

from fair_calib.report.labels import plain_labels

WIDTH = 100        # wider than this, the summary keeps only the Avg. column
ERR_WORDS = {"se": "standard error over the items", "sd": "std over calibration seeds",
             "mixed": "standard error or std over seeds"}


def read_cells(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a table's cells Parquet (fair_calib.report.tables.CELL_COLUMNS)."""
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _cell(c: Mapping[str, Any] | None) -> str:
    if c is None or c.get("value") is None:
        return "--"
    s = f"{c['value']:.1f}"
    if c.get("err") is not None:
        s += f" ± {c['err']:.1f}"
    return s + ("*" if c.get("bold") else "")


def table_lines(cells: Sequence[Mapping[str, Any]], labels: Mapping[str, Mapping[str, str]],
                width: int = WIDTH) -> list[str]:
    """The main table as aligned plain text: one row per (model, method) in the table's order,
    one column per task and Avg.; only Avg. when all columns would not fit in ``width``."""
    rows = list(dict.fromkeys((c["model"], c["method"]) for c in cells))
    cols = list(dict.fromkeys(c["column"] for c in cells))
    at = {(c["model"], c["method"], c["column"]): c for c in cells}

    def render(columns):
        head = ["model", "method"] + [
            "Avg." if k == "avg" else labels.get("tasks", {}).get(k, k) for k in columns]
        body, last = [], None
        for model, method in rows:
            name = "Chance" if method == "chance" else labels.get("methods", {}).get(method, method)
            shown = labels.get("models", {}).get(model, model) if model != last else ""
            last = model
            body.append([shown, name] + [_cell(at.get((model, method, k))) for k in columns])
        widths = [max(len(r[j]) for r in [head] + body) for j in range(len(head))]
        return ["  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in [head] + body]

    lines = render(cols)
    if max(len(ln) for ln in lines) > width and "avg" in cols:
        lines = render(["avg"]) + ["(per-task columns: in the .tex)"]
    return lines


def summary(config: Mapping[str, Any], results: str | Path = "results",
            shown: str | Path | None = None) -> list[str]:
    """The lines printed at the end of a successful run; ``shown``: the results folder as the
    user names it (a config's own ``workdir``: runs/smoke/results), where it differs."""
    results = Path(results)
    name = Path(shown) if shown else results
    tables = [results / "tables" / f"{t}.tex" for t in (config.get("tables") or {})]
    tables = [t for t in tables if t.is_file()]
    figures = sorted((results / "figures").glob("*.png")) if (results / "figures").is_dir() else []
    if not tables and not figures:
        return []
    out = ["", "Results:"]
    if tables:
        out.append("  tables:  " + ", ".join(str(name / t.relative_to(results)) for t in tables)
                   + " (LaTeX; the cells with their ± in the .parquet beside each)")
    if figures:
        out.append(f"  figures: {name / 'figures'}/ ({len(figures)} figures: PDF and PNG, "
                   "each with its caption in a .txt)")
    main = results / "tables" / "main.parquet"
    if main.is_file() and (results / "tables" / "main.tex").is_file():
        cells = read_cells(main)
        if cells:
            t = (config.get("tables") or {}).get("main") or {}
            kinds = {c.get("err_kind") for c in cells if c.get("err_kind")}
            err = ERR_WORDS.get(kinds.pop() if len(kinds) == 1 else "mixed", "")
            out += ["", f"Main table ({str(t.get('bits', '')).upper()}, accuracy in %; ± {err};",
                    "* = bold in the table (best beyond the noise); Chance: the score of answering "
                    "without", "reading the question, as the table's caption explains):"]
            out += ["  " + ln for ln in table_lines(cells, plain_labels(config))]
    return out


def print_summary(config: Mapping[str, Any], results: str | Path = "results",
                  stream: TextIO | None = None, shown: str | Path | None = None) -> None:
    """Print :func:`summary`; a summary that fails never fails the finished run."""
    stream = stream or sys.stdout
    try:
        lines = summary(config, results, shown)
    except Exception as err:  # noqa: BLE001 - the run succeeded; say why there is no summary
        lines = [f"(no results summary: {type(err).__name__}: {err})"]
    for ln in lines:
        print(ln, file=stream)
