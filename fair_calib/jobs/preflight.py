"""Before any job: corrupt or truncated intermediates are moved aside, so they are redone.

Outputs are written atomically (``io.atomic_path``), so a file under its final name is complete
unless something outside the pipeline broke it: a full disk during a copy, a partial rsync, a
file overwritten by hand. Snakemake sees only that the file exists and would keep it; the job
that reads it then fails. :func:`move_aside_corrupt` checks the intermediates under ``results/``
cheaply (Parquet footer, safetensors header against the file size, JSON of ``meta.json``) and
renames each broken one to ``<name>.corrupt`` (never deleted: it may be the only copy of hours
of work), so Snakemake finds the output missing and reruns exactly the job that writes it and
what depends on it, where a requested output needs it (an intermediate whose dependents are
intact and up to date is not needed, as for a deleted one). A calibration cell's completion
marker (``meta.json``, written last; evaluation and the diagnostics depend on it alone) is moved
aside, to ``meta.json.incomplete``, with a corrupt ``params.safetensors`` or ``stats.parquet``
of its cell, or where one is missing (moved aside by an earlier run, deleted by hand): the cell
is then unfinished, so naming its ``meta.json``, or anything that reads the cell, recalibrates
it. The Snakefile calls it at parse time, in the main process
only; a dry run (``-n``) only lists what a run would move (:func:`corrupt_intermediates`).

Calibration's per-block files (``blocks/<i>.safetensors``) are not outputs of any rule; the
calibration job itself discards an unreadable one and recomputes from it
(``fair_calib.calibrate``), so they are left alone here.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

CHECKED_SUFFIXES = (".parquet", ".safetensors")
CHECKED_NAMES = ("meta.json",)   # calibration's completion marker, read by evaluation
MARKER = "meta.json"             # a calibration cell's completion marker ...
MARKED = ("params.safetensors", "stats.parquet")   # ... of these outputs of its job
SKIPPED_FOLDERS = ("blocks",)    # calibration resumes from these; it checks them itself


def parquet_problem(path: Path) -> str | None:
    """Why a Parquet file is unreadable (its footer holds the schema and row groups: a
    truncated or overwritten file has none), else None."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pq.read_metadata(path)
    except (pa.ArrowException, OSError) as err:
        return str(err).splitlines()[0] if str(err) else type(err).__name__
    return None


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is unreadable: its 8-byte header length, JSON header and the
    tensors' byte ranges must account for exactly the file's size (a truncated file is
    shorter), else None. Reads the header only."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than the 8-byte header length"
        n = int.from_bytes(head, "little")
        if n > size - 8:
            return f"header of {n} bytes runs past the end of the {size}-byte file"
        try:
            header = json.loads(f.read(n))
            ends = [entry["data_offsets"][1] for key, entry in header.items()
                    if key != "__metadata__"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "header is not a safetensors JSON header"
    expected = 8 + n + max(ends, default=0)
    if expected != size:
        return f"{size} bytes where its header accounts for {expected}"
    return None


def json_problem(path: Path) -> str | None:
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        return str(err).splitlines()[0]
    return None


def problem_of(path: Path) -> str | None:
    """Why an intermediate is corrupt or truncated, else None (also for a type not checked)."""
    if path.suffix == ".parquet":
        return parquet_problem(path)
    if path.suffix == ".safetensors":
        return safetensors_problem(path)
    if path.name in CHECKED_NAMES:
        return json_problem(path)
    return None


def intermediates(root: Path) -> Iterator[Path]:
    """The files under ``root`` that stages write and read, in a stable order. Hidden names are
    a job's temporary files being written (``io.atomic_path``) and are skipped."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_FOLDERS and not d.startswith("."))
        for name in sorted(files):
            if not name.startswith(".") and (name.endswith(CHECKED_SUFFIXES)
                                             or name in CHECKED_NAMES):
                yield Path(folder) / name


def aside_name(path: Path, suffix: str = ".corrupt") -> Path:
    """``<name>.corrupt``, or ``<name>.corrupt-2``, ... when an earlier one is kept there."""
    target = path.with_name(path.name + suffix)
    k = 2
    while target.exists():
        target = path.with_name(f"{path.name}{suffix}-{k}")
        k += 1
    return target


def corrupt_intermediates(root: str | os.PathLike = "results") -> list[tuple[Path, Path, str]]:
    """(file, where it would go, why) for every corrupt intermediate under ``root``, and for
    the completion marker of a cell with a corrupt or missing output (``meta.json`` ->
    ``meta.json.incomplete``). Moves nothing."""
    found: list[tuple[Path, Path, str]] = []
    root = Path(root)
    if not root.is_dir():
        return found
    for path in intermediates(root):
        why = problem_of(path)
        if why is not None:
            found.append((path, aside_name(path), why))
        if path.name in MARKED + (MARKER,):
            found += _stale_marker(path.with_name(MARKER), found)
    return found


def _stale_marker(marker: Path, found: list) -> list[tuple[Path, Path, str]]:
    """The marker of a cell whose outputs are not all there and readable (one already moved
    aside by an earlier run included), unless it is listed already or is itself corrupt."""
    if not marker.is_file() or any(p == marker for p, _, _ in found) or problem_of(marker):
        return []
    listed = {p for p, _, _ in found}
    for name in MARKED:
        sibling = marker.with_name(name)
        state = "corrupt" if sibling in listed else None if sibling.is_file() else "missing"
        if state:
            return [(marker, aside_name(marker, ".incomplete"),
                     f"the completion marker of its cell, whose {name} is {state}")]
    return []


def move_aside_corrupt(root: str | os.PathLike = "results") -> list[tuple[Path, Path, str]]:
    """Rename every corrupt intermediate under ``root`` (and its cell's completion marker) as
    :func:`corrupt_intermediates` lists them; returns that list."""
    moved = corrupt_intermediates(root)
    for path, target, _ in moved:
        os.replace(path, target)
    return moved


def report_line(path: Path, target: Path, why: str, dry_run: bool = False) -> str:
    """The Note for one moved file (``dry_run``: one a run would move)."""
    # Snakemake regenerates a missing intermediate only where a requested output needs it (as
    # it does for temp files): a broken probe shard under an intact prior stays aside.
    move = (f"a run (without -n) moves it aside to {target.name}; this command moved nothing, "
            "and a plan it shows leaves out the jobs that follow from it" if dry_run
            else f"moved it aside to {target.name}")
    if target.name.startswith(f"{MARKER}.incomplete"):
        return (f"Note: {path} is {why}; {move}. The cell will be recalibrated where a requested "
                f"output needs it (naming this {MARKER} does).")
    return (f"Note: {path} is corrupt or truncated ({why}); {move}. It will be regenerated, with "
            "what depends on it, where a requested output needs it.")


# Commands that only show the workflow (its plan, graph, summary): they move nothing aside
INSPECTING = ("--dry-run", "--dryrun", "-n", "--summary", "-S", "--detailed-summary", "-D",
              "--dag", "--rulegraph", "--filegraph", "--d3dag", "--list-changes", "--lc",
              "--list-rules", "--list", "-l", "--list-target-rules", "--lt", "--lint",
              "--unlock", "--cleanup-metadata", "--cm", "--list-untracked", "--lu")


def inspecting(argv, dry_run: bool) -> bool:
    """Whether this Snakemake command only inspects (``dry_run``: Snakemake's own reading of
    ``-n``, also inside ``-np``)."""
    return dry_run or any(a.split("=", 1)[0] in INSPECTING for a in argv)


def lock_note(lock_dir: str, unlock: str) -> str:
    """The Note for a directory another Snakemake run holds (or a killed one left locked)."""
    return (f"Note: another Snakemake run holds the lock on this directory ({lock_dir}). Wait for "
            "it to finish; do not rerun with --rerun-incomplete (its jobs' outputs are "
            "incomplete because they are being written). If no other run is active (a killed "
            f"run left the lock behind), `{unlock}` removes it.")


def unlock_command(configfiles, config_args, start_dir: str, directory: str | None) -> str:
    """``snakemake --unlock`` with the run's own config files, ``--config`` and ``--directory``:
    the lock is in the config's ``workdir`` (``runs/smoke/.snakemake/`` for smoke.yaml), which
    a plain ``snakemake --unlock`` (the default config) does not touch."""
    import shlex

    def shown(path):
        rel = os.path.relpath(os.path.abspath(path), start_dir)
        return str(path) if rel.startswith("..") else rel

    words = ["snakemake", "--unlock"]
    if directory:
        words += ["--directory", shown(directory)]
    if configfiles:
        words += ["--configfile", *[shown(f) for f in configfiles]]
    if config_args:
        words += ["--config", *config_args]
    return " ".join(shlex.quote(w) for w in words)


def unknown_table_target(targets, tables) -> str | None:
    """A requested ``results/tables/<name>.tex`` (or ``.parquet``) whose name is not a table of
    the config, named with the tables there are (one line; None when every target is known)."""
    import re

    for target in sorted(targets):
        m = re.fullmatch(r"(?:\./)?results/tables/([^/]+)\.(tex|parquet)", str(target))
        if m and m.group(1) not in tables:
            known = ", ".join(f"results/tables/{t}.{m.group(2)}" for t in tables)
            return (f"target {target}: this config has no table {m.group(1)!r}; its tables are "
                    f"{known} (`snakemake` alone builds all of them)")
    return None


def file_in_model_folder(targets, models) -> str | None:
    """A requested file inside a model folder the pipeline writes whole
    (``resources/models/<m>/model.safetensors``: a directory output, which Snakemake cannot
    target file by file), named with the folder to target instead (one line)."""
    import re

    for target in sorted(map(str, targets)):
        m = re.fullmatch(r"(?:\./)?resources/(models|hub)/([^/]+)/(.+)", target)
        if not m:
            continue
        folder = f"resources/{m.group(1)}/{m.group(2)}"
        source = (models.get(m.group(2)) or {}).get("source")
        writes = {"models": "train", "hub": "convert"}[m.group(1)]
        if source != writes:
            known = sorted(k for k, v in models.items() if v.get("source") == writes)
            return (f"target {target}: this config has no model {m.group(2)!r} with source: "
                    f"{writes}, which would write {folder}; those it has: {known}")
        return (f"target {target} is a file inside the model folder {folder}, which its job "
                f"writes whole: target the folder (snakemake ... {folder})")
    return None


def incomplete_outputs(snakemake_dir: str = ".snakemake") -> list[str]:
    """The outputs Snakemake marks incomplete (``.snakemake/incomplete/``: a job started and its
    end was never recorded), decoded from the markers' names."""
    from base64 import urlsafe_b64decode

    root = os.path.join(snakemake_dir, "incomplete")
    out = []
    for path, _, files in os.walk(root):
        for name in files:
            if name == "migration_underway":
                continue
            parts = os.path.relpath(os.path.join(path, name), root).split(os.sep)
            try:
                out.append(urlsafe_b64decode("".join(p.lstrip("@") for p in parts)).decode())
            except (ValueError, UnicodeDecodeError):
                continue
    return sorted(out)


def incomplete_note(files: list[str], unlock: str | None = None) -> str | None:
    """The Note for outputs an earlier run left marked incomplete while no run holds the lock
    (it ended before recording them: a full disk, a killed Snakemake): redoing them is safe."""
    if not files:
        return None
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    return (f"Note: {len(files)} output{'s' * (len(files) != 1)} of an earlier run {'are' if len(files) != 1 else 'is'} marked "
            f"incomplete ({shown}): that run ended before recording {'them' if len(files) != 1 else 'it'} (a full disk, "
            "a killed Snakemake). No run holds the lock now, so add --rerun-incomplete to redo "
            "them: it is safe here (the lock Note's warning is for a run still writing them)")
