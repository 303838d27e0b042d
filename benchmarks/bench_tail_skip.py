"""What skipping the adaptive softmax's unread tail clusters buys in `generate` (docs/generation.md item 3): our
model's steps with `model.skip_unread_tails` on against off, alternating in one process, so that the comparison
holds whatever the machine's load (bench_generate.py compares against GPT-2 in fresh processes instead).

Shape and modes: bench_generate.py's (the d_model 256 model, WikiText-2 prompts of 16 words, no end-of-sequence stop),
the compiled step (`static_decoding = "compiled"`), float32, 2 threads. `--weights random` (seeded: at this shape
every tail is skipped, the skip's best case) or `trained` (bench_generate.py's `--trained-dir` checkpoint, made there:
an unsure model, near the worst case). Each round times one generate call per side after a warm-up call per side;
the table gives the median ms per step and checks that both sides chose the same tokens.

    python benchmarks/bench_tail_skip.py --weights random trained --modes repetition-penalty beam-4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_generate  # noqa: E402
from common import print_table, set_threads, write_json  # noqa: E402


def model_for(weights: str, trained_dir: str):
    """bench_generate's model of our side, with random (seeded) or trained weights, the step compiled."""
    return bench_generate.build("ours_compiled" if weights == "random" else "ours_trained_compiled", trained_dir)


def time_pair(model, mode: str, batch: int, new_tokens: int, rounds: int) -> dict:
    """Median ms per step with the skip on and off (alternating, `rounds` each) and whether the tokens agree."""
    prompts = bench_generate.prompts_for(batch, 16)
    kwargs = bench_generate.generate_kwargs("ours", new_tokens, mode)
    times, outputs = {True: [], False: []}, {}
    with torch.no_grad():
        for skip in (True, False):  # warm-up: compiles the step once per side
            model.skip_unread_tails = skip
            model.generate(prompts, **kwargs)
        for _ in range(rounds):
            for skip in (False, True):
                model.skip_unread_tails = skip
                torch.manual_seed(0)
                begin = time.perf_counter()
                outputs[skip] = model.generate(prompts, **kwargs)
                times[skip].append((time.perf_counter() - begin) * 1e3 / new_tokens)
    return {"off_ms": statistics.median(times[False]), "on_ms": statistics.median(times[True]),
            "same_tokens": bool(torch.equal(outputs[True], outputs[False])), "raw": times}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--weights", nargs="+", default=["random", "trained"], choices=["random", "trained"])
    parser.add_argument("--modes", nargs="+", default=["greedy", "repetition-penalty", "beam-4"],
                        choices=list(bench_generate.MODES))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--trained-dir", default="benchmarks/results/generate_trained_d256",
                        help="bench_generate.py's trained checkpoint (made there when missing)")
    parser.add_argument("--output", default="benchmarks/results/tail_skip.json")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    if "trained" in args.weights and not (Path(args.trained_dir) / "config.json").exists():
        bench_generate.train(Path(args.trained_dir), 300)
    results, rows = {}, []
    for weights in args.weights:
        model = model_for(weights, args.trained_dir)
        for mode in args.modes:
            for batch in args.batches:
                r = time_pair(model, mode, batch, args.new_tokens, args.rounds)
                results[f"{weights} {mode} batch={batch}"] = r
                rows.append([weights, mode, batch, r["off_ms"], r["on_ms"], r["off_ms"] / r["on_ms"],
                             "yes" if r["same_tokens"] else "NO"])
    table = print_table(["weights", "mode", "batch", "off ms / step", "on ms / step", "off / on", "same tokens"],
                        rows)
    write_json(args.output, {"results": results, "table": table, "args": vars(args)})
    return results


if __name__ == "__main__":
    main()
