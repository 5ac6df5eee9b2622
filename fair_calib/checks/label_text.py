"""Labels are text a reader can tell apart, checked before any job (``references.check_labels``):
every label a table, figure or the console prints is non-empty, one line, without leading or
trailing whitespace or runs of spaces (``"FlatQuant "`` beside ``FlatQuant`` would print two
rows a reader cannot tell apart, and the duplicate check compares labels as written), and at most
:data:`LABEL_MAX` characters where it fills a table column; two tables never share a LaTeX
``label:`` (``\\ref`` would point at one of them). Errors are one line naming the key."""
from __future__ import annotations

from typing import Any, Iterator, Mapping

from fair_calib.checks.config import ConfigError

# The longest plain-text label a table column holds: the main table (a table* in \small, two
# label columns beside up to 11 value columns, fair_calib/report/tables.py main_table) gives
# its model and method columns about a third of the page's text width; 40 characters of
# \small type are about 180 pt, a third of a two-column paper's 7-inch text width. The
# shipped configs' longest label has 35.
LABEL_MAX = 40
# Printed in a table column (where the entry is in a table): held to LABEL_MAX, counted as
# printed (:func:`printed_length`: a combining accent adds nothing; latex_label without its
# commands, braces and math shifts). group names a block of rows.
COLUMN_KEYS = ("label", "latex_label")
ENTRY_KEYS = ("label", "latex_label", "group")
# The table kinds that print a `header` (the ablations' label column) and an `fp_label`.
HEADER_KINDS = ("components", "nprobe", "schedule")
FP_LABEL_KINDS = ("w3a4", "qdrop")


def printed_length(text: str, latex: bool = False) -> int:
    """The characters ``text`` prints: combining marks (an accent written as its own code
    point) add none; in LaTeX (``latex``), commands (``\\textbf``), braces, ``$``, ``^`` and
    ``_`` none, an escaped character (``\\%``) one."""
    import re
    import unicodedata

    if latex:
        text = re.sub(r"\\([^A-Za-z])", r"\1", re.sub(r"\\[A-Za-z]+\*?\s*", "", text))
        text = re.sub(r"[{}$^_]", "", text)
    return sum(1 for c in text if not unicodedata.combining(c))


def _shown(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:60] + "...")


def text_problem(key: str, value: Any, column: bool) -> str | None:
    """Why a label at ``key`` is not plain one-line text a reader can tell apart, else None."""
    if not isinstance(value, str):
        return None                      # the schema names a label of another type
    if not value.strip():
        return (f"config: {key} = {value!r} is empty; give it text, or leave the key out "
                "(the entry's name is printed)")
    if any(c in value for c in "\n\r\t\v\f") or not value.isprintable():
        return (f"config: {key} = {_shown(value)} is not one line of text (a line break or "
                "control character would break the table's LaTeX and the console's lines)")
    if value != value.strip():
        return (f"config: {key} = {value!r} has leading or trailing whitespace; write "
                f"{value.strip()!r} (labels that differ only in spaces print alike)")
    if "  " in value:
        return (f"config: {key} = {value!r} has a run of spaces, which LaTeX prints as one; "
                f"write {' '.join(value.split())!r} (labels that differ only in spaces print "
                "alike)")
    n = printed_length(value, latex=key.endswith("latex_label"))
    if column and n > LABEL_MAX:
        return (f"config: {key} = {_shown(value)} prints {n} characters; a table column "
                f"holds at most {LABEL_MAX} (the main table's label column would run off the "
                "page): shorten it")
    return None


def in_tables(cfg: Mapping[str, Any]) -> dict[str, set]:
    """The models, methods and tasks some table prints (the prior ablation's included)."""
    out: dict[str, set] = {"models": set(), "methods": set(), "tasks": set()}
    for t in (cfg.get("tables") or {}).values():
        out["models"].update(t.get("models") or [])
        out["models"].update([t["model"]] if t.get("model") else [])
        out["methods"].update(t.get("methods") or [])
        out["methods"].update(t[k] for k in ("baseline", "method") if t.get(k))
        out["methods"].update(row[0] for row in t.get("rows") or [] if row)
        out["tasks"].update(t.get("tasks") or [])
    ab = cfg.get("prior_ablation") or {}
    if ab.get("enabled", True) and ab.get("models"):
        out["models"].update(ab.get("models") or [])
        out["methods"].update(list(ab.get("methods") or []) + list(ab.get("floors") or []))
        out["methods"].update(m for m, e in (cfg.get("methods") or {}).items()
                              if e.get("type") == "fp")
        out["tasks"].update([ab["task"]] if ab.get("task") else [])
    return out


def _labels(cfg: Mapping[str, Any]) -> Iterator[tuple[str, Any, bool]]:
    """(key, value, fills a table column) of every printed label of the config."""
    tabled = in_tables(cfg)
    for section in ("models", "methods", "tasks"):
        for name, entry in (cfg.get(section) or {}).items():
            for k in ENTRY_KEYS:
                if k in entry:
                    yield (f"{section}.{name}.{k}", entry[k],
                           k in COLUMN_KEYS and name in tabled[section])
    for tname, t in (cfg.get("tables") or {}).items():
        for k in ("label", "fp_label", "header"):
            if k in t:
                yield f"tables.{tname}.{k}", t[k], k in ("fp_label", "header")
        for i, row in enumerate(t.get("rows") or []):
            if len(row) > 1:
                yield f"tables.{tname}.rows[{i}]", row[1], True


def check_label_text(cfg: Mapping[str, Any]) -> None:
    """Every label is plain one-line text (see the module docstring); no two tables share a
    LaTeX ``label:``."""
    for tname, t in (cfg.get("tables") or {}).items():
        for key, kinds in (("header", HEADER_KINDS), ("fp_label", FP_LABEL_KINDS)):
            if key in t and t.get("kind") not in kinds:
                raise ConfigError(
                    f"config: tables.{tname}.{key} is printed only by tables of kind "
                    f"{', '.join(kinds)}; a table of kind {t.get('kind')} prints it nowhere: "
                    "leave it out")
    for key, value, column in _labels(cfg):
        problem = text_problem(key, value, column)
        if problem:
            raise ConfigError(problem)
    seen: dict[str, str] = {}
    for tname, t in (cfg.get("tables") or {}).items():
        if "label" not in t:
            continue
        if t["label"] in seen:
            raise ConfigError(f"config: tables.{seen[t['label']]}.label and tables.{tname}.label "
                              f"are both {t['label']!r}; a LaTeX \\ref to it would point at one "
                              "of the two tables. Give each table its own label.")
        seen[t["label"]] = tname
