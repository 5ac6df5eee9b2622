"""The `lm_eval.models` entry point pyproject.toml declares (issue 32) resolves to the registered
class. lm-eval 0.4.13 does not read the group (tests/cli/test_generate_cli.py)."""
from __future__ import annotations

import importlib.metadata as md
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GROUP = "lm_eval.models"


def _declared() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project.get("entry-points", {}).get(GROUP, {})


def test_pyproject_declares_the_model_and_it_resolves_to_the_class():
    from lm_eval.api.registry import get_model

    from fair_calib.evaluate.lm import DiffusionLM

    declared = _declared()
    assert declared == {"fair_calib_dlm": "fair_calib.evaluate.lm:DiffusionLM"}
    loaded = md.EntryPoint(name="fair_calib_dlm", value=declared["fair_calib_dlm"], group=GROUP).load()
    assert loaded is DiffusionLM and get_model("fair_calib_dlm") is DiffusionLM


def test_installed_metadata_carries_it():
    """The installed distribution's entry points (pip install -e . writes them); skipped where
    the installed metadata predates the declaration (an editable install of another checkout)."""
    try:
        dist = md.distribution("fair-calib")
    except md.PackageNotFoundError:
        pytest.skip("fair-calib is not installed (only imported from the checkout)")
    found = {ep.name: ep.value for ep in dist.entry_points if ep.group == GROUP}
    if not found:
        pytest.skip(f"the installed fair-calib metadata ({dist.locate_file('')}) has no {GROUP} "
                    "entry points: installed before pyproject.toml declared them; "
                    "`pip install -e .` refreshes it")
    assert found == _declared()
