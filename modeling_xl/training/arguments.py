"""Arguments of `scripts/pretrain.py`: one dataclass, a parser built from it, an optional YAML file, preset recipes.

Precedence (lowest to highest): the preset's recipe (`RECIPES[preset]`), the YAML file (`--config run.yaml`), the
command line. Every field left `None` after that falls back to the default written next to it below.

Batch vocabulary (Transformer-XL, Dai et al. 2019, section 3.2 and `data_utils.py`): the corpus is cut into
`train_batch_size` contiguous streams (the paper's batch size). With W processes, each process owns
`train_batch_size / W` fixed streams (its rows); `gradient_accumulation_steps` further cuts a process's rows into
that many chunks (the paper's `batch_chunk`), each with its own memory. One optimizer step always consumes one segment
of `tgt_len` tokens from every stream.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..configuration_transformer_xl import PRESETS
from ..runtime.cli import base_type, dataclass_parser, parse_bool
from ..runtime.run_folder import LOG_FILE, replace_text
from ..runtime.validators import check_model_source, choice, positive_int
from .checkpointing import CHECKPOINTS
from .feedback import PLOT_FILE
from .recipes import RECIPES

logger = logging.getLogger(__name__)

OBJECTIVES = ("clm", "plm")
SCHEDULERS = ("cosine", "linear", "constant", "constant_with_warmup")
OPTIMIZERS = ("adamw", "adam")
PRECISIONS = ("no", "fp16", "bf16")
TRACKERS = ("tensorboard", "trackio", "all", "none")

# recipe key -> argument name (RECIPES uses the paper's names)
_RECIPE_FIELDS = {
    "batch_size": "train_batch_size",
    "tgt_len": "tgt_len",
    "mem_len": "mem_len",
    "eval_tgt_len": "eval_tgt_len",
    "eval_mem_len": "eval_mem_len",
    "eval_clamp_len": "eval_clamp_len",
    "learning_rate": "learning_rate",
    "warmup_steps": "num_warmup_steps",
    "max_steps": "max_train_steps",
    "max_grad_norm": "max_grad_norm",
}


@dataclass
class PretrainArguments:
    """Everything a pretraining run needs; `None` means "from the preset recipe, else the fallback below"."""

    # data
    dataset_name: str | None = field(default=None, metadata={"help": "a `datasets` name (e.g. wikitext) or 'builtin' (offline corpus)"})
    dataset_config_name: str | None = field(default=None, metadata={"help": "the dataset configuration (e.g. wikitext-103-raw-v1)"})
    train_file: str | None = field(default=None, metadata={"help": "a local text/json/csv/parquet training file"})
    validation_file: str | None = field(default=None, metadata={"help": "a local validation file (same format)"})
    text_column: str = field(default="text", metadata={"help": "column holding the text"})
    tokenizer_name: str | None = field(default=None, metadata={"help": "tokenizer folder; default: the model's, else one trained on the training split"})
    tokenizer_type: str = field(default="word", metadata={"help": "tokenizer trained when none is given: word (WT103's, perplexities comparable to the papers), unigram (XLNet's subwords: any text the corpus's characters spell has no <unk>), char or byte"})
    tokenizer_vocab_size: int | None = field(default=None, metadata={"help": "symbols of a trained word-level or unigram tokenizer, special tokens included (default: the preset's vocab_size; fewer when the corpus has fewer words)"})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "processes for tokenization"})
    token_cache: bool | None = field(default=None, metadata={"help": "tokenize the corpus once into the token cache (a flat token file per split, memory-mapped by every process and every later run with the same corpus and tokenizer content; default: on for local files, --train_file or a local --dataset_name folder, unless --streaming); false: read the corpus into memory"})
    token_cache_dir: str | None = field(default=None, metadata={"help": "the token cache's folder (default: $MODELING_XL_CACHE/token_cache, else $XDG_CACHE_HOME or ~/.cache, /modeling_xl/token_cache); giving it turns the cache on"})
    streaming: bool = field(default=False, metadata={"help": "clm: read the training split with datasets streaming, tokenized on the fly, never stored (see docs/data.md for its costs)"})
    num_train_tokens: int | None = field(default=None, metadata={"help": "streaming: the training split's token count (skips the counting pass)"})
    char_level: bool | None = field(default=None, metadata={"help": "report bits per character (default: True for char/byte tokenizers)"})
    # model
    preset: str = field(default="tiny", metadata={"help": f"model preset: {', '.join(PRESETS)}"})
    config_name: str | None = field(default=None, metadata={"help": "a config folder/JSON (overrides the preset architecture)"})
    model_name_or_path: str | None = field(default=None, metadata={"help": "start from these weights (folder saved with save_pretrained)"})
    objective: str = field(default="clm", metadata={"help": "clm (Transformer-XL) or plm (XLNet-style permutation LM)"})
    dropout: float | None = field(default=None, metadata={"help": "override the preset's dropout"})
    dropatt: float | None = field(default=None, metadata={"help": "override the preset's attention dropout"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "recompute each layer in the backward pass"})
    # recurrence
    tgt_len: int | None = field(default=None, metadata={"help": "training segment length"})
    mem_len: int | None = field(default=None, metadata={"help": "training memory length"})
    clamp_len: int | None = field(default=None, metadata={"help": "training clamp_len (-1: none)"})
    same_length: bool | None = field(default=None, metadata={"help": "training same_length"})
    eval_tgt_len: int | None = field(default=None, metadata={"help": "evaluation segment length"})
    eval_mem_len: int | None = field(default=None, metadata={"help": "evaluation memory length"})
    eval_clamp_len: int | None = field(default=None, metadata={"help": "evaluation clamp_len"})
    eval_same_length: bool | None = field(default=None, metadata={"help": "evaluation same_length (default True, as the paper)"})
    # permutation LM (objective plm)
    reuse_len: int | None = field(default=None, metadata={"help": "plm: tokens of each sample kept as memory (default tgt_len // 2)"})
    num_predict: int | None = field(default=None, metadata={"help": "plm: targets per sample (default ~tgt_len / 6)"})
    perm_size: int | None = field(default=None, metadata={"help": "plm: local permutation block (default reuse_len)"})
    max_gram: int = field(default=5, metadata={"help": "plm: longest target span; lengths 1..max_gram drawn with p(n) ∝ 1/n (XLNet's 5; 1: single tokens)"})
    bi_data: bool = field(default=False, metadata={"help": "plm: half of the rows read backwards"})
    # optimisation
    output_dir: str | None = field(default=None, metadata={
        "help": "where the final model, logs and checkpoints go (default: outputs/pretrain)"})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "start afresh in an output_dir that holds an earlier run (its checkpoints, log and records are deleted; other files are kept)"})
    train_batch_size: int | None = field(default=None, metadata={"help": "global batch = number of streams (all processes)"})
    per_device_train_batch_size: int | None = field(default=None, metadata={"help": "streams per process (global = this x processes)"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "chunks each process's streams are cut into (one memory each)"})
    max_train_steps: int | None = field(default=None, metadata={"help": "optimizer steps"})
    learning_rate: float | None = field(default=None, metadata={"help": "peak learning rate"})
    optimizer: str = field(default="adamw", metadata={"help": "adamw or adam"})
    tail_capacity: str = field(default="auto", metadata={"help": "auto: each adaptive-softmax tail cluster scores only its own targets, in a buffer sized by the most that one forward of this run's data holds (static shapes, no host synchronisation: what a compiled or captured step needs; exact); none: every row under torch.compile, the rows selected by nonzero in eager mode"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "cosine, linear, constant, constant_with_warmup"})
    num_warmup_steps: int | None = field(default=None, metadata={"help": "linear warmup steps"})
    max_grad_norm: float | None = field(default=None, metadata={"help": "gradient clipping (default: the recipe's, else 0.25 as in the paper; 0: off)"})
    mixed_precision: str | None = field(default=None, metadata={"help": "no, fp16 or bf16 (default: accelerate config)"})
    seed: int = 42
    ddp_timeout: int = field(default=1800, metadata={"help": "seconds a process waits for the others in a collective (a stalled or dead rank ends the run after this, instead of hanging); as transformers' ddp_timeout"})
    # evaluation, checkpoints, feedback
    eval_steps: int | None = field(default=None, metadata={"help": "evaluate every N steps (default: 5 times per run)"})
    max_eval_segments: int | None = field(default=None, metadata={"help": "cap evaluation during training at N segments (final evaluation: all)"})
    checkpointing_steps: int | None = field(default=None, metadata={"help": "save a checkpoint every N steps"})
    checkpoints_total_limit: int | None = field(default=2, metadata={"help": "keep at most N checkpoints"})
    resume_from_checkpoint: str | None = field(default=None, metadata={"help": "a checkpoint folder or 'latest'"})
    logging_steps: int = field(default=10, metadata={"help": "log to the trackers every N steps"})
    with_tracking: bool = field(default=False, metadata={"help": "log to the trackers of --report_to"})
    report_to: str = field(default="tensorboard", metadata={"help": "tensorboard, trackio, all or none"})
    disable_tqdm: bool = False
    # publishing
    push_to_hub: bool = False
    hub_model_id: str | None = field(default=None, metadata={"help": "user/name on the Hub (default: the output folder name)"})
    hub_token: str | None = None
    hub_private_repo: bool = False
    config: str | None = field(default=None, metadata={"help": "YAML (or JSON) file with any of these arguments"})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def build_parser():
    """argparse parser with one `--name` per field (`modeling_xl.cli`; booleans accept `--flag` or `--flag false`)."""
    return dataclass_parser(PretrainArguments, description="Pretrain a Transformer-XL (clm) or XLNet-style "
                            "permutation LM (plm) with Accelerate.")


def parse_args(argv: list[str] | None = None) -> PretrainArguments:
    """Command line (+ optional YAML file) -> validated, recipe-resolved arguments."""
    given = vars(build_parser().parse_args(argv))
    from_file = load_config_file(given["config"]) if "config" in given else {}
    return resolve(PretrainArguments(**{**from_file, **given}), explicit=set(from_file) | set(given))


# what `save_resolved` adds to the arguments in training_config.yaml/.json
RUN_RECORD_KEYS = frozenset({"resolved_batch", "model_config"})


def arguments_of_run_record(values: dict) -> dict:
    """The arguments of a run from its `training_config` record, for a new run of the same settings: without the
    records (`RUN_RECORD_KEYS`), the file the run itself read (`config`), the Hub token placeholder; without what
    belonged to the old run's folder or publication (`resume_from_checkpoint`, `overwrite_output_dir`, `push_to_hub`,
    `hub_model_id`: give them on the command line again if meant); without the values the run derived from others
    (the global `train_batch_size` when `per_device_train_batch_size` was set, the tokenizer kind and size when the
    tokenizer came from a folder), which given together are an error."""
    dropped = RUN_RECORD_KEYS | {"config", "resume_from_checkpoint", "overwrite_output_dir", "push_to_hub",
                                 "hub_model_id"}
    values = {k: v for k, v in values.items() if k not in dropped}
    if values.get("hub_token") == "<HUB_TOKEN>":
        values["hub_token"] = None
    if values.get("per_device_train_batch_size") is not None:
        values.pop("train_batch_size", None)
    if values.get("tokenizer_name") is not None or values.get("model_name_or_path") is not None:
        values.pop("tokenizer_type", None)
        values.pop("tokenizer_vocab_size", None)
    return values


def load_config_file(path: str) -> dict:
    """Arguments from a YAML/JSON mapping, converted to each field's type; unknown keys are an error (typos must not
    be silently ignored). YAML reads `3e-4` as a string and `no` as false: both are converted or named here."""
    if not os.path.isfile(path):
        raise ValueError(f"config={path!r} does not exist; expected a YAML or JSON file of arguments")
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ValueError(f"config={path!r} is not UTF-8 text (byte {error.start}, line {line}: {error.reason}); "
                         "expected a YAML or JSON file saved as UTF-8") from None
    try:
        values = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ValueError(f"config={path!r} is not valid YAML{where} ({problem}); expected a mapping of "
                         "argument: value") from None
    if not isinstance(values, dict):
        raise ValueError(f"config={path!r} holds a {type(values).__name__}; expected a mapping of argument: value")
    if RUN_RECORD_KEYS & set(values):  # an earlier run's training_config.yaml/.json: its arguments run it again
        values = arguments_of_run_record(values)
        logger.info("config=%r is the record of an earlier run: its arguments are read without its records and "
                    "without resume_from_checkpoint, overwrite_output_dir, push_to_hub and hub_model_id", path)
    if "config" in values:  # one file of arguments: a nested reference would be silently ignored
        raise ValueError(f"config={path!r} has a 'config' key ({values['config']!r}); expected the arguments "
                         "themselves (a config file cannot include another)")
    fields = {f.name: f for f in dataclasses.fields(PretrainArguments)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"config={path!r} has unknown keys {unknown}; expected names among {sorted(fields)}")
    return {key: _convert(path, key, value, fields[key].type) for key, value in values.items()}


_TYPE_NAMES = {int: "an integer", float: "a number", bool: "a boolean (true/false)", str: "a string"}


def _convert(path: str, key: str, value, annotation):
    """One value of a config file as the field's type (None only where the field allows it)."""
    kind = base_type(annotation)
    if value is None and "None" in str(annotation):
        return None
    try:
        if kind is bool:
            return parse_bool(value)
        if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
            raise ValueError(value)
        if kind is int:  # `1e5` (a string to YAML) is 100000; 2.5 steps must not silently become 2
            number = float(value)
            if not number.is_integer():
                raise ValueError(value)
            return int(value) if isinstance(value, int) else int(number)
        return kind(value)
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        hint = " (YAML reads unquoted yes/no/on/off as booleans: quote the value)" if isinstance(value, bool) else ""
        raise ValueError(f"config={path!r}: {key}={value!r} is invalid; expected {_TYPE_NAMES[kind]}{hint}") from None


def resolve(args: PretrainArguments, explicit: set[str] = frozenset()) -> PretrainArguments:
    """Fill `None` fields from the preset's recipe then from fallbacks, and validate. Returns a new object."""
    if args.preset not in RECIPES:
        raise ValueError(f"preset={args.preset!r} is unknown; expected one of {sorted(RECIPES)}")
    values = args.to_dict()
    if values["per_device_train_batch_size"] is not None and "train_batch_size" in explicit:
        raise ValueError(
            f"train_batch_size={values['train_batch_size']} and per_device_train_batch_size="
            f"{values['per_device_train_batch_size']} are both set; expected one (global = per-device x processes)"
        )
    recipe, from_recipe = RECIPES[args.preset], set()
    for recipe_key, name in _RECIPE_FIELDS.items():
        if values[name] is None and name not in explicit and recipe_key in recipe:
            values[name] = recipe[recipe_key]
            from_recipe.add(name)
    saved_tokenizer = values["tokenizer_name"] or values["model_name_or_path"]
    for name in ("tokenizer_vocab_size", "tokenizer_type"):  # they describe a tokenizer trained here
        if saved_tokenizer is not None and name in explicit and values[name] is not None:
            source = "tokenizer_name" if values["tokenizer_name"] else "model_name_or_path"
            raise ValueError(f"{name}={values[name]!r} and {source}={saved_tokenizer!r} are both set; expected one "
                             f"({name} applies to a tokenizer trained on the corpus, {source} loads a saved one)")
    if ("num_warmup_steps" in from_recipe and values["max_train_steps"] is not None and "max_steps" in recipe
            and values["max_train_steps"] < recipe["max_steps"]):
        # a run shorter than the recipe's (--max_train_steps 5 of the tiny preset's 1,500): its warmup keeps the
        # recipe's share of the steps (the whole of it would be longer than the run, or most of it)
        values["num_warmup_steps"] = recipe["warmup_steps"] * values["max_train_steps"] // recipe["max_steps"]
        logger.info("num_warmup_steps=%d: the %s recipe's %d warmup steps of %d, scaled to max_train_steps=%d",
                    values["num_warmup_steps"], args.preset, recipe["warmup_steps"], recipe["max_steps"],
                    values["max_train_steps"])
    fallbacks = dict(tgt_len=128, mem_len=128, eval_tgt_len=None, eval_mem_len=None, clamp_len=-1,
                     eval_clamp_len=None, same_length=False, eval_same_length=True, learning_rate=2.5e-4,
                     num_warmup_steps=0, max_train_steps=1000, train_batch_size=16, output_dir="outputs/pretrain",
                     max_grad_norm=0.25)
    for name, value in fallbacks.items():
        if values[name] is None:
            values[name] = value
    for name, source in (("eval_tgt_len", "tgt_len"), ("eval_mem_len", "mem_len"), ("eval_clamp_len", "clamp_len")):
        if values[name] is None:
            values[name] = values[source]
    if values["eval_steps"] is None:
        values["eval_steps"] = max(1, values["max_train_steps"] // 5)
    if values["dataset_name"] is None and values["train_file"] is None:
        values["dataset_name"] = "builtin"
    values["token_cache_dir"] = resolve_token_cache_dir(values)
    resolved = PretrainArguments(**values)
    validate(resolved)
    return resolved


def validate(args: PretrainArguments) -> None:
    """Argument-level checks (no I/O beyond existence of named files): ValueError naming argument, value, expectation."""
    choice("objective", args.objective, OBJECTIVES)
    choice("lr_scheduler_type", args.lr_scheduler_type, SCHEDULERS)
    choice("optimizer", args.optimizer, OPTIMIZERS)
    choice("tail_capacity", args.tail_capacity, ("auto", "none"))
    choice("report_to", args.report_to, TRACKERS)
    choice("tokenizer_type", args.tokenizer_type, ("word", "unigram", "char", "byte"))
    if args.mixed_precision is not None:
        choice("mixed_precision", args.mixed_precision, PRECISIONS)
    for name in ("train_batch_size", "tgt_len", "eval_tgt_len", "max_train_steps", "gradient_accumulation_steps",
                 "eval_steps", "logging_steps", "ddp_timeout"):
        positive_int(name, getattr(args, name))
    for name in ("per_device_train_batch_size", "checkpointing_steps", "max_eval_segments", "checkpoints_total_limit"):
        if getattr(args, name) is not None:
            positive_int(name, getattr(args, name))
    if args.tokenizer_vocab_size is not None:
        specials = ["<eos>", "<unk>"] + (["<sep>", "<cls>"] if args.objective == "plm" else [])
        value = args.tokenizer_vocab_size
        if not isinstance(value, int) or isinstance(value, bool) or value < len(specials) + 1:
            raise ValueError(f"tokenizer_vocab_size={value!r} is invalid; expected an integer >= {len(specials) + 1} "
                             f"(the special tokens {specials} and at least one word)")
    check_data_source(args)
    if args.overwrite_output_dir and args.resume_from_checkpoint is not None:
        raise ValueError(f"overwrite_output_dir=True and resume_from_checkpoint={args.resume_from_checkpoint!r} are "
                         "both set; expected one (overwriting deletes the checkpoints a resume reads)")
    for name in ("mem_len", "eval_mem_len", "num_warmup_steps"):
        if getattr(args, name) < 0:
            raise ValueError(f"{name}={getattr(args, name)} is invalid; expected an integer >= 0")
    for name in ("clamp_len", "eval_clamp_len"):
        if getattr(args, name) < -1:
            raise ValueError(f"{name}={getattr(args, name)} is invalid; expected -1 (no clamping) or >= 0")
    if args.num_warmup_steps > args.max_train_steps:
        raise ValueError(f"num_warmup_steps={args.num_warmup_steps} is longer than max_train_steps="
                         f"{args.max_train_steps}; expected at most the number of steps")
    if not args.learning_rate > 0:
        raise ValueError(f"learning_rate={args.learning_rate} is invalid; expected a positive number")
    if args.max_grad_norm < 0:
        raise ValueError(f"max_grad_norm={args.max_grad_norm} is invalid; expected >= 0 (0 turns clipping off)")
    if args.dataset_name is not None and args.train_file is not None:
        raise ValueError(f"dataset_name={args.dataset_name!r} and train_file={args.train_file!r} are both set; expected one")
    for name in ("train_file", "validation_file"):
        path = getattr(args, name)
        if path is not None and os.path.isdir(path):
            hint = " (for a folder of train/valid/test files pass it as --dataset_name)" if name == "train_file" else ""
            raise ValueError(f"{name}={path!r} is a folder; expected a local text/json/csv/parquet file{hint}")
        if path is not None and not os.path.isfile(path):
            raise ValueError(f"{name}={path!r} does not exist; expected an existing local text/json/csv/parquet file")
    for name in ("model_name_or_path", "config_name", "tokenizer_name"):
        check_model_source(name, getattr(args, name))
    if args.push_to_hub and args.hub_model_id is not None and args.hub_model_id.count("/") > 1:
        raise ValueError(f"hub_model_id={args.hub_model_id!r} is invalid; expected 'name' or 'user/name'")


def default_token_cache_dir() -> str:
    """$MODELING_XL_CACHE/token_cache, else $XDG_CACHE_HOME/modeling_xl/token_cache, else
    ~/.cache/modeling_xl/token_cache."""
    root = os.environ.get("MODELING_XL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "modeling_xl")
    return os.path.join(root, "token_cache")


def resolve_token_cache_dir(values: dict) -> str | None:
    """The token cache folder of a run, or None for the corpus in memory (or streamed). `--token_cache_dir` turns the
    cache on; `--token_cache false` off (both: an error); otherwise it is on for local files (a `--train_file`, or a
    `--dataset_name` that is a local folder) and for `--token_cache true`, off for the built-in corpus, a Hub dataset
    and `--streaming`."""
    wanted, folder = values["token_cache"], values["token_cache_dir"]
    if wanted is False:
        if folder is not None:
            raise ValueError(f"token_cache=False and token_cache_dir={folder!r} are both set; expected one (the folder "
                             "turns the cache on)")
        return None
    if folder is not None:
        return folder
    if wanted is True:
        return default_token_cache_dir()
    dataset = values["dataset_name"]
    local = values["train_file"] is not None or (dataset not in (None, "builtin") and os.path.isdir(dataset))
    return default_token_cache_dir() if local and not values["streaming"] else None


def check_data_source(args: PretrainArguments) -> None:
    """--streaming / --token_cache_dir / --num_train_tokens combinations."""
    if args.streaming and args.token_cache_dir is not None:
        raise ValueError(f"streaming=True and token_cache_dir={args.token_cache_dir!r} are both set; expected one "
                         "(the cache tokenizes the corpus once and memory-maps it; streaming never stores it)")
    if args.streaming and args.objective == "plm":
        raise ValueError("streaming=True with objective='plm' is not supported: permutation-LM samples draw their B "
                         "segment anywhere in the row, which needs random access; expected --token_cache_dir")
    if (args.streaming and args.tokenizer_type in ("char", "unigram")
            and not (args.tokenizer_name or args.model_name_or_path)):
        raise ValueError(f"streaming=True with tokenizer_type={args.tokenizer_type!r} is not supported (it trains on the "
                         "whole corpus); expected tokenizer_type 'word' or 'byte', or a saved tokenizer (--tokenizer_name, "
                         "e.g. from scripts/train_tokenizer.py)")
    if args.num_train_tokens is not None:
        if not args.streaming:
            raise ValueError(f"num_train_tokens={args.num_train_tokens} is set without streaming=True; expected it "
                             "only with --streaming (other paths count the tokens they store)")
        positive_int("num_train_tokens", args.num_train_tokens)
    if args.token_cache_dir is not None and args.token_cache_dir.startswith("~"):
        raise ValueError(f"token_cache_dir={args.token_cache_dir!r} starts with '~', which is not expanded here; "
                         f"expected the full path ({os.path.expanduser(args.token_cache_dir)!r})")


def processes_split(args: PretrainArguments, num_processes: int) -> tuple[int, int]:
    """(global streams, streams per process). Raises when the streams cannot be shared evenly.

    Example: train_batch_size 16 over 2 processes with 2 accumulation chunks -> (16, 8), each chunk 4 streams.
    """
    if args.per_device_train_batch_size is not None:
        global_batch = args.per_device_train_batch_size * num_processes
    else:
        global_batch = args.train_batch_size
    if global_batch % num_processes:
        raise ValueError(
            f"train_batch_size={global_batch} streams cannot be shared by {num_processes} processes; expected a "
            f"multiple of {num_processes} (each process owns train_batch_size / num_processes fixed streams)"
        )
    per_process = global_batch // num_processes
    if per_process % args.gradient_accumulation_steps:
        raise ValueError(
            f"gradient_accumulation_steps={args.gradient_accumulation_steps} does not divide the {per_process} streams "
            f"of each process (train_batch_size={global_batch} / {num_processes} processes); expected a divisor of "
            f"{per_process}"
        )
    return global_batch, per_process


# what a pretraining run writes into its output folder besides the final model (which save_pretrained replaces)
# What --overwrite_output_dir deletes of an earlier pretraining run (not `runs/`: tracking logs may be other runs' too).
RUN_RECORDS = (CHECKPOINTS, LOG_FILE, "training_config.yaml", "training_config.json", "eval_results.json", PLOT_FILE)


def earlier_pretraining_run(folder: Path) -> list[str]:
    """The names in `folder` that mark an earlier pretraining run (its checkpoints, its step log)."""
    return [name for name in (CHECKPOINTS, LOG_FILE) if (folder / name).exists()]


def save_resolved(args: PretrainArguments, folder: Path, extra: dict | None = None) -> None:
    """Write the resolved run configuration as YAML and JSON (`training_config.{yaml,json}`); `--push_to_hub`
    uploads them, so the Hub token is written as `<HUB_TOKEN>` (as transformers' TrainingArguments does)."""
    values = {**args.to_dict(), **(extra or {})}
    if values.get("hub_token") is not None:
        values["hub_token"] = "<HUB_TOKEN>"
    replace_text(folder / "training_config.yaml", yaml.safe_dump(values, sort_keys=False))
    replace_text(folder / "training_config.json", json.dumps(values, indent=2))
