import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        raise FileNotFoundError(f"shared data not found at {SHARED_DATA}; CI clones the repo with ../shared beside it")
    return SHARED_DATA


@pytest.fixture
def one_thread():
    """Small models train faster on one thread than on two contended ones (the machine is shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
