"""What a checkpoint's weights are, as one string: a calibration belongs to the weights it was
made on, not to their path (a model retrained at the same path must not take the old one's
calibration).

``content_id(source)``: ``sha256:<hex>``, the sha256 of ``model.safetensors`` for a one-file
checkpoint (a trained tiny model's ``fair_calib.json`` records it as ``model_sha256``: read, not
recomputed), else the sha256 of the lines ``<file> <sha256>`` of its ``*.safetensors`` shards,
where a shard's sha256 is the Hugging Face cache's blob name (the cache names blobs by it) or
computed for files up to ``HASHED_BYTES`` together. None where it cannot be known cheaply: a
hub id not in the local cache, or a large checkpoint outside the cache. No heavy imports."""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

HASHED_BYTES = 2 * 2**30       # hashing more would cost every evaluation job seconds to minutes
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


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def content_id(source: str | os.PathLike) -> str | None:
    folder = _folder(str(source))
    if folder is None:
        return None
    meta = folder / "fair_calib.json"
    if meta.is_file():
        recorded = json.loads(meta.read_text()).get("model_sha256")
        if recorded:
            return f"sha256:{recorded}"
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        return None
    blobs = {p: Path(os.path.realpath(p)).name for p in shards}
    to_hash = [p for p in shards if not _BLOB.fullmatch(blobs[p])]
    if sum(p.stat().st_size for p in to_hash) > HASHED_BYTES:
        return None
    sums = {p: blobs[p] if p not in to_hash else _file_sha256(p) for p in shards}
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
