#!/usr/bin/env python
"""Deterministic text corpus of any size for the scale benchmark: Zipf-distributed words with sentence structure.

    python benchmarks/make_corpus.py --size_gb 1 --output_dir /data/zipf-1gb      # writes train.txt and valid.txt

Words are pronounceable syllable strings (`vocab_size` of them, rank r drawn with probability ∝ 1 / r^`zipf_s`, as
natural text roughly is); a sentence is 4-30 words, capitalised, ending in "." (or "," inside a longer clause); a
line (one paragraph, as WikiText) holds 1-6 sentences; every 50th line is blank. The same seed and size give the
same bytes on any machine. valid.txt is `valid_fraction` of the size, drawn after train.txt from the same stream.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]  # 70 syllables


def make_vocabulary(vocab_size: int, rng: np.random.Generator) -> list[str]:
    """`vocab_size` distinct words of 1-4 syllables, shorter words first (frequent words are short, as in real text):
    all words of n syllables in a seeded random order, then n + 1 syllables, and so on."""
    words, length = [], 1
    while len(words) < vocab_size:
        count = len(SYLLABLES) ** length
        picks = rng.permutation(count)[: vocab_size - len(words)]  # distinct syllable sequences, as base-70 numbers
        digits = (picks[:, None] // len(SYLLABLES) ** np.arange(length)) % len(SYLLABLES)
        words += ["".join(SYLLABLES[d] for d in row) for row in digits]
        length += 1
    return words


SUFFIXES = [" ", ". ", ", ", ".\n", ".\n\n"]  # after a word: inside a sentence, its end, a line's end, a blank line


class Corpus:
    """Byte tables for fast generation: every word, its capitalised form and the suffixes in one buffer, so a block
    of text is one gather (`np.repeat` of slice starts) instead of a Python string per word."""

    def __init__(self, words: list[str], zipf_s: float):
        pieces = [w.encode() for w in words] + [w.capitalize().encode() for w in words] + [x.encode() for x in SUFFIXES]
        self.lengths = np.array([len(p) for p in pieces], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])
        self.buffer = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        self.vocab_size = len(words)
        weights = 1.0 / np.arange(1, len(words) + 1) ** zipf_s
        self.cdf = np.cumsum(weights / weights.sum())

    def block(self, num_words: int, rng: np.random.Generator) -> bytes:
        """About `num_words` words as whole lines of sentences."""
        V = self.vocab_size
        ids = np.minimum(np.searchsorted(self.cdf, rng.random(num_words), side="right"), V - 1)
        ends = np.cumsum(rng.integers(4, 31, size=num_words // 4 + 1))  # sentence ends (exclusive)
        ends = ends[ends <= num_words]
        line_ends = np.unique(ends[np.minimum(np.cumsum(rng.integers(1, 7, size=len(ends))), len(ends)) - 1])
        n = int(line_ends[-1])
        ids = ids[:n]
        ids[np.concatenate([[0], ends[ends < n]])] += V  # capitalised sentence starts
        suffix = np.zeros(n, dtype=np.int64)
        suffix[ends[ends <= n] - 1] = np.where(rng.random(int((ends <= n).sum())) < 0.15, 2, 1)
        suffix[line_ends - 1] = np.where(rng.random(len(line_ends)) < 0.02, 4, 3)
        pieces = np.stack([ids, 2 * V + suffix], axis=1).reshape(-1)  # word, suffix, word, suffix, ...
        lengths = self.lengths[pieces]
        out_starts = np.cumsum(lengths) - lengths
        gather = np.repeat(self.starts[pieces] - out_starts, lengths) + np.arange(int(lengths.sum()))
        return self.buffer[gather].tobytes()


def write_corpus(path: Path, size_bytes: int, corpus: Corpus, rng, block_words: int = 2_000_000) -> int:
    """Blocks until `size_bytes`; the last one is cut after its last whole line within the size."""
    written = 0
    with open(path, "wb") as out:
        while written < size_bytes:
            block = corpus.block(block_words, rng)
            if written + len(block) > size_bytes:
                cut = block.rfind(b"\n", 0, size_bytes - written)
                block = block[: cut + 1] if cut >= 0 else block[: block.find(b"\n") + 1]
            out.write(block)
            written += len(block)
    return written


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size_gb", type=float, required=True, help="size of train.txt in GB (1e9 bytes)")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--vocab_size", type=int, default=200_000)
    parser.add_argument("--zipf_s", type=float, default=1.1)
    parser.add_argument("--valid_fraction", type=float, default=0.002)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.size_gb > 0:
        parser.error(f"--size_gb={args.size_gb}; expected a positive size")
    rng = np.random.default_rng(args.seed)
    corpus = Corpus(make_vocabulary(args.vocab_size, rng), args.zipf_s)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    size = int(args.size_gb * 1e9)
    train = write_corpus(out / "train.txt", size, corpus, rng)
    valid = write_corpus(out / "valid.txt", max(int(size * args.valid_fraction), 10_000), corpus, rng)
    print(f"wrote {out}/train.txt ({train:,} bytes) and valid.txt ({valid:,} bytes) in "
          f"{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
