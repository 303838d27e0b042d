#!/usr/bin/env python
"""lm-evaluation-harness on documents longer than its window: lm_eval's `hf` model against `transformer-xl` (segments
with memory, `modeling_xl.harness`) on the same folder and the same text, for word perplexity, time and peak memory.

Two local tasks are written from WikiText-2's test split (no download): `long`, its whole articles with more tokens
than the `hf` model's window (2048: each window a fresh forward, without the text before it), and `short`, its first
paragraphs of at least `--short_words` words (one window each, where the two must agree). Each (model, task) runs
`scripts/evaluate_harness.py` in a fresh process, one after the other: wall time of the whole command and of lm_eval's
evaluation (`total_evaluation_time_seconds`), the process's peak resident memory (`ru_maxrss` of the child, the
interpreter and libraries included).

    python benchmarks/bench_harness.py --model outputs/tiny-wt2        # a --preset tiny run on WikiText-2
    python benchmarks/bench_harness.py --model outputs/tiny-wt2 --ours mem_len=640   # adds a longer memory

Needs `pip install "modeling-xl[harness]"` and ../shared/data/wikitext-2 (or `--data`). Writes
`benchmarks/results/harness.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import DATA, REPO, machine_description, print_table, write_json

TITLE = re.compile(r"^ = [^=].* = $")  # an article's title line (sections have two or more '=')
TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
"""


def articles(path: Path) -> list[str]:
    """The articles of a WikiText file, each its non-empty lines joined by newlines (title included)."""
    found, current = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if TITLE.match(line) and current:
            found.append("\n".join(current))
            current = []
        if line.strip():
            current.append(line)
    if current:
        found.append("\n".join(current))
    return found


def write_tasks(folder: Path, model: str, data: Path, short_words: int, num_short: int, window: int) -> dict:
    """`long.jsonl` (articles of more than `window` tokens) and `short.jsonl` (paragraphs), with their task YAMLs."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=False)  # needs no code (docs/ecosystem.md)
    test = articles(data / "test.txt")
    long = [a for a in test if len(tokenizer.encode(a)) > window]
    paragraphs = [line for a in test for line in a.split("\n") if not line.startswith(" =")
                  and len(line.split()) >= short_words][:num_short]
    stats = {}
    for name, docs in (("long", long), ("short", paragraphs)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
        (folder / f"{name}.yaml").write_text(TASK.format(name=f"wt2_{name}", data=folder / f"{name}.jsonl"))
        tokens = [len(tokenizer.encode(d)) for d in docs]
        stats[name] = {"documents": len(docs), "words": sum(len(d.split()) for d in docs), "tokens": sum(tokens),
                       "min_tokens": min(tokens), "max_tokens": max(tokens)}
    return stats


def run(model_name: str, model_args: str, task: str, folder: Path, out: Path, threads: int) -> dict:
    """One `scripts/evaluate_harness.py` run in a fresh process: its figures, wall time and peak RSS."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, str(REPO / "scripts" / "evaluate_harness.py"), "--model", model_name, "--model_args",
               model_args, "--tasks", task, "--include_path", str(folder), "--device", "cpu", "--batch_size", "1",
               "--output_path", str(out)]
    log = out.with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "w") as stream:
        proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=stream, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS (KiB)
        proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{log.read_text()[-3000:]}")
    result = json.loads(max(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime).read_text())
    figures = result["results"][task]
    return {"model": model_name, "model_args": model_args, "task": task, "seconds": seconds,
            "evaluation_seconds": float(result.get("total_evaluation_time_seconds", "nan")),
            "peak_rss_mib": usage.ru_maxrss / 1024,
            "word_perplexity": figures["word_perplexity,none"], "byte_perplexity": figures["byte_perplexity,none"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a causal-LM folder (scripts/pretrain.py on WikiText-2)")
    parser.add_argument("--data", default=str(DATA / "wikitext-2"), help="folder holding WikiText-2's test.txt")
    parser.add_argument("--ours", nargs="*", default=[""], help="extra model args of transformer-xl runs, one run "
                        "each ('' = the folder's evaluation settings; e.g. mem_len=640)")
    parser.add_argument("--short_words", type=int, default=150, help="a short document's least words")
    parser.add_argument("--num_short", type=int, default=40, help="short documents")
    parser.add_argument("--window", type=int, default=2048, help="the hf model's window (its max_length)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tasks_dir", help="where the task YAMLs and documents go (default: a temporary folder)")
    parser.add_argument("--write_only", action="store_true", help="write the tasks, run nothing (then run "
                        "scripts/evaluate_harness.py --include_path TASKS_DIR --tasks wt2_long yourself)")
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "harness.json"))
    args = parser.parse_args(argv)
    work = Path(args.tasks_dir) if args.tasks_dir else Path(tempfile.mkdtemp(prefix="bench_harness_"))
    work.mkdir(parents=True, exist_ok=True)
    stats = write_tasks(work.resolve(), args.model, Path(args.data), args.short_words, args.num_short, args.window)
    print(json.dumps(stats))
    if args.write_only:
        return 0
    rows, results = [], []
    for task in ("wt2_long", "wt2_short"):
        runs = [("hf", f"pretrained={args.model},trust_remote_code=True")] + [
            ("transformer-xl", ",".join(a for a in (f"pretrained={args.model}", extra) if a)) for extra in args.ours]
        for model_name, model_args in runs:
            result = run(model_name, model_args, task, work, work / "out" / str(len(results)), args.threads)
            results.append(result)
            rows.append([task, model_name, model_args.split(",", 1)[1] if "," in model_args else "-",
                         f"{result['word_perplexity']:.2f}", f"{result['evaluation_seconds']:.0f}",
                         f"{result['seconds']:.0f}",
                         f"{result['peak_rss_mib']:.0f}"])
    print_table(["task", "model", "args", "word perplexity", "evaluation s", "wall s", "peak RSS MiB"], rows)
    write_json(args.output, {"machine": machine_description(), "load_before": os.getloadavg(), "documents": stats,
                             "threads": args.threads, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
