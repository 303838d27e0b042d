"""Throughput of WikiText-2 train: tokenize + chunk, cold cache, vs a reference-style pure-Python vocabulary.

Ours (fresh cache dir each repeat): load the text file as a `datasets` split, train the word-level tokenizer
(count + build), tokenize with `tokenize_corpus` (cached Arrow map), cut into ordered streams and read every batch.
Baseline (same process): what Transformer-XL's `Vocab` does - read lines, strip/split, `Counter`, build the
most_common vocabulary, encode line by line into LongTensors (with <eos>), concatenate, `view(B, -1)` chunking.
Usage: python benchmarks/bench_data.py [--repeats 3] [--batch-size 60 --tgt-len 150]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from modeling_xl.data.corpora import load_corpus
from modeling_xl.data.streams import OrderedStreams
from modeling_xl.data.tokenize import tokenize_split
from tokenization import train_word_level_tokenizer

TRAIN = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wikitext-2" / "train.txt"


def reference_style(path: Path, batch_size: int) -> int:
    """Count, build, encode line by line (as the reference's Python Vocab), then chunk as `data.view(B, -1)`."""
    counter = Counter()
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            counter.update(line.strip().split() + ["<eos>"])
    idx2sym = ["<eos>"] + [w for w, _ in counter.most_common() if w != "<eos>"]
    sym2idx = {s: i for i, s in enumerate(idx2sym)}
    unk = sym2idx.get("<unk>", 0)
    encoded = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            symbols = line.strip().split() + ["<eos>"]
            encoded.append(torch.LongTensor([sym2idx.get(s, unk) for s in symbols]))
    data = torch.cat(encoded)
    rows = data.size(0) // batch_size
    return data[: rows * batch_size].view(batch_size, rows).numel() and data.numel()


def ours(path: Path, batch_size: int, tgt_len: int, num_proc: int) -> tuple[int, dict]:
    cache = tempfile.mkdtemp(prefix="bench-data-")
    try:
        times = {}
        start = time.perf_counter()
        split = load_corpus(path, cache_dir=cache)["train"]
        times["load"] = time.perf_counter() - start
        tokenizer = train_word_level_tokenizer(split.data.column("text"))
        times["vocab"] = time.perf_counter() - start - times["load"]
        ids = tokenize_split(split, tokenizer, num_proc=num_proc, split="train")
        times["encode"] = time.perf_counter() - start - times["load"] - times["vocab"]
        streams = OrderedStreams(ids, batch_size=batch_size, tgt_len=tgt_len)
        for _ in streams:
            pass
        times["chunk"] = time.perf_counter() - start - sum(times.values())
        return int(ids.size), times
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=60)
    parser.add_argument("--tgt-len", type=int, default=150)
    parser.add_argument("--num-proc", type=int, default=1)
    args = parser.parse_args()
    print(f"cores={os.cpu_count()} load_average={os.getloadavg()[0]:.2f}")
    ours(TRAIN, args.batch_size, args.tgt_len, args.num_proc)  # warm imports / page cache for both sides
    best_ours, best_ref = None, None
    for repeat in range(args.repeats):
        tokens, times = ours(TRAIN, args.batch_size, args.tgt_len, args.num_proc)
        total = sum(times.values())
        start = time.perf_counter()
        ref_tokens = reference_style(TRAIN, args.batch_size)
        ref = time.perf_counter() - start
        assert ref_tokens == tokens, (ref_tokens, tokens)
        print(f"repeat {repeat}: ours {total:.3f}s ({', '.join(f'{k} {v:.3f}s' for k, v in times.items())}); "
              f"reference-style {ref:.3f}s; tokens {tokens}")
        best_ours = total if best_ours is None else min(best_ours, total)
        best_ref = ref if best_ref is None else min(best_ref, ref)
        tokenize_chunk = times["vocab"] + times["encode"] + times["chunk"]
    print(f"ours (load+vocab+tokenize+chunk, cold cache): {tokens / best_ours / 1e6:.2f}M tokens/s "
          f"(best of {args.repeats}: {best_ours:.3f}s)")
    print(f"ours last repeat without the file->Dataset load: {tokens / tokenize_chunk / 1e6:.2f}M tokens/s")
    print(f"reference-style Python vocab (count+build+encode+chunk): {tokens / best_ref / 1e6:.2f}M tokens/s "
          f"(best {best_ref:.3f}s)")
    print(f"ratio ours / reference-style: {best_ref / best_ours:.2f}x")


if __name__ == "__main__":
    main()
