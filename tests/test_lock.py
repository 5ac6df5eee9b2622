"""The tested environment is pinned (requirements/lock.txt): every dependency pyproject names
is locked at a version its range admits, the lock's torch is the README's, and every install
command (README, .ci/run, environment.yml, docs/cluster.md) installs through the lock. Whether
the pins still resolve from the registries is requirements/check-lock's (network; .ci/run)."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
LOCK = "requirements/lock.txt"


def _lock() -> dict[str, Version]:
    pins = {}
    for line in (REPO / LOCK).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def _declared() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return reqs


def test_every_declared_dependency_is_locked_within_its_range():
    pins = _lock()
    for req in _declared():
        if req.marker is not None and not req.marker.evaluate():
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"{LOCK} does not pin {req.name} (pyproject: {req})"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{LOCK} pins {req.name}=={pins[name]}, outside pyproject's {req}")


def test_the_lock_pins_each_package_once_and_the_readmes_torch():
    lines = [l for l in (REPO / LOCK).read_text().splitlines() if l and not l.startswith("#")]
    names = [canonicalize_name(l.split("==")[0]) for l in lines]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[^=\s]+", l) for l in lines), lines
    readme_torch = re.search(r"pip install torch==([0-9.]+)", (REPO / "README.md").read_text())
    assert _lock()["torch"] == Version(readme_torch.group(1))


def test_every_install_command_goes_through_the_lock():
    readme = (REPO / "README.md").read_text()
    installs = re.findall(r"pip install [^\n`]*-e \"\.\[dev\]\"", readme)
    assert len(installs) >= 2 and all(f"-c {LOCK}" in i for i in installs), installs
    ci = (REPO / ".ci/run").read_text()
    assert f'pip install -q -c {LOCK} -e ".[dev]"' in ci and "requirements/check-lock" in ci
    assert f"-c {LOCK}" in (REPO / "environment.yml").read_text()
    assert f"-c {LOCK}" in (REPO / "docs/cluster.md").read_text()
