"""Display names of a config's models, methods and tasks, for tables, figures and the console.

A ``label`` is plain text: the tables escape it for LaTeX, figures and the console print it as
written. A ``latex_label`` (optional) is LaTeX that the tables print instead. Both are display
only. No heavy imports: the Snakefile reads these while planning.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

SECTIONS = ("models", "methods", "tasks")


def display(entry: Mapping[str, Any], name: str) -> dict[str, str]:
    """``{"label": ..., "latex_label": ...}`` of one config entry (latex_label only where set)."""
    out = {"label": str(entry.get("label", name))}
    if entry.get("latex_label"):
        out["latex_label"] = str(entry["latex_label"])
    return out


def display_labels(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The ``labels`` settings of the table rule: name -> display() per section, and ``groups``
    (model -> its table block)."""
    out: dict[str, dict[str, Any]] = {
        k: {name: display(entry or {}, name) for name, entry in (config.get(k) or {}).items()}
        for k in SECTIONS}
    out["groups"] = {k: v.get("group", v.get("label", k))
                     for k, v in (config.get("models") or {}).items()}
    return out


def plain_labels(config: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """name -> plain-text label per section (figures, console)."""
    return {k: {name: str((entry or {}).get("label", name))
                for name, entry in (config.get(k) or {}).items()} for k in SECTIONS}


def prior_labels(config: Mapping[str, Any], methods: Sequence[str]) -> dict[str, str]:
    """Plain-text legend names of the priors ``methods`` calibrate with: "prior of FAIR-Calib"
    (priors have no label of their own; their config keys are not for readers)."""
    users: dict[str, list[str]] = {}
    for m in methods:
        entry = (config.get("methods") or {}).get(m) or {}
        if entry.get("prior"):
            users.setdefault(str(entry["prior"]), []).append(str(entry.get("label", m)))
    return {p: "prior of " + " / ".join(dict.fromkeys(labs)) for p, labs in users.items()}
