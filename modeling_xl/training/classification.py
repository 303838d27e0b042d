"""Sequence-classification fine-tuning behind `scripts/finetune_classification.py`: data -> model -> Accelerate loop ->
metrics -> checkpoints -> model card.

Data: a Hub dataset by name (e.g. `glue` / `sst2`, through `datasets.load_dataset`) or local CSV/TSV/JSON files with
`text_column` / `label_column`. Labels are mapped to ids from the training split (sorted), and every evaluation label
must be one of them. Texts are tokenized with the checkpoint's tokenizer (`<eos>` ends each text, the Transformer-XL
counterpart of XLNet's final `<cls>`) and left-padded per batch, so "last" pooling reads the final token.
Metrics go through `evaluate` with the offline modules of `modeling_xl/metrics` (accuracy, F1); the dev loss is the
mean over every dev example, whatever the number of processes. Checkpoints (`checkpoint-N/`) resume exactly (see
`finetune_checkpoints`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import datasets
import torch
import torch.nn.functional as F

from tokenization import check_vocab_matches

from ..data.corpora import load_split_files
from .arguments import _positive, check_model_source, check_output_dir, clear_run_records
from .checkpointing import read_training_state
from .feedback import StepLog
from .finetune_checkpoints import (check_compatible, checkpoint_rng, earlier_run, read_checkpoint_rng, resolve_checkpoint,
                                   rng_states, save_checkpoint, set_rng, split_checkpoint_rng)
from .teardown import end_run

logger = logging.getLogger(__name__)

LOCAL_BUILDERS = {".csv": ("csv", {}), ".tsv": ("csv", {"delimiter": "\t", "quoting": 3}), ".json": ("json", {}),
                  ".jsonl": ("json", {})}
RESULTS_FILE = "classification_results.json"


@dataclass
class FinetuneArguments:
    model_name_or_path: str
    output_dir: str
    dataset_name: str | None = None
    dataset_config_name: str | None = None
    train_file: str | None = None
    validation_file: str | None = None
    validation_split: str = "validation"
    text_column: str = "sentence"
    label_column: str = "label"
    tokenizer_name: str | None = None
    from_scratch: bool = False
    summary_type: str | None = None
    max_length: int = 128
    per_device_train_batch_size: int = 32
    per_device_eval_batch_size: int = 64
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    num_train_epochs: int = 1
    max_train_steps: int | None = None
    max_train_time: float | None = None
    num_warmup_steps: int = 0
    max_train_samples: int | None = None
    eval_steps: int | None = None
    checkpointing_steps: int | None = None
    resume_from_checkpoint: str | None = None  # a checkpoint-N folder or 'latest' (the newest in output_dir)
    overwrite_output_dir: bool = False  # start afresh in a folder holding an earlier run (its checkpoints go)
    seed: int = 42
    compare_with: str | None = None
    disable_tqdm: bool = False


def validate(args: FinetuneArguments) -> None:
    """Argument-level checks, before anything is read or written: ValueError naming argument, value, expectation."""
    for name in ("max_length", "per_device_train_batch_size", "per_device_eval_batch_size", "num_train_epochs"):
        _positive(name, getattr(args, name))
    for name in ("max_train_steps", "max_train_samples", "eval_steps", "checkpointing_steps"):
        if getattr(args, name) is not None:
            _positive(name, getattr(args, name))
    if args.num_warmup_steps < 0:
        raise ValueError(f"num_warmup_steps={args.num_warmup_steps} is invalid; expected an integer >= 0")
    if args.overwrite_output_dir and args.resume_from_checkpoint is not None:
        raise ValueError(f"overwrite_output_dir=True and resume_from_checkpoint={args.resume_from_checkpoint!r} are "
                         "both set; expected one (overwriting deletes the checkpoints a resume reads)")
    if not args.learning_rate > 0:
        raise ValueError(f"learning_rate={args.learning_rate!r} is invalid; expected a positive number")
    if args.weight_decay < 0:
        raise ValueError(f"weight_decay={args.weight_decay!r} is invalid; expected a number >= 0")
    if args.max_train_time is not None and not args.max_train_time > 0:
        raise ValueError(f"max_train_time={args.max_train_time!r} is invalid; expected a positive number of seconds")
    for name in ("model_name_or_path", "tokenizer_name"):
        check_model_source(name, getattr(args, name))
    if args.summary_type not in (None, "last", "first", "mean"):
        raise ValueError(f"summary_type={args.summary_type!r} is invalid; expected 'last', 'first' or 'mean'")
    if args.compare_with is not None:  # read after training: a wrong path would fail once the time is spent
        compare_results_path(args.compare_with)


def compare_results_path(compare_with: str) -> Path:
    """The results file `--compare_with` names (a file, or a run folder holding one); ValueError if there is none."""
    path = Path(compare_with)
    path = path / RESULTS_FILE if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"compare_with={compare_with!r} is invalid; expected a {RESULTS_FILE} file or a fine-tuning "
                         "output folder holding one")
    return path


def load_raw_datasets(args: FinetuneArguments) -> datasets.DatasetDict:
    """{"train", "validation"} from the Hub (`dataset_name`) or local files (`train_file`, `validation_file`)."""
    if (args.dataset_name is None) == (args.train_file is None):
        raise ValueError(f"dataset_name={args.dataset_name!r}, train_file={args.train_file!r}; expected exactly one "
                         "of them (a Hub dataset by name, or local CSV/TSV/JSON files)")
    if args.dataset_name is not None:
        try:
            raw = datasets.load_dataset(args.dataset_name, args.dataset_config_name)
        except Exception as error:  # offline or unknown name: one clear message
            raise OSError(f"could not load dataset_name={args.dataset_name!r} (config {args.dataset_config_name!r}) "
                          f"from the Hugging Face Hub ({type(error).__name__}: {error}); offline, pass local files "
                          "with --train_file/--validation_file instead") from error
        if args.validation_split not in raw:
            raise ValueError(f"validation_split={args.validation_split!r} is not in {args.dataset_name!r}; expected "
                             f"one of {sorted(raw)}")
        return datasets.DatasetDict({"train": raw["train"], "validation": raw[args.validation_split]})
    if args.validation_file is None:
        raise ValueError("validation_file is None; expected a dev file beside train_file (dev scores are reported)")
    files = {"train": args.train_file, "validation": args.validation_file}
    suffixes = {Path(f).suffix.lower() for f in files.values()}
    for name, path in files.items():
        if not Path(path).is_file():
            raise FileNotFoundError(f"{name}_file={path!r} does not exist")
    if len(suffixes) != 1 or next(iter(suffixes)) not in LOCAL_BUILDERS:
        raise ValueError(f"train/validation files have suffixes {sorted(suffixes)}; expected both .csv, .tsv, .json "
                         "or .jsonl")
    builder, options = LOCAL_BUILDERS[next(iter(suffixes))]
    return load_split_files(builder, files, **options)


def label_mapping(raw: datasets.DatasetDict, args: FinetuneArguments) -> dict:
    """{label value: id} from the sorted training labels. Raises on a missing text/label column, an empty text, or
    an evaluation label that the training split does not have."""
    for split, data in raw.items():
        for column in (args.text_column, args.label_column):
            if column not in data.column_names:
                name = "text_column" if column == args.text_column else "label_column"
                raise ValueError(f"{name}={column!r} is not a column of the {split} split; expected one of "
                                 f"{data.column_names}")
        empty = [i for i, text in enumerate(data[args.text_column]) if text is None or not str(text).strip()]
        if empty:
            raise ValueError(f"the {split} split has empty texts in {args.text_column!r} at rows {empty[:5]}; "
                             "expected a non-empty text per example")
    mapping = {value: i for i, value in enumerate(sorted(set(raw["train"][args.label_column])))}
    for split, data in raw.items():
        unknown = sorted(set(data[args.label_column]) - set(mapping), key=str)
        if unknown:
            raise ValueError(f"label_column={args.label_column!r} of the {split} split has unknown label values "
                             f"{unknown[:5]}; expected one of {sorted(mapping, key=str)}")
    if len(mapping) < 2:
        raise ValueError(f"the training labels are {sorted(mapping, key=str)}; expected at least two classes")
    return mapping


def tokenize_split(data: datasets.Dataset, tokenizer, args: FinetuneArguments, mapping: dict) -> datasets.Dataset:
    """input_ids (truncated to max_length, keeping the end with the final `<eos>`) and integer `labels`."""
    def encode(batch):
        ids = tokenizer(batch[args.text_column], add_special_tokens=True)["input_ids"]
        return {"input_ids": [x[-args.max_length:] for x in ids],
                "labels": [mapping[v] for v in batch[args.label_column]]}

    return data.map(encode, batched=True, remove_columns=data.column_names, desc="Tokenizing")


def left_pad_collate(pad_id: int):
    """Batch of {"input_ids", "labels"} -> left-padded input_ids [B, T], attention_mask [B, T], labels [B]."""
    def collate(examples):
        width = max(len(e["input_ids"]) for e in examples)
        ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
        mask = torch.zeros(len(examples), width, dtype=torch.long)
        for row, example in enumerate(examples):
            n = len(example["input_ids"])
            ids[row, width - n:] = torch.tensor(example["input_ids"])
            mask[row, width - n:] = 1
        return {"input_ids": ids, "attention_mask": mask,
                "labels": torch.tensor([e["labels"] for e in examples], dtype=torch.long)}

    return collate


def build_metrics(num_labels: int):
    """accuracy + F1 (binary for two classes, macro otherwise) through `evaluate`, from the offline modules."""
    import evaluate

    from ..metrics import METRICS_DIR

    metrics = evaluate.combine([str(METRICS_DIR / "accuracy"), str(METRICS_DIR / "f1")])
    return metrics, {} if num_labels == 2 else {"average": "macro"}


def build_model(args: FinetuneArguments, mapping: dict):
    """The classifier: a causal-LM / permutation-LM / classification checkpoint with (only) a new head, or with
    `from_scratch` the same architecture randomly initialised."""
    from ..configuration_transformer_xl import TransformerXLConfig
    from ..modeling_classification import TransformerXLForSequenceClassification

    labels = {"num_labels": len(mapping), "id2label": {i: str(v) for v, i in mapping.items()},
              "label2id": {str(v): i for v, i in mapping.items()}}
    if args.summary_type is not None:
        labels["summary_type"] = args.summary_type
    if args.from_scratch:
        config = TransformerXLConfig.from_pretrained(args.model_name_or_path, **labels)
        return TransformerXLForSequenceClassification(config)
    return TransformerXLForSequenceClassification.from_pretrained(args.model_name_or_path, **labels)


@torch.no_grad()
def evaluate_model(accelerator, model, dataloader, metrics, metric_kwargs) -> dict:
    """Accuracy/F1 and `eval_loss` over the whole dev set: predictions, labels and per-example losses are gathered
    from every process (`gather_for_metrics` drops the examples repeated to even out the last batch), so every
    process returns the same numbers."""
    model.eval()
    total_loss, count = 0.0, 0
    for batch in dataloader:
        out = model(**batch)
        # per example, the model's own loss (single-label cross-entropy: the labels are class ids, see label_mapping)
        losses = F.cross_entropy(out.logits.float(), batch["labels"], reduction="none")
        predictions, references, losses = accelerator.gather_for_metrics(
            (out.logits.argmax(-1), batch["labels"], losses))
        metrics.add_batch(predictions=predictions.cpu(), references=references.cpu())
        total_loss += float(losses.double().sum())
        count += len(losses)
    model.train()
    return {**{k: float(v) for k, v in metrics.compute(**metric_kwargs).items()}, "eval_loss": total_loss / count}


def run_finetuning(args: FinetuneArguments) -> dict:
    """Fine-tune, evaluate on the dev split, save model + tokenizer + results + model card; returns the results.

    Every check that can fail on bad input (arguments, output folder, data, the checkpoint to resume) runs before
    anything is written or any weights are loaded."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer, get_scheduler

    validate(args)
    resuming = args.resume_from_checkpoint is not None
    _check_output_is_not_an_input(args)
    output_dir = check_output_dir(args.output_dir, resuming=resuming, overwrite=args.overwrite_output_dir,
                                  earlier_run=lambda folder: earlier_run(folder, RESULTS_FILE))
    if args.overwrite_output_dir:
        _check_inputs_survive(args, [output_dir / name for name in earlier_run(output_dir, RESULTS_FILE)])
    resume_from = resolve_checkpoint(output_dir, args.resume_from_checkpoint) if resuming else None
    accelerator = Accelerator()
    set_seed(args.seed)
    raw = load_raw_datasets(args)
    if args.max_train_samples is not None:
        keep = range(min(args.max_train_samples, len(raw["train"])))
        raw["train"] = raw["train"].shuffle(seed=args.seed).select(keep)
    mapping = label_mapping(raw, args)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name or args.model_name_or_path)
    with accelerator.main_process_first():
        train, dev = (tokenize_split(raw[split], tokenizer, args, mapping) for split in ("train", "validation"))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else _config_pad_id(args)
    collate = left_pad_collate(pad_id)
    train_loader = DataLoader(train, shuffle=True, batch_size=args.per_device_train_batch_size, collate_fn=collate)
    dev_loader = DataLoader(dev, batch_size=args.per_device_eval_batch_size, collate_fn=collate)
    train_loader, dev_loader = accelerator.prepare(train_loader, dev_loader)  # sharded over the processes
    max_steps = args.max_train_steps or args.num_train_epochs * len(train_loader)
    layout = {"num_processes": accelerator.num_processes, "per_device_train_batch_size":
              args.per_device_train_batch_size, "num_train_examples": len(train), "seed": args.seed}
    saved = None
    if resume_from is not None:  # before the model is loaded or anything is written
        saved = read_training_state(resume_from)
        check_compatible(saved, layout, resume_from, max_steps)
    model = build_model(args, mapping)
    # before the first batch: an id past the embedding would fail there, naming neither the model nor the tokenizer
    check_vocab_matches(tokenizer, model.config, allow_larger_model=True,
                        context=f"tokenizer_name={args.tokenizer_name or args.model_name_or_path!r} does not fit "
                                f"model_name_or_path={args.model_name_or_path!r}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    # the prepared scheduler steps once per process at every optimizer step (Accelerate's convention)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
                              num_training_steps=max_steps * accelerator.num_processes)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if accelerator.is_main_process and args.overwrite_output_dir:  # only once every check has passed
        deleted = clear_run_records(output_dir, earlier_run(output_dir, RESULTS_FILE))
        if deleted:
            logger.info("overwrite_output_dir: deleted %s of the earlier run in %s", ", ".join(deleted), output_dir)
    accelerator.wait_for_everyone()
    history, step, seconds_before, resumed_rng = [], 0, 0.0, None
    if saved is not None:
        accelerator.load_state(str(resume_from))  # weights, optimizer, scheduler, every process's RNG
        history, step, seconds_before = saved["history"], saved["step"], saved["train_seconds"]
        resumed_rng = read_checkpoint_rng(resume_from, accelerator.process_index)
        logger.info("resumed from %s at step %d", resume_from, step)
    metrics, metric_kwargs = build_metrics(len(mapping))
    log = StepLog(output_dir, enabled=accelerator.is_main_process, resume_step=step if resuming else None)
    start = time.perf_counter() - seconds_before  # the training time before a resume counts too

    def evaluate_at(at: int) -> None:
        evaluate_and_log(accelerator, model, dev_loader, metrics, metric_kwargs, history, log, at)

    def checkpoint_at(at: int, rng) -> None:
        state = {**layout, "history": history, "train_seconds": time.perf_counter() - start}
        save_checkpoint(accelerator, output_dir, at, state, rng)

    step = train_loop(accelerator, args, model, optimizer, scheduler, train_loader, max_steps, step, resumed_rng, start,
                      log, evaluate_at, checkpoint_at)
    train_seconds = time.perf_counter() - start
    scored = bool(history) and history[-1]["step"] == step  # the last step was an eval step: already scored
    final = ({k: v for k, v in history[-1].items() if k != "step"} if scored
             else evaluate_model(accelerator, model, dev_loader, metrics, metric_kwargs))
    results = {"dev": final, "history": history, "train_steps": step, "train_seconds": train_seconds,
               "train_examples_seen": step * args.per_device_train_batch_size * accelerator.num_processes,
               "num_train_examples": len(train), "num_dev_examples": len(dev), "labels": list(map(str, mapping)),
               "initialisation": "from scratch" if args.from_scratch else f"pretrained {args.model_name_or_path}",
               "args": asdict(args)}
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if not scored:
            log.write({"step": step, **final})
        save_outputs(accelerator.unwrap_model(model), tokenizer, args, results)
    del model, optimizer, train_loader, dev_loader, scheduler  # the prepared wrappers go first (see `end_run`)
    end_run(accelerator)
    return results


def _check_output_is_not_an_input(args) -> None:
    """The fine-tuned model, tokenizer and card are saved into output_dir: it must not be the folder of the model or
    tokenizer this run starts from (they would be written over, with or without --overwrite_output_dir)."""
    out = Path(args.output_dir).resolve()
    for name in ("model_name_or_path", "tokenizer_name"):
        value = getattr(args, name)
        if value and Path(value).is_dir() and Path(value).resolve() == out:
            raise ValueError(f"output_dir={args.output_dir!r} is the folder of {name}={value!r}; the fine-tuned model "
                             "would be saved over it. Expected another output folder")


def _check_inputs_survive(args, doomed: list[Path]) -> None:
    """--overwrite_output_dir must not delete the model or tokenizer this run starts from."""
    for name in ("model_name_or_path", "tokenizer_name"):
        value = getattr(args, name)
        if value and Path(value).exists():
            inside = [p for p in doomed if Path(value).resolve().is_relative_to(p.resolve())]
            if inside:
                raise ValueError(f"{name}={value!r} lies in {inside[0]}, which --overwrite_output_dir would delete "
                                 "(an earlier run's record); expected a model and tokenizer outside it")


def train_loop(accelerator, args, model, optimizer, scheduler, train_loader, max_steps: int, step: int,
               checkpoint_rng_states: dict | None, start: float, log: StepLog, evaluate, checkpoint) -> int:
    """Optimizer steps from `step` to `max_steps` (or `max_train_time`), each logged to `log`; `evaluate(step)` every
    eval_steps and `checkpoint(step, states)` every checkpointing_steps (`checkpoint_rng`). Returns the steps done.

    An epoch's shuffled order is drawn from the RNG (the torch RNG, or the generator shared by several processes) when
    its iterator starts. A resumed run (`checkpoint_rng_states` from the checkpoint) draws its first epoch's order
    again from the states that epoch started with, skips the batches already read, and goes on with the states of the
    checkpoint: the batches and dropout masks of an uninterrupted run, also in the epochs after."""
    from tqdm.auto import tqdm

    progress = tqdm(total=max_steps, initial=step, desc="fine-tuning",
                    disable=args.disable_tqdm or not accelerator.is_local_main_process)
    model.train()
    resumed = None if checkpoint_rng_states is None else split_checkpoint_rng(checkpoint_rng_states)
    while step < max_steps and not _out_of_time(args, start):
        done = step % len(train_loader)  # batches of this epoch already read (by the run that was resumed)
        if resumed is not None:  # the first epoch after a resume: its order is drawn from the saved states
            set_rng(train_loader, resumed[0] if done else resumed[1])
        epoch_rng = rng_states(train_loader)
        batches = iter(train_loader)
        for _ in range(done):
            next(batches)
        if resumed is not None and done:  # then on with the states of the checkpoint (dropout, the next epochs)
            set_rng(train_loader, resumed[1])
        resumed = None
        for batch in batches:
            loss = model(**batch).loss
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            mean_loss = float(accelerator.reduce(loss.detach(), reduction="mean"))  # over every process's batch
            progress.update(1)
            progress.set_postfix(loss=f"{mean_loss:.4f}")
            log.write({"step": step, "loss": mean_loss, "lr": scheduler.get_last_lr()[0]})
            if args.eval_steps and step % args.eval_steps == 0:
                evaluate(step)
            if args.checkpointing_steps and step % args.checkpointing_steps == 0:
                checkpoint(step, checkpoint_rng(epoch_rng, train_loader))
            if step >= max_steps or _out_of_time(args, start):
                break
    progress.close()
    return step


def evaluate_and_log(accelerator, model, dev_loader, metrics, metric_kwargs, history: list, log: StepLog,
                     step: int) -> None:
    history.append({"step": step, **evaluate_model(accelerator, model, dev_loader, metrics, metric_kwargs)})
    log.write(history[-1])
    logger.info("step %d: %s", step, history[-1])


def _config_pad_id(args) -> int:
    """The checkpoint's `pad_token_id` (or 0), for a tokenizer without a pad token; reads only its config."""
    from ..configuration_transformer_xl import TransformerXLConfig

    return TransformerXLConfig.from_pretrained(args.model_name_or_path).pad_token_id or 0


def _out_of_time(args, start: float) -> bool:
    return args.max_train_time is not None and time.perf_counter() - start >= args.max_train_time


def save_outputs(model, tokenizer, args: FinetuneArguments, results: dict) -> None:
    """Model (+ remote code), tokenizer, `classification_results.json`, and README.md from the card template."""
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / RESULTS_FILE).write_text(json.dumps(results, indent=2, default=str) + "\n")
    baseline = None
    if args.compare_with is not None:
        baseline = json.loads(compare_results_path(args.compare_with).read_text())
    classification_card(args, results, baseline, model.config).save(out / "README.md")


def dev_accuracy_line(results: dict) -> str:
    dev = results["dev"]
    return (f"accuracy {dev['accuracy']:.4f}, f1 {dev['f1']:.4f}, loss {dev['eval_loss']:.4f} after "
            f"{results['train_steps']} steps ({results['train_seconds']:.0f} s, "
            f"{math.floor(results['train_examples_seen'])} examples)")


TEMPLATE = Path(__file__).resolve().parents[2] / "model_cards" / "sequence_classification.md"


def classification_card(args: FinetuneArguments, results: dict, baseline: dict | None, config):
    """`huggingface_hub.ModelCard` from `model_cards/sequence_classification.md`: `model-index` with the measured
    dev accuracy and F1, the hyperparameters, and (with `compare_with`) the other run's dev scores beside ours."""
    import platform

    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    dataset = args.dataset_name or Path(args.train_file).parent.name
    name = Path(args.output_dir).name
    evals = [EvalResult(task_type="text-classification", dataset_type=dataset, dataset_name=dataset,
                        dataset_config=args.dataset_config_name, dataset_split="validation", metric_type=metric,
                        metric_value=round(results["dev"][metric], 4)) for metric in ("accuracy", "f1")]
    card_data = ModelCardData(model_name=name, library_name="transformers", pipeline_tag="text-classification",
                              tags=["transformer-xl", "text-classification", "modeling_xl"], eval_results=evals)
    runs = [(results["initialisation"], results)] + ([(baseline["initialisation"], baseline)] if baseline else [])
    comparison = [(init, f"{r['dev']['accuracy']:.4f}", f"{r['dev']['f1']:.4f}", r["train_steps"],
                   f"{r['train_seconds']:.0f}") for init, r in runs]
    hyperparameters = [(k, v) for k, v in asdict(args).items() if v is not None and k not in ("compare_with",)]
    if not TEMPLATE.exists():  # installed without the repository's model_cards/ folder
        raise FileNotFoundError(f"model card template {TEMPLATE} is missing; expected the repository's model_cards/")
    return ModelCard.from_template(
        card_data, template_path=str(TEMPLATE), model_name=name, dataset=dataset, labels=results["labels"],
        initialisation=results["initialisation"], summary_type=config.summary_type, architecture=(
            f"{config.n_layer} layers, d_model {config.d_model}, {config.n_head} heads, attn_type {config.attn_type}"),
        results=comparison, hyperparameters=hyperparameters, num_dev=results["num_dev_examples"],
        num_train=results["num_train_examples"], hardware=f"{platform.machine()} CPU" if not torch.cuda.is_available()
        else torch.cuda.get_device_name(), dev_line=dev_accuracy_line(results))
