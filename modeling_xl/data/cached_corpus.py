"""The token cache of pretraining: the corpus tokenized once into a `modeling_xl.data.token_cache` entry, then
memory-mapped. Pretraining turns it on by default for local files (`training.arguments.resolve_token_cache_dir`;
`--token_cache false` turns it off).

The entry's key hashes what decides the token ids: the corpus files (path, size, modification time; a Hub name and
config; or the built-in corpus's Python version), the tokenizer (the content of a saved one: what its tokenizer.json
says about normalizing, splitting, the vocabulary and the special tokens, wherever the folder is; or the settings of
one trained here), the objective (plm adds <sep> and <cls>), the text column and the validation hold-out. An entry
built with a tokenizer trained here is also named by that tokenizer's content (`token_cache.add_alias`), so a rerun
that loads the first run's saved tokenizer (`--tokenizer_name <first output_dir>`) finds it too. A run whose entry
exists opens it without loading the corpus or training a tokenizer, so it reaches its first step in seconds; editing
a corpus file (new size or modification time) makes a new entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .sources import CorpusSource, TokenizerRecipe
from .token_cache import TokenCache, add_alias, get_or_build, token_dtype, write_split_tokens
from .tokenizer_choice import load_tokenizer, tokenizer_vocab_size

logger = logging.getLogger(__name__)


def _file_identity(path: Path) -> list:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def corpus_identity(corpus: CorpusSource) -> dict:
    from .corpora import BUILTIN_NAMES

    identity = {"text_column": corpus.text_column}
    for name in ("train_file", "validation_file", "dataset_name"):
        value = getattr(corpus, name)
        if value is None:
            continue
        if name == "dataset_name" and value in BUILTIN_NAMES:
            identity[name] = {"builtin": sys.version}
        elif os.path.exists(value):
            identity[name] = _file_identity(Path(value))
        else:
            identity[name] = {"hub": value, "config": corpus.dataset_config_name}
    return identity


def tokenizer_identity(recipe: TokenizerRecipe) -> dict:
    saved = recipe.saved
    if saved is None:
        return {"trained": recipe.kind, "vocab_size": recipe.vocab_size}
    folder = Path(saved)
    if not folder.is_dir():
        return {"saved": saved}
    content = tokenizer_content(folder)
    if content is not None:
        return {"content": content}
    digest = hashlib.sha256()
    for file in sorted(folder.glob("*token*.json")):  # tokenizer.json, tokenizer_config.json, special_tokens_map.json
        digest.update(file.name.encode() + file.read_bytes())
    return {"saved": str(folder.resolve()), "sha256": digest.hexdigest()}


# what in a tokenizer.json decides the ids of a text (padding and truncation settings, the decoder do not)
_ENCODING_PARTS = ("normalizer", "pre_tokenizer", "model", "post_processor", "added_tokens")


def tokenizer_content(folder: Path) -> str | None:
    """SHA-256 of the parts of `folder/tokenizer.json` that decide the ids (`_ENCODING_PARTS`), or None without a
    readable tokenizer.json. The same for a tokenizer trained here and for its copy saved in a run's output folder
    (with `<eos>` declared as pad / sep / cls, which adds no symbol)."""
    path = Path(folder) / "tokenizer.json"
    try:
        parts = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(parts, dict):
        return None
    chosen = {name: parts.get(name) for name in _ENCODING_PARTS}
    return hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()


def cache_identity(corpus: CorpusSource, recipe: TokenizerRecipe, tokenizer: dict | None = None) -> dict:
    """What decides the token ids of `corpus` read by `recipe` (`tokenizer`: the tokenizer's identity instead of the
    recipe's, for an alias)."""
    from .corpora import VALIDATION_FRACTION

    return {"corpus": corpus_identity(corpus), "tokenizer": tokenizer or tokenizer_identity(recipe),
            "plm_tokens": recipe.plm_tokens, "validation_fraction": VALIDATION_FRACTION}


@dataclass(frozen=True)
class CacheBuild:
    """What a cache entry is built from: the corpus, the tokenizer recipe, the worker processes and whether progress
    bars show."""

    corpus: CorpusSource
    recipe: TokenizerRecipe
    num_proc: int
    show_progress: bool = True


def cached_tokens(corpus: CorpusSource, recipe: TokenizerRecipe, cache_dir, num_proc: int | None = None,
                  show_progress: bool = True) -> TokenCache:
    """The entry of `corpus` read by `recipe` in `cache_dir`, built when absent (`num_proc` worker processes; all
    cores when None). Processes that share the folder wait on its lock and open the entry the first one built (on
    several machines with local folders, one process per machine builds it). Local text files with a word-level
    tokenizer are read directly (`build_from_text_files`); any other corpus or tokenizer goes through `datasets`
    (`build_through_datasets`): the same ids either way."""
    job = CacheBuild(corpus, recipe, num_proc or os.cpu_count() or 1, show_progress)

    def build(folder: Path):
        files = local_text_files(corpus)
        if files is not None:
            built = build_from_text_files(job, folder, *files)
            if built is not None:
                return built
        return build_through_datasets(job, folder)

    identity = cache_identity(corpus, recipe)
    cache = get_or_build(cache_dir, identity, build)
    if "trained" in identity["tokenizer"]:  # a rerun loading this tokenizer from a saved folder finds the entry too
        content = tokenizer_content(cache.path / "tokenizer")
        if content is not None:
            add_alias(cache_dir, cache_identity(corpus, recipe, {"content": content}), cache.path)
    logger.info("token cache %s: %s tokens (%s); --token_cache false reads the corpus into memory instead", cache.path,
                ", ".join(f"{split} {count:,}" for split, count in cache.splits.items()), cache.meta["dtype"])
    return cache


def _summary(splits: dict, dtype, phases: dict, num_proc: int, method: str):
    """(splits, dtype, facts for meta.json); logs one line. Phases: `load_seconds` (the corpus loaded, or the text
    files cut into pieces), `tokenizer_seconds` (the tokenizer loaded or trained: the text-file build's word counting
    pass is here), `tokenize_seconds` (the ids written)."""
    total, seconds = sum(splits.values()), sum(phases.values())
    facts = {"method": method, **phases, "num_proc": num_proc, "build_seconds": seconds,
             "build_tokens_per_second": total / max(seconds, 1e-9)}
    logger.info("token cache built (%s): corpus %.1f s, tokenizer %.1f s, tokenization %.1f s: %s tokens in %.1f s "
                "(%.2fM tokens/s, %d processes)", method, phases["load_seconds"], phases["tokenizer_seconds"],
                phases["tokenize_seconds"], f"{total:,}", seconds, facts["build_tokens_per_second"] / 1e6, num_proc)
    return splits, dtype, facts


def build_through_datasets(job: CacheBuild, folder: Path):
    """Any corpus and tokenizer: the corpus loaded into `datasets`' Arrow files, the tokenizer loaded or trained on
    it, then every split tokenized in `job.num_proc` processes."""
    from .corpora import load_splits

    started = time.perf_counter()
    corpus, _ = load_splits(job.corpus)
    loaded = time.perf_counter()
    tokenizer = load_tokenizer(job.recipe, corpus["train"].data.column(job.corpus.text_column))
    trained = time.perf_counter()
    dtype = token_dtype(tokenizer_vocab_size(tokenizer))
    splits = {split: write_split_tokens(corpus[split], tokenizer, folder / f"{split}.bin",
                                        text_column=job.corpus.text_column, dtype=dtype, num_proc=job.num_proc,
                                        desc=f"Tokenizing {split} into the cache",
                                        disable_progress=not job.show_progress)
              for split in ("train", "validation")}
    tokenizer.save_pretrained(str(folder / "tokenizer"))
    phases = {"load_seconds": loaded - started, "tokenizer_seconds": trained - loaded,
              "tokenize_seconds": time.perf_counter() - trained}
    return _summary(splits, dtype, phases, job.num_proc, "datasets")


def local_text_files(corpus: CorpusSource) -> tuple[Path, Path | None] | None:
    """(training file, validation file or None: hold out the training file's last lines) when the corpus is local
    plain-text files (.txt, .tokens, .raw, one text per line) that `build_from_text_files` reads; else None. Anything
    the datasets loader would refuse (an empty file, mixed extensions, another text column) also gives None, so
    that loader raises its own error."""
    from .corpora import BUILDERS, BUILTIN_NAMES, check_utf8, split_files

    source = corpus.location
    if source is None or source in BUILTIN_NAMES or not os.path.exists(source) or corpus.text_column != "text":
        return None
    try:
        files = split_files(Path(source))
        validation = split_files(Path(corpus.validation_file))["train"] if corpus.validation_file else None
    except (OSError, ValueError):
        return None
    every = [*files.values(), *([validation] if validation is not None else [])]
    if len({f.suffix for f in files.values()}) != 1 or any(BUILDERS.get(f.suffix) != "text" for f in every):
        return None
    if any(f.stat().st_size == 0 for f in every):
        return None
    validation = validation if validation is not None else files.get("validation")
    for unread in set(every) - {files["train"], validation}:  # e.g. a folder's test.txt: checked as datasets would
        check_utf8(unread)
    return files["train"], validation


def build_from_text_files(job: CacheBuild, folder: Path, train: Path, validation: Path | None):
    """The entry from local text files (`text_file_build`): the same ids as `build_through_datasets`. None when the
    tokenizer is not of the word-level shape it encodes (the caller then builds through datasets)."""
    from tokenization.arrow_words import WordLevelPlan

    from .corpora import VALIDATION_FRACTION
    from .text_file_build import count_pieces, encode_pieces, plan_pieces
    from .tokenizer_choice import add_plm_tokens, word_level_tokenizer_from_counts

    corpus, recipe, progress = job.corpus, job.recipe, not job.show_progress
    tokenizer = load_tokenizer(recipe) if recipe.saved is not None else None
    if (tokenizer is not None and WordLevelPlan.from_tokenizer(tokenizer) is None) or (
            tokenizer is None and recipe.kind != "word"):
        return None
    started = time.perf_counter()
    pieces = plan_pieces(train, validation, held_out_fraction=VALIDATION_FRACTION,
                         source_name=f"{corpus.argument}={corpus.location!r}")
    planned = time.perf_counter()
    counted = count_pieces(pieces, folder / "scratch", num_proc=job.num_proc, count_train=tokenizer is None,
                           desc="Counting words (cache build 1/2)", disable_progress=progress)
    check_text_present(corpus, counted, held_out=validation is None)
    if tokenizer is None:
        tokenizer = word_level_tokenizer_from_counts(counted.words, counted.counts, recipe.word_vocabulary_size)
        if recipe.plm_tokens:
            add_plm_tokens(tokenizer)
    trained = time.perf_counter()
    dtype = token_dtype(tokenizer_vocab_size(tokenizer))
    splits = encode_pieces(pieces, folder / "scratch", folder, tokenizer, dtype=dtype, num_proc=job.num_proc,
                           desc="Writing token ids (cache build 2/2)", disable_progress=progress)
    tokenizer.save_pretrained(str(folder / "tokenizer"))
    phases = {"load_seconds": planned - started, "tokenizer_seconds": trained - planned,
              "tokenize_seconds": time.perf_counter() - trained}
    return _summary(splits, dtype, phases, job.num_proc, "text files")


def check_text_present(corpus: CorpusSource, counted, held_out: bool) -> None:
    """As `corpora.check_corpus` says it: the training split (with the held-out validation lines when `held_out`)
    and a separate validation file must each have words."""
    checks = [(str(corpus.location), counted.split_words["train"] + held_out * counted.split_words["validation"],
               counted.split_lines["train"] + held_out * counted.split_lines["validation"])]
    if corpus.validation_file:  # loaded as a corpus of its own, whose training split must have text
        checks.append((str(corpus.validation_file), counted.split_words["validation"],
                       counted.split_lines["validation"]))
    for corpus_name, words, rows in checks:
        if words == 0:
            raise ValueError(f"corpus {corpus_name!r} has an empty training split ({rows} rows, no text); expected "
                             f"at least one non-empty line")
