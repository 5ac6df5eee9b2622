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
