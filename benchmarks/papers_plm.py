"""XLNet-style pretraining against BERT and against our causal LM at equal budget (issue 48, `bench_papers.py --table
plm-vs-bert`; Yang et al. 2019, Table 1: the same data and hyperparameters).

Pretraining. One Unigram tokenizer of 8,000 pieces (`scripts/train_tokenizer.py --kind unigram`), trained once on
WikiText-2's training split, gives the one token stream all three models read (the tokenizer's ids of that split,
`<eos>`-free lines as `scripts/pretrain.py` tokenizes them). Each model reads 16 rows of 64 positions a step for
`PRETRAIN_STEPS` steps, with AdamW (no weight decay), the `tiny` recipe's learning rate, warmup (its share of a
1,500-step run) then cosine, and clipping at 1.0, dropout 0.1 (none on the attention weights):

- `plm`: `scripts/pretrain.py --preset tiny --objective plm` (XLNet's `reuse ++ A <sep> B <sep> <cls>` samples, reuse
  32, about 1 in 6 positions predicted, memory carried);
- `clm`: `scripts/pretrain.py --preset tiny` (the causal Transformer-XL, adaptive softmax, memory carried);
- `bert`: transformers' `BertForMaskedLM` of the same depth, width, heads and feed-forward size (its own embedding
  with 512 positions and 2 segment types, its own tied output layer), trained here on `<cls> 62 tokens <sep>` blocks
  read from the same 16 contiguous rows, masked by `DataCollatorForLanguageModeling` (15%: 80% mask, 10% random,
  10% kept), no next-sentence task. Twice in the table: `bert` at the recipe's learning rate (3e-3, the same
  hyperparameters as ours; the post-LN BERT sits on the unigram plateau there for all 4,500 steps), and the best of
  `BERT_GRID` (5e-4 / 1e-3 / 2e-3) by masked-LM loss on WikiText-2's validation split (`best_bert`).
- `plm_scratch`: the `plm` model's architecture and tokenizer with fresh weights, not pretrained (`scratch_copy`):
  what pretraining adds to each task.

Fine-tuning, the same runner and budget for every model (`BUDGET`; learning rate 1e-3, 10% warmup then linear decay,
batch 16, AdamW, clipping 1.0: transformers' Trainer defaults besides), seeds 42 / 1 / 2 (the head's initialisation,
dropout and data order; the rows are the same for every seed and model): SQuAD v1.1 span QA by `run_qa.py`, UD EWT
UPOS tagging by `run_ner.py` and ARC-Easy by `run_swag.py` (transformers' example scripts, offline copies by
../shared/hf_examples/prepare.sh), SST-2 and ud-genre by `classify_worker` below (a Trainer over
`AutoModelForSequenceClassification` with the same arguments: the examples have no text-classification script, and
`scripts/finetune_classification.py` builds only our classifier). Each model reads its own layout: BERT `<cls> A <sep>
B <sep>` padded on the right (question first in QA), ours `A <sep> B <sep> <cls>` padded on the left (the permutation
LM reads XLNet's passage-first QA layout; the causal LM's QA folder pads on the right so that it reads the question
before the passage). The baselines are fit on the same training rows and scored on the same dev rows.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from common import run_script, write_marker

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
WIKITEXT2 = SHARED / "data" / "wikitext-2"
VOCAB_SIZE = 8000
PRETRAIN_STEPS = 4500
# BERT twice in the table: at the recipe's learning rate (Yang et al.'s "same hyperparameters"; this post-LN model stays
# on the unigram plateau there: docs/papers.md), and tuned: the rate of BERT_GRID whose pretrained model has the lowest
# masked-LM loss on WikiText-2's validation split (`bert_validation_loss`), as GPT-2's rate is chosen by its
# validation perplexity in xl-vs-gpt2. Every BERT of BERT_RATES is pretrained; two of them are fine-tuned.
BERT_GRID = (5e-4, 1e-3, 2e-3)
BERT_RATES = {"bert": None, **{f"bert_lr{lr:g}": lr for lr in BERT_GRID}}
BERT_FINETUNE_PROBE = 3e-4  # the tuned BERT is also fine-tuned at this rate (its runs spread widely at COMMON's)
OURS = {"plm": ("plm", ()), "clm": ("clm", ())}  # name -> (objective, extra `scripts/pretrain.py` arguments)
# Item 3 of issue 48: the permutation LM again with one sampler size changed, fine-tuned like the others (a column of
# the table): `plm_np21` predicts 21 of 64 positions a sample (1 in 3) where the default predicts 11 (~1 in 6, XLNet's
# K = 6), so that at this budget it sees about twice the targets a step; `plm_reuse16` keeps 16 positions for the next
# memory instead of 32, so that its A <sep> B <sep> <cls> part is 48 long instead of 32, nearer the fine-tuning
# tasks' lengths (its local permutation blocks follow, 16 long, as XLNet's `perm_size` follows `reuse_len`);
# `plm_span1` predicts single tokens (`--max_gram 1`) where the default draws spans of 1-5 (XLNet's), each target
# with its own context of 6 instead of a span's 6-30
SAMPLER_VARIANTS = {"plm_np21": ("plm", ("--num_predict", 21)), "plm_reuse16": ("plm", ("--reuse_len", 16)),
                    "plm_span1": ("plm", ("--max_gram", 1))}
# ... and the recipe: `plm_lr0.001` pretrains at 1e-3, the tuned BERT's rate, where the `tiny` recipe's 3e-3 was
# chosen for the causal LM (docs/pretraining.md)
RECIPE_VARIANTS = {"plm_lr0.001": ("plm", ("--learning_rate", "1e-3"))}
PRETRAINED = {**OURS, **SAMPLER_VARIANTS, **RECIPE_VARIANTS}
# ... and "the summary a head reads": our two pretrained models again, their classification and multiple-choice heads
# pooling the mean of the real tokens' states instead of the last one's (`summary_type`: XLNet reads its <cls>, last),
# fine-tuned only on the tasks whose heads read a summary (`SUMMARY_TASKS`); name -> the pretrained model they copy
SUMMARY_VARIANTS = {"plm_mean": "plm", "clm_mean": "clm"}
SUMMARY_TASKS = ("sst2", "ud-genre", "arc")
# `plm_scratch`: the permutation LM's architecture and tokenizer with fresh weights (`scratch_copy`), fine-tuned the
# same way: what pretraining adds on each task at this size. Fine-tuned: MODELS, and the tuned BERT (`best_bert`);
# `plm@ft0.0003`: the permutation LM fine-tuned at BERT_FINETUNE_PROBE (is COMMON's rate what holds it under clm?)
MODELS = (*OURS, *SAMPLER_VARIANTS, *RECIPE_VARIANTS, *SUMMARY_VARIANTS, "plm_scratch", "bert",
          f"plm@ft{BERT_FINETUNE_PROBE:g}")
SEEDS = (42, 1, 2)
DATA_SEED = 0  # draws the training rows of every task, once
COMMON = {"learning_rate": 1e-3, "warmup_steps": 0.1, "per_device_train_batch_size": 16,
          "per_device_eval_batch_size": 32}
# task -> (runner, training rows, epochs, max tokens); dev: the whole split (SQuAD: the 4 held-out articles)
BUDGET = {
    "sst2": ("classify", 4000, 2, 64),
    "ud-genre": ("classify", 4000, 2, 64),
    "squad": ("question-answering/run_qa.py", 1000, 2, 192),
    "upos": ("token-classification/run_ner.py", 3000, 2, 128),
    "arc": ("multiple-choice/run_swag.py", 1000, 2, 64),
}
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1", "TOKENIZERS_PARALLELISM":
           "false", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_DISABLED": "true"}


# ------------------------------------------------------------------------------------------------------- pretraining
def train_tokenizer(folder: Path) -> Path:
    if not (folder / "tokenizer.json").exists():
        run_script([sys.executable, REPO / "scripts" / "train_tokenizer.py", "--corpus", WIKITEXT2, "--kind", "unigram",
                    "--vocab-size", VOCAB_SIZE, "--output", folder], "the Unigram tokenizer")
    return folder


def pretrain_ours(model: str, tokenizer: Path, folder: Path, steps: int) -> dict:
    """`scripts/pretrain.py --preset tiny --objective {plm,clm}` (and `model`'s extra arguments, `PRETRAINED`) on
    WikiText-2 with `tokenizer` (skipped when done)."""
    objective, extra = PRETRAINED[model]
    if not (folder / "eval_results.json").exists():
        seconds = run_script([sys.executable, REPO / "scripts" / "pretrain.py", "--preset", "tiny", "--objective",
                              objective, *extra, "--dataset_name", WIKITEXT2, "--tokenizer_name", tokenizer,
                              "--max_train_steps", steps, "--eval_steps", 10**9, "--max_eval_segments", 1,
                              "--token_cache", "false", "--disable_tqdm", "--overwrite_output_dir", "--output_dir",
                              folder], f"pretraining {model}")
        write_marker(folder / "wall.json", {"seconds": seconds})
    return {**json.loads((folder / "eval_results.json").read_text()),
            **json.loads((folder / "wall.json").read_text())}


def bert_tokenizer(tokenizer: Path):
    """The same Unigram pieces with BERT's template (`<cls> A <sep> B <sep>`, segment ids 0 / 1) and right padding."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    from tokenization._wrapping import wrap_tokenizer

    ours = AutoTokenizer.from_pretrained(tokenizer)
    backend = ours.backend_tokenizer
    cls, sep = ours.cls_token_id, ours.sep_token_id
    backend.post_processor = processors.TemplateProcessing(
        single="<cls>:0 $A:0 <sep>:0", pair="<cls>:0 $A:0 <sep>:0 $B:1 <sep>:1",
        special_tokens=[("<cls>", cls), ("<sep>", sep)])
    return wrap_tokenizer(backend, unk_token="<unk>", cls_token="<cls>", sep_token="<sep>", pad_token="<pad>",
                          mask_token="<mask>", padding_side="right",
                          model_input_names=["input_ids", "token_type_ids", "attention_mask"])


def train_stream(tokenizer: Path) -> np.ndarray:
    """WikiText-2's training split as `scripts/pretrain.py` tokenizes it with `tokenizer` (a folder)."""
    from papers_lm import token_streams

    return token_streams("wt2", tokenizer)[0]


def bert_blocks(train: np.ndarray, steps: int, cls: int, sep: int, rows: int = 16, length: int = 64):
    """[rows, length] blocks `<cls> t_1 .. t_62 <sep>`: step t reads the t-th piece of each of `rows` contiguous
    rows of the stream (as ours' ordered streams), starting over at the rows' starts when they are read through."""
    text = length - 2
    row_len = len(train) // rows
    per_row = row_len // text
    starts = np.arange(rows)[:, None] * row_len
    for step in range(steps):
        pieces = train[starts + (step % per_row) * text + np.arange(text)]
        yield torch.from_numpy(np.concatenate([np.full((rows, 1), cls), pieces, np.full((rows, 1), sep)], axis=1))


def bert_config(tokenizer):
    """BERT of the `tiny` preset's depth, width, heads, feed-forward size and dropout."""
    from transformers import BertConfig

    from modeling_xl import TransformerXLConfig

    ours = TransformerXLConfig.from_preset("tiny")
    return BertConfig(vocab_size=len(tokenizer), hidden_size=ours.d_model, num_hidden_layers=ours.n_layer,
                      num_attention_heads=ours.n_head, intermediate_size=ours.d_inner,
                      hidden_dropout_prob=ours.dropout, attention_probs_dropout_prob=ours.dropatt,
                      max_position_embeddings=512, type_vocab_size=2, pad_token_id=tokenizer.pad_token_id)


def pretrain_bert(tokenizer: Path, folder: Path, steps: int, seed: int = 42,
                  learning_rate: float | None = None) -> dict:
    """`BertForMaskedLM` with `DataCollatorForLanguageModeling`, ours' recipe (see the module docstring), or another
    peak `learning_rate`."""
    from papers_lm import optimizer_step, recipe
    from transformers import BertForMaskedLM, DataCollatorForLanguageModeling, get_scheduler

    done = folder / "train.json"
    if done.exists():
        return json.loads(done.read_text())
    rec, tok = recipe(), bert_tokenizer(tokenizer)
    train = train_stream(tokenizer)
    torch.manual_seed(seed)
    model = BertForMaskedLM(bert_config(tok)).train()
    collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, seed=seed)
    learning_rate = learning_rate or rec["learning_rate"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0, fused=True)
    warmup = rec["warmup_steps"] * steps // rec["max_steps"]
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=warmup, num_training_steps=steps)
    losses, start = [], time.perf_counter()
    for blocks in bert_blocks(train, steps, tok.cls_token_id, tok.sep_token_id):
        batch = collator.torch_call([{"input_ids": row} for row in blocks])
        loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        optimizer_step(model, loss, optimizer, rec["max_grad_norm"], scheduler)
        losses.append(loss.item())
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    result = {"steps": steps, "warmup_steps": warmup, "learning_rate": learning_rate,
              "final_train_loss": float(np.mean(losses[-100:])), "seconds": time.perf_counter() - start,
              "loss_per_100_steps": [float(np.mean(losses[i : i + 100])) for i in range(0, len(losses), 100)]}
    write_marker(done, result)
    return result


def bert_validation_loss(tokenizer: Path, folder: Path, seed: int = 0) -> dict:
    """A pretrained BERT's masked-LM loss (mean over the masked positions) on WikiText-2's validation split, read once
    in the blocks of pretraining (`bert_blocks`: 16 rows, `<cls>` 62 tokens `<sep>`), masked by the pretraining
    collator with one seed, so every BERT is scored on the same masks. Written to `folder`/valid.json."""
    from papers_lm import token_streams
    from transformers import BertForMaskedLM, DataCollatorForLanguageModeling

    done = folder / "valid.json"
    if done.exists():
        return json.loads(done.read_text())
    tok = bert_tokenizer(tokenizer)
    valid = token_streams("wt2", tokenizer)[1]
    model = BertForMaskedLM.from_pretrained(folder).eval()
    collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, seed=seed)
    pieces = len(valid) // 16 // 62  # every piece of every row once
    total, count = 0.0, 0
    with torch.no_grad():
        for blocks in bert_blocks(valid, pieces, tok.cls_token_id, tok.sep_token_id):
            batch = collator.torch_call([{"input_ids": row} for row in blocks])
            masked = int((batch["labels"] != -100).sum())
            total += float(model(input_ids=batch["input_ids"], labels=batch["labels"]).loss) * masked
            count += masked
    result = {"mlm_loss": total / count, "masked_positions": count, "seed": seed}
    write_marker(done, result)
    return result


def best_bert(root: Path) -> str:
    """The BERT of BERT_GRID with the lowest validation masked-LM loss (each scored by `bert_validation_loss`)."""
    grid = [name for name, lr in BERT_RATES.items() if lr in BERT_GRID]
    return min(grid, key=lambda name: json.loads((root / name / "valid.json").read_text())["mlm_loss"])


# ------------------------------------------------------------------------------------------------------------ folders
def finetuned_at(model: str) -> tuple[str, float | None]:
    """A table model may name its fine-tuning rate after "@ft" (`bert_lr0.001@ft0.0003`): (the pretrained model,
    that rate, or None for COMMON's)."""
    name, _, rate = model.partition("@ft")
    return name, float(rate) if rate else None


def pretrained_marker(root: Path, model: str) -> Path:
    """The file whose existence says that `model` is pretrained (written last)."""
    model = finetuned_at(model)[0]
    if model == "plm_scratch" or model in SUMMARY_VARIANTS:  # beside its folder, which the copy clears (the unit's
        return root / f"{model}.json"                           # lock lies beside it too)
    return root / model / ("train.json" if model in BERT_RATES else "wall.json")


def scratch_copy(root: Path, seed: int = 42) -> None:
    """`plm_scratch`: the permutation LM's config and tokenizer files, its weights drawn afresh at `seed`, saved as a
    model folder with its code."""
    from modeling_xl import TransformerXLConfig, TransformerXLForPermutationLM

    folder = root / "plm_scratch"
    shutil.rmtree(folder, ignore_errors=True)  # a copy a killed run left half made
    torch.manual_seed(seed)
    model = TransformerXLForPermutationLM(TransformerXLConfig.from_pretrained(root / "plm"))
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(root / "plm" / name, folder / name)
    write_marker(pretrained_marker(root, "plm_scratch"), {"source": str(root / "plm"), "seed": seed})


def summary_copy(root: Path, model: str) -> None:
    """`model` of SUMMARY_VARIANTS: its source's folder with `summary_type` "mean" in the config."""
    source, folder = root / SUMMARY_VARIANTS[model], root / model
    shutil.rmtree(folder, ignore_errors=True)  # a copy a killed run left half made
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.lock", "checkpoints"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "summary_type": "mean"}, indent=2) + "\n")
    write_marker(pretrained_marker(root, model), {"source": str(source), "summary_type": "mean"})


def finetuned_on(model: str, task: str) -> bool:
    """Whether the table has `model` fine-tuned on `task` (a summary variant only where a head reads the summary)."""
    return finetuned_at(model)[0] not in SUMMARY_VARIANTS or task in SUMMARY_TASKS


def model_folder(root: Path, model: str, task: str) -> Path:
    """The folder `model` is fine-tuned from on `task`: its own, or for the causal LM's QA its question-first copy."""
    model = finetuned_at(model)[0]
    return root / "clm_question_first" if (model, task) == ("clm", "squad") else root / model


def question_first_copy(root: Path) -> None:
    """The causal LM's folder with a tokenizer that pads on the right: `run_qa.py` then writes the question first."""
    from bench_tasks import right_padded

    shutil.rmtree(root / "clm_question_first", ignore_errors=True)  # a copy a killed run left half made
    right_padded(root / "clm", root / "clm_question_first")
    write_marker(root / "clm_question_first.json", {"source": str(root / "clm"), "padding_side": "right"})


# --------------------------------------------------------------------------------------------------------- task data
def _sample(rows: list, count: int | None) -> list:
    """`count` rows drawn once (DATA_SEED), in their file order; all of them when `count` is None or larger."""
    if count is None or count >= len(rows):
        return rows
    return [rows[i] for i in sorted(random.Random(DATA_SEED).sample(range(len(rows)), count))]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def prepare_tasks(work: Path, budget: dict, dev_rows: int | None = None) -> dict:
    """The training and dev files of every task (the drawn training rows, the whole dev split, or its first
    `dev_rows`) and each task's baseline on them: {task: {"files": [...], "train_rows", "dev_rows", "baseline"}}."""
    import bench_baselines as bb
    import bench_tasks as bt

    done = work / "tasks.json"
    if done.exists():
        return json.loads(done.read_text())
    work.mkdir(parents=True, exist_ok=True)
    raw = bt.task_data(SHARED / "data", work)  # qa / pos / mc rows, and swag-format ARC files
    sst2 = {s: list(zip(*bb.read_tsv(SHARED / "data" / "sst2" / f"{s}.tsv"))) for s in ("train", "dev")}
    genre = {s: list(zip(*bb.ud_genre(SHARED / "data" / "ud_ewt" / f"{s}.jsonl"))) for s in ("train", "dev")}
    rows = {"sst2": (sst2["train"], sst2["dev"]), "ud-genre": (genre["train"], genre["dev"]),
            "squad": (raw["qa"]["train"], raw["qa"]["dev"]), "upos": (raw["pos"]["train"], raw["pos"]["dev"]),
            "arc": (raw["mc"]["train"], raw["mc"]["dev"])}
    tasks = {}
    for task, (train, dev) in rows.items():
        train, dev = _sample(train, budget[task][1]), dev[:dev_rows]
        if task == "upos":  # run_ner.py takes its labels from the training rows
            tags = {tag for row in train for tag in row["upos_tags"]}
            dev = [row for row in dev if set(row["upos_tags"]) <= tags]
        tasks[task] = {"files": _write_task_files(work, task, train, dev), "train_rows": len(train),
                       "dev_rows": len(dev), "baseline": _baseline(task, train, dev)}
    write_marker(done, tasks)
    return tasks


def _write_task_files(work: Path, task: str, train: list, dev: list) -> list[str]:
    """The runner's --train_file / --validation_file arguments for these rows."""
    paths = [work / f"{task}_train.json", work / f"{task}_dev.json"]
    for path, rows in zip(paths, (train, dev)):
        if task in ("sst2", "ud-genre"):
            _write_jsonl(path, [{"text": text, "label": label} for text, label in rows])
        elif task == "squad":
            path.write_text(json.dumps({"data": rows}, ensure_ascii=False), encoding="utf-8")
        else:
            _write_jsonl(path, rows)
    return ["--train_file", str(paths[0]), "--validation_file", str(paths[1])]


def _baseline(task: str, train: list, dev: list) -> dict:
    """The simplest baseline on these rows: TF-IDF + logistic regression (classification), the best-overlap
    sentence (QA), each word's most frequent tag (tagging), the choice sharing the most words with the question."""
    import bench_baselines as bb
    import bench_tasks as bt

    if task in ("sst2", "ud-genre"):
        return {"name": "TF-IDF + logistic regression", "accuracy": bb.tfidf_logistic_regression(
            tuple(map(list, zip(*train))), tuple(map(list, zip(*dev))))}
    if task == "squad":
        return {"name": "best-overlap sentence", **bt.qa_sentence_baseline(dev)}
    if task == "upos":
        return {"name": "most frequent tag", **bt.pos_most_frequent_tag(train, dev)}
    return {"name": "most overlapping choice", **bt.mc_overlap_baseline(dev)}


# -------------------------------------------------------------------------------------------------------- fine-tuning
def example_scripts(folder: Path) -> Path:
    """Offline copies of transformers' example scripts (../shared/hf_examples/prepare.sh), made once."""
    if not (folder / "question-answering" / "run_qa.py").exists():
        subprocess.run(["bash", str(SHARED / "hf_examples" / "prepare.sh"), str(folder)], check=True,
                       capture_output=True, env={**os.environ, "PYTHON": sys.executable})
    return folder


def finetune(task: str, model: Path, files: list[str], seed: int, out: Path, budget: dict, scripts: Path,
             learning_rate: float | None = None) -> dict:
    """One fine-tuning run; its dev metrics (the example scripts' keys) and wall seconds. `learning_rate` replaces
    COMMON's."""
    from common import run_worker

    runner, _, epochs, max_length = budget[task]
    settings = {**COMMON, "learning_rate": learning_rate or COMMON["learning_rate"]}
    start = time.perf_counter()
    if runner == "classify":
        result = run_worker(sys.executable, Path(__file__).with_name("bench_papers.py"), {
            "worker": "classify", "model": str(model), "train": files[1], "dev": files[3], "seed": seed,
            "epochs": epochs, "max_length": max_length, "output_dir": str(out), "settings": settings},
            timeout=6 * 3600)
    else:
        extra = {"squad": ["--doc_stride", "64"], "arc": [],
                 "upos": ["--text_column_name", "tokens", "--label_column_name", "upos_tags"]}[task]
        common = [f"--{k}={v}" for k, v in settings.items()]
        proc = subprocess.run([sys.executable, str(scripts / runner), "--model_name_or_path", str(model),
                               "--trust_remote_code", "--do_train", "--do_eval", "--output_dir", str(out), *common,
                               "--num_train_epochs", str(epochs), "--max_seq_length", str(max_length), "--seed",
                               str(seed), "--report_to", "none", "--save_strategy", "no", *extra, *files],
                              capture_output=True, text=True, env={**os.environ, **OFFLINE})
        if proc.returncode != 0:
            raise RuntimeError(f"{runner} on {model} failed:\n{proc.stderr[-4000:]}")
        result = json.loads((out / "all_results.json").read_text())
    return {**result, "wall_s": time.perf_counter() - start}


def classify_worker(args: dict) -> dict:
    """Sequence classification with transformers' Trainer over `AutoModelForSequenceClassification` (any of the
    three folders), the example scripts' way: seed set before the model is built, dynamic padding, dev accuracy."""
    from datasets import Dataset
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    torch.set_num_threads(1)
    train, dev = ([json.loads(line) for line in open(args[s], encoding="utf-8")] for s in ("train", "dev"))
    names = sorted({r["label"] for r in train})
    tokenizer = AutoTokenizer.from_pretrained(args["model"])

    def encode(rows):
        encoded = tokenizer([r["text"] for r in rows], truncation=True, max_length=args["max_length"])
        return Dataset.from_dict({**encoded, "labels": [names.index(r["label"]) for r in rows]})

    set_seed(args["seed"])
    model = AutoModelForSequenceClassification.from_pretrained(
        args["model"], num_labels=len(names), id2label=dict(enumerate(names)),
        label2id={n: i for i, n in enumerate(names)}, trust_remote_code=True)
    training = TrainingArguments(output_dir=args["output_dir"], num_train_epochs=args["epochs"], seed=args["seed"],
                                 report_to="none", save_strategy="no", **args["settings"])
    trainer = Trainer(model=model, args=training, train_dataset=encode(train), processing_class=tokenizer,
                      data_collator=DataCollatorWithPadding(tokenizer))
    trainer.train()
    prediction = trainer.predict(encode(dev))
    logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
    return {"eval_accuracy": float((logits.argmax(-1) == prediction.label_ids).mean()),
            "eval_loss": prediction.metrics.get("test_loss"), "train_rows": len(train), "eval_rows": len(dev)}
