"""Labels are text a reader can tell apart, checked before any job (``references.check_labels``):
every label a table, figure or the console prints is non-empty, one line, without leading or
trailing whitespace or runs of spaces (``"FlatQuant "`` beside ``FlatQuant`` would print two
rows a reader cannot tell apart, and the duplicate check compares labels as written), and at most
:data:`LABEL_MAX` characters where it fills a table column; two tables never share a LaTeX
``label:`` (``\\ref`` would point at one of them). Errors are one line naming the key."""
from __future__ import annotations

from typing import Any, Iterator, Mapping

from fair_calib.config import ConfigError

# The longest plain-text label a table column holds: the main table (a table* in \small, two
# label columns beside up to 11 value columns, fair_calib/report/tables.py main_table) gives
# its model and method columns about a third of the page's text width; 40 characters of
# \small type are about 180 pt, a third of a two-column paper's 7-inch text width. The
# shipped configs' longest label has 35.
LABEL_MAX = 40
# Printed in a table column: held to LABEL_MAX. latex_label is LaTeX source, whose length is
# not its printed width; group names a block of rows.
COLUMN_KEYS = ("label",)
ENTRY_KEYS = ("label", "latex_label", "group")


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
    if column and len(value) > LABEL_MAX:
        return (f"config: {key} = {_shown(value)} is {len(value)} characters; a table column "
                f"holds at most {LABEL_MAX} (the main table's label column would run off the "
                "page): shorten it")
    return None


def _labels(cfg: Mapping[str, Any]) -> Iterator[tuple[str, Any, bool]]:
    """(key, value, fills a table column) of every printed label of the config."""
    for section in ("models", "methods", "tasks"):
        for name, entry in (cfg.get(section) or {}).items():
            for k in ENTRY_KEYS:
                if k in entry:
                    yield f"{section}.{name}.{k}", entry[k], k in COLUMN_KEYS
    for tname, t in (cfg.get("tables") or {}).items():
        for k in ("label", "fp_label", "header"):
            if k in t:
                yield f"tables.{tname}.{k}", t[k], k == "fp_label"
        for i, row in enumerate(t.get("rows") or []):
            if len(row) > 1:
                yield f"tables.{tname}.rows[{i}]", row[1], True


def check_label_text(cfg: Mapping[str, Any]) -> None:
    """Every label is plain one-line text (see the module docstring); no two tables share a
    LaTeX ``label:``."""
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
