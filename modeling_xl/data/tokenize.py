"""Tokenize a corpus into one flat token-id stream per split: batched, multi-process, cached `Dataset.map`.

Each text row becomes its ids (with the tokenizer's special tokens, e.g. `<eos>` per line); the rows of a split are
then concatenated in order. Batches travel as Arrow tables (`with_format("arrow")`), so no per-token Python objects
are made: word-level tokenizers use the exact Arrow fast path of `tokenization.arrow_words`, others the tokenizer's
batched Rust encoder. The map's fingerprint is derived from the input dataset, the tokenizer's full JSON and the text
column, so a second run with the same inputs reuses the cache file (`load_from_cache_file=True`).
"""

from __future__ import annotations

import hashlib
import os

import datasets
import numpy as np
import pyarrow as pa

from tokenization.arrow_words import WordLevelPlan, encode_lines

TOKENIZE_VERSION = "2"  # 2: a task-layout template (XLNet's A <sep> <cls>) ends corpus lines with </s>
MULTIPROCESS_MIN_ROWS = 50_000  # below this, starting worker processes costs more than it saves


def tokenize_corpus(corpus: datasets.DatasetDict | dict, tokenizer, *, text_column: str = "text",
                    num_proc: int | None = None, batch_size: int = 2000, load_from_cache_file: bool = True,
                    ) -> dict[str, np.ndarray]:
    """{split: 1-D int32 token ids} for every split of `corpus`.

    `num_proc=None` uses one process for small splits and all cores above `MULTIPROCESS_MIN_ROWS` rows.
    """
    plan = WordLevelPlan.from_tokenizer(tokenizer)
    return {split: tokenize_split(data, tokenizer, text_column=text_column, num_proc=num_proc, batch_size=batch_size,
                                  load_from_cache_file=load_from_cache_file, plan=plan, split=split)
            for split, data in corpus.items()}


def tokenize_split(data: datasets.Dataset, tokenizer, *, text_column: str = "text", num_proc: int | None = None,
                   batch_size: int = 2000, load_from_cache_file: bool = True, plan=None,
                   split: str = "data") -> np.ndarray:
    """One split -> flat int32 ids (a zero-copy view of the cached Arrow file when it is a single chunk).

    `plan`: the word-level fast-path plan, computed from the tokenizer when not given (None if it does not apply).
    """
    if plan is None:
        plan = WordLevelPlan.from_tokenizer(tokenizer)
    if text_column not in data.column_names:
        raise ValueError(f"split {split!r} has columns {data.column_names}; expected a text column {text_column!r}")
    if data.num_rows == 0:  # `map` over no rows adds no column; the streams then say the split has no tokens
        return np.zeros(0, dtype=np.int32)
    if num_proc is None:
        num_proc = 1 if data.num_rows < MULTIPROCESS_MIN_ROWS else (os.cpu_count() or 1)
    backend_json = tokenizer.backend_tokenizer.to_str()
    fingerprint = hashlib.sha256(
        f"{TOKENIZE_VERSION}|{data._fingerprint}|{text_column}|{backend_json}".encode()).hexdigest()[:32]
    tokenized = data.with_format("arrow").map(
        _encode_table, batched=True, batch_size=batch_size, num_proc=num_proc if num_proc > 1 else None,
        remove_columns=data.column_names, fn_kwargs={"tokenizer": tokenizer, "text_column": text_column, "plan": plan},
        new_fingerprint=fingerprint, load_from_cache_file=load_from_cache_file,
        features=datasets.Features({"input_ids": datasets.List(datasets.Value("int32"))}),
        desc=f"Tokenizing {split}")
    return flat_ids(tokenized)


def _encode_table(batch: pa.Table, tokenizer, text_column: str, plan) -> pa.Table:
    ids, counts = encode_lines(batch.column(text_column), tokenizer, plan)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids, pa.int32()))})


def flat_ids(tokenized: datasets.Dataset, column: str = "input_ids") -> np.ndarray:
    """Concatenate a list<int32> column into one array (no copy when the table has a single chunk)."""
    chunks = [chunk.flatten().to_numpy(zero_copy_only=False) for chunk in tokenized.data.column(column).chunks]
    if not chunks:
        return np.zeros(0, dtype=np.int32)
    return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
