"""Arguments of the fine-tuning scripts: `CommonArguments` (every task), `FinetuneArguments` (sequence
classification; the other tasks' dataclasses live beside their jobs), and the checks that need no data. The parsers
are built from the dataclasses by `modeling_xl.cli`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..runtime.validators import check_model_source, choice, positive_int
from .adapters import AdapterArguments, validate_adapter_arguments

RESULTS_FILE = "classification_results.json"
TRAINING_CONFIG = "training_config.json"  # every resolved argument, and which defaults were chosen for this model
# the results file of every fine-tuning task: a folder holding any of them holds an earlier run
# (`checkpoints.earlier_run`)
TASK_RESULTS_FILES = {"classification": RESULTS_FILE, "question-answering": "qa_results.json",
                      "token-classification": "token_classification_results.json",
                      "multiple-choice": "multiple_choice_results.json"}
PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")  # as transformers
BUILTIN_TASKS = ("builtin", "builtin-long")  # see finetuning.builtin_task


@dataclass
class CommonArguments(AdapterArguments):
    """What every fine-tuning run needs, whatever its task (`FinetuneArguments` and the task scripts' arguments add
    their columns and options); the LoRA options come from `adapters.AdapterArguments`."""

    model_name_or_path: str = field(metadata={"help": "the pretrained folder (causal / permutation LM, classifier)"})
    output_dir: str = field(metadata={"help": "where the fine-tuned model, results, card and checkpoints go"})
    # data
    dataset_name: str | None = field(default=None, metadata={"help": "a Hub dataset (e.g. glue), or 'builtin' / "
                                     "'builtin-long': the offline topic task (paragraphs / long documents)"})
    dataset_config_name: str | None = field(default=None, metadata={"help": "the Hub dataset's configuration (sst2)"})
    train_file: str | None = field(default=None, metadata={"help": "local .csv/.tsv/.json/.jsonl training file"})
    validation_file: str | None = field(default=None, metadata={"help": "local dev file (same format)"})
    validation_split: str = field(default="validation", metadata={"help": "the Hub dataset's dev split"})
    # model
    tokenizer_name: str | None = field(default=None, metadata={"help": "tokenizer folder (default: the model's)"})
    allow_unknown_tokens: bool = field(default=False, metadata={
        "help": "fine-tune even when more than half of the training texts' tokens are the tokenizer's unknown token "
                "(above 10%% a warning names the likely cause)"})
    from_scratch: bool = field(default=False, metadata={"help": "same architecture, random weights (the baseline)"})
    max_length: int = field(default=128, metadata={"help": "tokens per text (pair); with --long_document the "
                                                          "segment length"})
    # optimisation
    per_device_train_batch_size: int = 32
    per_device_eval_batch_size: int = 64
    learning_rate: float | None = field(default=None, metadata={
        "help": "peak learning rate (default: from the model's width and whether it is pretrained, "
                "modeling_xl.finetuning.defaults; 1e-3 for the tiny preset)"})
    weight_decay: float = 0.0
    num_train_epochs: int | None = field(default=None, metadata={
        "help": "epochs (default: from the model's width, modeling_xl.finetuning.defaults; 5 for the tiny preset, 3 "
                "for XLNet's sizes)"})
    max_train_steps: int | None = field(default=None, metadata={"help": "optimizer steps (default: the epochs')"})
    max_train_time: float | None = field(default=None, metadata={"help": "stop training after this many seconds"})
    num_warmup_steps: int | None = field(default=None, metadata={"help": "linear warmup steps (default: 10%% of the "
                                                                        "run's steps)"})
    max_train_samples: int | None = field(default=None, metadata={"help": "train on a random subset of this size"})
    seed: int = 42
    # evaluation, checkpoints, feedback
    eval_steps: int | None = field(default=None, metadata={"help": "evaluate on the dev split every N steps"})
    checkpointing_steps: int | None = field(default=None, metadata={"help": "write checkpoint-N/ every N steps"})
    resume_from_checkpoint: str | None = field(default=None, metadata={"help": "a checkpoint-N folder or 'latest'"})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "start afresh in a folder holding an earlier "
                                                                       "run (its checkpoints and records go)"})
    compare_with: str | None = field(default=None, metadata={"help": "a run folder (or its results JSON) whose dev "
                                                                    "scores the model card shows beside these"})
    disable_tqdm: bool = False


@dataclass
class FinetuneArguments(CommonArguments):
    """Everything a sequence-classification run needs."""

    text_column: str = field(default="sentence", metadata={"help": "column holding the text (the first of a pair)"})
    text_pair_column: str | None = field(default=None, metadata={"help": "column holding the second text of a pair"})
    label_column: str = field(default="label", metadata={"help": "column holding the label(s)"})
    problem_type: str | None = field(default=None, metadata={"help": "single_label_classification, "
                                     "multi_label_classification or regression (default: from the labels)"})
    label_delimiter: str = field(default=",", metadata={"help": "multi-label: separator of labels in a text column"})
    threshold: float = field(default=0.5, metadata={"help": "multi-label: a class is predicted when sigmoid > this"})
    summary_type: str | None = field(default=None, metadata={"help": "pooling: last, first or mean real token"})
    long_document: bool = field(default=False, metadata={"help": "read whole documents segment by segment with "
                                                                "memory (forward_long) instead of truncating"})
    detach_memory: bool = field(default=False, metadata={"help": "with --long_document: the paper's detached memory "
                                "(only the last segment trained; less memory, but evidence in earlier segments is "
                                "not learned) instead of the gradient through every segment"})


def validate_common(args: CommonArguments, results_file: str = RESULTS_FILE) -> None:
    """Argument-level checks of every task, before anything is read or written: ValueError naming argument, value,
    expectation."""
    for name in ("max_length", "per_device_train_batch_size", "per_device_eval_batch_size"):
        positive_int(name, getattr(args, name))
    for name in ("num_train_epochs", "max_train_steps", "max_train_samples", "eval_steps", "checkpointing_steps"):
        if getattr(args, name) is not None:
            positive_int(name, getattr(args, name))
    if args.num_warmup_steps is not None and args.num_warmup_steps < 0:
        raise ValueError(f"num_warmup_steps={args.num_warmup_steps} is invalid; expected an integer >= 0")
    if args.overwrite_output_dir and args.resume_from_checkpoint is not None:
        raise ValueError(f"overwrite_output_dir=True and resume_from_checkpoint={args.resume_from_checkpoint!r} are "
                         "both set; expected one (overwriting deletes the checkpoints a resume reads)")
    if args.learning_rate is not None and not args.learning_rate > 0:
        raise ValueError(f"learning_rate={args.learning_rate!r} is invalid; expected a positive number")
    if args.weight_decay < 0:
        raise ValueError(f"weight_decay={args.weight_decay!r} is invalid; expected a number >= 0")
    if args.max_train_time is not None and not args.max_train_time > 0:
        raise ValueError(f"max_train_time={args.max_train_time!r} is invalid; expected a positive number of seconds")
    for name in ("model_name_or_path", "tokenizer_name"):
        check_model_source(name, getattr(args, name))
    if args.compare_with is not None:  # read after training: a wrong path would fail once the time is spent
        compare_results_path(args.compare_with, results_file)
    validate_adapter_arguments(args)


def validate_task(args: CommonArguments, results_file: str, example_dataset: str) -> None:
    """`validate_common` for a task other than classification, which has no built-in dataset."""
    validate_common(args, results_file)
    if args.dataset_name in BUILTIN_TASKS:
        raise ValueError(f"dataset_name={args.dataset_name!r} is the built-in classification task; expected a "
                         f"dataset of this task (e.g. {example_dataset}) or --train_file/--validation_file")


def validate(args: FinetuneArguments) -> None:
    """`validate_common` and the classification arguments' checks."""
    validate_common(args)
    if args.summary_type is not None:
        choice("summary_type", args.summary_type, ("last", "first", "mean"))
    if args.problem_type is not None:
        choice("problem_type", args.problem_type, PROBLEM_TYPES)
    if not 0.0 < args.threshold < 1.0:
        raise ValueError(f"threshold={args.threshold!r} is invalid; expected a probability strictly between 0 and 1")
    if not args.label_delimiter:
        raise ValueError("label_delimiter='' is invalid; expected a non-empty separator such as ','")
    if args.detach_memory and not args.long_document:
        raise ValueError("detach_memory=True without long_document=True; expected it only with --long_document (it "
                         "says how the memory between a document's segments is trained)")
    if args.long_document and args.text_pair_column is not None:
        raise ValueError(f"long_document=True and text_pair_column={args.text_pair_column!r} are both set; expected "
                         "one (a long document is read as one text, segment by segment)")
    if args.dataset_name in BUILTIN_TASKS and args.text_pair_column is not None:
        raise ValueError(f"text_pair_column={args.text_pair_column!r} is set for dataset_name={args.dataset_name!r}, "
                         "whose rows have one text; expected no text_pair_column")


def compare_results_path(compare_with: str, results_file: str = RESULTS_FILE) -> Path:
    """The results file `--compare_with` names (a file, or a run folder holding one); ValueError if there is none."""
    path = Path(compare_with)
    path = path / results_file if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"compare_with={compare_with!r} is invalid; expected a {results_file} file or a fine-tuning "
                         "output folder holding one")
    return path
