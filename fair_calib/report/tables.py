r"""LaTeX tables, generated from result files alone (eval Parquet, calibration stats, meta.json).

Every table follows the paper's layout (booktabs). A result that should be in a table but is
not found shows as ``--`` and is listed in a footnote under the table; nothing is dropped
silently. Accuracies are stored as fractions and printed as percentages with one decimal, the
precision of their ``±`` (:data:`DIGITS`; one rule for every accuracy cell, Chance included).

Labels: a ``label`` is plain text, printed as written (LaTeX specials ``% _ # & $ { } ~ ^ \``
escaped, :func:`latex_escape`); a ``latex_label`` is LaTeX, printed verbatim in its place
(``\textbf{FAIR-Calib}``, ``w/o $\lambda_0$``). Captions are LaTeX (a bare ``%`` is escaped).

Uncertainty: every accuracy cell carries a ``±`` (printed small, one decimal): lm-eval's
standard error of the mean over the evaluated items (the eval Parquet's ``stderr``), or, where a
cell has several eval rows told apart by a ``seed`` column (several calibration seeds), the mean
and the sample standard deviation over the seeds. Avg. propagates them as independent:
``sqrt(sum ±^2) / n_tasks``. Bold marks the best *quantized* value of a column (within each
model group for the family tables) only where it beats every other quantized value of the column
by more than ``Z * sqrt(±_best^2 + ±_other^2)`` (``Z`` = 1.96, a two-sided 95 % test of the
difference); otherwise nothing in the column is bold. The FP (and chance) rows never take part.
The caption says both conventions (:data:`CONVENTION`). Every table also returns its cells as a
frame (:data:`CELL_COLUMNS`), which the CLI writes beside the LaTeX (``--cells-out``).

``fair-calib report --settings JSON --inputs FILES... --table NAME --out FILE.tex``

Settings (JSON; every list keeps its order in the table)::

    {"models":  {"tiny-llada": {"label": "Tiny-LLaDA", "family": "LLaDA"}, ...}
                 (or a list of {"name", "label", "family"}),
     "methods": {"fp": {"label": "FP"},
                 "fair-calib": {"label": "FAIR-Calib", "latex_label": "\\textbf{FAIR-Calib}"}, ...},
     "tasks":   {"synth_mc": {"label": "SynthMC", "metric": "acc"}, ...},
     "bits": "w4a4",                 # the quantized setting of the main table
     "fp_method": "fp",              # default "fp"
     "chance": true,                 # main table: add a Chance row where eval rows carry chance
     "table": {...}}                 # options of the table asked for (below)

The workflow's form is accepted too: the grid (``models``, ``methods``, ``tasks``, ``bits``)
inside ``table`` (read before the top level), and ``labels: {"models": {name: label},
"groups": {model: family}, "methods": {...}, "tasks": {...}}``. Without ``--table`` the table
is ``table.kind`` / ``table.layout`` (``family`` -> main, ``average`` -> ablation, ``flat`` ->
W3A4/QDrop layout) / ``table.name`` when one of ``TABLES``, else ``main``.

``table`` options: ``model`` (ablation / w3a4 / qdrop tables: the one model), ``rows`` (list of
[method, plain-text label], or [method] for the method's own label, for ablation tables), ``methods`` (list of methods for w3a4 / qdrop),
``bits``, ``baseline`` and ``method`` (memory tables), ``caption``, ``label``, ``fp_label``.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

SHADE = r"\cellcolor{gray!20}"
MISSING = "--"
TABLES = ("main", "components", "nprobe", "schedule", "w3a4", "qdrop", "calib_memory",
          "deploy_memory")
METRIC_PREFERENCE = ("acc", "exact_match", "pass@1", "mc2", "acc_norm")
FILTER_PREFERENCE = ("none", "strict-match")
Z = 1.96  # bold only where the difference to every other quantized value exceeds Z noise units
CELLS_CONVENTION = (r"Cells: value{\scriptsize$\pm$s}, s = standard error over the evaluated"
                    r" items (lm-eval), or the standard deviation over calibration seeds where"
                    r" several ran; Avg.\ combines them as independent.")
CONVENTION = (CELLS_CONVENTION + r" Bold: best quantized method of a column,"
              r" only where it beats every other quantized method by more than"
              rf" ${Z}\sqrt{{s_1^2+s_2^2}}$.")
DIGITS = 1  # decimals of every accuracy cell and of its ± (percent; SEs here are >= ~0.3 points)
CHANCE_NOTE = (r"Chance: the score of answering without reading the question; on a multiple-choice"
               r" task, picking an option uniformly at random (the mean of 1/options over the"
               r" items); on an exact-match task, always giving the task's most frequent answer"
               r" where the task has a closed answer set (the embedded tasks), else 0.")
CELL_COLUMNS = ("table", "model", "method", "bits", "column", "value", "err", "err_kind",
                "n_seeds", "n_items", "bold", "arithmetic", "reference", "diff_ref", "p_ref",
                "mde_ref")
# Which arithmetic computed a quantized cell (the evaluation's record, evaluate/run.py): fake
# quantization (the reference, unmarked) or the real low-bit kernels on integer codes, marked.
INTEGER_ARITHMETIC = ("integer", "emulated", "mixed")
ARITH_MARK = "$^\\dagger$"
ARITH_NOTE = ("$^\\dagger$: computed on integer codes (the real low-bit kernels); unmarked "
              "quantized cells by fake quantization.")


# ----------------------------------------------------------------------------- helpers
def latex_escape(text: str) -> str:
    """Plain text -> LaTeX that prints it: ``% _ # & $ { } ~ ^ \\`` escaped (a ``%`` would
    comment out the rest of a row, ``&`` start a new cell)."""
    out = str(text).replace("\\", "\x00")
    for a, b in (("&", r"\&"), ("%", r"\%"), ("$", r"\$"), ("#", r"\#"), ("_", r"\_"),
                 ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}"),
                 ("^", r"\textasciicircum{}")):
        out = out.replace(a, b)
    return out.replace("\x00", r"\textbackslash{}")


def _label(labels: Mapping[str, Any], kind: str, name: str) -> str:
    """The LaTeX of a name's label: its ``latex_label`` verbatim, else its plain ``label`` (else
    the name) escaped."""
    entry = (labels.get(kind) or {}).get(name)
    if isinstance(entry, Mapping):
        if entry.get("latex_label"):
            return str(entry["latex_label"])
        entry = entry.get("label")
    return latex_escape(str(entry) if entry else name)


def _is_nan(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def pick_metric(eval_df: pd.DataFrame, task: str, labels: Mapping[str, Any],
                model: str | None = None) -> str | None:
    """The metric reported for ``task`` (of ``model``'s rows when given: one column may hold
    models scored by different recipes, e.g. OpenCompass's ``acc`` beside lm-eval's
    ``exact_match``): settings ``tasks.<task>.metric``, else the only metric of the task, else
    by ``METRIC_PREFERENCE`` on the metric name before the lm-eval filter (``"acc,none"`` ->
    ``acc``), filter ``none`` then ``strict-match`` first. Ambiguity raises."""
    entry = (labels.get("tasks") or {}).get(task)
    if isinstance(entry, Mapping) and entry.get("metric"):
        return str(entry["metric"])
    sel = eval_df["task"] == task
    if model is not None:
        sel &= eval_df["model"] == model
    metrics = sorted(eval_df.loc[sel, "metric"].unique())
    if not metrics:
        return None
    if len(metrics) == 1:
        return metrics[0]
    for pref in METRIC_PREFERENCE:
        cands = [m for m in metrics if m.split(",", 1)[0] == pref]
        if len(cands) == 1:
            return cands[0]
        for flt in FILTER_PREFERENCE:
            if f"{pref},{flt}" in cands:
                return f"{pref},{flt}"
        if cands:
            break
    raise ValueError(f"task {task!r}{'' if model is None else f' of model {model!r}'} has "
                     f"metrics {metrics}; name one in settings tasks.{task}.metric")


def other_filters(eval_df: pd.DataFrame, task: str, model: str, metric: str | None) -> list[str]:
    """The metrics of ``model``'s ``task`` rows that are ``metric`` under another lm-eval filter
    (GSM8K's ``exact_match,flexible-extract`` beside ``exact_match,strict-match``): what the
    authors' harness computes besides the reported number."""
    if metric is None or "," not in metric:
        return []
    name = metric.split(",", 1)[0]
    rows = eval_df.loc[(eval_df["task"] == task) & (eval_df["model"] == model), "metric"]
    return sorted(m for m in rows.unique() if m != metric and m.split(",", 1)[0] == name)


@dataclass
class Cell:
    """One table cell in percent: ``err`` is the ± (``err_kind`` "se": lm-eval standard error
    over items; "sd": standard deviation over ``n_seeds`` calibration seeds)."""
    value: float | None
    err: float | None = None
    err_kind: str = ""
    n_seeds: int = 1
    n_items: int | None = None


MISSING_CELL = Cell(None)


def _finite(x: Any) -> float | None:
    return None if _is_nan(x) else float(x)


def _aggregate(rows: pd.DataFrame, where: str) -> Cell:
    """The cell of one (model, method, bits, task): one eval row -> value ± stderr; several rows
    with distinct ``seed`` values -> mean ± sample std over seeds (ddof=1)."""
    n_items = _finite(rows["n"].iloc[0]) if "n" in rows.columns else None
    n_items = None if n_items is None else int(n_items)
    if len(rows) == 1:
        se = _finite(rows["stderr"].iloc[0]) if "stderr" in rows.columns else None
        return Cell(float(rows["value"].iloc[0]) * 100.0, None if se is None else se * 100.0,
                    "se" if se is not None else "", 1, n_items)
    if "seed" not in rows.columns or rows["seed"].nunique() != len(rows):
        raise ValueError(f"{len(rows)} eval rows for {where}: one expected per cell "
                         "(or one per calibration seed, told apart by a `seed` column)")
    v = rows["value"].to_numpy(dtype=np.float64) * 100.0
    return Cell(float(v.mean()), float(v.std(ddof=1)), "sd", len(v), n_items)


class _Cells:
    """Look-up of cells (value ± noise, percent) with a record of what was missing."""

    def __init__(self, eval_df: pd.DataFrame, labels: Mapping[str, Any]):
        self.df = eval_df
        self.labels = labels
        self._metric: dict[tuple[str, str], str | None] = {}
        self.missing: list[str] = []

    def metric(self, model: str, task: str) -> str | None:
        """The metric reported for ``model``'s ``task`` (:func:`pick_metric` over its rows)."""
        if (model, task) not in self._metric:
            self._metric[model, task] = pick_metric(self.df, task, self.labels, model)
        return self._metric[model, task]

    def get(self, model: str, method: str, bits: str | None, task: str,
            fp_method: str = "fp", metric: str | None = None, note: bool = True) -> Cell:
        """The cell of ``model``'s ``task`` (its reported metric, or ``metric``); a missing one
        is listed under the table unless ``note`` is off."""
        metric = metric or self.metric(model, task)
        rows = self.rows(model, method, bits, task, fp_method, metric)
        if rows.empty:
            extra = [bits] if (method != fp_method and bits is not None) else []
            if note:
                self.note(model, method, *extra, task)
            return MISSING_CELL
        return _aggregate(rows, f"{model}/{method}/{bits}/{task}")

    def rows(self, model: str, method: str, bits: str | None, task: str, fp_method: str,
             metric: str | None) -> pd.DataFrame:
        """The eval rows of one cell (one per seed), with a value."""
        d = self.df
        sel = (d["model"] == model) & (d["method"] == method) & (d["task"] == task)
        if metric is not None:
            sel &= d["metric"] == metric
        if method != fp_method and bits is not None:
            sel &= d["bits"] == bits
        return d.loc[sel & d["value"].notna()]

    def chance(self, task: str) -> Cell:
        if "chance" not in self.df.columns:
            return MISSING_CELL
        d = self.df.loc[self.df["task"] == task, "chance"].dropna()
        return MISSING_CELL if d.empty else Cell(float(d.iloc[0]) * 100.0)

    def note(self, *parts: str) -> None:
        self.missing.append(" / ".join(parts))


def _fmt(v: float | None, bold: bool = False, shade: bool = False, digits: int = DIGITS) -> str:
    s = MISSING if v is None else f"{v:.{digits}f}"
    if bold and v is not None:
        s = rf"\textbf{{{s}}}"
    return (SHADE + s) if shade else s


def _fmt_cell(c: Cell, bold: bool = False, shade: bool = False) -> str:
    r"""``70.0{\scriptsize$\pm$1.2}``, value and ± with :data:`DIGITS` decimals; the ± is left
    out where no noise estimate exists."""
    s = _fmt(c.value, bold=bold, shade=shade)
    if c.value is not None and c.err is not None:
        s += rf"{{\scriptsize$\pm${c.err:.{DIGITS}f}}}"
    return s


def _avg(cells: Sequence[Cell]) -> Cell:
    """Mean over tasks; the noise of independent cells combines as sqrt(sum err^2) / n."""
    if not cells or any(c.value is None for c in cells):
        return MISSING_CELL
    value = float(np.mean([c.value for c in cells]))
    if any(c.err is None for c in cells):
        return Cell(value)
    err = math.sqrt(sum(c.err ** 2 for c in cells)) / len(cells)
    kinds = {c.err_kind for c in cells}
    return Cell(value, err, kinds.pop() if len(kinds) == 1 else "mixed",
                min(c.n_seeds for c in cells))


def _beats(a: Cell, b: Cell, z: float = Z) -> bool:
    """``a`` exceeds ``b`` by more than the noise of their difference (unknown noise: 0)."""
    noise = math.sqrt((a.err or 0.0) ** 2 + (b.err or 0.0) ** 2)
    return a.value - b.value > z * noise


def _best(rows: Sequence[Sequence[Cell]], z: float = Z) -> list[set[int]]:
    """For each column, the row of the best value when it beats every other row's value by more
    than the noise (see :func:`_beats`); an empty set where no value is clearly best or the
    column has fewer than two values (a lone method has nothing to be best against)."""
    out = []
    ncol = len(rows[0]) if rows else 0
    for j in range(ncol):
        vals = [(i, r[j]) for i, r in enumerate(rows) if r[j].value is not None]
        if len(vals) < 2:
            out.append(set())
            continue
        top_i, top = max(vals, key=lambda iv: iv[1].value)
        clear = all(_beats(top, c, z) for i, c in vals if i != top_i)
        out.append({top_i} if clear else set())
    return out


def _records(table: str, model: str, method: str, bits: str | None, columns: Sequence[str],
             cells: Sequence[Cell], bold: set[int] | Sequence[bool] = (),
             arithmetic: str = "", against: Sequence[Any] = (),
             reference: str | None = None) -> list[dict]:
    """Rows of the cells frame (:data:`CELL_COLUMNS`) for one table row; ``against`` holds
    each column's paired comparison with ``reference`` (report/paired.py), where computed."""
    against = list(against) or [None] * len(columns)
    return [{"table": table, "model": model, "method": method, "bits": bits, "column": col,
             "value": c.value, "err": c.err, "err_kind": c.err_kind or None,
             "n_seeds": c.n_seeds, "n_items": c.n_items, "bold": j in bold,
             "arithmetic": arithmetic, "reference": reference if a is not None else None,
             "diff_ref": None if a is None else a.diff, "p_ref": None if a is None else a.p,
             "mde_ref": None if a is None else a.mde}
            for j, (col, c, a) in enumerate(zip(columns, cells, against))]


def arithmetic_of_row(eval_df: pd.DataFrame, model: str, method: str, bits: str | None) -> str:
    """The arithmetic of one table row's evaluations (``mixed`` where they differ; "" where
    the rows carry no record)."""
    if "arithmetic" not in eval_df.columns:
        return ""
    rows = eval_df[(eval_df["model"] == model) & (eval_df["method"] == method)]
    if bits is not None and "bits" in rows.columns:
        rows = rows[rows["bits"] == bits]
    names = sorted({str(a) for a in rows["arithmetic"] if isinstance(a, str) and a})
    return names[0] if len(names) == 1 else ("mixed" if names else "")


def _with_convention(caption: str | None) -> str:
    return f"{caption} {CONVENTION}" if caption else CONVENTION


def _footnote(missing: Sequence[str]) -> str:
    if not missing:
        return ""
    items = "; ".join(latex_escape(m) for m in missing)
    return ("\\par\\smallskip{\\footnotesize Missing results (shown as --): " + items + ".}\n")


def _wrap(body: str, caption: str | None, label: str | None, env: str | None,
          pre: str = "") -> str:
    if env is None:
        return body
    head = f"\\begin{{{env}}}[t]\n\\centering\n"
    if caption:
        head += f"\\caption{{{caption}}}\n"
    if label:
        head += f"\\label{{{label}}}\n"
    return head + pre + body + f"\\end{{{env}}}\n"


# ----------------------------------------------------------------------------- paired tests
PAIRED_CONVENTION = (r"Bold: best quantized method of a column, only where a paired test over"
                     r" the same items and the calibration seeds (two-sided, 5\,\%) finds it"
                     r" above every other quantized method; $^{\uparrow}$/$^{\downarrow}$:"
                     r" significantly above/below {ref} in the same test.")


class _PairedScores:
    """Per-item scores of a table's runs, for paired tests (report/paired.py)."""

    def __init__(self, cells: "_Cells", fp_method: str):
        self.cells = cells
        self.fp_method = fp_method
        self._cache: dict[tuple, list[list[np.ndarray]] | None] = {}

    def runs(self, model: str, method: str, bits: str | None, tasks: Sequence[str]):
        """[per seed: [per task: item scores]], or None where a run or its records are missing."""
        key = (model, method, bits, tuple(tasks))
        if key not in self._cache:
            self._cache[key] = self._load(model, method, bits, tasks)
        return self._cache[key]

    def _load(self, model, method, bits, tasks):
        from .paired import item_scores

        if "path" not in self.cells.df.columns:
            return None
        per_seed: dict[int, list[np.ndarray]] = {}
        for task in tasks:
            metric = self.cells.metric(model, task)
            rows = self.cells.rows(model, method, bits, task, self.fp_method, metric)
            if rows.empty:
                return None
            for _, r in rows.iterrows():
                seed = int(r["seed"]) if "seed" in rows.columns and not _is_nan(r["seed"]) else 0
                per_seed.setdefault(seed, []).append(item_scores(r["path"], metric))
        runs = [per_seed[k] for k in sorted(per_seed)]
        return runs if all(len(r) == len(tasks) for r in runs) else None

    def compare(self, model, a, b, bits_of, tasks):
        from .paired import compare

        ra, rb = self.runs(model, a, bits_of(a), tasks), self.runs(model, b, bits_of(b), tasks)
        return None if ra is None or rb is None else compare(ra, rb)


def _paired_best(model: str, quant: Sequence[str], qvals, columns, column_tasks,
                 paired: _PairedScores, bits_of) -> list[set[int]]:
    """Per column, the row whose value a paired test finds above every other row's."""
    out = []
    for j, _col in enumerate(columns):
        vals = [(i, r[j]) for i, r in enumerate(qvals) if r[j].value is not None]
        if len(vals) < 2:
            out.append(set())
            continue
        top_i, _ = max(vals, key=lambda iv: iv[1].value)
        tests = [paired.compare(model, quant[top_i], quant[i], bits_of, column_tasks[j])
                 for i, _ in vals if i != top_i]
        clear = all(t is not None and t.significant and t.diff > 0 for t in tests)
        out.append({top_i} if clear else set())
    return out


def _direction_mark(test) -> str:
    if test is None or not test.significant:
        return ""
    return "$^{\\uparrow}$" if test.diff > 0 else "$^{\\downarrow}$"


def _mde_note(model_label: str, tests: Sequence[Any], reference_label: str) -> str:
    mdes = [t.mde for t in tests if t is not None]
    if not mdes:
        return ""
    return (f"{latex_escape(model_label)}: a paired difference of {min(mdes):.1f}--{max(mdes):.1f}"
            f" points against {reference_label} is detected with 80\\,\\% power"
            " (two-sided 5\\,\\%).")


# ----------------------------------------------------------------------------- main tables
def main_table(eval_df: pd.DataFrame, models: Sequence[str], methods: Sequence[str],
               tasks: Sequence[str], labels: Mapping[str, Any], *, bits: str | None = None,
               fp_method: str = "fp", chance: bool = True, caption: str | None = None,
               label: str | None = None, env: str | None = "table*",
               records: list[dict] | None = None, name: str = "main",
               method_bits: Mapping[str, str] | None = None, significance: str = "unpaired",
               reference: str | None = None) -> str:
    """One family table (paper Tables 1-2): a ``\\multirow`` group per model, the FP row shaded
    on every cell, then (when ``chance`` and eval rows carry it) an unshaded Chance row, then
    the quantized methods at ``bits``; per-task columns and Avg. (mean over tasks, ``--`` when
    any task is missing; no Avg. for a single task, which it would repeat). Cells carry their ± and bold follows the noise rule (module
    docstring); ``records`` (a list) receives the cells frame's rows.

    ``labels`` has ``models`` / ``methods`` / ``tasks`` name -> label (or {"label": ...}), and
    optionally ``tasks.<t>.metric``. Quantized rows need ``bits`` when eval_df holds several;
    ``method_bits`` (method -> bits) gives single rows their own (QDLM's grid: W4A16 GPTQ next
    to W8A8 SmoothQuant and W4A4 FlatQuant).

    ``significance: paired`` (the bench) replaces the noise rule by paired tests over the same
    items and the seeds (report/paired.py): bold where the best row is significantly above
    every other, an arrow where a row is significantly above or below ``reference``, and a
    note of the minimum detectable difference against it.
    """
    if significance not in ("unpaired", "paired"):
        raise ValueError(f"table {name!r}: significance must be 'unpaired' or 'paired', got "
                         f"{significance!r}")
    bits_of = dict(method_bits or {})
    cells = _Cells(eval_df, labels)
    records = [] if records is None else records
    with_avg = len(tasks) > 1
    columns = list(tasks) + (["avg"] if with_avg else [])
    quant = [m for m in methods if m != fp_method]
    show_chance = chance and any(cells.chance(t).value is not None for t in tasks)
    ncol = len(columns)
    lines = [
        "{\\renewcommand{\\arraystretch}{0.92}",
        "\\setlength{\\tabcolsep}{3.7pt}",
        "\\small",
        "\\begin{tabular}{ll" + "c" * ncol + "}",
        "\\toprule",
        " & ".join(["\\textbf{Model}", "\\textbf{Method}"]
                   + [f"\\textbf{{{_label(labels, 'tasks', t)}}}" for t in tasks]
                   + (["\\textbf{Avg.}"] if with_avg else [])) + " \\\\",
    ]

    def row_cells(model, method):
        vals = [cells.get(model, method, bits_of.get(method, bits), t, fp_method) for t in tasks]
        return vals + ([_avg(vals)] if with_avg else [])

    paired = _PairedScores(cells, fp_method) if significance == "paired" else None
    if paired is not None and reference is not None and reference not in quant:
        raise ValueError(f"table {name!r}: reference {reference!r} is not one of its quantized "
                         f"methods {quant}")
    ref = reference or (quant[0] if quant else None)
    column_tasks = [[t] for t in tasks] + ([list(tasks)] if with_avg else [])
    bits_fn = lambda m: bits_of.get(m, bits)  # noqa: E731
    mde_notes = []
    marked = False
    for model in models:
        lines.append("\\midrule")
        mlabel = _label(labels, "models", model)
        nrows = (1 if fp_method in methods else 0) + (1 if show_chance else 0) + len(quant)
        lines.append(f"\\multirow{{{nrows}}}{{*}}{{\\textbf{{{mlabel}}}}}")
        if fp_method in methods:
            vals = row_cells(model, fp_method)
            row = [SHADE + _label(labels, "methods", fp_method)] + [_fmt_cell(v, shade=True) for v in vals]
            lines.append("& " + " & ".join(row) + " \\\\")
            records += _records(name, model, fp_method, "fp", columns, vals)
        if show_chance:
            cv = [cells.chance(t) for t in tasks]
            cv += [_avg(cv)] if with_avg else []
            lines.append("& " + " & ".join(["Chance"] + [_fmt_cell(v) for v in cv]) + " \\\\")
            records += _records(name, model, "chance", None, columns, cv)
        qvals = [row_cells(model, m) for m in quant]
        best = (_best(qvals) if paired is None else
                _paired_best(model, quant, qvals, columns, column_tasks, paired, bits_fn))
        model_tests = []
        for i, m in enumerate(quant):
            bold = {j for j in range(ncol) if i in best[j]}
            arith = arithmetic_of_row(eval_df, model, m, bits_of.get(m, bits))
            mark = ARITH_MARK if arith in INTEGER_ARITHMETIC else ""
            marked = marked or bool(mark)
            against = ([paired.compare(model, m, ref, bits_fn, ct) if m != ref else None
                        for ct in column_tasks] if paired is not None else [])
            model_tests += [t for t in against if t is not None]
            row = [_label(labels, "methods", m)]
            row += [_fmt_cell(v, bold=j in bold) + (mark if v.value is not None else "")
                    + (_direction_mark(against[j]) if against else "")
                    for j, v in enumerate(qvals[i])]
            lines.append("& " + " & ".join(row) + " \\\\")
            records += _records(name, model, m, bits_of.get(m, bits), columns, qvals[i], bold,
                                arith, against, ref if against else None)
        if paired is not None:
            mde_notes.append(_mde_note(_label(labels, "models", model), model_tests,
                                       _label(labels, "methods", ref)))
    lines += ["\\bottomrule", "\\end{tabular}}"]
    also = _also_reported(cells, models, [m for m in methods if m == fp_method] + quant, tasks,
                          labels, lambda m: bits_of.get(m, bits), fp_method)
    notes = " ".join(n for n in mde_notes if n)
    body = ("\n".join(lines) + "\n" + _footnote(cells.missing) + also
            + (f"\\par\\smallskip{{\\footnotesize {notes}}}\n" if notes else ""))
    convention = (_with_convention(caption) if paired is None else
                  (f"{caption} " if caption else "") + CELLS_CONVENTION + " "
                  + PAIRED_CONVENTION.replace("{ref}", _label(labels, "methods", ref)))
    full = (convention + (" " + CHANCE_NOTE if show_chance else "")
            + (" " + ARITH_NOTE if marked else ""))
    return _wrap(body, full, label, env)


def _also_reported(cells: _Cells, models: Sequence[str], methods: Sequence[str],
                   tasks: Sequence[str], labels: Mapping[str, Any], bits_of, fp_method: str) -> str:
    """A note under the table with the values of every metric the authors' harness computes
    beside the reported one (:func:`other_filters`; Dream's and LLaDA-Base's GSM8K report
    lm-eval's ``strict-match`` and compute ``flexible-extract`` too), per model and method."""
    items = []
    for task in tasks:
        for model in models:
            for metric in other_filters(cells.df, task, model, cells.metric(model, task)):
                vals = [(m, cells.get(model, m, bits_of(m), task, fp_method, metric, note=False))
                        for m in methods]
                shown = ", ".join(f"{_label(labels, 'methods', m)} {_fmt_cell(c)}"
                                  for m, c in vals if c.value is not None)
                if shown:
                    items.append(f"{_label(labels, 'tasks', task)}, "
                                 f"{_label(labels, 'models', model)}, "
                                 f"{latex_escape(metric.replace(',', ' '))}: {shown}")
    if not items:
        return ""
    return ("\\par\\smallskip{\\footnotesize Also computed by the authors' harness, beside the "
            "metric shown: " + "; ".join(items) + ".}\n")


# ----------------------------------------------------------------------------- ablations
def average_table(eval_df: pd.DataFrame, model: str, rows: Sequence[tuple[str, str]],
                  tasks: Sequence[str], labels: Mapping[str, Any], *, bits: str | None = None,
                  header: str = "Method", fp_method: str = "fp", caption: str | None = None,
                  label: str | None = None, env: str | None = "table",
                  records: list[dict] | None = None, name: str = "ablation") -> str:
    """Ablation table (components, N_probe, lambda0 schedule): one row per (method, row label)
    with the average accuracy over ``tasks`` on ``model`` (± and bold as in the module
    docstring). A method with any task missing shows ``--`` and its missing tasks go to the
    footnote."""
    cells = _Cells(eval_df, labels)
    records = [] if records is None else records
    avgs = [[_avg([cells.get(model, method, bits, t, fp_method) for t in tasks])]
            for method, _ in rows]
    best = _best(avgs)[0] if avgs else set()
    lines = ["\\small", "\\begin{tabular}{lc}", "\\toprule",
             f"\\textbf{{{header}}} & \\textbf{{Avg.}} \\\\", "\\midrule"]
    for i, (method, rlabel) in enumerate(rows):
        lines.append(f"{rlabel} & {_fmt_cell(avgs[i][0], bold=i in best)} \\\\")
        records += _records(name, model, method, bits, ["avg"], avgs[i], {0} if i in best else set())
    lines += ["\\bottomrule", "\\end{tabular}"]
    body = "\n".join(lines) + "\n" + _footnote(cells.missing)
    return _wrap(body, _with_convention(caption), label, env)


def flat_table(eval_df: pd.DataFrame, model: str, methods: Sequence[str], tasks: Sequence[str],
               labels: Mapping[str, Any], *, bits: str | None = None, fp_method: str = "fp",
               fp_label: str = "Real-valued", caption: str | None = None,
               label: str | None = None, env: str | None = "table",
               records: list[dict] | None = None, name: str = "flat") -> str:
    """Single-model comparison (W3A4 and QDrop-style W8A8 tables): FP row ("Real-valued") then
    ``methods`` at ``bits``; task columns and AVG; ± and bold as in the module docstring."""
    cells = _Cells(eval_df, labels)
    records = [] if records is None else records
    columns = list(tasks) + ["avg"]
    lines = ["\\setlength{\\tabcolsep}{3.5pt}", "\\small", "\\resizebox{\\linewidth}{!}{",
             "\\begin{tabular}{l" + "c" * (len(tasks) + 1) + "}", "\\toprule",
             " & ".join(["\\textbf{Method}"]
                        + [f"\\textbf{{{_label(labels, 'tasks', t)}}}" for t in tasks]
                        + ["\\textbf{AVG}"]) + " \\\\", "\\midrule"]

    def row_vals(method):
        vals = [cells.get(model, method, bits, t, fp_method) for t in tasks]
        return vals + [_avg(vals)]

    fp_vals = row_vals(fp_method)
    lines.append(" & ".join([latex_escape(fp_label)] + [_fmt_cell(v) for v in fp_vals]) + " \\\\")
    records += _records(name, model, fp_method, "fp", columns, fp_vals)
    quant = [m for m in methods if m != fp_method]
    qvals = [row_vals(m) for m in quant]
    best = _best(qvals)
    for i, m in enumerate(quant):
        bold = {j for j in range(len(columns)) if i in best[j]}
        lines.append(" & ".join([_label(labels, "methods", m)]
                                + [_fmt_cell(v, bold=j in bold) for j, v in enumerate(qvals[i])])
                     + " \\\\")
        records += _records(name, model, m, bits, columns, qvals[i], bold)
    lines += ["\\bottomrule", "\\end{tabular}", "}"]
    body = "\n".join(lines) + "\n" + _footnote(cells.missing)
    return _wrap(body, _with_convention(caption), label, env)


# ----------------------------------------------------------------------------- memory
UNRECORDED_MEASURE = ("not recorded (stats written before the measure was recorded; "
                      "calibrate again to measure it)")


def memory_measure_note(kinds: Sequence[str | None]) -> str:
    """The caption's sentence on what the memory cells measure, one clause per measure used
    (fair_calib.jobs.memory.MEASURES; None: an older stats file that did not record it)."""
    from fair_calib.jobs.memory import MEASURES

    used = sorted({k for k in kinds if k is not None} & set(MEASURES))
    used += sorted({k for k in kinds if k is not None} - set(MEASURES))
    clauses = [MEASURES.get(k, k) for k in used] + ([UNRECORDED_MEASURE] if None in kinds else [])
    return "Peak memory in MB (2$^{20}$ bytes), measured as " + "; ".join(
        latex_escape(c) for c in clauses) + "."


def calib_memory_table(stats_df: pd.DataFrame, models: Sequence[str], baseline: str, method: str,
                       labels: Mapping[str, Any], *, bits: str | None = None,
                       caption: str | None = None, label: str | None = None,
                       env: str | None = "table") -> str:
    """Peak calibration memory (MB; max of ``peak_mem_mb`` over a run's stats rows) of the
    baseline and FAIR-Calib per model, and Reduction = baseline / FAIR-Calib. The caption ends
    with what was measured (``peak_mem_kind``, :func:`memory_measure_note`); a Reduction between
    two runs measured differently is not printed (--), as the numbers do not compare.

    ``stats_df`` columns: model, method, bits, peak_mem_mb, and peak_mem_kind where recorded."""
    missing: list[str] = []
    kinds: list[str | None] = []

    def peak(model, m):
        sel = (stats_df["model"] == model) & (stats_df["method"] == m)
        if bits is not None:
            sel &= stats_df["bits"] == bits
        v = stats_df.loc[sel, "peak_mem_mb"].dropna()
        if v.empty:
            missing.append(f"{model} / {m}" + (f" / {bits}" if bits else ""))
            return None, None
        kind = (stats_df.loc[v.idxmax(), "peak_mem_kind"]
                if "peak_mem_kind" in stats_df.columns else None)
        kind = None if _is_nan(kind) else kind
        kinds.append(kind)
        return float(v.max()), kind

    lines = ["\\setlength{\\tabcolsep}{6pt}", "\\small", "\\begin{tabular}{lccc}", "\\toprule",
             f"\\textbf{{Model}} & \\textbf{{{_label(labels, 'methods', baseline)} (MB)}} & "
             f"\\textbf{{{_label(labels, 'methods', method)} (MB)}} & \\textbf{{Reduction}} \\\\",
             "\\midrule"]
    for model in models:
        (b, bkind), (f, fkind) = peak(model, baseline), peak(model, method)
        comparable = b is not None and f and bkind == fkind and bkind is not None
        red = f"{b / f:.2f}$\\times$" if comparable else MISSING
        lines.append(f"{_label(labels, 'models', model)} & {_fmt(b, digits=0)} & "
                     f"{_fmt(f, digits=0)} & {red} \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    note = memory_measure_note(kinds) if kinds else ""
    full = f"{caption} {note}".strip() if caption else note
    return _wrap("\n".join(lines) + "\n" + _footnote(missing), full or None, label, env)


def deploy_memory_table(mem_df: pd.DataFrame, models: Sequence[str], method: str,
                        labels: Mapping[str, Any], *, bits: str | None = None,
                        caption: str | None = None, label: str | None = None,
                        env: str | None = "table") -> str:
    """Deployment memory of FP vs. the quantized export of ``method`` and the saving FP/method.

    ``mem_df`` columns: model, method, bits, export_bytes, fp_bytes (from each calibration run's
    meta.json). Sizes print in GB (1e9 bytes) when the largest FP size is at least 1 GB, else
    in MB (1e6 bytes)."""
    missing: list[str] = []
    rows = []
    for model in models:
        sel = (mem_df["model"] == model) & (mem_df["method"] == method)
        if bits is not None:
            sel &= mem_df["bits"] == bits
        r = mem_df.loc[sel]
        if r.empty or _is_nan(r["export_bytes"].iloc[0]) or _is_nan(r["fp_bytes"].iloc[0]):
            missing.append(f"{model} / {method}" + (f" / {bits}" if bits else ""))
            rows.append((model, None, None))
        else:
            rows.append((model, float(r["fp_bytes"].iloc[0]), float(r["export_bytes"].iloc[0])))
    top = max([fp for _, fp, _ in rows if fp is not None], default=0.0)
    unit, scale = ("GB", 1e9) if top >= 1e9 else ("MB", 1e6)
    lines = ["\\setlength{\\tabcolsep}{8pt}", "\\small", "\\begin{tabular}{lccc}", "\\toprule",
             f"\\textbf{{Model}} & \\textbf{{FP ({unit})}} & "
             f"\\textbf{{{_label(labels, 'methods', method)} ({unit})}} & \\textbf{{Memory saving}} \\\\",
             "\\midrule"]
    for model, fp, ex in rows:
        sv = f"{fp / ex:.2f}$\\times$" if fp is not None and ex else MISSING
        lines.append(f"{_label(labels, 'models', model)} & "
                     f"{_fmt(None if fp is None else fp / scale, digits=2)} & "
                     f"{_fmt(None if ex is None else ex / scale, digits=2)} & {sv} \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return _wrap("\n".join(lines) + "\n" + _footnote(missing), caption, label, env)


# ----------------------------------------------------------------------------- inputs
def _names(section: Any) -> list[str]:
    if section is None:
        return []
    if isinstance(section, Mapping):
        return list(section)
    return [s["name"] if isinstance(s, Mapping) else str(s) for s in section]


def _as_map(section: Any) -> dict[str, Any]:
    if section is None:
        return {}
    if isinstance(section, Mapping):
        return dict(section)
    return {s["name"]: s for s in section if isinstance(s, Mapping)}


def labels_from_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """name -> {"label", "family", "metric"} maps of models / methods / tasks, merged from the
    top-level sections and from ``labels`` (name -> label strings, ``groups``: model -> family)
    as the workflow's table rule passes them."""
    out: dict[str, Any] = {}
    extra = settings.get("labels") or {}
    for k in ("models", "methods", "tasks"):
        merged: dict[str, dict[str, Any]] = {}
        for name, entry in _as_map(settings.get(k)).items():
            merged[name] = dict(entry) if isinstance(entry, Mapping) else {"label": str(entry)}
        for name, lab in (extra.get(k) or {}).items():
            e = merged.setdefault(name, {})
            if isinstance(lab, Mapping):
                e.update(lab)
            else:
                e.setdefault("label", str(lab))
        out[k] = merged
    for name, group in (extra.get("groups") or {}).items():
        out["models"].setdefault(name, {}).setdefault("family", str(group))
    for name, e in out["models"].items():
        if "family" not in e and "group" in e:
            e["family"] = e["group"]
    return out


def _escape_percent(text: str | None) -> str | None:
    """Captions are LaTeX, but a bare % (as in "accuracy, %") would comment the line out."""
    import re

    return None if text is None else re.sub(r"(?<!\\)%", r"\\%", str(text))


def _row(row: Any, labels: Mapping[str, Any]) -> tuple[str, str]:
    """An ablation row of the settings: [method, plain-text label] (escaped), or [method] / a
    bare method name for the method's own label (its ``latex_label`` where it has one)."""
    if isinstance(row, str) or len(row) == 1:
        method = row if isinstance(row, str) else row[0]
        return str(method), _label(labels, "methods", str(method))
    return str(row[0]), latex_escape(str(row[1]))


LAYOUTS = {"family": "main", "average": "components", "flat": "w3a4"}


def resolve_table(name: str | None, settings: Mapping[str, Any]) -> str:
    """Which table to build: ``--table``, else ``table.kind`` / ``table.layout`` / ``table.name``
    of the settings (``family`` -> main, ``average`` -> ablation, ``flat`` -> w3a4 layout)."""
    if name:
        return name
    opts = settings.get("table") or {}
    for key in ("kind", "layout", "name"):
        v = opts.get(key)
        if v in TABLES:
            return v
        if v in LAYOUTS:
            return LAYOUTS[v]
    return "main"


def _key3(path: Path) -> tuple[str, str, str]:
    """(model, method, bits) of results/calib/{model}/{method}/{bits}/<file>."""
    return path.parent.parent.parent.name, path.parent.parent.name, path.parent.name


SEED_SEP = "@s"  # the workflow names a method's calibration-seed runs `method@s<k>`


def split_seed(df: pd.DataFrame) -> pd.DataFrame:
    """Eval rows of a seeded run (method `fair-calib@s1`) -> method `fair-calib`, seed 1."""
    if "seed" in df.columns or not df["method"].str.contains(SEED_SEP, regex=False).any():
        return df
    parts = df["method"].str.split(SEED_SEP, n=1, expand=True, regex=False)
    seed = pd.to_numeric(parts[1], errors="raise") if parts.shape[1] > 1 else None
    return df.assign(method=parts[0], seed=seed)


def load_inputs(paths: Sequence[str | Path]) -> dict[str, pd.DataFrame]:
    """Sort input files into eval rows, calibration stats and export sizes.

    * ``*.parquet`` with a ``task`` column: eval rows;
    * ``*.parquet`` with ``peak_mem_mb``: calibration stats at results/calib/M/X/B/stats.parquet;
    * ``*.json`` with ``export_bytes``: a calibration meta.json at results/calib/M/X/B/meta.json
      (keys ``export_bytes`` and ``fp_bytes``), or a list/table of such records carrying
      model/method/bits; ``*.parquet`` with ``export_bytes``: such a table.
    """
    from fair_calib.jobs.io import read_json, read_parquet

    evals, stats, mems, weights = [], [], [], []
    for p in map(Path, paths):
        if p.suffix == ".json":
            obj = read_json(p)
            recs = obj if isinstance(obj, list) else [obj]
            for r in recs:
                if "export_bytes" not in r:
                    continue
                m, x, b = (r.get("model"), r.get("method"), r.get("bits"))
                if m is None:
                    m, x, b = _key3(p)
                mems.append({"model": m, "method": x, "bits": b,
                             "export_bytes": r.get("export_bytes"), "fp_bytes": r.get("fp_bytes", r.get("fp_bf16_bytes"))})
            continue
        df, prov = read_parquet(p)
        if "task" in df.columns:
            evals.append(split_seed(df.assign(arithmetic=_eval_arithmetic(p, prov), path=str(p))))
            # the weights each cell was computed on (evaluate/run.py), compared below
            weights += [(m, str(p), prov.get("model_content")) for m in df["model"].unique()]
        elif "peak_mem_mb" in df.columns:
            m, x, b = _key3(p)
            stats.append(df.assign(model=m, method=x, bits=b))
        elif "export_bytes" in df.columns:
            mems.append(df)
        else:
            raise ValueError(f"{p}: not an eval, calibration-stats or export-size file")

    from fair_calib.jobs.model_tracking import mixed_weights

    mixed = mixed_weights(weights)
    if mixed:
        raise ValueError(mixed)

    def cat(frames, cols):
        flat = [f if isinstance(f, pd.DataFrame) else pd.DataFrame([f]) for f in frames]
        return pd.concat(flat, ignore_index=True) if flat else pd.DataFrame(columns=cols)

    return {"eval": cat(evals, ["model", "method", "bits", "task", "metric", "value", "chance"]),
            "stats": cat(stats, ["model", "method", "bits", "peak_mem_mb", "peak_mem_kind"]),
            "memory": cat(mems, ["model", "method", "bits", "export_bytes", "fp_bytes"])}


def _eval_arithmetic(eval_path: Path, prov: Mapping[str, Any]) -> str:
    """The arithmetic an evaluation recorded: its Parquet file's provenance (evaluate/run.py),
    else its raw JSON records (an eval file whose provenance lacks the key)."""
    if "arithmetic" in prov:
        return str(prov["arithmetic"])
    from fair_calib.evaluate.run import arithmetic_of, run_per_docs

    return arithmetic_of(*run_per_docs(eval_path))


def build_table(name: str | None, settings: Mapping[str, Any],
                data: Mapping[str, pd.DataFrame], records: list[dict] | None = None) -> str:
    """The LaTeX of table ``name`` (one of ``TABLES``; None: from the settings, see
    :func:`resolve_table`) from loaded inputs and settings. The grid (``models``, ``methods``,
    ``tasks``, ``bits``) is read from ``settings.table`` first, then from the top level.
    ``records`` (a list) receives the accuracy tables' cells (:data:`CELL_COLUMNS`)."""
    name = resolve_table(name, settings)
    records = [] if records is None else records
    tname = str((settings.get("table") or {}).get("name") or name)
    if name not in TABLES:
        raise ValueError(f"unknown table {name!r}; one of {TABLES}")
    labels = labels_from_settings(settings)
    opts = dict(settings.get("table") or {})
    fp = opts.get("fp_method", settings.get("fp_method", "fp"))

    def grid(key):
        return _names(opts[key]) if key in opts else _names(settings.get(key))

    models, methods, tasks = grid("models"), grid("methods"), grid("tasks")
    bits = opts.get("bits", settings.get("bits"))
    cap, lab = _escape_percent(opts.get("caption")), opts.get("label")
    chance = bool(opts.get("chance", settings.get("chance", True)))
    ev = data["eval"]
    if name == "main":
        families: dict[str, list[str]] = {}
        for m in models:
            families.setdefault(str(labels["models"].get(m, {}).get("family", "")), []).append(m)
        parts = []
        for fam, ms in families.items():
            efam = latex_escape(fam)
            fcap = (f"{cap} ({efam} family)" if cap and len(families) > 1 else cap) or (
                f"\\textbf{{{latex_escape((bits or '').upper())} results on the {efam} family.}} "
                "Accuracy (\\%). Higher is better.")
            slug = "".join(ch if ch.isalnum() else "_" for ch in fam.lower()) or "all"
            # the table's own name in its label: two tables of kind main (main, prior_ablation)
            # never share one \label
            own = "".join(ch if ch.isalnum() else "_" for ch in tname)
            flab = lab or f"tab:{own}_{slug}"
            if lab and len(families) > 1:
                flab = f"{lab}_{slug}"
            parts.append(main_table(ev, ms, methods, tasks, labels, bits=bits, fp_method=fp,
                                    chance=chance, caption=fcap, label=flab, records=records,
                                    name=tname, method_bits=opts.get("method_bits"),
                                    significance=str(opts.get("significance", "unpaired")),
                                    reference=opts.get("reference")))
        return "\n".join(parts)
    model = opts.get("model") or (models[0] if models else None)
    if name in ("components", "nprobe", "schedule"):
        header = (latex_escape(opts["header"]) if opts.get("header") else
                  {"components": "Method", "nprobe": "$N_{probe}$",
                   "schedule": "$\\lambda_0$ schedule"}[name])
        rows = [_row(r, labels) for r in opts.get("rows", [])] or \
            [(m, _label(labels, "methods", m)) for m in methods if m != fp]
        return average_table(ev, model, rows, tasks, labels, bits=bits, header=header,
                             fp_method=fp, caption=cap, label=lab, records=records, name=tname)
    if name in ("w3a4", "qdrop"):
        return flat_table(ev, model, methods, tasks, labels, bits=bits, fp_method=fp,
                          fp_label=opts.get("fp_label", "Real-valued"), caption=cap, label=lab,
                          records=records, name=tname)
    if name == "calib_memory":
        return calib_memory_table(data["stats"], models, opts["baseline"], opts["method"], labels,
                                  bits=bits, caption=cap, label=lab)
    method = opts.get("method") or next((m for m in methods if m != fp), None)
    return deploy_memory_table(data["memory"], models, method, labels, bits=bits, caption=cap,
                               label=lab)


def cells_frame(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The cells of a table as a frame with :data:`CELL_COLUMNS` (empty for memory tables)."""
    return pd.DataFrame(list(records), columns=list(CELL_COLUMNS))


def cells_schema():
    import pyarrow as pa

    return pa.schema([("table", pa.string()), ("model", pa.string()), ("method", pa.string()),
                      ("bits", pa.string()), ("column", pa.string()), ("value", pa.float64()),
                      ("err", pa.float64()), ("err_kind", pa.string()), ("n_seeds", pa.int64()),
                      ("n_items", pa.int64()), ("bold", pa.bool_()),
                      ("arithmetic", pa.string()), ("reference", pa.string()),
                      ("diff_ref", pa.float64()), ("p_ref", pa.float64()),
                      ("mde_ref", pa.float64())])


def run_cli(argv: Sequence[str]) -> None:
    from fair_calib.jobs.io import provenance, write_parquet, write_text

    ap = argparse.ArgumentParser(prog="fair-calib report")
    ap.add_argument("--settings", required=True, help="JSON (module docstring)")
    ap.add_argument("--inputs", nargs="+", required=True,
                    help="eval parquets, calib stats.parquet, calib meta.json")
    ap.add_argument("--table", choices=TABLES, default=None,
                    help="default: settings table.kind / table.layout / table.name, else main")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells-out", default=None,
                    help="Parquet of the printed cells: value, ± (err, err_kind), bold")
    a = ap.parse_args(list(argv))
    settings = json.loads(a.settings)
    records: list[dict] = []
    tex = build_table(a.table, settings, load_inputs(a.inputs), records)
    name = resolve_table(a.table, settings)
    write_text(a.out, f"% generated by fair-calib report (table {name}); do not edit\n" + tex)
    if a.cells_out:
        write_parquet(cells_frame(records), a.cells_out, cells_schema(), provenance(settings))
