"""Weights changed in place (fair_calib/jobs/model_tracking.py): a model folder's content is part of
what the jobs reading it depend on, so Snakemake replans them, and a table never mixes cells of
two weights of one model."""
from __future__ import annotations

import os
import time

import pandas as pd
import pyarrow as pa
import pytest

from fair_calib.jobs import model_tracking as MT
from fair_calib.jobs.io import provenance, write_parquet
from fair_calib.report import tables as T

EVAL_SCHEMA = pa.schema([
    ("model", pa.string()), ("method", pa.string()), ("bits", pa.string()),
    ("task", pa.string()), ("metric", pa.string()), ("value", pa.float64()),
    ("stderr", pa.float64()), ("n", pa.int64()), ("chance", pa.float64()),
    ("settings", pa.string()),
])


@pytest.fixture(autouse=True)
def _own_hash_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FAIR_CALIB_HASH_CACHE", str(tmp_path / "sha256.json"))


def _model(folder, data=b"weights-a", stamp_age=100.0):
    """A folder as train_tiny leaves it: weights, then Snakemake's .snakemake_timestamp."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(data)
    stamp = folder / MT.TIMESTAMP
    stamp.touch()
    t = time.time() - stamp_age
    os.utime(folder / "model.safetensors", (t - 1, t - 1))
    os.utime(stamp, (t, t))
    return folder


def _rewrite_in_place(path, data):
    with open(path, "r+b") as f:      # as safetensors' save_file or a copy over it does
        f.write(data)


def test_weights_rewritten_in_place_move_the_folder_time_forward(tmp_path):
    folder = _model(tmp_path / "resources/models/tiny-llada")
    rec = tmp_path / "rec"
    assert MT.sync_model("tiny-llada", folder, True, rec) is None      # first sight: recorded
    assert MT.record_path("tiny-llada", rec).read_text().startswith("sha256:")
    before = (folder / MT.TIMESTAMP).stat().st_mtime
    _rewrite_in_place(folder / "model.safetensors", b"weights-b")
    os.utime(folder / "model.safetensors", (before - 50, before - 50))   # mtime set back (touch -d)
    change = MT.sync_model("tiny-llada", folder, True, rec)
    assert change is not None and change.old != change.new
    note = change.note()
    assert note.startswith("Note: models.tiny-llada:") and change.old in note and change.new in note
    assert (folder / MT.TIMESTAMP).stat().st_mtime > before + 50      # newer than its dependants
    # idempotent: the next run finds the record current
    assert MT.sync_model("tiny-llada", folder, True, rec) is None


def test_a_retrain_by_its_own_job_replans_nothing_more(tmp_path):
    folder = _model(tmp_path / "m")
    rec = tmp_path / "rec"
    MT.sync_model("m", folder, True, rec)
    (folder / "model.safetensors").write_bytes(b"retrained")
    stamp = folder / MT.TIMESTAMP
    later = time.time() + 5              # the job ended after it wrote the weights
    os.utime(stamp, (later, later))
    assert MT.sync_model("m", folder, True, rec) is None
    assert stamp.stat().st_mtime == pytest.approx(later)
    assert MT.record_path("m", rec).read_text().strip() == MT.current_content(folder)


def test_a_touch_alone_changes_nothing(tmp_path):
    folder = _model(tmp_path / "m")
    rec = tmp_path / "rec"
    MT.sync_model("m", folder, True, rec)
    before = (folder / MT.TIMESTAMP).stat().st_mtime
    os.utime(folder / "model.safetensors")
    assert MT.sync_model("m", folder, True, rec) is None
    assert (folder / MT.TIMESTAMP).stat().st_mtime == before


def test_a_training_record_is_the_baseline_of_a_folder_met_first(tmp_path):
    """A model trained before tracking existed and edited since: its fair_calib.json's sha256."""
    import hashlib
    import json

    folder = _model(tmp_path / "m", b"edited")
    (folder / "fair_calib.json").write_text(json.dumps(
        {"model_sha256": hashlib.sha256(b"trained").hexdigest()}))
    change = MT.sync_model("m", folder, True, tmp_path / "rec")
    assert change is not None and change.new == MT.current_content(folder)


def test_a_local_folder_is_tracked_by_its_record(tmp_path):
    folder = tmp_path / "some/folder"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"a")
    rec = tmp_path / "rec"
    assert MT.sync_model("local", folder, False, rec) is None
    path = MT.record_path("local", rec)
    first, t0 = path.read_text(), path.stat().st_mtime
    _rewrite_in_place(folder / "model.safetensors", b"b")
    change = MT.sync_model("local", folder, False, rec)
    assert change is not None and path.read_text().strip() == change.new != first.strip()
    assert path.stat().st_mtime >= t0   # dated by the weights' ctime: newer than what read "a"


def test_local_folders_are_inputs_of_the_jobs_that_read_them():
    text = open(os.path.join(os.path.dirname(__file__), "..", "..",
                             "workflow/rules/common.smk")).read()
    assert "record_path(wc.model)" in text and "sync_model_content()" in text


def _eval_file(path, model, method, content):
    df = pd.DataFrame([{"model": model, "method": method, "bits": "w2a4", "task": "t1",
                        "metric": "acc", "value": 0.5, "stderr": 0.01, "n": 10,
                        "chance": 0.25, "settings": "{}"}])
    write_parquet(df, path, EVAL_SCHEMA, provenance=provenance({}, model_content=content,
                                                               arithmetic="fake"))
    return path


def test_a_table_refuses_cells_of_two_weights_naming_both(tmp_path):
    a = _eval_file(tmp_path / "rtn.parquet", "tiny-llada", "rtn", "sha256:" + "a" * 64)
    b = _eval_file(tmp_path / "flat.parquet", "tiny-llada", "flatquant", "sha256:" + "b" * 64)
    with pytest.raises(ValueError) as err:
        T.load_inputs([a, b])
    msg = str(err.value)
    assert "\n" not in msg and "a" * 64 in msg and "b" * 64 in msg and "tiny-llada" in msg
    assert "rtn.parquet" in msg and "flat.parquet" in msg


def test_a_table_of_one_weights_and_older_cells_is_built(tmp_path):
    a = _eval_file(tmp_path / "rtn.parquet", "m", "rtn", "sha256:" + "a" * 64)
    b = _eval_file(tmp_path / "fp.parquet", "m", "fp", "sha256:" + "a" * 64)
    c = _eval_file(tmp_path / "old.parquet", "m", "x", None)         # before the record existed
    d = _eval_file(tmp_path / "other.parquet", "m2", "rtn", "sha256:" + "c" * 64)
    assert len(T.load_inputs([a, b, c, d])["eval"]) == 4
