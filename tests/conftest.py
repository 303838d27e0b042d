import os
from pathlib import Path

# Before anything imports triton (torch.compile's tests do): triton's interpreter must be on from its import for the
# Triton kernel's CPU tests (tests/test_triton_attention.py); the suite runs without a GPU, where nothing else runs
# triton. A machine with CUDA keeps its compiled kernels.
if not os.environ.get("CUDA_VISIBLE_DEVICES") and not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from floors import is_floor_test  # noqa: E402
from kernel_sets import inductor_cache_dir  # noqa: E402

# Under pytest-xdist every worker is a process with torch's default of one thread per core: `-n 2` on two cores runs
# four threads on two. Each worker takes its share of the cores instead, and so do the scripts the tests start (they
# inherit OMP_NUM_THREADS); an OMP_NUM_THREADS the caller set is kept.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    _THREADS = max(1, len(os.sched_getaffinity(0)) // _WORKERS)
    torch.set_num_threads(_THREADS)
    os.environ["OMP_NUM_THREADS"] = str(_THREADS)
# Inductor's compiled-graph cache is shared by every CPU kernel set unless told otherwise, and reuses what one set
# compiled under another (tests/kernel_sets.py): the suite, and the processes it starts, keep one cache per set. A
# TORCHINDUCTOR_CACHE_DIR the caller set is kept.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", inductor_cache_dir(torch.backends.cpu.get_cpu_capability()))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The token cache is on by default for local corpora (training.arguments.resolve_token_cache_dir): the suite's entries
# go to a folder of its own, removed at exit, not into the user's ~/.cache (scripts run by the tests inherit it)
_CACHE = __import__("tempfile").mkdtemp(prefix="modeling_xl_test_cache.")
os.environ["MODELING_XL_CACHE"] = _CACHE
__import__("atexit").register(__import__("shutil").rmtree, _CACHE, True)

REPO = Path(__file__).resolve().parents[1]
# The real corpora (WikiText-2, tiny-shakespeare, SST-2) live beside the checkout; MODELING_XL_SHARED_DATA points
# elsewhere (CI sets it to a missing folder to show that a clone without them passes, with those tests skipped).
SHARED_DATA = Path(os.environ.get("MODELING_XL_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real corpora folder, for tests of their exact figures; skipped (with how to get it) where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"needs the real corpora at {SHARED_DATA} (wikitext-2/{{train,valid,test}}.txt, "
                    f"tinyshakespeare/input.txt, sst2/): put them in ../shared/data beside the checkout or set "
                    f"MODELING_XL_SHARED_DATA to their folder")
    return SHARED_DATA


@pytest.fixture
def one_thread():
    """Small models train faster on one thread than on two contended ones (the machine is shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def wikitext_folder(tmp_path_factory) -> Path:
    """A generated corpus folder in WikiText's layout (train/valid/test.txt, 3,000/300/300 lines; see
    tests/generated_corpora.py), for pipeline, script and training tests."""
    from generated_corpora import write_wikitext_folder

    return write_wikitext_folder(tmp_path_factory.mktemp("generated") / "wikitext-like")


def pytest_collection_modifyitems(config, items):
    """Mark the tests whose outcome depends on a dependency's version (`floors.py`): `.ci/run` runs `-m floors` at
    every dependency's floor."""
    for item in items:
        if is_floor_test(item.nodeid):
            item.add_marker(pytest.mark.floors)
