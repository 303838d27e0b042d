r"""Spread of every training-outcome test's asserted quantity, over seeds and CPU kernel sets (issue 50).

A test that asserts what training reached (an accuracy, a loss under a value, a drop of the loss) is one draw: torch
picks its CPU kernels by the processor's instruction set (`ATEN_CPU_CAPABILITY`: `default` = scalar, `avx2`,
`avx512`), each sums in its own order, and a small model's training follows the rounding. This script runs each
test's own training function (imported from `tests/`, not copied) over seeds, once per capability, each capability
in a fresh process (torch reads `ATEN_CPU_CAPABILITY` when it is imported), with the thread setting CI's workers use
(one thread: `pytest -n 2` on two cores), and prints min / median / max of every asserted quantity. `--mutations`
runs each test's feature-removed variants (memory off, gradient detached, no learning, ...) at its first seed: the
value a broken feature gives, which the threshold must reject.

    python benchmarks/bench_outcome_spreads.py --capabilities native default            # every case, 5 seeds
    python benchmarks/bench_outcome_spreads.py --cases classification copy --seeds 10
    python benchmarks/bench_outcome_spreads.py --mutations --capabilities native
    python benchmarks/bench_outcome_spreads.py --table                                  # the table of the JSON lines

`native` leaves `ATEN_CPU_CAPABILITY` unset (the machine's best). A capability the processor lacks stops its worker
with SIGILL (torch does not check the variable against the processor): it is reported as such, not measured.
Results are appended, one JSON line per run, to `benchmarks/results/outcome_spreads.jsonl` (`--out`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "outcome_spreads.jsonl"


def _test_module(name: str):
    """A module of tests/ (the tests' own functions), imported as pytest imports it (tests/ on the path)."""
    import importlib

    for path in (str(TESTS), str(REPO / "benchmarks")):
        if path not in sys.path:
            sys.path.insert(0, path)
    return importlib.import_module(name)


@dataclass
class Case:
    """`run(seed, folder, **mutation)` -> the quantities the test asserts on; `seeds(n)`: the seeds measured, the
    test's own draw first; `mutations`: name -> keyword arguments that remove the tested feature."""
    test: str
    run: Callable[..., dict]
    seeds: Callable[[int], list[int]] = lambda n: list(range(n))
    mutations: dict[str, dict] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------- the cases
def _classification(seed, folder, mem_len=8, detach_memory=False):
    m = _test_module("test_classification")
    return {"accuracy": m.train_long_document_model(mem_len, seed=seed, detach_memory=detach_memory)}


def _classification_no_memory(seed, folder):
    return {"accuracy": _test_module("test_classification").train_long_document_model(0, seed=seed)}


def _copy(seed, folder, mem_len=10):
    return _test_module("test_modeling_transformer_xl").train_copy_model(seed, mem_len=mem_len)


def _plm(seed, folder, learning_rate=2e-3, steps=(100, 150, 200, 300)):
    """One run of `train_plm` (constant learning rate: a shorter run is a prefix of it): the test's quantities at
    each step count."""
    m = _test_module("test_permutation_lm")
    import math

    import torch

    torch.set_num_threads(1)
    losses, vocab_size = m.train_plm(steps=max(steps), seed=seed, learning_rate=learning_rate)
    out = {"initial_minus_uniform": losses[0] - math.log(vocab_size)}
    for n in steps:
        first, last = sum(losses[:20]) / 20, sum(losses[n - 20:n]) / 20
        out[f"first20_minus_last20@{n}"] = first - last
        out[f"initial_minus_last20@{n}"] = losses[0] - last
    return out


def _tiny_spike(steps):
    def run(seed, folder, max_grad_norm=0.0):
        result = _test_module("test_adversarial").first_tiny_losses(folder / "run", steps, seed=seed,
                                                                    max_grad_norm=max_grad_norm)
        return {"max_rise": result["max_rise"], "last": result["last"]}
    return run


def _finetuning(function_name):
    """A fine-tuning test's function: the checkpoint's weights from `seed`, the fine-tuning seed 42 + `seed`."""
    def run(seed, folder, learning_rate=None):
        m = _test_module("test_finetuning")
        checkpoint = m.make_lm_checkpoint(folder / "lm", seed)
        if learning_rate is None:
            results = getattr(m, function_name)(folder, checkpoint, seed=42 + seed)
        elif function_name == "binary_task_results":
            results = m.binary_task_results(folder, checkpoint, 42 + seed, learning_rate=learning_rate)
        else:  # the script's last --learning_rate wins
            results = getattr(m, function_name)(folder, checkpoint, 42 + seed, "--learning_rate", str(learning_rate))
        return {k: v for k, v in results["dev"].items() if isinstance(v, (int, float))}
    return run


def _pair_match(seed, folder, learning_rate=1e-3, **cell):
    dev = _test_module("test_finetuning").pair_match_results(folder, seed, learning_rate=learning_rate, **cell)["dev"]
    return {"accuracy": dev["accuracy"], "eval_loss": dev["eval_loss"]}


def _long_document(seed, folder):
    scores = _test_module("test_finetuning").long_document_scores(folder, model_seed=seed, seed=42 + seed)
    out = {f"{arm}.{k}": scores[arm][k] for arm in scores for k in ("accuracy", "eval_loss", "cue_rows_changed")}
    out["whole_minus_one_read.accuracy"] = scores["whole"]["accuracy"] - scores["one_read"]["accuracy"]
    out["whole_over_one_read.eval_loss"] = scores["whole"]["eval_loss"] / scores["one_read"]["eval_loss"] - 1
    return out


def _pretraining(function_name, *args):
    def run(seed, folder, learning_rate="1e-2"):
        m = _test_module("test_training_steps")
        extra = [_generated_wikitext(folder)] if function_name == "plm_folder_run" else []
        history = getattr(m, function_name)(folder, *extra, *args, seed=seed, learning_rate=learning_rate)
        key = "bpc" if function_name == "char_level_run" else "eval_loss"
        return {f"{key}_drop": history[0][key] - history[-1][key]}
    return run


def _generated_wikitext(folder):
    return _test_module("generated_corpora").write_wikitext_folder(folder / "wikitext-like")


# the clipping the recipe had when the spike was found (0.25), and the recipe's own (1.0)
SPIKE_MUTATIONS = {"max_grad_norm 0.25": dict(max_grad_norm=0.25), "max_grad_norm 1.0": dict(max_grad_norm=1.0)}

CASES: dict[str, Case] = {
    "classification": Case("test_classification.py::test_long_document_label_from_first_segment_is_learned_with_"
                           "memory_only", _classification,
                           mutations={"mem_len=0": dict(mem_len=0), "detach_memory": dict(detach_memory=True)}),
    "classification-no-memory": Case("(the same test's mem_len=0 arm)", _classification_no_memory),
    "copy": Case("test_modeling_transformer_xl.py::test_learns_to_copy_what_only_the_memory_holds", _copy,
                 mutations={"mem_len=0": dict(mem_len=0)}),
    "plm": Case("test_permutation_lm.py::test_tiny_model_trained_on_wikitext_like_text_lowers_its_permutation_lm_"
                "loss", _plm, mutations={"no learning (lr 1e-9)": dict(learning_rate=1e-9)}),
    "tiny-spike-400": Case("test_adversarial.py::test_first_steps_of_the_tiny_preset_without_clipping_do_not_spike"
                           "[400]", _tiny_spike(400), seeds=lambda n: [42 + i for i in range(n)],
                           mutations=SPIKE_MUTATIONS),
    "tiny-spike-1500": Case("test_adversarial.py::test_first_steps_of_the_tiny_preset_without_clipping_do_not_spike"
                            "[1500]", _tiny_spike(1500), seeds=lambda n: [42 + i for i in range(n)],
                            mutations=SPIKE_MUTATIONS),
    "binary": Case("test_finetuning.py::test_binary_task_learns_and_writes_model_card_checkpoints_and_results",
                   _finetuning("binary_task_results"), mutations={"no learning (lr 1e-9)": dict(learning_rate=1e-9)}),
    "four-topics": Case("test_finetuning.py::test_string_labels_with_more_than_two_classes",
                        _finetuning("four_topics_results"),
                        mutations={"no learning (lr 1e-9)": dict(learning_rate=1e-9)}),
    "second-text": Case("test_finetuning.py::test_text_pairs_with_the_word_level_layout",
                        _finetuning("second_text_sentiment_results"),
                        mutations={"no learning (lr 1e-9)": dict(learning_rate=1e-9)}),
    "regression": Case("test_finetuning.py::test_regression_from_fractional_labels", _finetuning("regression_results"),
                       mutations={"no learning (lr 1e-9)": dict(learning_rate=1e-9)}),
    "multi-label": Case("test_finetuning.py::test_multi_label_from_delimited_labels",
                        _finetuning("multi_label_results"),
                        mutations={"no learning (lr 1e-9)": dict(learning_rate=1e-9)}),
    "pair-match": Case("test_finetuning.py::test_a_pair_label_that_only_comparing_the_texts_gives_is_learned",
                       _pair_match, mutations={"no learning (lr 1e-9)": dict(learning_rate=1e-9)}),
    "long-document": Case("test_finetuning.py::test_long_document_learns_evidence_that_truncation_cuts",
                          _long_document),
    "char-bpc": Case("test_training_steps.py::test_script_on_a_char_level_text_file_reports_bpc",
                     _pretraining("char_level_run"), seeds=lambda n: [42 + i for i in range(n)],
                     mutations={"no learning (lr 1e-9)": dict(learning_rate="1e-9")}),
    "plm-folder": Case("test_training_steps.py::test_plm_objective_trains_on_a_wikitext_folder",
                       _pretraining("plm_folder_run"), seeds=lambda n: [42 + i for i in range(n)],
                       mutations={"no learning (lr 1e-9)": dict(learning_rate="1e-9")}),
    "unigram-clm": Case("test_training_steps.py::test_unigram_tokenizer_runs_the_main_command[clm]",
                        _pretraining("unigram_run", "clm"), seeds=lambda n: [42 + i for i in range(n)],
                        mutations={"no learning (lr 1e-9)": dict(learning_rate="1e-9")}),
    "unigram-plm": Case("test_training_steps.py::test_unigram_tokenizer_runs_the_main_command[plm]",
                        _pretraining("unigram_run", "plm"), seeds=lambda n: [42 + i for i in range(n)],
                        mutations={"no learning (lr 1e-9)": dict(learning_rate="1e-9")}),
}


# ---------------------------------------------------------------------------------------------------- running
def worker(case_names: list[str], seeds: int, mutations: bool, out: Path) -> None:
    """Run in this process (its ATEN_CPU_CAPABILITY already applied): every case's seeds, or its mutations."""
    for path in (str(TESTS), str(REPO)):
        sys.path.insert(0, path)
    import conftest  # noqa: F401  the suite's environment: offline, its own token cache, thread rules
    import torch

    torch.set_num_threads(1)  # a CI worker's share of two cores (tests/conftest.py), the `one_thread` fixture's
    capability = torch.backends.cpu.get_cpu_capability()
    for name in case_names:
        case = CASES[name]
        runs = ([(name_, case.seeds(1)[0], kwargs) for name_, kwargs in case.mutations.items()] if mutations
                else [(None, seed, {}) for seed in case.seeds(seeds)])
        for mutation, seed, kwargs in runs:
            torch.manual_seed(0)  # what the suite's autouse fixture does before every test
            start = time.perf_counter()
            try:
                with tempfile.TemporaryDirectory(prefix="outcome_spread.") as folder:
                    quantities, error = case.run(seed, Path(folder), **kwargs), None
            except Exception as e:  # recorded, and the next run goes on: one broken case does not hide the others
                quantities, error = {}, f"{type(e).__name__}: {e}"
            record = dict(case=name, test=case.test, capability=capability, seed=seed, mutation=mutation,
                          quantities=quantities, error=error, seconds=round(time.perf_counter() - start, 1),
                          threads=torch.get_num_threads(), torch=torch.__version__,
                          date=time.strftime("%Y-%m-%d"))
            with open(out, "a") as f:
                f.write(json.dumps(record) + "\n")
            print(json.dumps(record), flush=True)


def launch(capability: str, case_names: list[str], seeds: int, mutations: bool, out: Path) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability != "native":
        env["ATEN_CPU_CAPABILITY"] = capability
    command = [sys.executable, __file__, "--worker", "--cases", *case_names, "--seeds", str(seeds), "--out", str(out)]
    code = subprocess.run(command + (["--mutations"] if mutations else []), env=env).returncode
    if code < 0:
        print(f"capability {capability}: the worker died of signal {-code} (SIGILL: the processor lacks it)")
    return code


def table(out: Path) -> str:
    """min / median / max of each (case, quantity, capability) over the seeds; the mutations' values beside."""
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    spreads, mutated = {}, {}
    for r in records:
        for quantity, value in r["quantities"].items():
            if r["mutation"] is None:
                spreads.setdefault((r["case"], quantity), {}).setdefault(r["capability"], []).append(value)
            else:
                mutated.setdefault((r["case"], quantity), []).append(f"{r['mutation']}: {value:.3f}")
    rows = ["| case | quantity | capability | seeds | min | median | max | mutations (first seed) |",
            "|---|---|---|---|---|---|---|---|"]
    for (case, quantity), by_capability in spreads.items():
        for capability, values in sorted(by_capability.items()):
            rows.append(f"| {case} | {quantity} | {capability} | {len(values)} | {min(values):.4f} | "
                        f"{statistics.median(values):.4f} | {max(values):.4f} | "
                        f"{'; '.join(mutated.get((case, quantity), []))} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="+", default=["all"], help=f"of {', '.join(CASES)}")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--capabilities", nargs="+", default=["native", "default"],
                        help="native (ATEN_CPU_CAPABILITY unset), default (scalar), avx2, avx512")
    parser.add_argument("--mutations", action="store_true", help="the feature-removed variants, first seed only")
    parser.add_argument("--table", action="store_true", help="print the table of --out and stop")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = list(CASES) if args.cases == ["all"] else args.cases
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"--cases {unknown} are unknown; expected some of {list(CASES)}")
    if args.table:
        print(table(args.out))
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.worker:
        worker(names, args.seeds, args.mutations, args.out)
        return 0
    codes = [launch(c, names, args.seeds, args.mutations, args.out) for c in args.capabilities]
    print(table(args.out))
    return max(abs(c) for c in codes)


if __name__ == "__main__":
    sys.exit(main())
