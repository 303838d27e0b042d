"""Throughput of WikiText-2 train: tokenize + chunk, cold cache, vs a reference-style pure-Python vocabulary.

Ours (fresh cache dir each repeat): load the text file as a `datasets` split, train the word-level tokenizer
(count + build), tokenize with `tokenize_corpus` (cached Arrow map), cut into ordered streams and read every batch.
Baseline (same process): what Transformer-XL's `Vocab` does - read lines, strip/split, `Counter`, build the
most_common vocabulary, encode line by line into LongTensors (with <eos>), concatenate, `view(B, -1)` chunking.
Every figure is the best of `--repeats` (the fastest repeat of each side and part); prints a table and writes JSON
(default benchmarks/results/data.json).
Usage: python benchmarks/bench_data.py [--repeats 3] [--batch-size 60 --tgt-len 150]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, set_threads, write_json  # noqa: E402

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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=60)
    parser.add_argument("--tgt-len", type=int, default=150)
    parser.add_argument("--num-proc", type=int, default=1)
    parser.add_argument("--output", default="benchmarks/results/data.json")
    args = parser.parse_args(argv)
    set_threads()
    print(f"cores={os.cpu_count()} load_average={os.getloadavg()[0]:.2f}")
    ours(TRAIN, args.batch_size, args.tgt_len, args.num_proc)  # warm imports / page cache for both sides
    runs = []
    for repeat in range(args.repeats):
        tokens, times = ours(TRAIN, args.batch_size, args.tgt_len, args.num_proc)
        start = time.perf_counter()
        ref_tokens = reference_style(TRAIN, args.batch_size)
        ref = time.perf_counter() - start
        assert ref_tokens == tokens, (ref_tokens, tokens)
        total = sum(times.values())
        runs.append(dict(times, total=total, without_load=total - times["load"], reference=ref))
        parts = ", ".join(f"{k} {v:.3f}s" for k, v in times.items())
        print(f"repeat {repeat}: ours {runs[-1]['total']:.3f}s ({parts}); reference-style {ref:.3f}s; tokens {tokens}")
    best = {key: min(run[key] for run in runs) for key in ("total", "without_load", "reference")}
    rate = {key: tokens / value for key, value in best.items()}
    table = print_table(
        ["pipeline (WikiText-2 train, best of %d)" % args.repeats, "s", "tokens/s"],
        [["ours: load + vocabulary + tokenize + chunk, cold cache", best["total"], rate["total"]],
         ["ours without the file -> Dataset load", best["without_load"], rate["without_load"]],
         ["reference-style Python Vocab: count + build + encode + chunk", best["reference"], rate["reference"]],
         ["ours / reference-style (end to end)", f"{best['reference'] / best['total']:.2f}x",
          "target >= 1.5M tokens/s"]],
    )
    result = {"tokens": tokens, "repeats": runs, "best_s": best, "tokens_per_s": rate, "table": table,
              "batch_size": args.batch_size, "tgt_len": args.tgt_len, "num_proc": args.num_proc}
    write_json(args.output, result)
    return result


if __name__ == "__main__":
    main()
