"""`--streaming`: the training split read through `datasets` streaming, tokenized on the fly, never materialised.

Local files (txt/.tokens/.raw, json/jsonl, csv/tsv, parquet, each optionally compressed: .gz, .bz2, .xz, .zst) and
Hub names go through the same call, `datasets.load_dataset(..., streaming=True)`. Each row of the ordered streams
opens its own iterator and skips to its region (`modeling_xl.data.streams.StreamingOrderedStreams`), so a process
holds O(its rows x one batch of text) in memory and resumes at the exact segment.

What it costs (why `--token_cache_dir` is usually better): the layout needs the training split's token count up front,
one extra tokenization pass unless `--num_train_tokens` gives it; a word-level tokenizer trained here needs one
counting pass; and at every start (and resume) each row re-reads and re-tokenizes the text before its region, up to
the whole split for the last row. Every token is tokenized again at every epoch. The validation split is tokenized into
memory (it must fit).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from .corpora import BUILDERS, SPLIT_ALIASES, TEXT_OPTIONS
from .pretrain_data import PretrainData, describe
from .sources import CorpusSource, StreamLayout, TokenizerRecipe
from .streams import EvalStreams, StreamingOrderedStreams
from .tokenizer_choice import load_tokenizer, tokenizer_vocab_size, word_level_tokenizer_from_counts

logger = logging.getLogger(__name__)
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst", ".lz4")
TEXT_BATCH = 2000  # lines per batch read from the stream


def _builder_and_split(file: Path) -> tuple[str | None, str | None]:
    """("text", "train") for train.txt.gz: the format from the inner extension, the split from the stem."""
    suffixes = [s for s in file.suffixes if s not in COMPRESSIONS]
    if not suffixes or suffixes[-1] not in BUILDERS:
        return None, None
    stem = file.name[: -len("".join(file.suffixes))] if file.suffixes else file.name
    return BUILDERS[suffixes[-1]], SPLIT_ALIASES.get(stem.split(".")[-1] if stem.startswith("wiki.") else stem)


def streaming_splits(source: str, config: str | None, text_column: str) -> dict:
    """{split: datasets.IterableDataset} for a local file/folder or a Hub name (same `load_dataset` call)."""
    import datasets

    path = Path(source)
    if path.exists():
        files = {}
        for file in [path] if path.is_file() else sorted(path.iterdir()):
            builder, split = _builder_and_split(file)
            if builder is None:
                if path.is_file():
                    raise ValueError(f"{file} has extensions {file.suffixes}; expected one of {sorted(BUILDERS)}, "
                                     f"optionally followed by one of {list(COMPRESSIONS)}")
                continue
            files[split if path.is_dir() else "train"] = (builder, file)
        files.pop(None, None)
        if "train" not in files:
            raise ValueError(f"folder {path} has no train file; expected train/valid/test files with one of the "
                             f"extensions {sorted(BUILDERS)} (optionally compressed)")
        splits = {}
        for split, (builder, file) in files.items():
            options = dict(TEXT_OPTIONS) if builder == "text" else {}
            if file.name.removesuffix("".join(s for s in file.suffixes if s in COMPRESSIONS)).endswith(".tsv"):
                options["delimiter"] = "\t"
            splits[split] = datasets.load_dataset(builder, data_files={split: str(file)}, split=split,
                                                  streaming=True, **options)
    else:
        try:
            loaded = datasets.load_dataset(source, config, streaming=True)
        except Exception as error:  # offline, unknown name: one clear message
            raise ValueError(f"dataset_name={source!r} (config {config!r}) could not be opened for streaming: "
                             f"{type(error).__name__}: {error}") from None
        splits = {SPLIT_ALIASES.get(split, split): data for split, data in loaded.items()}
    for split, data in splits.items():
        if data.column_names is not None and text_column not in data.column_names:
            raise ValueError(f"corpus {source!r} split {split!r} has columns {data.column_names}; expected a text "
                             f"column {text_column!r} (pass --text_column)")
    return splits


def text_batches(data, text_column: str):
    """Lists of lines, TEXT_BATCH at a time, in corpus order."""
    for batch in data.iter(batch_size=TEXT_BATCH):
        yield [line if line is not None else "" for line in batch[text_column]]


def token_chunks(data, tokenizer, text_column: str):
    """Token ids of the corpus, one array per batch of lines (as `tokenize_corpus` would concatenate them)."""
    from tokenization.arrow_words import WordLevelPlan, encode_lines

    plan = WordLevelPlan.from_tokenizer(tokenizer)
    for lines in text_batches(data, text_column):
        yield encode_lines(lines, tokenizer, plan)[0]


def streaming_tokenizer(recipe: TokenizerRecipe, train, text_column: str):
    """A saved tokenizer, the byte-level one, or a word-level one trained on streamed counts (same ids as the
    in-memory path: `WordCounter` reproduces `count_words`)."""
    if recipe.saved is not None or recipe.kind == "byte":
        return load_tokenizer(recipe)
    from tokenization.word_level import WordCounter

    counter = WordCounter()
    for lines in text_batches(train, text_column):
        counter.update(lines)
    return word_level_tokenizer_from_counts(*counter.result(), recipe.vocab_size)


def build_streaming_data(corpus: CorpusSource, recipe: TokenizerRecipe, layout: StreamLayout,
                         num_train_tokens: int | None = None, char_level: bool | None = None):
    """PretrainData whose training rows stream from the corpus (causal LM only; see the module docstring)."""
    splits = streaming_splits(corpus.location, corpus.dataset_config_name, corpus.text_column)
    if corpus.validation_file:
        splits["validation"] = streaming_splits(corpus.validation_file, None, corpus.text_column)["train"]
    if "validation" not in splits:
        raise ValueError(f"streaming=True with {corpus.argument}={corpus.location!r}: no validation split; expected "
                         "--validation_file or a corpus with a validation split (a stream cannot hold out its last "
                         "rows)")
    tokenizer = streaming_tokenizer(recipe, splits["train"], corpus.text_column)
    train = splits["train"]

    def open_chunks():
        return token_chunks(train, tokenizer, corpus.text_column)

    if num_train_tokens is None:
        logger.info("streaming: counting the training tokens (one pass; --num_train_tokens skips it)")
        num_train_tokens = sum(chunk.size for chunk in open_chunks())
    chunks = list(token_chunks(splits["validation"], tokenizer, corpus.text_column))
    valid_ids = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)
    where = dict(rank=layout.process_index, world_size=layout.num_processes)
    streams = StreamingOrderedStreams(open_chunks, layout.num_streams, layout.tgt_len, num_tokens=num_train_tokens,
                                      **where)
    validation = EvalStreams(valid_ids, layout.num_streams, layout.eval_tgt_len, **where)
    vocab = tokenizer_vocab_size(tokenizer)
    if valid_ids.size and int(valid_ids.max()) >= vocab:
        raise ValueError(f"the validation token ids reach {int(valid_ids.max())}, outside the tokenizer's vocabulary "
                         f"of {vocab}; expected ids produced by the same tokenizer")
    info = describe(corpus, recipe, tokenizer, {"train": range(num_train_tokens), "validation": valid_ids}, char_level)
    return PretrainData(tokenizer, streams, validation, info)
