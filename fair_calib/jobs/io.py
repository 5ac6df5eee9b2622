"""Files between stages: atomic writes, Parquet with explicit schemas, safetensors, provenance.

Every stage meets the next only through files written here. A file is written to a temporary
name in the same folder and renamed into place, so an interrupted job never leaves a partial
output that Snakemake (or a resumed run) could take as complete.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping

# pyarrow is imported inside the Parquet functions: GPU benchmark scripts import stage code on
# machines that have torch but no pyarrow.

PROVENANCE_KEY = b"fair_calib.provenance"


class CorruptFileError(ValueError):
    """A file between stages that cannot be read (truncated, overwritten, not what its name
    says). The message names the file and the one command that regenerates it."""


def regenerate_hint(path: str | os.PathLike) -> str:
    # Snakemake's pre-flight check (fair_calib.jobs.preflight) moves a corrupt file under results/
    # aside by itself; one elsewhere (a model folder under resources/) must be deleted.
    return ("Run snakemake again: it moves a corrupt file under results/ aside (<name>.corrupt) "
            "and regenerates it and what depends on it; elsewhere delete it first: "
            f"rm -r {str(path)!r}")


def corrupt(path: str | os.PathLike, what: str, err: BaseException | str) -> CorruptFileError:
    detail = str(err).splitlines()[0] if str(err) else type(err).__name__
    return CorruptFileError(f"{path}: corrupt or truncated {what} ({detail}). "
                            f"{regenerate_hint(path)}")


def config_hash(obj: Any) -> str:
    """Stable short hash of a JSON-serialisable config section (key order does not matter)."""
    blob = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes (hex), read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def package_versions() -> dict[str, str]:
    """Versions of the packages whose behaviour changes numbers."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "tokenizers", "lm-eval", "fair-calib", "numpy", "pandas"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def provenance(config: Any, seed: int | None = None, **extra: Any) -> dict[str, Any]:
    """Provenance record stored in every output: config hash, the config itself, seed, versions."""
    rec = {
        "config_hash": config_hash(config),
        "config": config,
        "seed": seed,
        "versions": package_versions(),
    }
    rec.update(extra)
    return rec


def current_umask() -> int:
    """The process's umask (read by setting it and putting it back: there is no getter)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def give_umask_permissions(path: Path, folder: bool = False) -> None:
    """The permissions ``open()`` / ``mkdir()`` would have given: ``tempfile`` creates its
    files 0600 and folders 0700 (private by design), which would make every output unreadable
    to the colleagues a shared cluster filesystem's umask (022, 002) lets read it."""
    os.chmod(path, (0o777 if folder else 0o666) & ~current_umask())


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix or path.suffix + ".tmp",
                               dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        give_umask_permissions(tmp_path)
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; it replaces ``path`` only on success, so a
    killed job never leaves a half-written model folder that looks finished."""
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        # everything inside too: libraries write some files through private temporary files
        # (transformers' save_pretrained leaves model.safetensors 0600 whatever the umask)
        for folder, dirs, files in os.walk(tmp):
            for name in dirs:
                give_umask_permissions(Path(folder) / name, folder=True)
            for name in files:
                if not os.path.islink(os.path.join(folder, name)):
                    give_umask_permissions(Path(folder) / name)
        give_umask_permissions(tmp, folder=True)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise corrupt(path, "JSON file", err) from None


def write_parquet(df, path: str | os.PathLike, schema,
                  provenance: Mapping[str, Any] | None = None) -> None:
    """Write a pandas DataFrame with an explicit Arrow schema and provenance metadata.

    Columns missing from ``df`` or of a type that cannot be cast to the schema raise an error
    naming the column, instead of silently writing a differently-typed file.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    missing = [f.name for f in schema if f.name not in df.columns]
    if missing:
        raise ValueError(f"{path}: DataFrame lacks schema columns {missing}")
    try:
        table = pa.Table.from_pandas(df[[f.name for f in schema]], schema=schema,
                                     preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise ValueError(f"{path}: data does not match schema: {err}") from err
    meta = dict(table.schema.metadata or {})
    meta[PROVENANCE_KEY] = json.dumps(provenance or {}, sort_keys=True, default=str).encode()
    table = table.replace_schema_metadata(meta)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_parquet(path: str | os.PathLike):
    """Read a Parquet file written by :func:`write_parquet`; returns (DataFrame, provenance)."""
    import pyarrow.parquet as pq

    import pyarrow as pa

    if not Path(path).exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        table = pq.read_table(path)
        meta = table.schema.metadata or {}
        prov = json.loads(meta[PROVENANCE_KEY]) if PROVENANCE_KEY in meta else {}
    except (pa.ArrowException, OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise corrupt(path, "Parquet file", err) from None
    return table.to_pandas(), prov


def save_tensors(tensors: Mapping[str, Any], path: str | os.PathLike,
                 provenance: Mapping[str, Any] | None = None) -> None:
    """Save tensors to safetensors atomically, with provenance as JSON in the header metadata."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    meta = {"provenance": json.dumps(provenance or {}, sort_keys=True, default=str)}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)


def load_tensors(path: str | os.PathLike, device: str = "cpu"):
    """Load a safetensors file; returns (dict of tensors, provenance)."""
    from safetensors import safe_open

    from safetensors import SafetensorError

    if not Path(path).exists():
        raise FileNotFoundError(f"{path}: no such file")
    out = {}
    try:
        with safe_open(str(path), framework="pt", device=device) as f:
            meta = f.metadata() or {}
            for key in f.keys():
                out[key] = f.get_tensor(key)
        prov = json.loads(meta.get("provenance", "{}"))
    except (SafetensorError, json.JSONDecodeError, UnicodeDecodeError, OSError) as err:
        raise corrupt(path, "safetensors file", err) from None
    return out, prov
