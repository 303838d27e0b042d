"""The in-memory pretraining corpus: corpus (modeling_xl.data.corpora) -> tokenizer (tokenization/) -> token ids
(modeling_xl.data.tokenize); `data_sources.build_data` turns them into this process's rows.

Every failure here (missing file or dataset, undecodable text, empty corpus, too few tokens for the streams) happens
before the model is built, so bad input costs seconds, not a training run.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

from ..runtime.validators import local_folder_hint

logger = logging.getLogger(__name__)
COUNT_BATCH = 500_000  # lines counted at a time when training a word-level vocabulary
VALIDATION_FRACTION = 0.05  # held out from the end of the training rows when the corpus has no validation split


def load_splits(args):
    """DatasetDict with train and validation splits, and a name for the model card."""
    import datasets

    from ..data.corpora import load_corpus

    source = args.train_file or args.dataset_name
    name = "train_file" if args.train_file else "dataset_name"
    try:
        corpus = load_corpus(source, args.dataset_config_name, text_column=args.text_column)
    except OSError as error:
        raise ValueError(f"{name}={source!r} could not be loaded: {error}") from None
    except ValueError as error:
        raise ValueError(f"{name}={source!r}: {error}") from None
    if args.validation_file:
        try:
            validation = load_corpus(args.validation_file, text_column=args.text_column)["train"]
        except (OSError, ValueError) as error:
            raise ValueError(f"validation_file={args.validation_file!r}: {error}") from None
        corpus = datasets.DatasetDict({**corpus, "validation": validation})
    if "validation" not in corpus:
        rows = corpus["train"].num_rows
        held_out = max(1, int(rows * VALIDATION_FRACTION))
        if rows < 2:
            raise ValueError(f"{name}={source!r} has {rows} row(s) and no validation split; expected a "
                             "--validation_file or a corpus with at least two lines")
        logger.info("no validation split: holding out the last %d of %d training rows", held_out, rows)
        corpus = datasets.DatasetDict({"train": corpus["train"].select(range(rows - held_out)),
                                       "validation": corpus["train"].select(range(rows - held_out, rows))})
    return datasets.DatasetDict({"train": corpus["train"], "validation": corpus["validation"]}), str(source)


def load_tokenizer(args, corpus):
    """--tokenizer_name, else the tokenizer saved with --model_name_or_path, else one trained on the training split
    (word level by default, capped at the preset's vocabulary size; unigram at that size; char; byte)."""
    from transformers import AutoTokenizer

    saved = args.tokenizer_name or args.model_name_or_path
    if saved is not None:
        try:
            return AutoTokenizer.from_pretrained(saved)
        except (OSError, ValueError) as error:
            name = "tokenizer_name" if args.tokenizer_name else "model_name_or_path"
            raise ValueError(f"{name}={saved!r} has no loadable tokenizer ({error}){local_folder_hint(saved)}; "
                             "expected a folder with tokenizer.json (e.g. written by scripts/train_tokenizer.py)"
                             ) from None
    if args.tokenizer_type == "byte":
        from tokenization.char_level import byte_level_tokenizer

        return byte_level_tokenizer()
    texts = corpus["train"].data.column(args.text_column)
    if args.tokenizer_type == "word":
        return word_level_tokenizer_of_size(texts, word_vocabulary_size(args))
    if args.tokenizer_type == "char":
        from tokenization.char_level import train_char_level_tokenizer

        return train_char_level_tokenizer(texts.to_pylist())
    if args.tokenizer_type == "unigram":  # XLNet's subwords; its <sep> and <cls> serve the permutation LM as they are
        from tokenization.unigram import train_unigram_tokenizer

        from ..configuration_transformer_xl import PRESETS

        return train_unigram_tokenizer(texts.to_pylist(),
                                       vocab_size=args.tokenizer_vocab_size or PRESETS[args.preset]["vocab_size"])
    raise ValueError(f"tokenizer_type={args.tokenizer_type!r} is invalid; expected 'word', 'unigram', 'char' or 'byte'")


def word_vocabulary_size(args) -> int:
    """Symbols of the word-level vocabulary trained here: --tokenizer_vocab_size (or the preset's), less <sep> and
    <cls> with the permutation LM (`add_plm_tokens` adds them after training)."""
    from ..configuration_transformer_xl import PRESETS

    vocab_size = args.tokenizer_vocab_size or PRESETS[args.preset]["vocab_size"]
    return vocab_size - (2 if args.objective == "plm" else 0)


def word_level_tokenizer_of_size(texts, vocab_size: int):
    """Word-level tokenizer (reference order) of exactly `vocab_size` symbols, <eos> and <unk> included (fewer only
    when the corpus has fewer distinct words).

    <unk> is counted once: WikiText contains the literal word <unk>, which then keeps its frequency rank; otherwise it
    is appended after the words. Example, vocab_size 4: "a a a b b <unk> c" -> [<eos>, a, b, <unk>] (<unk> is a word
    of the corpus); "a a b c" -> [<eos>, a, b, <unk>] (c makes room for the appended <unk>).
    """
    from tokenization.word_level import WordCounter

    counter = WordCounter()  # batch by batch: a corpus column larger than memory is never copied whole
    for chunk in (texts.chunks if hasattr(texts, "chunks") else [texts]):
        for start in range(0, len(chunk), COUNT_BATCH):
            counter.update(chunk[start : start + COUNT_BATCH])
    return word_level_tokenizer_from_counts(*counter.result(), vocab_size)


def word_level_tokenizer_from_counts(words, counts, vocab_size: int):
    """`word_level_tokenizer_of_size` from word counts already made (e.g. streamed, `tokenization.WordCounter`).
    A corpus without an uppercase letter gives a tokenizer that lowercases its input (a Lowercase normalizer, saved
    with it): the corpus's own ids are unchanged, and cased text (fine-tuning data, prompts) still finds its words."""
    from tokenization.word_level import build_vocab, has_uppercase, word_level_tokenizer

    if not words:
        raise ValueError("the corpus has no words (empty or whitespace only); expected at least one non-empty line")
    vocab = build_vocab(words, counts, max_size=vocab_size - 1)  # <eos> + words, <unk> among them if the corpus has it
    if len(vocab) > vocab_size:  # <unk> is not among the kept words and was appended: make room for it
        vocab = build_vocab(words, counts, max_size=vocab_size - 2)
    return word_level_tokenizer(vocab, lowercase=not has_uppercase(words))


def is_character_level(tokenizer) -> bool:
    """Whether every token is one character or byte: the char and byte tokenizers of `tokenization.char_level` (a
    BPE model without merges)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    model = json.loads(backend.to_str())["model"]
    return model.get("type") == "BPE" and not model.get("merges")


def tokenizer_kind(tokenizer) -> str:
    """What a tokenizer is, in words, from its `tokenizer.json` model: "word level", "character level", "byte level"
    (the tokenizers of `tokenization`), "Unigram", "BPE", "WordPiece"; else the model type, or the class name."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return type(tokenizer).__name__
    saved = json.loads(backend.to_str())
    model = saved["model"].get("type")
    if is_character_level(tokenizer):
        return "byte level" if (saved.get("decoder") or {}).get("type") == "ByteLevel" else "character level"
    return {"WordLevel": "word level", "BPE": "BPE", "Unigram": "Unigram", "WordPiece": "WordPiece"}.get(
        model, model or type(tokenizer).__name__)


def describe(args, source: str, tokenizer, ids: dict[str, np.ndarray]) -> dict:
    """Facts about the data for logs and the model card."""
    from ..data.corpora import BUILTIN_NAMES

    if args.char_level is not None:
        char_level = args.char_level
    elif args.tokenizer_name or args.model_name_or_path:  # a saved tokenizer: what it is, not --tokenizer_type
        char_level = is_character_level(tokenizer)
    else:
        char_level = args.tokenizer_type in ("char", "byte")
    pretty = {"builtin": "the built-in offline corpus (English prose from the Python standard library's docstrings)"}
    builtin = source in BUILTIN_NAMES
    local = not builtin and os.path.exists(source)
    # a local file or folder is named by its base name (its path says nothing on another machine); only a Hub id
    # (`wikitext`, `user/name`) is linked from the card's `datasets:` metadata
    name = Path(source).resolve().name if local else source
    description = pretty.get(source, f"`{name}`" + (" (local files)" if local else "")
                             + (f" ({args.dataset_config_name})" if args.dataset_config_name else ""))
    return {
        "dataset_name": name,
        "dataset_pretty_name": name,
        "hub_dataset": None if local or builtin else source,
        "description": description,
        "tokenizer": f"{tokenizer_kind(tokenizer)}, {len(tokenizer):,} symbols"
                     + (", trained on the training split" if not (args.tokenizer_name or args.model_name_or_path)
                        else ""),
        "char_level": char_level,
        "example_prompt": "The",
        "train_tokens": int(len(ids["train"])),
        "eval_tokens": int(len(ids["validation"])),
    }
