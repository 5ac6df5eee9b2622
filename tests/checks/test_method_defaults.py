"""A job's settings hold its method's resolved values (fair_calib/checks/method_defaults.py): writing a
documented default explicitly (``flatquant-seeds: {alpha: 0.3}``, ``gptq: {arithmetic:
authors}``) gives the same settings, hence reruns nothing."""
from __future__ import annotations

import inspect
import re
import sys

import pytest

from fair_calib.checks.method_defaults import METHOD_DEFAULTS, resolved_method
from fair_calib.names.registry import METHOD_TYPES, method_setting_names

_GET = re.compile(r'\b(?:self\.cfg|c)\.get\("(\w+)",\s*([^()]+?)\)')


def _read_defaults(method_type: str) -> dict:
    """The defaults a method class reads (``cfg.get(key, default)``), the most derived class's
    winning, for the keys its type may hold; a key read with two defaults in one class is left
    out (then it cannot be one table entry, and the comparison below fails)."""
    from fair_calib.methods import REGISTRY

    allowed = set(method_setting_names(method_type))
    out: dict = {}
    for klass in reversed(REGISTRY[method_type].__mro__):
        if not klass.__module__.startswith("fair_calib"):
            continue
        own: dict = {}
        for m in _GET.finditer(inspect.getsource(klass)):
            own.setdefault(m.group(1), set()).add(repr(eval(m.group(2), vars(sys.modules[klass.__module__]))))
        for key, values in own.items():
            if key in allowed:
                out[key] = eval(next(iter(values))) if len(values) == 1 else "<ambiguous>"
    return out


@pytest.mark.parametrize("method_type", METHOD_TYPES)
def test_the_defaults_are_those_the_methods_read(method_type):
    import json

    # as the job's settings hold them (JSON: a tuple default is a list there)
    assert json.dumps(METHOD_DEFAULTS.get(method_type, {}), sort_keys=True) == \
        json.dumps(_read_defaults(method_type), sort_keys=True)


@pytest.mark.parametrize("entry", [
    {"type": "flatquant", "alpha": 0.3},                # config/README's own default
    {"type": "flatquant", "alpha": .3, "epochs": 15.0},
    {"type": "gptq", "arithmetic": "authors"},
    {"type": "fair_calib", "prior": "default", "weighting": "prior", "shuffle": False},
])
def test_writing_a_default_gives_the_same_settings(entry):
    written = {k: v for k, v in entry.items() if k not in ("type", "prior")}
    bare = {k: v for k, v in entry.items() if k not in written}
    assert resolved_method(entry) == resolved_method(bare)
    assert repr(resolved_method(entry)) == repr(resolved_method(bare))   # the params' JSON


def test_another_value_gives_other_settings():
    assert resolved_method({"type": "flatquant", "alpha": 0.5}) != resolved_method({"type": "flatquant"})
    assert resolved_method({"type": "rtn", "export": 1})["export"] == 1   # not True: not the default


def test_the_workflow_passes_resolved_methods():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "workflow/rules/common.smk").read_text()
    assert "resolved_method(" in text


def test_a_tiny_models_train_defaults_are_resolved_too():
    from fair_calib.checks.method_defaults import resolved_train

    assert resolved_train({"lr": 0.005, "layers": 4.0, "steps": 1500}) == resolved_train(None)
    assert resolved_train({"hidden": 64})["hidden"] == 64
    assert repr(resolved_train({"layers": 4.0})) == repr(resolved_train({}))
