"""The `tiny` recipe's schedule chosen by held-out perplexity: learning rate, warmup and gradient clipping.

Each schedule trains `scripts/pretrain.py --preset tiny` (one process, seed 42) on three corpora, at two step budgets,
and reads the final evaluation (the whole validation split, the recipe's evaluation segment and memory lengths):

- `wt2`: WikiText-2, word level (`--dataset_name ../shared/data/wikitext-2`, the preset's 8,000-word tokenizer);
- `shakespeare`: tiny-shakespeare, character level (`--train_file input.txt --tokenizer_type char`: the last 5% of
  lines held out); perplexity per character;
- `builtin`: the built-in corpus (no data argument), word level.

Warmup is given as steps of a 1,500-step run and scaled with the budget (50 -> 13 at 400 steps), as the recipe does.
Rows are written to the JSON after every run, and a rerun skips those already there (`--fresh` starts over).

    python benchmarks/bench_recipe.py                       # every schedule, corpus and budget (~65 min, 2 cores)
    python benchmarks/bench_recipe.py --corpora wt2 --steps 400 --schedules no_clip clip1
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

from common import print_table, run_script, write_json

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
RECIPE_STEPS = 1500

CORPORA = {
    "wt2": ["--dataset_name", str(SHARED / "wikitext-2")],
    "shakespeare": ["--train_file", str(SHARED / "tinyshakespeare" / "input.txt"), "--tokenizer_type", "char"],
    "builtin": [],
}

# name -> (learning rate, warmup steps of a 1,500-step run, max_grad_norm; 0 = no clipping). `clip1` is the recipe
# since 2026-11-28 (chosen by this table); `no_clip` the recipe before it.
SCHEDULES = {
    "no_clip": (3e-3, 50, 0.0),
    "clip0.25": (3e-3, 50, 0.25),
    "clip1": (3e-3, 50, 1.0),
    "clip0.25_warmup150": (3e-3, 150, 0.25),
    "lr1e-3": (1e-3, 50, 0.0),
    "lr1e-3_clip0.25": (1e-3, 50, 0.25),
}


def run_one(corpus: str, steps: int, schedule: str, seed: int) -> dict:
    lr, warmup, clip = SCHEDULES[schedule]
    warmup_steps = warmup * steps // RECIPE_STEPS
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        command = [sys.executable, str(REPO / "scripts" / "pretrain.py"), "--preset", "tiny", *CORPORA[corpus],
                   "--max_train_steps", str(steps), "--learning_rate", str(lr), "--num_warmup_steps", str(warmup_steps),
                   "--max_grad_norm", str(clip), "--seed", str(seed), "--eval_steps", "1000000000",
                   "--token_cache", "false", "--output_dir", str(out)]
        seconds = run_script(command, f"{corpus} {steps} {schedule}")
        results = json.loads((out / "eval_results.json").read_text())
        losses = [json.loads(line)["loss"] for line in (out / "train_log.jsonl").read_text().splitlines()
                  if '"loss"' in line]
    return {"corpus": corpus, "steps": steps, "schedule": schedule, "learning_rate": lr, "warmup_steps": warmup_steps,
            "max_grad_norm": clip, "seed": seed, "perplexity": results["perplexity"], "eval_loss": results["eval_loss"],
            "max_train_loss": max(losses) if losses else None, "seconds": round(seconds, 1)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpora", nargs="+", default=list(CORPORA), choices=list(CORPORA))
    parser.add_argument("--steps", nargs="+", type=int, default=[400, 1500])
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=list(SCHEDULES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[42])
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "recipe.json"))
    parser.add_argument("--fresh", action="store_true", help="ignore the rows already in --output")
    args = parser.parse_args(argv)
    if "wt2" in args.corpora or "shakespeare" in args.corpora:
        if not SHARED.is_dir():
            parser.error(f"the corpora wt2 and shakespeare read {SHARED}, which does not exist")

    path = Path(args.output)
    rows = [] if args.fresh or not path.exists() else json.loads(path.read_text())["rows"]
    done = {(r["corpus"], r["steps"], r["schedule"], r["seed"]) for r in rows}
    for corpus in args.corpora:
        for steps in args.steps:
            for schedule in args.schedules:
                for seed in args.seeds:
                    if (corpus, steps, schedule, seed) in done:
                        continue
                    row = run_one(corpus, steps, schedule, seed)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                    write_json(path, {"rows": rows})

    table = []
    for schedule in SCHEDULES:
        cells = []
        for corpus in CORPORA:
            for steps in sorted({r["steps"] for r in rows}):
                found = [r["perplexity"] for r in rows
                         if (r["schedule"], r["corpus"], r["steps"]) == (schedule, corpus, steps)]
                # geometric mean over seeds: the mean of the eval losses
                cells.append(f"{math.exp(sum(map(math.log, found)) / len(found)):.2f}" if found else "-")
        if any(c != "-" for c in cells):
            table.append([schedule, *cells])
    headers = ["schedule"] + [f"{c} {s}" for c in CORPORA for s in sorted({r["steps"] for r in rows})]
    print_table(headers, table)
    return {"rows": rows}


if __name__ == "__main__":
    main()
