"""What a checkpoint's weights are, as one string: a calibration belongs to the weights it was
made on, not to their path (a model retrained at the same path, or its file changed in place,
must not take the old one's calibration).

``content_id(source)``: ``sha256:<hex>``, the sha256 of ``model.safetensors`` for a one-file
checkpoint, else the sha256 of the lines ``<file> <sha256>`` of its ``*.safetensors`` shards.
A file's sha256 is computed from its bytes (never read from a side file such as a trained tiny
model's ``fair_calib.json``, which an edit of the weights leaves as it was) and kept in a cache
(:func:`hash_cache_path`) under the file's size, mtime, ctime and inode: an unchanged file is
not read again, a file whose stat differs in any of them is. A shard in the Hugging Face cache
is named by its sha256 (huggingface_hub checks it on download) and is not read. Files outside
the cache are hashed up to ``HASHED_BYTES`` together. None where the id cannot be known
cheaply: a hub id not in the local cache, or a large checkpoint outside the cache. No heavy
imports."""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

HASHED_BYTES = 2 * 2**30       # hashing more would cost an evaluation job seconds to minutes
HASH_CACHE_ENV = "FAIR_CALIB_HASH_CACHE"
_BLOB = re.compile(r"[0-9a-f]{64}")


def _folder(source: str) -> Path | None:
    path = Path(source)
    if path.is_dir():
        return path
    if source.count("/") != 1:
        return None
    try:              # a hub id: its snapshot in the local cache, if there is one
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for name in ("model.safetensors.index.json", "model.safetensors"):
        hit = try_to_load_from_cache(source, name)
        if isinstance(hit, str):
            return Path(hit).parent
    return None


def _read_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def hash_cache_path() -> Path:
    """``$FAIR_CALIB_HASH_CACHE``, else ``$XDG_CACHE_HOME/fair_calib/sha256.json`` (default
    ``~/.cache``): one JSON file per user, shared by every job of the machine."""
    env = os.environ.get(HASH_CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fair_calib" / "sha256.json"


def _stat_key(st: os.stat_result) -> list[int]:
    # size and mtime change with any write; ctime and inode too, and cannot be set back by hand
    # (touch -d, cp -p and rsync -t restore an mtime), nor does a replaced file keep its inode
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _load_cache(path: Path) -> dict:
    try:
        files = json.loads(path.read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return {}
    return files if isinstance(files, dict) else {}


def _store(path: Path, real: str, key: list[int], sha: str) -> None:
    """Add one entry (and drop those of files gone since) by an atomic replace; a cache that
    cannot be written (a read-only home) only costs the next job a re-read."""
    import tempfile

    files = {p: e for p, e in _load_cache(path).items() if os.path.exists(p)}
    files[real] = {"stat": key, "sha256": sha}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"files": files}, f)
        os.replace(tmp, path)
    except OSError:
        pass


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 (hex) of a file's bytes, from the cache when the file's stat is the one recorded
    with it, else read (and then recorded, unless the file changed while it was read)."""
    real = os.path.realpath(path)
    key = _stat_key(os.stat(real))
    cache = hash_cache_path()
    hit = _load_cache(cache).get(real)
    if isinstance(hit, dict) and hit.get("stat") == key and _BLOB.fullmatch(str(hit.get("sha256"))):
        return hit["sha256"]
    sha = _read_sha256(Path(real))
    if _stat_key(os.stat(real)) == key:
        _store(cache, real, key, sha)
    return sha


def content_id(source: str | os.PathLike) -> str | None:
    folder = _folder(str(source))
    if folder is None:
        return None
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        return None
    blobs = {p: Path(os.path.realpath(p)).name for p in shards}
    to_hash = [p for p in shards if not _BLOB.fullmatch(blobs[p])]
    if sum(p.stat().st_size for p in to_hash) > HASHED_BYTES:
        return None
    sums = {p: blobs[p] if p not in to_hash else file_sha256(p) for p in shards}
    if len(shards) == 1 and shards[0].name == "model.safetensors":
        return f"sha256:{sums[shards[0]]}"
    lines = "".join(f"{p.name} {sums[p]}\n" for p in shards)
    return f"sha256:{hashlib.sha256(lines.encode()).hexdigest()}"


class CalibrationOfOtherWeightsError(ValueError):
    """A calibration applied to weights other than those it was made on."""


def recorded_content(calib_dir: str | os.PathLike) -> tuple[str | None, str | None]:
    """(content id, model folder) a calibration's meta.json records (None: an older one)."""
    meta_path = Path(calib_dir) / "meta.json"
    if not meta_path.is_file():
        return None, None
    run = (json.loads(meta_path.read_text()).get("provenance") or {}).get("config") or {}
    return run.get("model_content"), run.get("model_dir")


def check_calibration_content(calib_dir: str | os.PathLike, source: str | os.PathLike) -> None:
    """Refuse ``calib_dir`` on ``source`` when the weights it was made on were others (both
    content ids known and different), naming both."""
    made, made_dir = recorded_content(calib_dir)
    if made is None:
        return
    now = content_id(source)
    if now is not None and now != made:
        raise CalibrationOfOtherWeightsError(
            f"calib_dir={calib_dir} was made on weights {made} ({made_dir}), but {source} now "
            f"holds weights {now} (retrained or replaced since); recalibrate for these weights "
            "(Snakemake: rerun the calibrate job, e.g. with --forcerun calibrate)")
