"""`host_memory.keep_freed_memory`: freed CPU memory stays in the process (no page faults when it is used again), the
user's own malloc settings win, and pretraining and fine-tuning on the CPU apply it. Each allocator check runs in a
fresh process, since the setting is process-wide."""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from modeling_xl.finetuning import FinetuneArguments, run_finetuning
from modeling_xl.training import parse_args, run_pretraining

REPO = Path(__file__).resolve().parents[1]
glibc_only = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="the setting is glibc malloc's")

# Allocates a 48 MiB tensor (above glibc's largest automatic mmap threshold, 32 MiB, like the tied table's gradient
# of a 33k-word vocabulary at width 256), writes it, frees it, and counts the page faults of doing that again.
PROBE = """
import json, resource, sys
import torch
from modeling_xl.host_memory import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
def faults_of_one_round():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.empty(12 * 2**20).fill_(1.0)  # 48 MiB
    del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_one_round()
print(json.dumps({"applied": applied, "faults": min(faults_of_one_round() for _ in range(3))}))
"""


def probe(mode: str, **env) -> dict:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    environment.update(env, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=environment,
                          check=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc_only
def test_freed_memory_is_used_again_without_page_faults():
    pages = 12 * 2**20 * 4 // 4096
    default, kept = probe("default"), probe("keep")
    assert default["faults"] > pages // 2, default  # each round maps fresh pages and faults them in
    assert kept["applied"] is True
    assert kept["faults"] < pages // 20, kept  # the freed block is handed out again


@glibc_only
def test_the_users_own_malloc_settings_are_left_alone():
    kept = probe("keep", MALLOC_TRIM_THRESHOLD_="131072")
    assert kept["applied"] is False
    assert kept["faults"] > 12 * 2**20 * 4 // 4096 // 2  # glibc's own behaviour, unchanged


class Applied(Exception):
    """Raised by the patched `keep_freed_memory`: the run got there, and stops before any data or model exists."""


def test_pretraining_on_the_cpu_keeps_freed_memory(tmp_path):
    args = parse_args(["--preset", "debug", "--output_dir", str(tmp_path / "out"), "--disable_tqdm"])
    with mock.patch("modeling_xl.training.loop.keep_freed_memory", side_effect=Applied) as keep:
        with pytest.raises(Applied):
            run_pretraining(args)
    keep.assert_called_once_with()


def test_finetuning_on_the_cpu_keeps_freed_memory(tmp_path):
    (tmp_path / "model").mkdir()
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
    args = FinetuneArguments(model_name_or_path=str(tmp_path / "model"), output_dir=str(tmp_path / "out"),
                             train_file=str(train), validation_file=str(train), disable_tqdm=True)
    with mock.patch("modeling_xl.finetuning.loop.keep_freed_memory", side_effect=Applied) as keep:
        with pytest.raises(Applied):
            run_finetuning(args)
    keep.assert_called_once_with()
