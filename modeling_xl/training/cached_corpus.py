"""`--token_cache_dir`: the corpus tokenized once into a `modeling_xl.data.token_cache` entry, then memory-mapped.

The entry's key hashes what decides the token ids: the corpus files (path, size, modification time; a Hub name and
config; or the built-in corpus's Python version), the tokenizer (the saved tokenizer's files, or the settings of the
one trained here), the objective (plm adds <sep> and <cls>), the text column and the validation hold-out. A run whose
entry exists opens it without loading the corpus or training a tokenizer, so it reaches its first step in seconds;
editing a corpus file (new size or modification time) makes a new entry.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import time
from pathlib import Path

from ..data.token_cache import TokenCache, get_or_build, token_dtype, write_split_tokens

logger = logging.getLogger(__name__)


def _file_identity(path: Path) -> list:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def corpus_identity(args) -> dict:
    from ..data.corpora import BUILTIN_NAMES

    identity = {"text_column": args.text_column}
    for name in ("train_file", "validation_file", "dataset_name"):
        value = getattr(args, name)
        if value is None:
            continue
        if name == "dataset_name" and value in BUILTIN_NAMES:
            identity[name] = {"builtin": sys.version}
        elif os.path.exists(value):
            identity[name] = _file_identity(Path(value))
        else:
            identity[name] = {"hub": value, "config": args.dataset_config_name}
    return identity


def tokenizer_identity(args) -> dict:
    saved = args.tokenizer_name or args.model_name_or_path
    if saved is None:
        from ..configuration_transformer_xl import PRESETS

        return {"trained": args.tokenizer_type,
                "vocab_size": args.tokenizer_vocab_size or PRESETS[args.preset]["vocab_size"]}
    folder = Path(saved)
    if not folder.is_dir():
        return {"saved": saved}
    digest = hashlib.sha256()
    for file in sorted(folder.glob("*token*.json")):  # tokenizer.json, tokenizer_config.json, special_tokens_map.json
        digest.update(file.name.encode() + file.read_bytes())
    return {"saved": str(folder.resolve()), "sha256": digest.hexdigest()}


def cache_identity(args) -> dict:
    from .corpus import VALIDATION_FRACTION

    return {"corpus": corpus_identity(args), "tokenizer": tokenizer_identity(args),
            "plm_tokens": args.objective == "plm", "validation_fraction": VALIDATION_FRACTION}


def cached_tokens(args) -> TokenCache:
    """The cache entry of this run's corpus and tokenizer, built when absent. Processes that share the folder wait
    on its lock and open the entry the first one built (on several machines with local folders, one process per
    machine builds it)."""
    from .corpus import load_splits, load_tokenizer

    def build(folder: Path):
        started = time.perf_counter()
        corpus, _ = load_splits(args)
        loaded = time.perf_counter()
        tokenizer = load_tokenizer(args, corpus)
        trained = time.perf_counter()
        if args.objective == "plm":
            from .plm import add_plm_tokens

            add_plm_tokens(tokenizer)
        from .data import tokenizer_vocab_size

        dtype = token_dtype(tokenizer_vocab_size(tokenizer))
        num_proc = args.preprocessing_num_workers or os.cpu_count() or 1
        splits = {split: write_split_tokens(corpus[split], tokenizer, folder / f"{split}.bin",
                                            text_column=args.text_column, dtype=dtype, num_proc=num_proc,
                                            desc=f"Tokenizing {split} into the cache",
                                            disable_progress=args.disable_tqdm)
                  for split in ("train", "validation")}
        tokenized = time.perf_counter()
        tokenizer.save_pretrained(str(folder / "tokenizer"))
        facts = {"load_seconds": loaded - started, "tokenizer_seconds": trained - loaded,
                 "tokenize_seconds": tokenized - trained, "num_proc": num_proc,
                 "tokens_per_second": sum(splits.values()) / max(tokenized - trained, 1e-9)}
        logger.info("token cache built: corpus loaded in %.1f s, tokenizer in %.1f s, %s tokens in %.1f s "
                    "(%.2fM tokens/s, %d processes)", facts["load_seconds"], facts["tokenizer_seconds"],
                    f"{sum(splits.values()):,}", facts["tokenize_seconds"], facts["tokens_per_second"] / 1e6, num_proc)
        return splits, dtype, facts

    cache = get_or_build(args.token_cache_dir, cache_identity(args), build)
    logger.info("token cache %s: %s tokens (%s)", cache.path,
                ", ".join(f"{split} {count:,}" for split, count in cache.splits.items()), cache.meta["dtype"])
    return cache

