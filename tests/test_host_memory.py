"""`host_memory.keep_freed_memory`: freed CPU memory stays in the process (no page faults when it is used again), and
the user's own malloc settings win; `runs.keep_freed_host_memory` applies it on the CPU only. Each allocator check runs
in a fresh process, since the setting is process-wide. (That pretraining and fine-tuning call it before their training
loops: tests/test_training_steps.py, tests/test_finetuning.py.)"""

import json
import os
import platform
import resource
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from modeling_xl.runtime import processes as runs

REPO = Path(__file__).resolve().parents[1]
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
glibc_only = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="the setting is glibc malloc's")
# with transparent huge pages on for every mapping, a fresh 48 MiB block faults in 2 MiB at a time: nothing to see
small_pages_only = pytest.mark.skipif(THP.is_file() and "[always]" in THP.read_text(),
                                      reason="transparent huge pages are 'always' here")
PROBE_PAGES = 10 * 2**20 * 4 // resource.getpagesize()  # pages of the probe's measured 40 MiB block

# Allocates a 48 MiB tensor (above glibc's largest automatic mmap threshold, 32 MiB, like the tied table's gradient
# of a 33k-word vocabulary at width 256), writes it, frees it, then counts the page faults of writing a 40 MiB one.
# Smaller than the freed block: torch allocates with posix_memalign, which asks malloc for the block plus its
# alignment, so a block of exactly the freed size may not fit the freed chunk and is carved from the top of the heap
# instead (10 rounds of one 48 MiB size: 0 faults in 1 to 3 of them, 2026-11-29); that made this test fail about one
# run in two.
PROBE = """
import importlib.util, json, resource, sys
import torch
# the module by its path: the probe needs nothing else of the package (importing it would take seconds)
spec = importlib.util.spec_from_file_location("host_memory", HOST_MEMORY_FILE)
host_memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(host_memory)
keep_freed_memory = host_memory.keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else "not called"
def faults_of_one_round(floats=10 * 2**20):  # 40 MiB
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.empty(floats).fill_(1.0)
    del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_one_round(12 * 2**20)  # 48 MiB
print(json.dumps({"applied": applied, "faults": min(faults_of_one_round() for _ in range(3))}))
""".replace("HOST_MEMORY_FILE", repr(str(REPO / "modeling_xl" / "runtime" / "host_memory.py")))


def probe(mode: str, **env: str) -> dict:
    """Run PROBE in a fresh process with `env` added (and no malloc settings of this environment): {"applied": what
    keep_freed_memory returned (None: applied; else why not), "faults": page faults of one allocation round}."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    environment.update(env, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=environment,
                          check=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc_only
@small_pages_only
def test_freed_memory_is_used_again_without_page_faults():
    default, kept = probe("default"), probe("keep")
    assert default["faults"] > PROBE_PAGES // 2, default  # each round maps fresh pages and faults them in
    assert kept["applied"] is None, kept  # None: applied
    assert kept["faults"] < PROBE_PAGES // 20, kept  # the freed block is handed out again


@glibc_only
@small_pages_only
@pytest.mark.parametrize("setting", [{"MALLOC_TRIM_THRESHOLD_": "131072"},
                                     {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"}])
def test_the_users_own_malloc_settings_are_left_alone(setting):
    kept = probe("keep", **setting)
    assert next(iter(setting)) in kept["applied"], kept  # the reason names the user's setting
    assert kept["faults"] > PROBE_PAGES // 2, kept  # glibc's own behaviour, unchanged


def test_settings_of_other_malloc_knobs_do_not_count_as_the_users_thresholds(monkeypatch):
    from modeling_xl.runtime.host_memory import user_malloc_settings

    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0:glibc.cpu.hwcaps=-AVX2")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert user_malloc_settings() == []
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert user_malloc_settings() == ["MALLOC_MMAP_THRESHOLD_"]


def test_the_training_loops_helper_applies_it_on_the_cpu_only(caplog):
    with mock.patch.object(runs, "keep_freed_memory", return_value=None) as keep:
        runs.keep_freed_host_memory(torch.device("cuda"))
        keep.assert_not_called()
        with caplog.at_level("INFO", logger="modeling_xl.runtime.processes"):
            runs.keep_freed_host_memory(torch.device("cpu"))
        keep.assert_called_once_with()
    assert "keeps freed memory" in caplog.text
    with mock.patch.object(runs, "keep_freed_memory", return_value="the C library is not glibc"):
        with caplog.at_level("INFO", logger="modeling_xl.runtime.processes"):
            runs.keep_freed_host_memory(torch.device("cpu"))
    assert "left as it is: the C library is not glibc" in caplog.text
