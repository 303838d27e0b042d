"""benchmarks/bench_generate.py's `floor` sides: the work a decoder pays per step beside its backbone in a mode that
needs every log-probability is timed with the processors `generate` itself builds for that mode, with GPT-2's output
product (`floor`) or ours (`floor_ours`)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_generate  # noqa: E402


@pytest.mark.parametrize("mode, expected", [("top-k", {"TopKLogitsWarper"}),
                                            ("top-p", {"TemperatureLogitsWarper", "TopPLogitsWarper"}),
                                            ("repetition-penalty", {"RepetitionPenaltyLogitsProcessor"}),
                                            ("greedy", set()), ("beam-4", set())])
def test_floor_times_the_processors_generate_builds_for_the_mode(mode, expected):
    config, processors = bench_generate.mode_processors(mode)
    assert {type(p).__name__ for p in processors} == expected
    assert config.do_sample == (mode in ("top-k", "top-p"))
    assert (config.num_beams or 1) == (4 if mode == "beam-4" else 1)


@pytest.mark.parametrize("impl", ["floor", "floor_ours"])
def test_floor_worker_reports_one_time_per_call(impl):
    result = bench_generate.worker({"impl": impl, "threads": 1, "batch": 2, "mode": "top-k", "new_tokens": 10,
                                    "calls": 3})
    assert len(result["times"]) == 3 and all(t > 0 for t in result["times"])


def test_tail_skip_pair_times_both_sides_with_the_same_tokens(monkeypatch):
    """benchmarks/bench_tail_skip.py's A/B: one time per round per side, the switch left on, the tokens compared
    (prompts of random ids: the benchmark's own come from WikiText-2 in ../shared, which a fresh clone lacks)."""
    import bench_tail_skip
    import torch

    monkeypatch.setattr(bench_generate, "prompts_for", lambda batch, prompt_len: torch.randint(
        0, bench_generate.SHAPE["vocab_size"], (batch, prompt_len), generator=torch.Generator().manual_seed(1)))

    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM

    torch.manual_seed(0)
    config = TransformerXLConfig.from_preset("debug", vocab_size=bench_generate.SHAPE["vocab_size"], d_embed=16,
                                             div_val=1, cutoffs=[2000, 10000, 20000])
    model = TransformerXLForCausalLM(config).eval()
    result = bench_tail_skip.time_pair(model, "beam-4", batch=2, new_tokens=4, rounds=2)
    assert result["same_tokens"] and model.skip_unread_tails
    assert len(result["raw"][True]) == len(result["raw"][False]) == 2 and result["on_ms"] > 0
