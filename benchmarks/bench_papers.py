"""The papers' own comparisons at equal budget (issue 48), one command per table.

`--table xl-vs-gpt2` (Dai et al. 2019: Transformer-XL against a vanilla Transformer of the same size). Protocol in
`papers_lm.py`: ours is the `tiny` recipe (`scripts/pretrain.py --preset tiny`) on WikiText-2 (word level, the
preset's 8,000-word tokenizer) and tiny-shakespeare (character level, the last 5% of lines held out); GPT-2 is
transformers' `GPT2LMHeadModel` of the same depth, width, heads, feed-forward size and dropout, same tokenizer,
trained on the same token stream for the same steps and tokens per step, with the same optimizer (AdamW), schedule
(warmup then cosine) and clipping, its learning rate tuned on `papers_lm.LEARNING_RATES` at training windows of 256
(n_positions 256), the best then also trained on windows of 1,024 (n_positions 1,024) to reach the longest context.
Both score the same validation targets with the same contexts: ours 64 tokens a segment with memory M, GPT-2
windows of M + 64 tokens moved by 64, each scoring its last 64 targets, for M in 0 / 64 / 128 / 256 / 512 (128 is
the recipe's evaluation memory, the main column). Training tokens/s and peak memory come from a separate timed
phase: fresh processes, one thread, the models back to back, 3 rounds (the median), machine load recorded.

`--table plm-vs-bert` (Yang et al. 2019, Table 1: XLNet against BERT with the same data and hyperparameters).
Protocol in `papers_plm.py`: one Unigram tokenizer trained on WikiText-2's training split; our permutation LM, our
causal LM and transformers' `BertForMaskedLM` (with `DataCollatorForLanguageModeling`) of the same depth, width,
heads and feed-forward size, each pretrained there for `papers_plm.PRETRAIN_STEPS` steps of 16 x 64 positions with
the `tiny` recipe's schedule (BERT also at each rate of `papers_plm.BERT_GRID`, the one with the lowest validation
masked-LM loss fine-tuned beside the one at the recipe's rate, also at `papers_plm.BERT_FINETUNE_PROBE`); then each
fine-tuned with the same runner and budget (`papers_plm.BUDGET`) on SST-2, ud-genre, SQuAD, UD EWT UPOS and
ARC-Easy, seeds 42 / 1 / 2, beside each task's baseline on the same rows.

Every trained model, score and timing is written under `--results` (default benchmarks/results/papers) as soon as
it exists and is reused by the next run, so a killed run continues where it stopped (`--fresh`: delete it first).
Two processes of the same `plm-vs-bert` command share its work: each piece (a pretraining, a fine-tuning run) is
locked while it runs, the other process takes the next free one, and both end by waiting for the rest.
`--dry-run` runs either table at toy sizes into `--results`/dry-run (20 steps; 48 rows and 1 epoch a task).

    python benchmarks/bench_papers.py --table xl-vs-gpt2
    python benchmarks/bench_papers.py --table plm-vs-bert    # start it twice to use two cores
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])  # the scripts we start
for name, value in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(name, value)

from common import emit, print_table, run_worker, worker_args, write_json, write_marker  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "papers"
SPEED_ROUNDS, SPEED_STEPS, SPEED_WARMUP = 3, 20, 3


class Scores:
    """(summed NLL, targets) per model and context, kept in a JSON file as soon as each is computed."""

    def __init__(self, path: Path):
        self.path = path
        self.values = json.loads(path.read_text()) if path.exists() else {}

    def get(self, name: str, context: int, compute) -> dict | None:
        key = f"{name}@{context}"
        if key not in self.values:
            start = time.perf_counter()
            result = compute()
            self.values[key] = None if result is None else {"nll": result[0], "tokens": result[1],
                                                            "seconds": time.perf_counter() - start}
            write_marker(self.path, self.values)
        value = self.values[key]
        return None if value is None else {**value, "perplexity": _perplexity(value)}


def _perplexity(value: dict) -> float:
    import math

    return math.exp(value["nll"] / value["tokens"])


def n_params(folder: Path, kind: str) -> int:
    from transformers import GPT2LMHeadModel

    from modeling_xl import TransformerXLForCausalLM

    cls = TransformerXLForCausalLM if kind == "ours" else GPT2LMHeadModel
    return sum(p.numel() for p in cls.from_pretrained(folder).parameters())


# ------------------------------------------------------------------------------------------------------ xl-vs-gpt2
def tune_gpt2(train, valid, config: dict, folder: Path, steps: int, scores: Scores) -> tuple[dict, str]:
    """GPT-2 with n_positions 256 at every learning rate of the grid, scored at the main context; the grid widened
    by a factor of 2 past an edge that wins (at most twice), so the anchor's best lies inside it. ({name: model},
    the best name)."""
    import papers_lm as lm

    rates, models = list(lm.LEARNING_RATES), {}
    for _ in range(3):
        for lr in rates:
            name = f"gpt2_n{lm.GPT2_LENGTHS[0]}_lr{lr:g}"
            if name not in models:
                gpt2 = lm.gpt2_config(config, lm.GPT2_LENGTHS[0], config["vocab_size"])
                models[name] = {"kind": "gpt2", "train": lm.train_gpt2(train, gpt2, lr, steps, folder / name)}
                scores.get(name, lm.MAIN_CONTEXT, lambda: lm.score_gpt2(folder / name, valid, lm.MAIN_CONTEXT))
        best = min(models, key=lambda n: scores.get(n, lm.MAIN_CONTEXT, None)["perplexity"])
        lr = models[best]["train"]["lr"]
        if lr not in (min(rates), max(rates)):
            break
        rates.append(lr * 2 if lr == max(rates) else lr / 2)
    return models, best


def compare_on_corpus(corpus: str, folder: Path, steps: int | None, valid_tokens: int | None = None) -> dict:
    """Ours, the GPT-2 grid and the long-window GPT-2 on one corpus, with every score of the sweep."""
    import numpy as np
    import papers_lm as lm

    folder.mkdir(parents=True, exist_ok=True)
    steps = steps or lm.recipe()["max_steps"]
    ours = lm.pretrain_ours(corpus, folder / "ours", steps)
    train, valid = lm.token_streams(corpus, folder / "ours")
    valid = valid[:valid_tokens]
    np.save(folder / "train_ids.npy", train)  # read by the speed workers
    config = json.loads((folder / "ours" / "config.json").read_text())
    scores = Scores(folder / "scores.json")
    grid, best = tune_gpt2(train, valid, config, folder, steps, scores)
    models = {"ours": {"kind": "ours", "train": ours}, **grid}
    for context in lm.CONTEXTS:  # the sweep of what exists first: a run stopped during the long training keeps it
        scores.get("ours", context, lambda: lm.score_ours(folder / "ours", valid, context))
        scores.get(best, context, lambda: lm.score_gpt2(folder / best, valid, context))
    long = f"gpt2_n{lm.GPT2_LENGTHS[1]}_lr{models[best]['train']['lr']:g}"
    gpt2 = lm.gpt2_config(config, lm.GPT2_LENGTHS[1], config["vocab_size"])
    models[long] = {"kind": "gpt2", "train": lm.train_gpt2(train, gpt2, models[best]["train"]["lr"], steps,
                                                           folder / long)}
    for context in lm.CONTEXTS:
        scores.get(long, context, lambda: lm.score_gpt2(folder / long, valid, context))
    for name, model in models.items():
        model["params"] = n_params(folder / name, model["kind"])
        model["scores"] = {c: scores.get(name, c, None) for c in lm.CONTEXTS if f"{name}@{c}" in scores.values}
    return {"models": models, "best": best, "long": long, "char_level": lm.CORPORA[corpus]["char_level"],
            "valid_targets": int(len(valid) - 1), "train_tokens": int(len(train))}


def measure_speed(folder: Path, names: list[str], kinds: dict) -> dict:
    """Training tokens/s and peak memory, `SPEED_ROUNDS` rounds of fresh processes, the models back to back."""
    path = folder / "speed.json"
    if path.exists():
        return json.loads(path.read_text())
    load_before, runs = os.getloadavg(), {name: [] for name in names}
    for _ in range(SPEED_ROUNDS):
        for name in names:
            runs[name].append(run_worker(sys.executable, Path(__file__), {
                "worker": "speed", "kind": kinds[name], "folder": str(folder / name), "threads": 1,
                "train_ids": str(folder / "train_ids.npy"), "steps": SPEED_STEPS, "warmup": SPEED_WARMUP}))
    result = {name: {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
                     "peak_mib": statistics.median(r["tensor_peak_bytes"] for r in rs) / 2**20,
                     "rss_growth_mib": statistics.median(r["rss_growth_bytes"] for r in rs) / 2**20, "runs": rs}
              for name, rs in runs.items()}
    result["load_avg"] = {"before": load_before, "after": os.getloadavg()}
    write_marker(path, result)
    return result


def xl_vs_gpt2(args) -> dict:
    import papers_lm as lm

    start = time.perf_counter()
    report = {}
    for corpus in args.corpora:
        report[corpus] = compare_on_corpus(corpus, args.results / "xl-vs-gpt2" / corpus, args.steps,
                                           args.valid_tokens)
    for corpus, found in report.items():
        names = ["ours", found["best"], found["long"]]
        found["speed"] = measure_speed(args.results / "xl-vs-gpt2" / corpus, names,
                                       {n: found["models"][n]["kind"] for n in names})
    tables = xl_tables(report, lm)
    payload = {"table": "xl-vs-gpt2", "corpora": report, "tables": tables, "seconds_this_run":
               time.perf_counter() - start, "protocol": {"contexts": lm.CONTEXTS, "segment": lm.SEGMENT,
               "learning_rates": lm.LEARNING_RATES, "gpt2_lengths": lm.GPT2_LENGTHS, "recipe": lm.recipe()}}
    write_json(args.results / "xl-vs-gpt2.json", payload)
    return payload


def xl_tables(report: dict, lm) -> list[str]:
    main, grid, sweep = [], [], []
    for corpus, found in report.items():
        models, best, long = found["models"], found["best"], found["long"]
        anchor = models[best]["scores"][lm.MAIN_CONTEXT]["perplexity"]
        for name in ("ours", best, long):
            cell = models[name]["scores"].get(lm.MAIN_CONTEXT)
            speed = found["speed"][name]
            main.append([corpus, name, f"{models[name]['params']:,}", f"{cell['perplexity']:.2f}" if cell else "-",
                         f"{cell['perplexity'] / anchor:.3f}" if cell else "-", f"{speed['tokens_per_s']:,.0f}",
                         f"{speed['peak_mib']:.0f} ({speed['rss_growth_mib']:.0f})",
                         f"{models[name]['train']['seconds'] / 60:.1f}"])
        for name in models:
            if name != "ours" and name != long:
                grid.append([corpus, models[name]["train"]["lr"], f"{models[name]['train']['final_train_loss']:.3f}",
                             f"{models[name]['scores'][lm.MAIN_CONTEXT]['perplexity']:.2f}"])
        for context in lm.CONTEXTS:
            cells = [models[n]["scores"].get(context) for n in ("ours", best, long)]
            known = [c["perplexity"] for c in cells[1:] if c]
            sweep.append([corpus, context, context + lm.SEGMENT,
                          *(f"{c['perplexity']:.2f}" if c else "- (past n_positions)" for c in cells),
                          f"{cells[0]['perplexity'] / min(known):.3f}"])
    return [print_table(["corpus", "model", "parameters", f"perplexity, context {lm.MAIN_CONTEXT}",
                         "/ tuned GPT-2", "training tokens/s", "peak MiB: tensors (RSS growth)", "training min"], main),
            print_table(["corpus", "GPT-2 learning rate", "final training loss",
                         f"perplexity, context {lm.MAIN_CONTEXT}"], grid),
            print_table(["corpus", "ours: memory", "GPT-2: window", "ours", "GPT-2 n_positions 256",
                         "GPT-2 n_positions 1,024", "ours / best GPT-2"], sweep)]


# ----------------------------------------------------------------------------------------------------- plm-vs-bert
METRICS = {"sst2": ("eval_accuracy", "accuracy"), "ud-genre": ("eval_accuracy", "accuracy"),
           "squad": ("eval_f1", "f1"), "upos": ("eval_accuracy", "accuracy"), "arc": ("eval_accuracy", "accuracy")}


@contextmanager
def claimed(path: Path, wait: bool):
    """An exclusive lock on `path`.lock while the work that writes `path` runs: a second process started with the
    same command skips that work (`wait=False`: yields False) or waits for it. The lock ends with its process."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True


def run_units(units: list) -> None:
    """Each (result path, function writing it, paths it needs...) not done yet: first those whose inputs exist and
    that no other process holds, then the rest in order, waiting for each. Two processes of the same command so
    share the work, and both end with every result."""
    for wait in (False, True):
        for path, work, *needs in units:
            if path.exists() or (not wait and not all(n.exists() for n in needs)):
                continue
            with claimed(path, wait) as mine:
                if mine and not path.exists():
                    work()


def pretraining_units(root: Path, steps: int) -> list:
    """The tokenizer, then the permutation LM, the causal LM and every BERT (each then scored on the validation
    split), each behind the file that says it is done."""
    import papers_plm as plm

    tokenizer = root / "tokenizer"
    made = tokenizer / "tokenizer.json"
    ours = [(plm.pretrained_marker(root, m), lambda m=m: plm.pretrain_ours(m, tokenizer, root / m, steps), made)
            for m in plm.PRETRAINED]
    berts = []
    for m, lr in plm.BERT_RATES.items():
        berts += [(plm.pretrained_marker(root, m), lambda m=m, lr=lr: plm.pretrain_bert(tokenizer, root / m, steps,
                                                                                       learning_rate=lr), made),
                  (root / m / "valid.json", lambda m=m: plm.bert_validation_loss(tokenizer, root / m),
                   plm.pretrained_marker(root, m))]
    scratch = (plm.pretrained_marker(root, "plm_scratch"), lambda: plm.scratch_copy(root),
               plm.pretrained_marker(root, "plm"))
    summaries = [(plm.pretrained_marker(root, m), lambda m=m: plm.summary_copy(root, m),
                  plm.pretrained_marker(root, source)) for m, source in plm.SUMMARY_VARIANTS.items()]
    return [(made, lambda: plm.train_tokenizer(tokenizer)), *ours, scratch, *summaries, *berts]


def finetuning_units(root: Path, budget: dict, seeds, dev_rows, models) -> list:
    """The task files, the example scripts, the causal LM's question-first copy, then every (seed, task, model) run of
    `models`, each runnable as soon as what it reads exists (so fine-tuning starts while a slower model still
    pretrains)."""
    import papers_plm as plm

    tasks, scripts = root / "data" / "tasks.json", root / "hf_scripts" / "question-answering" / "run_qa.py"
    question_first = root / "clm_question_first.json"
    units = [(tasks, lambda: plm.prepare_tasks(root / "data", budget, dev_rows)),
             (scripts, lambda: plm.example_scripts(root / "hf_scripts")),
             (question_first, lambda: plm.question_first_copy(root), plm.pretrained_marker(root, "clm"))]

    def run(task, model, seed):
        out = root / "runs" / f"{task}_{model}_s{seed}"  # a model's name may hold a dot: no `with_suffix` here
        files = json.loads(tasks.read_text())[task]["files"]
        result = plm.finetune(task, plm.model_folder(root, model, task), files, seed, out, budget,
                              root / "hf_scripts", learning_rate=plm.finetuned_at(model)[1])
        done = run_result(root, task, model, seed)
        done.parent.mkdir(parents=True, exist_ok=True)
        write_marker(done, result)
        shutil.rmtree(out, ignore_errors=True)  # the fine-tuned weights: only the scores are kept

    for seed in seeds:
        for task in budget:
            for model in (m for m in models if plm.finetuned_on(m, task)):
                needs = [plm.pretrained_marker(root, model), tasks, scripts]
                needs += [question_first] if plm.model_folder(root, model, task).name == "clm_question_first" else []
                units.append((run_result(root, task, model, seed), lambda t=task, m=model, s=seed: run(t, m, s),
                              *needs))
    return units


def run_result(root: Path, task: str, model: str, seed: int) -> Path:
    """The file that holds one fine-tuning run's scores (and says that the run is done)."""
    return root / "runs" / f"{task}_{model}_s{seed}.json"


def pretrained(root: Path, steps: int) -> dict:
    """What each pretraining gave (validation loss, BERT's final training loss, seconds) and each model's
    parameters."""
    import papers_plm as plm
    from safetensors.torch import load_file

    done = {m: plm.pretrain_ours(m, root / "tokenizer", root / m, steps) for m in plm.PRETRAINED}
    for model, lr in plm.BERT_RATES.items():
        done[model] = {**plm.pretrain_bert(root / "tokenizer", root / model, steps, learning_rate=lr),
                       "validation": plm.bert_validation_loss(root / "tokenizer", root / model)}
    for model in ("plm_scratch", *plm.SUMMARY_VARIANTS):
        done[model] = json.loads(plm.pretrained_marker(root, model).read_text())
    for model in done:
        done[model]["params"] = sum(t.numel() for t in load_file(root / model / "model.safetensors").values())
    return done


def plm_vs_bert(args) -> dict:
    import papers_plm as plm

    start = time.perf_counter()
    root = args.results / "plm-vs-bert"
    budget = dict(plm.BUDGET)
    seeds, dev_rows = plm.SEEDS, None
    if args.dry_run:
        budget = {task: (runner, 48, 1, length) for task, (runner, _, _, length) in budget.items()}
        seeds, dev_rows = plm.SEEDS[:1], 48
    steps = args.steps or plm.PRETRAIN_STEPS
    run_units(pretraining_units(root, steps) + finetuning_units(root, budget, seeds, dev_rows, plm.MODELS))
    tuned = plm.best_bert(root)  # known once every BERT of the grid is pretrained and scored
    probe = f"{tuned}@ft{plm.BERT_FINETUNE_PROBE:g}"
    models = (*plm.MODELS, tuned, probe)
    run_units(finetuning_units(root, budget, seeds, dev_rows, (tuned, probe)))
    tasks = json.loads((root / "data" / "tasks.json").read_text())
    results = {(t, m, s): json.loads(run_result(root, t, m, s).read_text())
               for s in seeds for t in budget for m in models if plm.finetuned_on(m, t)}
    table = plm_table(results, tasks, seeds, models)
    payload = {"table": "plm-vs-bert", "pretraining": pretrained(root, steps), "tuned_bert": tuned,
               "budget": budget, "seeds": seeds, "tasks": tasks,
               "runs": {f"{t}/{m}/{s}": r for (t, m, s), r in results.items()}, "markdown": table,
               "seconds_this_run": time.perf_counter() - start}
    write_json(args.results / "plm-vs-bert.json", payload)
    return payload


def plm_table(results: dict, tasks: dict, seeds, models) -> str:
    import papers_plm as plm

    rows = []
    for task, (key, baseline_key) in METRICS.items():
        cells, means = [], {}
        for model in models:
            if not plm.finetuned_on(model, task):  # a summary variant on a task whose head reads no summary
                cells.append("-")
                continue
            scores = [results[(task, model, s)][key] for s in seeds]
            means[model] = statistics.mean(scores)
            spread = f" ± {statistics.stdev(scores):.3f}" if len(scores) > 1 else ""
            cells.append(f"{means[model]:.3f}{spread}")
        base = tasks[task]["baseline"]
        rows.append([task, tasks[task]["train_rows"], tasks[task]["dev_rows"], *cells,
                     f"{base[baseline_key]:.3f} ({base['name']})", max(means, key=means.get)])
    return print_table(["task (metric)", "train rows", "dev rows", *[f"{m}: mean ± sd" for m in models],
                        "baseline", "best"], rows)


# ------------------------------------------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table", required=True, choices=["xl-vs-gpt2", "plm-vs-bert"])
    parser.add_argument("--corpora", nargs="+", default=["wt2", "shakespeare"], choices=["wt2", "shakespeare"])
    parser.add_argument("--steps", type=int, help="training steps of every model (default: the recipe's 1,500)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--dry-run", action="store_true",
                        help="a smoke run at toy sizes (20 steps, 4,000 validation tokens, 2 timed steps) into "
                             "--results/dry-run")
    parser.add_argument("--fresh", action="store_true", help="delete this table's earlier results first")
    args = parser.parse_args(argv)
    if not (REPO.parent / "shared" / "data").is_dir():
        parser.error(f"the corpora are read from {REPO.parent / 'shared' / 'data'}, which does not exist")
    import torch

    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"  # the training scripts started from here
    args.valid_tokens = None
    if args.dry_run:
        global SPEED_STEPS, SPEED_ROUNDS
        args.results, args.steps, args.valid_tokens = args.results / "dry-run", 20, 4000
        SPEED_STEPS, SPEED_ROUNDS = 2, 1
    if args.fresh:
        shutil.rmtree(args.results / args.table, ignore_errors=True)
    return xl_vs_gpt2(args) if args.table == "xl-vs-gpt2" else plm_vs_bert(args)


def worker(args: dict) -> dict:
    """One measurement in a fresh process (`common.run_worker`): a timed training phase, or a classification run."""
    if args["worker"] == "speed":
        import papers_lm

        return papers_lm.speed_worker(args)
    import papers_plm

    return papers_plm.classify_worker(args)


if __name__ == "__main__":
    if "--args" in sys.argv:
        emit(worker(worker_args()))
    else:
        main()
