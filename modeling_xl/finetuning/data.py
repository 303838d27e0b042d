"""Fine-tuning data: loading (Hub, local files, the built-in task), row checks, tokenization (single texts, text
pairs, whole documents) and the left-padding collate.

Token layouts (the tokenizer's own templates):
- Unigram (XLNet) tokenizer: `A <sep> <cls>`, pairs `A <sep> B <sep> <cls>` with segment ids A=0, B=1, <cls>=2,
  which the bidirectional backbone reads as its segment term (`token_type_ids`).
- word-level tokenizer: `A <eos>`, pairs `A <eos> B <eos>`; char-level: `A \\n`, pairs `A \\n B \\n`. No segment
  ids: the causal backbone has no segment embedding; the separator marks the boundary and the pooled last token has
  read both texts.
A single text longer than `max_length` keeps its end (with the final special token); a pair is cut longest-first
(the tokenizer's `truncation="longest_first"`), keeping the special tokens. With `long_document` nothing is cut: the
model reads the whole text `max_length` tokens at a time with memory.
"""

from __future__ import annotations

from pathlib import Path

import datasets
import torch
from datasets.exceptions import DatasetGenerationError

from ..data.corpora import load_split_files
from .arguments import BUILTIN_TASKS, FinetuneArguments
from .labels import LabelSpace, build_label_space

# CSV/TSV: an empty cell and a numeric "nan" / "NaN" are missing; pandas' other default missing markers ("NA",
# "N/A", "None", "null", "<NA>", ...) are kept as the texts and labels they are (a class named "NA" stays a class)
_CSV_CELLS = {"keep_default_na": False, "na_values": ["", "nan", "NaN"]}
LOCAL_BUILDERS = {".csv": ("csv", dict(_CSV_CELLS)), ".tsv": ("csv", {"delimiter": "\t", "quoting": 3, **_CSV_CELLS}),
                  ".json": ("json", {}), ".jsonl": ("json", {})}


def load_raw_datasets(args) -> datasets.DatasetDict:
    """{"train", "validation"} from the built-in task, the Hub (`dataset_name`) or local files; with
    `max_train_samples` the train split is a random subset of that size, taken here, before any job checks its rows
    or computes its targets (which are by row)."""
    raw = _load_raw_datasets(args)
    if args.max_train_samples is not None:
        keep = range(min(args.max_train_samples, len(raw["train"])))
        raw["train"] = raw["train"].shuffle(seed=args.seed).select(keep)
    return raw


def _load_raw_datasets(args) -> datasets.DatasetDict:
    if (args.dataset_name is None) == (args.train_file is None):
        raise ValueError(f"dataset_name={args.dataset_name!r}, train_file={args.train_file!r}; expected exactly one "
                         "of them (a Hub dataset by name, 'builtin', or local CSV/TSV/JSON files)")
    if args.dataset_name in BUILTIN_TASKS:
        from .builtin_task import builtin_task

        return builtin_task(long_documents=args.dataset_name == "builtin-long")
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
    suffixes = {Path(f).suffix.lower().replace(".jsonl", ".json") for f in files.values()}  # both JSON lines or not
    for name, path in files.items():
        if Path(path).is_dir():
            inside = sorted(p.name for p in Path(path).iterdir() if p.suffix.lower() in LOCAL_BUILDERS)[:8]
            raise ValueError(f"{name}_file={path!r} is a folder; expected a .csv, .tsv, .json or .jsonl file"
                             + (f" (this folder holds {inside})" if inside else ""))
        if not Path(path).is_file():
            raise FileNotFoundError(f"{name}_file={path!r} does not exist")
    if len(suffixes) != 1 or next(iter(suffixes)) not in LOCAL_BUILDERS:
        raise ValueError(f"train/validation files have suffixes {sorted(suffixes)}; expected both .csv, .tsv, .json "
                         "or .jsonl")
    builder, options = LOCAL_BUILDERS[next(iter(suffixes))]
    return datasets.DatasetDict({split: _read_split(split, path, builder, options) for split, path in files.items()})


def _read_split(split: str, path: str, builder: str, options: dict):
    """One local file as a split, with errors that name the argument and the file."""
    expected = "expected a header row and at least one example" if builder == "csv" else "expected at least one example"
    argument = f"{split}_file={path!r}"
    if Path(path).stat().st_size == 0:
        raise ValueError(f"{argument} is empty (0 bytes); {expected}")
    if builder == "csv" and _lines_with_text(path, 2) < 2:
        found = "holds a header but no rows" if _lines_with_text(path, 1) else "holds only blank lines"
        raise ValueError(f"{argument} {found}; {expected}")
    try:
        rows = load_split_files(builder, {split: path}, **options)[split]
    except OSError:
        raise
    except Exception as error:  # datasets' own message names neither the argument nor the file
        cause, seen = error, set()  # datasets' DatasetGenerationError wraps the parser's error: show that
        while isinstance(cause, DatasetGenerationError) and cause.__cause__ is not None and id(cause) not in seen:
            seen.add(id(cause))
            cause = cause.__cause__
        raise ValueError(f"{argument} could not be read as {Path(path).suffix.lower()[1:].upper()} "
                         f"({type(cause).__name__}: {str(cause).strip()}); {expected}"
                         f"{_separator_hint(path)}") from error
    if builder == "json" and len(rows) == 1 and "data" in rows.column_names:
        # one JSON object whose "data" holds the rows (SQuAD's files, transformers' run_qa.py convention)
        rows = load_split_files(builder, {split: path}, field="data", **options)[split]
    if len(rows) == 0:
        raise ValueError(f"{argument} has no rows; {expected}")
    return rows


def _separator_hint(path) -> str:
    """For a CSV/TSV whose header is split by another character than the file type's (a semicolon- or tab-separated
    .csv, a comma-separated .tsv): what to do; else ""."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".csv", ".tsv"):
        return ""
    separator = LOCAL_BUILDERS[suffix][1].get("delimiter", ",")
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as handle:
            header = next((line for line in handle if line.strip()), "")
    except OSError:
        return ""
    found = [name for char, name in ((";", "semicolons"), ("\t", "tabs"), (",", "commas"), ("|", "bars"))
             if char != separator and char in header and separator not in header]
    if not found:
        return ""
    wanted = "tab" if separator == "\t" else "comma"
    return (f" (its header {header.strip()[:60]!r} is separated by {found[0]}: a {suffix} file is "
            f"read {wanted}-separated; save it comma-separated as .csv or tab-separated as .tsv)")


def _lines_with_text(path, at_most: int) -> int:
    """How many lines of `path` hold more than whitespace, counting up to `at_most`."""
    found = 0
    with open(path, "rb") as handle:
        for line in handle:
            found += bool(line.strip())
            if found >= at_most:
                break
    return found


def row_namer(args: FinetuneArguments, column: str):
    """describe(split, row) -> "validation_file='dev.csv', row 3, column 'label'" (rows from 1, header excluded)."""
    def describe(split: str, row: int) -> str:
        if args.train_file is not None:
            source = f"{split}_file={args.train_file if split == 'train' else args.validation_file!r}"
        else:
            name = split if split == "train" or args.dataset_name in BUILTIN_TASKS else args.validation_split
            source = f"dataset_name={args.dataset_name!r} (split {name!r})"
        return f"{source}, row {row}, column {column!r}"
    return describe


def check_rows(raw: datasets.DatasetDict, args: FinetuneArguments) -> tuple[LabelSpace, dict[str, list]]:
    """Columns present, no empty text, every label valid for the problem type: (label space, {split: targets})."""
    columns = [("text_column", args.text_column), ("label_column", args.label_column)]
    if args.text_pair_column is not None:
        columns.insert(1, ("text_pair_column", args.text_pair_column))
    for split, data in raw.items():
        for name, column in columns:
            if column not in data.column_names:
                hint = ""
                if len(data.column_names) == 1 and args.train_file is not None:
                    hint = _separator_hint(args.train_file if split == "train" else args.validation_file)
                raise ValueError(f"{name}={column!r} is not a column of the {split} split; expected one of "
                                 f"{data.column_names}{hint}")
        for _, column in columns[:-1]:
            describe = row_namer(args, column)
            for row, text in enumerate(data[column]):
                if text is None or not str(text).strip():
                    raise ValueError(f"{describe(split, row + 1)}: the text is empty ({text!r}); expected a non-empty "
                                     "text in every row")
    feature = raw["train"].features.get(args.label_column)
    names = feature.names if isinstance(feature, datasets.ClassLabel) else None
    return build_label_space({split: raw[split][args.label_column] for split in ("train", "validation")},
                             args.problem_type, args.label_delimiter, row_namer(args, args.label_column), names)


def tokenize_split(data: datasets.Dataset, targets: list, tokenizer, args: FinetuneArguments,
                   keep_token_types: bool) -> datasets.Dataset:
    """input_ids (+ token_type_ids for the bidirectional backbone) and `labels` per row (see the module docstring)."""
    def encode(batch, indices):
        texts = [str(t) for t in batch[args.text_column]]
        if args.text_pair_column is not None:
            pairs = [str(t) for t in batch[args.text_pair_column]]
            encoded = tokenizer(texts, pairs, truncation="longest_first", max_length=args.max_length,
                                return_token_type_ids=keep_token_types)
        else:
            encoded = tokenizer(texts, return_token_type_ids=keep_token_types)
            if not args.long_document:
                encoded = {k: [x[-args.max_length:] for x in v] for k, v in encoded.items()}
        out = {"input_ids": encoded["input_ids"], "labels": [targets[i] for i in indices]}
        if keep_token_types:
            out["token_type_ids"] = encoded["token_type_ids"]
        return out

    return data.map(encode, batched=True, with_indices=True, remove_columns=data.column_names, desc="Tokenizing")


def padded(rows: list[list[int]], value: int, left: bool = False, width: int | None = None) -> torch.Tensor:
    """Rows of ids as one LongTensor [len(rows), width] (default: the longest row), filled with `value` on the right,
    or on the left with `left`; an empty row is all `value`."""
    width = max(len(r) for r in rows) if width is None else width
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            (out[i, width - len(row):] if left else out[i, :len(row)]).copy_(torch.tensor(row))
    return out


def left_pad_collate(pad_id: int, label_dtype: torch.dtype = torch.long):
    """Batch of {"input_ids", "labels"[, "token_type_ids"]} -> left-padded input_ids [B, T], attention_mask [B, T],
    token_type_ids [B, T] (when given), labels [B] (class ids or numbers) or [B, C] (multi-label 0/1)."""
    def collate(examples):
        ids = [e["input_ids"] for e in examples]
        batch = {"input_ids": padded(ids, pad_id, left=True), "attention_mask": padded([[1] * len(r) for r in ids], 0,
                                                                                       left=True),
                 "labels": torch.tensor([e["labels"] for e in examples], dtype=label_dtype)}
        if "token_type_ids" in examples[0]:
            batch["token_type_ids"] = padded([e["token_type_ids"] for e in examples], 0, left=True)
        return batch

    return collate
