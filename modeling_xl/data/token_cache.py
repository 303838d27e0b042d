"""Tokenized-corpus cache: each split tokenized once into a flat token file, read by every process as an `np.memmap`.

Layout of one cache entry, `<cache_dir>/<key>/` (key = fingerprint of corpus + tokenizer + settings, `cache_key`):

    meta.json        {"version", "dtype", "splits": {split: number of tokens}, "identity": what the key hashes}
    <split>.bin      the split's token ids, concatenated in corpus order, native byte order, `dtype`
    tokenizer/       the tokenizer the ids come from (`save_pretrained`)
    COMPLETE         written last: an entry without it is never used

An entry may have a second name: `<cache_dir>/<other key>.alias` holds an entry's key (`add_alias`). The pretraining
cache names an entry built with a tokenizer trained on the corpus also by that tokenizer's content, so a later run
that loads the saved tokenizer instead of training it finds the same entry (`training.cached_corpus`).

Why a flat file: `np.memmap` pages in only the windows a batch reads, and the page cache is shared by all processes
on a machine, so a corpus of any size costs each process a few MB of resident memory (ordered streams and the
permutation-LM rows read windows by index; nothing is loaded up front).

Crash safety: an entry is built in `<key>.partial/` under an exclusive lock (`<key>.lock`, `fcntl.flock`, released by
the kernel when the builder dies), every file is fsynced, `COMPLETE` is written and fsynced, then the folder is
renamed to `<key>` (atomic on POSIX) and the parent folder fsynced. A build killed at any moment leaves at most a
`.partial` folder, which the next build deletes; a second run that waits on the lock then finds the finished entry.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

CACHE_VERSION = 3  # 2: a text file's opening byte order mark is dropped (entries of 1 may hold it); 3: a task-layout
# template (XLNet's A <sep> <cls>, the Unigram tokenizer's) ends corpus lines with </s> (`arrow_words.encode_lines`)
COMPLETE = "COMPLETE"
META = "meta.json"


def cache_key(identity: dict) -> str:
    """32 hex digits of the SHA-256 of `identity` (a JSON-able dict: corpus, tokenizer, settings, format version)."""
    text = json.dumps({"cache_version": CACHE_VERSION, **identity}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (half the disk and page cache of int32), else int32."""
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


@dataclass
class TokenCache:
    """A complete cache entry: `tokens(split)` is a read-only `np.memmap` (nothing read until indexed)."""

    path: Path
    meta: dict

    @property
    def splits(self) -> dict[str, int]:
        return dict(self.meta["splits"])

    def tokens(self, split: str) -> np.ndarray:
        if split not in self.meta["splits"]:
            raise KeyError(f"token cache {self.path} has splits {sorted(self.meta['splits'])}; no {split!r}")
        if self.meta["splits"][split] == 0:
            return np.zeros(0, dtype=self.meta["dtype"])
        return np.memmap(self.path / f"{split}.bin", dtype=self.meta["dtype"], mode="r")

    def tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.path / "tokenizer"))


def open_cache(path: str | Path) -> TokenCache | None:
    """The entry at `path` if it is complete and consistent (marker present, every file the size meta.json says),
    else None (absent, half-written, or damaged: the caller rebuilds it)."""
    path = Path(path)
    if not (path / COMPLETE).is_file() or not (path / META).is_file():
        return None
    try:
        meta = json.loads((path / META).read_text())
        itemsize = np.dtype(meta["dtype"]).itemsize
        for split, count in meta["splits"].items():
            if (path / f"{split}.bin").stat().st_size != count * itemsize:
                logger.warning("token cache %s: %s.bin does not hold %d tokens; rebuilding it", path, split, count)
                return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        logger.warning("token cache %s is unreadable (%s); rebuilding it", path, error)
        return None
    return TokenCache(path, meta)


@contextmanager
def _locked(lock_path: Path):
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def get_or_build(cache_dir: str | Path, identity: dict, build) -> TokenCache:
    """The entry for `identity`, built by `build(folder)` when absent. `build` writes `<split>.bin` files and
    `tokenizer/` into `folder` and returns (splits {split: token count}, dtype, facts about the build for meta.json);
    this function writes meta.json and the marker, and publishes the folder atomically. Safe against concurrent
    runs and kills (module docstring)."""
    cache_dir = Path(cache_dir).expanduser()
    final = cache_dir / cache_key(identity)
    cache = open_cache(final) or _aliased(cache_dir, final.name)
    if cache is not None:
        return cache
    with _locked(cache_dir / f"{final.name}.lock"):
        cache = open_cache(final)  # built by another run while this one waited for the lock
        if cache is not None:
            return cache
        partial = cache_dir / f"{final.name}.partial"
        for stale in (partial, final):  # a killed build's leftovers, or a damaged entry
            if stale.exists():
                logger.info("token cache: removing the incomplete %s", stale)
                shutil.rmtree(stale)
        partial.mkdir(parents=True)
        splits, dtype, facts = build(partial)
        meta = {"version": CACHE_VERSION, "dtype": np.dtype(dtype).name, "splits": splits, "identity": identity,
                "build": facts}
        (partial / META).write_text(json.dumps(meta, indent=2, default=str))
        for file in sorted(partial.rglob("*")):
            if file.is_file():
                _fsync(file)
        (partial / COMPLETE).write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")
        _fsync(partial / COMPLETE)
        _fsync(partial)
        os.replace(partial, final)
        _fsync(cache_dir)
    cache = open_cache(final)
    if cache is None:
        raise OSError(f"token cache {final} was written but does not read back complete; expected a writable "
                      "local folder for --token_cache_dir")
    return cache


def add_alias(cache_dir: str | Path, identity: dict, entry: Path) -> None:
    """Name `entry` (a complete entry in `cache_dir`) also by `identity`: `<key>.alias` holding the entry's key,
    written to a temporary name and renamed (a reader sees no alias or a whole one). An existing entry or alias of
    that key is left as it is."""
    cache_dir = Path(cache_dir)
    key = cache_key(identity)
    if key == entry.name or (cache_dir / key).exists() or (cache_dir / f"{key}.alias").exists():
        return
    temporary = cache_dir / f"{key}.alias.{os.getpid()}"
    temporary.write_text(entry.name + "\n")
    os.replace(temporary, cache_dir / f"{key}.alias")


def _aliased(cache_dir: Path, key: str) -> TokenCache | None:
    """The complete entry `<key>.alias` names, if any."""
    alias = cache_dir / f"{key}.alias"
    if not alias.is_file():
        return None
    target = alias.read_text().strip()
    cache = open_cache(cache_dir / target) if target and "/" not in target else None
    if cache is not None:
        logger.info("token cache: %s is the entry %s (the same corpus and tokenizer content)", key, target)
    return cache


# ---- building: tokenize a split in parallel, append its ids to one flat file ------------------------------------

_WORKER = {}


def _init_worker(data, tokenizer, text_column, plan, dtype):
    _WORKER.update(data=data.with_format("arrow"), tokenizer=tokenizer, text_column=text_column, plan=plan,
                   dtype=dtype)


def _encode_rows(task):
    """Rows [lo, hi) of the split -> their ids written to `path` (one part file per task); returns (rows, tokens)."""
    from tokenization.arrow_words import encode_lines

    lo, hi, batch_size, path = task
    data, dtype = _WORKER["data"], _WORKER["dtype"]
    tokens = 0
    with open(path, "wb") as out:
        for start in range(lo, hi, batch_size):
            table = data[start : min(start + batch_size, hi)]
            ids, _ = encode_lines(table.column(_WORKER["text_column"]), _WORKER["tokenizer"], _WORKER["plan"])
            out.write(ids.astype(dtype, copy=False).tobytes())
            tokens += ids.size
    return hi - lo, tokens


def write_split_tokens(data, tokenizer, path: Path, *, text_column: str = "text", dtype=np.int32,
                       num_proc: int = 1, batch_size: int = 2000, desc: str = "Tokenizing",
                       disable_progress: bool = False) -> int:
    """Tokenize the rows of `data` (a `datasets.Dataset`, memory-mapped Arrow) into the flat file `path`, in row
    order, with `num_proc` processes; a progress bar shows rows, tokens/s and the ETA. Returns the token count.

    The rows are cut into contiguous tasks (about 16 per process, so the bar moves and the processes stay busy);
    each task writes its own part file, and the parts are appended in order."""
    from tqdm.auto import tqdm

    from tokenization.arrow_words import WordLevelPlan

    rows = data.num_rows
    per_task = max(batch_size, -(-rows // (max(num_proc, 1) * 16)))
    tasks = [(lo, min(lo + per_task, rows), batch_size, str(path) + f".part{k:05d}")
             for k, lo in enumerate(range(0, rows, per_task))]
    plan = WordLevelPlan.from_tokenizer(tokenizer)
    init = (data, tokenizer, text_column, plan, np.dtype(dtype))
    total, started = 0, time.perf_counter()
    bar = tqdm(total=rows, desc=desc, unit=" rows", disable=disable_progress)
    if num_proc > 1 and len(tasks) > 1:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the workers are the parallelism
        pool = multiprocessing.get_context("fork").Pool(num_proc, initializer=_init_worker, initargs=init)
        results = pool.imap(_encode_rows, tasks)
    else:
        pool = None
        _init_worker(*init)
        results = map(_encode_rows, tasks)
    try:
        for done_rows, tokens in results:
            total += tokens
            bar.update(done_rows)
            bar.set_postfix_str(f"{total / max(time.perf_counter() - started, 1e-9) / 1e6:.2f}M tokens/s")
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
    with open(path, "wb") as out:
        for task in tasks:
            with open(task[3], "rb") as part:
                shutil.copyfileobj(part, out, 16 << 20)
            os.remove(task[3])
    return total
