import pytest
import torch

from tiny_eval_helpers import data_dir, make_loaded, write_synthetic


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture
def tiny_llada():
    return make_loaded("tiny-llada")


@pytest.fixture
def synthetic_dir(tmp_path):
    return write_synthetic(tmp_path / "synthetic")


@pytest.fixture
def offline_data_dir():
    d = data_dir()
    if not d.is_dir():
        pytest.skip(f"offline data directory {d} absent (set FAIR_CALIB_DATA_DIR to run these tests)")
    return d
