import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config, items):
    """Tests marked `first` before the others (their files first, under pyproject's
    `--dist loadfile`): started last, the whole-DAG run would keep one worker busy for minutes
    after the other has finished."""
    items.sort(key=lambda item: item.get_closest_marker("first") is None)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The offline copies of the public data sets (never part of the repo)."""
    path = Path(os.environ.get("FAIR_CALIB_DATA_DIR", REPO.parent / "shared" / "data"))
    if not path.is_dir():
        pytest.skip(f"offline data dir {path} absent (set FAIR_CALIB_DATA_DIR)")
    return path


@pytest.fixture(autouse=True)
def _own_hash_cache(tmp_path_factory, monkeypatch):
    """Each test's weights-hash cache (fair_calib.jobs.model_identity) is its own, never the user's."""
    monkeypatch.setenv("FAIR_CALIB_HASH_CACHE",
                       str(tmp_path_factory.mktemp("hash_cache") / "sha256.json"))
