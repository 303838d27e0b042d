r"""Fine-tuning defaults chosen by held-out evaluation, and what they give beside the bag-of-words baseline.

Two tables, one run per cell (seed 42, or `--seed`; `scripts/finetune_classification.py`, dev accuracy):

- `--table grid`: the learning rate and epochs (warmup left to its default, 10% of the steps) on the built-in topic
  task and SST-2 (its first 4,000 training rows after the seeded shuffle, `--max_train_samples 4000`; the whole dev
  split), from a pretrained `tiny` model (`--model`) and from scratch. `modeling_xl.finetuning.defaults` was chosen
  from it.
- `--table defaults`: every argument at its default on each classification set there is: the built-in task,
  `builtin-pairs` (same topic or not; `--text_pair_column sentence2`), `squad-pairs` (does this sentence answer
  this question, from SQuAD, as GLUE's QNLI), `ud-genre` (cased UD English-EWT sentences by web genre) and SST-2,
  from each model of `--model` / `--unigram_model` and from scratch (`--starts` picks one), beside
  `benchmarks/bench_baselines.py`'s TF-IDF + logistic regression. `--sst2_rows N` trains SST-2 on N rows instead
  of all 67,349 (the CPU budget).

The pretrained models are the README's main command, `python scripts/pretrain.py --preset tiny --output_dir M`, and
the same with `--tokenizer_type unigram` (the recommended tokenizer for text other than the pretraining corpus).
Rows are written to the JSON after every run; a rerun skips those already there (`--fresh` starts over).

    python benchmarks/bench_finetune_defaults.py --table grid --model outputs/tiny                 # ~30 min, 2 cores
    python benchmarks/bench_finetune_defaults.py --table defaults --model outputs/tiny \
        --unigram_model outputs/tiny-unigram --sst2_rows 4000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from common import print_table, run_script, write_json

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
sys.path.insert(0, str(REPO))

GRID = [(lr, epochs) for lr in (1e-4, 3e-4, 1e-3) for epochs in (1, 3)] + [(3e-3, 3), (1e-3, 5), (3e-3, 5)]
GRID_TASKS = ("builtin", "sst2")
DEFAULT_TASKS = ("builtin", "builtin-pairs", "squad-pairs", "ud-genre", "sst2")
PAIR_TASKS = ("builtin-pairs", "squad-pairs")


def task_arguments(task: str, data: Path, sst2_rows: int | None) -> list[str]:
    if task == "builtin":
        return ["--dataset_name", "builtin"]
    folder = {"builtin-pairs": data / "pairs", "squad-pairs": data / "squad_pairs", "ud-genre": data / "ud_genre",
              "sst2": SHARED / "sst2"}[task]
    files = ["--train_file", str(folder / "train.tsv"), "--validation_file", str(folder / "dev.tsv")]
    if task in PAIR_TASKS:
        return files + ["--text_pair_column", "sentence2"]
    return files + (["--max_train_samples", str(sst2_rows)] if task == "sst2" and sst2_rows else [])


def run_one(task: str, start: str, model: str, data: Path, extra: list[str], sst2_rows: int | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        command = [sys.executable, str(REPO / "scripts" / "finetune_classification.py"), "--model_name_or_path", model,
                   *task_arguments(task, data, sst2_rows), *extra, *(["--from_scratch"] if start == "scratch" else []),
                   "--output_dir", str(out), "--disable_tqdm"]
        seconds = run_script(command, f"{task} {start} {extra}")
        results = json.loads((out / "classification_results.json").read_text())
    args = results["args"]
    return {"task": task, "start": start, "model": model, "learning_rate": args["learning_rate"],
            "num_train_epochs": args["num_train_epochs"], "num_warmup_steps": args["num_warmup_steps"],
            "accuracy": results["dev"]["accuracy"], "train_steps": results["train_steps"],
            "num_train_examples": results["num_train_examples"], "unknown_token_share": results["unknown_token_share"],
            "seconds": round(seconds, 1), "extra": extra}


def baselines_on_the_same_rows(sst2_rows: int | None, seed: int = 42) -> dict:
    """`bench_baselines`' TF-IDF + logistic regression and most frequent class, trained on the rows fine-tuning
    trains on: SST-2's first `sst2_rows` after the script's seeded shuffle (`datasets` `shuffle(seed=seed)`), the
    other sets whole."""
    from collections import Counter

    import bench_baselines
    import datasets

    out = {}
    for task, data in bench_baselines.sets().items():
        if task not in DEFAULT_TASKS:
            continue
        train, dev = data["train"], data["validation"]
        if task == "sst2" and sst2_rows:
            keep = datasets.Dataset.from_dict({"i": list(range(len(train[0])))}).shuffle(seed=seed)["i"][:sst2_rows]
            train = ([train[0][i] for i in keep], [train[1][i] for i in keep])
        majority = Counter(train[1]).most_common(1)[0][0]
        out[task] = {"train": len(train[0]), "tfidf": bench_baselines.tfidf_logistic_regression(train, dev),
                     "majority": sum(y == majority for y in dev[1]) / len(dev[1]),
                     "second_text_alone": bench_baselines.second_text_alone(train, dev)}
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table", choices=("grid", "defaults"), required=True)
    parser.add_argument("--model", required=True, help="the main command's output folder (word level)")
    parser.add_argument("--unigram_model", help="the main command's output with --tokenizer_type unigram")
    parser.add_argument("--tasks", nargs="+", help="a subset of the table's tasks")
    parser.add_argument("--starts", nargs="+", choices=("pretrained", "scratch"), default=("pretrained", "scratch"),
                        help="defaults table: from the pretrained weights, from scratch, or both (the default)")
    parser.add_argument("--sst2_rows", type=int, default=None, help="defaults table: SST-2 training rows (all)")
    parser.add_argument("--output", default=None)
    parser.add_argument("--fresh", action="store_true", help="ignore the rows already in --output")
    parser.add_argument("--seed", type=int, default=42,
                        help="the fine-tuning seed, which also draws SST-2's training subset (and, defaults table, "
                             "the baselines' rows with it)")
    args = parser.parse_args(argv)
    path = Path(args.output or REPO / "benchmarks" / "results" / f"finetune_{args.table}.json")
    rows = [] if args.fresh or not path.exists() else json.loads(path.read_text())["rows"]
    data = path.parent / "finetune_data"
    import bench_baselines

    if args.table == "defaults":  # the files of the sets the defaults table reads from files
        tasks = args.tasks or DEFAULT_TASKS
        if "builtin-pairs" in tasks:
            bench_baselines.write_pairs(data / "pairs")
        if "squad-pairs" in tasks:
            bench_baselines.write_pair_files(data / "squad_pairs", bench_baselines.squad_pairs(bench_baselines.SQUAD))
        if "ud-genre" in tasks:
            bench_baselines.write_ud_genre(data / "ud_genre")

    models = {"word": args.model, **({"unigram": args.unigram_model} if args.unigram_model else {})}
    # from scratch: the same architecture and tokenizer as each model, random weights
    seed = [] if args.seed == 42 else ["--seed", str(args.seed)]  # 42, the script's default, keeps the rows' keys
    if args.table == "grid":
        plan = [(task, start, args.model, ["--learning_rate", f"{lr:g}", "--num_train_epochs", str(epochs), *seed],
                 4000)
                for task in args.tasks or GRID_TASKS for start in ("pretrained", "scratch") for lr, epochs in GRID]
    else:
        plan = [(task, start, model, seed, args.sst2_rows) for task in args.tasks or DEFAULT_TASKS
                for model in models.values() for start in args.starts]
    done = {(r["task"], r["start"], r["model"], tuple(r["extra"])) for r in rows}
    for task, start, model, extra, sst2_rows in plan:
        if (task, start, model, tuple(extra)) in done:
            continue
        row = run_one(task, start, model, data, extra, sst2_rows)
        print(json.dumps(row), flush=True)
        rows.append(row)
        write_json(path, {"rows": rows})
    if args.table == "defaults":
        baselines = baselines_on_the_same_rows(args.sst2_rows, args.seed)
        print_table(["task", "train rows", "TF-IDF + logistic regression", "most frequent class",
                     "pairs: second text alone"],
                    [[task, b["train"], f"{b['tfidf']:.4f}", f"{b['majority']:.4f}",
                      "" if b["second_text_alone"] is None else f"{b['second_text_alone']:.4f}"]
                     for task, b in baselines.items()])
        write_json(path, {"rows": rows, "baselines": baselines})
    print_table(["task", "start", "model", "lr", "epochs", "warmup", "steps", "<unk>", "accuracy", "s"],
                [[r["task"], r["start"], Path(r["model"]).name, f"{r['learning_rate']:g}", r["num_train_epochs"],
                  r["num_warmup_steps"], r["train_steps"], f"{r['unknown_token_share'] or 0:.3f}",
                  f"{r['accuracy']:.4f}", r["seconds"]] for r in rows])
    return {"rows": rows}


if __name__ == "__main__":
    main()
