"""Fixtures for the decoding tests."""
from __future__ import annotations

import pytest
import torch

from decoding_helpers import tiny_llama
from fair_calib.models.adapters import LoadedModel

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def llada_tiny() -> LoadedModel:
    return tiny_llama("tiny-llada")


@pytest.fixture(scope="session")
def dream_tiny() -> LoadedModel:
    return tiny_llama("tiny-dream")


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(123)
    return [torch.randint(0, 30, (n,), generator=g).tolist() for n in (5, 2, 8)]
