"""Token-cache build straight from local text files with a word-level tokenizer: count and tokenize in parallel.

The generic build (`token_cache.write_split_tokens`) first loads the corpus into `datasets`' Arrow files, then counts
the words in one process, then tokenizes. This one reads the text files directly, in pieces of `piece_bytes` cut at
line ends, and gives the same ids bit for bit:

1. plan: each file is cut into pieces at line ends; without a validation file the last
   `max(1, int(rows * held_out_fraction))` lines of the training file are held out (the in-memory loader's rule), so
   the piece holding the boundary is cut at that line's first byte;
2. count (all workers, one piece each at a time): the piece's text (line ends as Python's text mode reads them:
   "\\r\\n" and "\\r" become "\\n") is split into words (`tokenization.byte_words`), the words are dictionary-encoded
   (Arrow: one hash pass, the piece's distinct words in first-seen order), and the piece's word indices, with a
   sentinel index after each line for its `<eos>`, go to a scratch file. The parent merges the pieces' distinct words
   and counts in piece order (`FirstSeenCounts`): the whole training split's words in first-seen order, as counting
   it in one go would give, hence the same vocabulary;
3. encode (all workers): a piece's distinct words are looked up once in the vocabulary (`index_in`), and its scratch
   indices become ids by one gather; each piece writes a part file, and the parts are appended in order.

The text is split once; the second pass reads 4 bytes per token of indices, not the text. Where the word-level fast
path of `tokenization.arrow_words` would step aside (a word that contains an added token such as `<sep>` without
being it), that piece is encoded by the Rust tokenizer instead, as `encode_lines` does.
"""

from __future__ import annotations

import codecs
import multiprocessing
import os
import re
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..runtime.host_memory import keep_freed_memory

PIECE_BYTES = 8 << 20  # measured: 8 MB pieces counted ~1.5x faster per core than 32 MB ones (fewer page faults)


@dataclass(frozen=True)
class Piece:
    """Bytes [start, end) of `file`, whole lines, belonging to `split`."""

    split: str
    file: str
    start: int
    end: int


# ---- reading -------------------------------------------------------------------------------------------------------

def read_piece(piece: Piece) -> bytes:
    """The piece's text with Python's text-mode line ends ("\\r\\n" and "\\r" read as "\\n"), checked to be UTF-8;
    a byte order mark at the start of the file is dropped (as `corpora.TEXT_OPTIONS` reads it)."""
    with open(piece.file, "rb") as handle:
        handle.seek(piece.start)
        text = handle.read(piece.end - piece.start)
    if piece.start == 0 and text.startswith(codecs.BOM_UTF8):
        text = text[len(codecs.BOM_UTF8):]
    if b"\r" in text:
        text = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    try:
        pa.LargeStringArray.from_buffers(1, pa.py_buffer(np.array([0, len(text)], np.int64)),
                                         pa.py_buffer(text)).validate(full=True)
    except pa.ArrowInvalid:
        from .corpora import check_utf8

        check_utf8(Path(piece.file))  # raises naming the file, line and byte offset
        raise
    return text


_LINE_END = re.compile(rb"\r\n|\r|\n")  # Python's text mode ends lines at each of these


def piece_bounds(file: Path, piece_bytes: int, window_bytes: int = 1 << 20) -> list[tuple[int, int]]:
    """[start, end) byte ranges covering `file`, each ending after a line end ("\n", "\r\n" or a lone "\r", so
    a file with old Mac line ends is cut too), or at the end of the file."""
    size = file.stat().st_size
    bounds, start = [], 0
    with open(file, "rb") as handle:
        while start < size:
            end = min(start + piece_bytes, size)
            handle.seek(end)
            while end < size:  # extend to the next line end
                window = handle.read(window_bytes)
                line_end = _LINE_END.search(window)
                if line_end is None:
                    end += len(window)
                    continue
                cut = end + line_end.end()
                if line_end.group() == b"\r" and line_end.end() == len(window):  # its "\n" in the next window?
                    handle.seek(cut)
                    cut += handle.read(1) == b"\n"
                end = cut
                break
            bounds.append((start, end))
            start = end
    return bounds


def count_lines(piece: Piece) -> int:
    """Lines that end inside the piece, as Python's text mode counts line ends ("\\n", "\\r\\n" or a lone "\\r")."""
    with open(piece.file, "rb") as handle:
        handle.seek(piece.start)
        raw = handle.read(piece.end - piece.start)
    return raw.count(b"\n") + raw.count(b"\r") - raw.count(b"\r\n")


def line_start(piece: Piece, line: int) -> int:
    """File offset of the first byte of the piece's `line`-th line (0 is the piece's start)."""
    if line == 0:
        return piece.start
    with open(piece.file, "rb") as handle:
        handle.seek(piece.start)
        data = np.frombuffer(handle.read(piece.end - piece.start), dtype=np.uint8)
    ends = data == 10
    lone_cr = data == 13
    lone_cr[:-1] &= data[1:] != 10  # "\r\n" ends its line at the "\n"
    return piece.start + int(np.flatnonzero(ends | lone_cr)[line - 1]) + 1


def plan_pieces(train: Path, validation: Path | None, *, held_out_fraction: float, source_name: str,
                piece_bytes: int | None = None, mapper=map) -> list[Piece]:
    """Pieces of the training file (then of the validation file, or the held-out end of the training file), of
    about `piece_bytes` (default `PIECE_BYTES`). `mapper` maps `count_lines` over pieces."""
    piece_bytes = piece_bytes or PIECE_BYTES
    pieces = [Piece("train", str(train), a, b) for a, b in piece_bounds(train, piece_bytes)]
    if validation is not None:
        return pieces + [Piece("validation", str(validation), a, b) for a, b in piece_bounds(validation, piece_bytes)]
    lines = list(mapper(count_lines, pieces))
    last = pieces[-1]
    with open(train, "rb") as handle:
        handle.seek(last.end - 1)
        unterminated = handle.read(1) not in (b"\n", b"\r")
    rows = sum(lines) + unterminated
    if rows < 2:
        raise ValueError(f"{source_name} has {rows} row(s) and no validation split; expected a --validation_file or a "
                         "corpus with at least two lines")
    boundary = rows - max(1, int(rows * held_out_fraction))  # the first held-out line
    before = 0
    for index, (piece, count) in enumerate(zip(pieces, lines)):
        if boundary < before + count or index == len(pieces) - 1:
            cut = line_start(piece, boundary - before)
            head = [replace(piece, end=cut)] if cut > piece.start else []
            tail = [replace(piece, split="validation", start=cut)] + [replace(p, split="validation")
                                                                        for p in pieces[index + 1:]]
            return pieces[:index] + head + tail
        before += count
    raise AssertionError("unreachable: the last piece holds the boundary")


# ---- the two passes (worker side) ----------------------------------------------------------------------------------

_STATE: dict = {}  # set in the parent before the pool forks: scratch folder, then the vocabulary


def _scratch(index: int, kind: str) -> Path:
    return Path(_STATE["scratch"]) / f"piece{index:06d}.{kind}"


def _count_piece(task) -> tuple:
    """Pass 1 on one piece: (index, split, distinct words, their counts, words, lines); scratch files hold the
    piece's word indices (a sentinel after each line) and its distinct words."""
    from tokenization.arrow_words import insert_after_each_line
    from tokenization.byte_words import split_text

    index, piece = task
    words, per_line = split_text(read_piece(piece))
    encoded = pc.dictionary_encode(words)  # distinct words of the piece in first-seen order
    distinct, indices = encoded.dictionary, encoded.indices.to_numpy().astype(np.int32, copy=False)
    counts = np.bincount(indices, minlength=len(distinct)).astype(np.int64)
    insert_after_each_line(indices, per_line, np.int32(len(distinct))).tofile(_scratch(index, "idx"))
    with pa.OSFile(str(_scratch(index, "words")), "wb") as sink:
        with pa.ipc.new_file(sink, pa.schema([("word", distinct.type)])) as writer:
            writer.write_table(pa.table({"word": distinct}))
    return index, piece.split, distinct, counts, int(indices.size), int(per_line.size)


def _encode_piece(task) -> tuple[int, int]:
    """Pass 2 on one piece: its ids into `<part>`; returns (index, tokens)."""
    from tokenization.arrow_words import encode_lines

    index, piece, part = task
    plan, dtype = _STATE["plan"], _STATE["dtype"]
    with pa.memory_map(str(_scratch(index, "words"))) as source:
        distinct = pa.ipc.open_file(source).read_all().column("word").combine_chunks()
    if any(pc.any(pc.and_(pc.match_substring(distinct, added), pc.not_equal(distinct, added))).as_py()
           for added in plan.added):  # the Rust tokenizer splits such a word: encode this piece as it does
        text = read_piece(piece)
        ends = np.flatnonzero(np.frombuffer(text, np.uint8) == 10) + 1
        offsets = np.unique(np.concatenate([[0], ends, [len(text)]])).astype(np.int32)
        lines = pa.StringArray.from_buffers(offsets.size - 1, pa.py_buffer(offsets), pa.py_buffer(text))
        ids, _ = encode_lines(lines, _STATE["tokenizer"], None)
    else:
        if plan.lowercase:  # lowercasing never makes or removes whitespace: per word equals per line, as Rust does it
            from tokenization.word_level import lowercase_like_tokenizers

            distinct = lowercase_like_tokenizers(distinct)
        lookup = pc.fill_null(pc.index_in(distinct, value_set=plan.symbols), plan.unk_id).to_numpy()
        indices = np.fromfile(_scratch(index, "idx"), dtype=np.int32)
        sentinel = len(distinct)
        if plan.eos_id is None:  # no <eos> template: drop the line-end sentinels
            indices = indices[indices != sentinel]
        ids = np.append(lookup.astype(np.int32), np.int32(plan.eos_id or 0))[indices]
    ids.astype(dtype, copy=False).tofile(part)
    for kind in ("idx", "words"):
        _scratch(index, kind).unlink()
    return index, int(ids.size)


# ---- the build (parent side) ---------------------------------------------------------------------------------------

def _pool_map(num_proc: int):
    if num_proc <= 1:
        return None, map
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the workers are the parallelism
    # workers keep freed memory (`host_memory`): with glibc's defaults every large array of a piece is mapped and
    # unmapped again, so every piece page-faults its memory in anew (8 MB pieces: 51 MB/s per core, 61 with this)
    pool = multiprocessing.get_context("fork").Pool(num_proc, initializer=keep_freed_memory)
    return pool, pool.imap


@dataclass
class CountResult:
    """Pass 1: the training split's words in first-seen order with their counts; words and lines per split."""

    words: list[str]
    counts: np.ndarray
    split_words: dict[str, int]
    split_lines: dict[str, int]


def count_pieces(pieces: list[Piece], scratch: Path, *, num_proc: int, count_train: bool, desc: str,
                 disable_progress: bool) -> CountResult:
    """Pass 1 over every piece; merges the training pieces' counts in order when `count_train`."""
    from tqdm.auto import tqdm

    from tokenization.word_level import FirstSeenCounts

    scratch.mkdir(parents=True, exist_ok=True)
    _STATE.clear()
    _STATE["scratch"] = str(scratch)
    merged = FirstSeenCounts()
    split_words = {"train": 0, "validation": 0}
    split_lines = {"train": 0, "validation": 0}
    started, total = time.perf_counter(), 0
    bar = tqdm(total=sum(p.end - p.start for p in pieces), desc=desc, unit="B", unit_scale=True,
               disable=disable_progress)
    pool, mapper = _pool_map(num_proc)
    try:
        for index, split, distinct, counts, words, lines in mapper(_count_piece, list(enumerate(pieces))):
            if count_train and split == "train":
                merged.add(distinct, counts)
            split_words[split] += words
            split_lines[split] += lines
            total += words + lines
            bar.update(pieces[index].end - pieces[index].start)
            bar.set_postfix_str(f"{total / max(time.perf_counter() - started, 1e-9) / 1e6:.2f}M tokens/s")
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
    words, counts = merged.result()
    return CountResult(words, counts, split_words, split_lines)


def encode_pieces(pieces: list[Piece], scratch: Path, folder: Path, tokenizer, *, dtype, num_proc: int,
                  desc: str, disable_progress: bool) -> dict[str, int]:
    """Pass 2: every piece's ids, appended in order into `folder/<split>.bin`; returns {split: tokens}."""
    from tqdm.auto import tqdm

    from tokenization.arrow_words import WordLevelPlan

    plan = WordLevelPlan.from_tokenizer(tokenizer)
    if plan is None:
        raise ValueError("the text-file build needs a word-level tokenizer (WordLevel, WhitespaceSplit, at most a "
                         "Lowercase normalizer); expected the generic build (token_cache.write_split_tokens) for it")
    _STATE.update(scratch=str(scratch), plan=plan, dtype=np.dtype(dtype), tokenizer=tokenizer)
    tasks = [(i, p, str(folder / f"{p.split}.bin.part{i:05d}")) for i, p in enumerate(pieces)]
    splits = {"train": 0, "validation": 0}
    started = time.perf_counter()
    bar = tqdm(total=len(tasks), desc=desc, unit=" pieces", disable=disable_progress)
    pool, mapper = _pool_map(num_proc)
    try:
        for index, tokens in mapper(_encode_piece, tasks):
            splits[pieces[index].split] += tokens
            bar.update(1)
            bar.set_postfix_str(f"{sum(splits.values()) / max(time.perf_counter() - started, 1e-9) / 1e6:.2f}M "
                                "tokens/s")
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
    for split in splits:
        with open(folder / f"{split}.bin", "wb") as out:
            for _, piece, part in tasks:
                if piece.split == split:
                    with open(part, "rb") as handle:
                        shutil.copyfileobj(handle, out, 16 << 20)
                    os.remove(part)
    shutil.rmtree(scratch)
    return splits
