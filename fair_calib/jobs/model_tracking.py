"""Weights changed in place, made visible to Snakemake before it plans (torch-free; the
Snakefile calls :func:`sync_models` at parse time, in the main process).

Snakemake compares modification times: a job reruns when an input is newer than its outputs.
A model folder is a directory, whose time Snakemake reads from its ``.snakemake_timestamp``
(written when the job that made it ended), so a ``model.safetensors`` rewritten in place (a
scaled tensor, a copy over it) leaves every job that read the old weights "up to date"; a
local folder (``source: /some/folder``) was no input at all.

Each run therefore records every local model's content (``content_id``: the weights' sha256,
cached by stat in ``~/.cache/fair_calib/sha256.json``) in ``resources/model_content/<model>.sha256``
and, where it differs from the record:

- a folder the pipeline writes (``source: train`` / ``convert``): when its weights changed
  after the job that wrote them ended (their newest ctime, which no ``touch -d`` or ``cp -p``
  sets back, is later than the folder's ``.snakemake_timestamp``), that timestamp is moved
  forward to it, so every job that reads the model replans; a retrain by its own job moves
  nothing;
- a local folder: the record itself is the jobs' input, rewritten with the new content id and
  dated by the weights' newest ctime, so the jobs that read it replan (Snakemake also compares
  the record's checksum: a touch alone reruns nothing).

A hub id is tracked by name: the hub cache's files are content-addressed, and a newer revision
is caught by the jobs (a calibration of other weights is refused, naming both sha256) and by
the table (cells of two weights of one model are refused, naming both).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

RECORD_DIR = "resources/model_content"
TIMESTAMP = ".snakemake_timestamp"


def record_path(model: str, record_dir: str | os.PathLike = RECORD_DIR) -> Path:
    return Path(record_dir) / f"{model}.sha256"


def weight_files(folder: str | os.PathLike) -> list[Path]:
    return sorted(Path(folder).glob("*.safetensors"))


def current_content(folder: str | os.PathLike) -> str | None:
    """The folder's content id (``sha256:...``); above the hashed size
    (``model_identity.HASHED_BYTES``) a ``stat:...`` id of its weight files' size, mtime, ctime
    and inode instead. None without weight files."""
    from fair_calib.jobs.model_identity import _stat_key, content_id

    files = weight_files(folder)
    if not files:
        return None
    cid = content_id(str(folder))
    if cid is not None:
        return cid
    lines = "".join(f"{p.name} {_stat_key(os.stat(p))}\n" for p in files)
    return f"stat:{hashlib.sha256(lines.encode()).hexdigest()}"


def _newest_ctime(folder: str | os.PathLike) -> float:
    return max(os.stat(p).st_ctime for p in weight_files(folder))


def _write_record(path: Path, content: str, when: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(content + "\n")
    os.utime(tmp, (when, when))
    os.replace(tmp, path)


def _trained_baseline(folder: Path) -> str | None:
    """What the training job recorded (``fair_calib.json``: ``model_sha256``), the baseline of a
    folder met for the first time."""
    try:
        sha = json.loads((folder / "fair_calib.json").read_text()).get("model_sha256")
    except (OSError, ValueError, AttributeError):
        return None
    return f"sha256:{sha}" if isinstance(sha, str) and len(sha) == 64 else None


@dataclass(frozen=True)
class Change:
    model: str
    folder: str
    old: str
    new: str

    def note(self) -> str:
        return (f"Note: models.{self.model}: the weights in {self.folder} changed in place "
                f"({self.old} -> {self.new}); every job that read them replans")


def sync_model(model: str, folder: str | os.PathLike, produced: bool,
               record_dir: str | os.PathLike = RECORD_DIR) -> Change | None:
    """Record ``folder``'s content and make a change visible to Snakemake (module docstring);
    returns the change where jobs that read the old weights now replan."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    new = current_content(folder)
    if new is None:
        return None
    rec = record_path(model, record_dir)
    old = rec.read_text(encoding="utf-8").strip() if rec.is_file() else None
    if old is None and produced:
        old = _trained_baseline(folder)
    if old == new and rec.is_file():
        return None
    when = _newest_ctime(folder)
    _write_record(rec, new, when)
    if old is None or old == new:
        return None
    if produced:
        stamp = folder / TIMESTAMP
        try:
            made = stamp.stat().st_mtime if stamp.exists() else folder.stat().st_mtime
        except OSError:
            return None
        if when <= made:      # rewritten by its own job (a retrain): nothing to replan
            return None
        os.utime(stamp if stamp.exists() else folder, (when, when))
    return Change(model, str(folder), old, new)


def sync_models(models: Iterable[tuple[str, str, bool]],
                record_dir: str | os.PathLike = RECORD_DIR) -> list[Change]:
    """:func:`sync_model` over (name, folder, produced by the pipeline) of the models in use."""
    out = []
    for model, folder, produced in models:
        change = sync_model(model, folder, produced, record_dir)
        if change is not None:
            out.append(change)
    return out


def mixed_weights(cells: Iterable[tuple[str, str, str | None]]) -> str | None:
    """A one-line error where the cells of one model (``(model, cell, content id)``) were
    computed on two different weights, naming both and a cell of each; None where they agree
    (cells without a recorded id are not compared)."""
    seen: dict[str, dict[str, str]] = {}
    for model, cell, content in cells:
        if content:
            seen.setdefault(model, {}).setdefault(content, cell)
    for model, by_content in sorted(seen.items()):
        if len(by_content) > 1:
            (a, ca), (b, cb) = list(by_content.items())[:2]
            return (f"model {model}: the table's cells come from two different weights: {ca} "
                    f"from {a}, {cb} from {b} (its weights changed between the jobs); rerun "
                    "snakemake, which replans every job that read the old weights")
    return None
