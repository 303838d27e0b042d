"""benchmarks/gpu_check.py --dry-run: the GPU check's code paths on the CPU at toy sizes, so that the check cannot rot
between the rare runs on a GPU machine. Run as the GPU machine runs it: a fresh process in which `datasets` and
`evaluate` cannot be imported (that machine has neither)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUNNER = """
import runpy, sys
sys.modules["datasets"] = None  # importing either now raises ImportError, as on the GPU machine
sys.modules["evaluate"] = None
sys.argv = ["gpu_check.py", "--dry-run", "--output", sys.argv[1]]
runpy.run_path({script!r}, run_name="__main__")
"""


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    output = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    code = RUNNER.format(script=str(REPO / "benchmarks" / "gpu_check.py"))
    result = subprocess.run([sys.executable, "-c", code, str(output)], capture_output=True, text=True, timeout=600,
                            cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(output.read_text()), result.stdout


def test_every_section_runs_without_error(dry_run):
    results, stdout = dry_run
    for letter in "abcde":
        assert letter in results and "error" not in results[letter] and "skipped" not in results[letter], letter
    assert results["environment"]["device"] == "cpu"
    assert "| section | item |" in stdout and results["table"].count("\n") > 20


def test_kernels_match_their_references(dry_run):
    """(a): every attention implementation (the Triton kernel under the interpreter in fp32), the adaptive softmax in
    three precisions and both whole models pass their tolerances."""
    kernels = dry_run[0]["a"]
    attention = kernels["attention"]
    assert any(name.startswith("relative_attention[triton]") for name in attention)
    assert {name.split()[1] for name in attention} == {"fp32", "bf16", "fp16"}
    for group in ("attention", "adaptive_softmax", "models"):
        for name, result in kernels[group].items():
            assert result["ok"], (group, name, result)


def test_training_curves_and_throughput_rows(dry_run):
    """(b) a loss per step for each precision, finite; (c)-(e) a positive rate for every side."""
    results = dry_run[0]
    for precision in ("fp32", "bf16", "fp16"):
        curve = results["b"]["curves"][precision]
        assert len(curve) == 6 and all(math.isfinite(x) for x in curve)
    sides = [k for k, v in results["c"].items() if isinstance(v, dict) and "tokens_per_s" in v]
    assert {"ours [sdpa] bf16", "ours [triton] bf16", "ours (permutation LM)", "transformers XLNet", "GPT-2"} <= set(
        sides)
    assert all(results["c"][k]["tokens_per_s"] > 0 and results["c"][k]["mfu"] > 0 for k in sides)
    assert all(results["d"][f"{impl} mem={m}"]["tokens_per_s"] > 0 for impl in ("sdpa", "triton") for m in (8, 16))
    generation = [k for k in results["e"] if k.startswith("ours") and not k.endswith("error")]
    assert len(generation) == 16 and all(results["e"][k] > 0 for k in generation)  # 2 sides x 2 batches x 2 x 2
    assert "ours [sdpa+whole] bf16" in sides  # the whole step compiled with the softmax's tail capacity
    attention = results["c"]["attention_ms"]  # one layer alone: SDPA, and Triton per tile and table gradient
    assert {f"triton tile {tile} table gradient {how}" for tile in ("autotune", "16 warps 1")
            for how in ("bands", "atomic")} | {"sdpa"} == set(attention)
    assert all(isinstance(ms, float) and ms > 0 for ms in attention.values()), attention


def test_items_past_the_budget_are_skipped_and_named():
    """--budget-s: an item (a side of (c), a comparison of (e)) that would start after the deadline is skipped with a
    row naming it; the rows of what ran before still count, without the references that were skipped."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check
    import torch

    calls = []
    late = gpu_check.Check(torch.device("cpu"), dry=True, deadline=0.0)  # spent before anything starts
    assert late.budgeted("c", "GPT-2", lambda: calls.append("ran")) is None and calls == []
    assert late.rows == [["c", "SKIPPED GPT-2", "--budget-s spent", "", ""]]
    on_time = gpu_check.Check(torch.device("cpu"), dry=True, deadline=None)
    assert on_time.budgeted("c", "GPT-2", lambda: 7) == 7 and on_time.rows == []

    out = {"ours [eager] bf16": {"tokens_per_s": 1000.0, "peak_mib": None}}  # no SDPA side, no references
    gpu_check.throughput_rows(on_time, out, rate=1e9)
    assert out["ours [eager] bf16"]["mfu"] is None
    assert on_time.rows == [["c", "train ours [eager] bf16", "tokens/s (MFU, peak memory)", "1,000 (MFU not counted)",
                             "0.02x NVIDIA A100 AMP"]]
