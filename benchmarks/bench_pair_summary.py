r"""A pair label that only comparing the two texts gives, learned or not, by summary and depth.

The task: does B repeat A? A is 8 words drawn from 32 (`w0` ... `w31`); B repeats it or is another draw, a seeded coin,
half each; 2,000 training and 200 dev pairs. Neither text alone says the label: the model has to match B to A token by
token across `A <eos> B <eos>`. A causal model from scratch (d_model 64, 4 heads, `--layers` deep), fine-tuned by
`scripts/finetune_classification.py` (batch 32, learning rate 1e-3, `--epochs`), with the classifier reading the last
position (the default summary) or the mean of the real tokens (`--summary_type mean`). Chance is 0.5.

`tests/test_finetuning.py::test_a_pair_label_that_only_comparing_the_texts_gives_is_learned` runs one cell (its
`PAIR_MATCH`: 4 layers, mean summary, 6 epochs, seed 0) through `run_match`; this script runs the seeds and the other
cells.

    python benchmarks/bench_pair_summary.py                          # 2 and 4 layers x last / mean x 5 seeds, ~6 min
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORDS, LENGTH = 32, 8


def match_rows(n: int, seed: int) -> list[tuple[str, str, str]]:
    """(A, B, `same` / `different`) rows of the task above."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        first = [f"w{rng.randrange(WORDS)}" for _ in range(LENGTH)]
        same = rng.random() < 0.5
        second = first if same else [f"w{rng.randrange(WORDS)}" for _ in range(LENGTH)]
        rows.append((" ".join(first), " ".join(second), "same" if same else "different"))
    return rows


def _write_tsv(path: Path, rows) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        f.write("first\tsecond\tlabel\n")
        f.writelines(f"{a}\t{b}\t{label}\n" for a, b, label in rows)
    return path


def run_match(folder: Path, summary: str = "last", layers: int = 4, seed: int = 0, epochs: int = 10,
              learning_rate: float = 1e-3) -> dict:
    """Build the task and a fresh model under `folder`, fine-tune, return the script's results (dev accuracy and
    loss under `dev`)."""
    import torch

    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM
    from tokenization import train_word_level_tokenizer

    rows = match_rows(2200, seed)
    tokenizer = train_word_level_tokenizer([" ".join(f"w{i}" for i in range(WORDS))])
    config = TransformerXLConfig.from_preset("debug", vocab_size=len(tokenizer), cutoffs=[], adaptive=False,
                                             d_model=64, d_embed=64, n_head=4, d_head=16, d_inner=128, n_layer=layers)
    torch.manual_seed(seed)
    TransformerXLForCausalLM(config).save_pretrained(folder / "lm")
    tokenizer.save_pretrained(folder / "lm")
    train = _write_tsv(folder / "train.tsv", rows[:2000])
    dev = _write_tsv(folder / "dev.tsv", rows[2000:])
    spec = importlib.util.spec_from_file_location("finetune_classification",
                                                  REPO / "scripts" / "finetune_classification.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    output = folder / f"out-{summary}-{layers}-{seed}"
    code = script.main(["--model_name_or_path", str(folder / "lm"), "--output_dir", str(output),
                        "--train_file", str(train), "--validation_file", str(dev), "--text_column", "first",
                        "--text_pair_column", "second", "--num_train_epochs", str(epochs),
                        "--learning_rate", str(learning_rate),
                        "--per_device_train_batch_size", "32", "--summary_type", summary, "--seed", str(seed),
                        "--disable_tqdm"])
    if code != 0:
        raise RuntimeError(f"finetune_classification.py exited with {code} ({summary}, {layers} layers, seed {seed})")
    return json.loads((output / "classification_results.json").read_text())


def main(argv=None) -> list[dict]:
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import print_table, set_threads, write_json

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--epochs", type=int, nargs="+", default=[6, 10], help="one per --layers entry")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--output", default="benchmarks/results/pair_summary.json")
    args = parser.parse_args(argv)
    if len(args.layers) != len(args.epochs):
        parser.error(f"--layers {args.layers} and --epochs {args.epochs}: expected one epoch count per depth")
    set_threads(1)
    results = []
    for layers, epochs in zip(args.layers, args.epochs):
        for summary in ("last", "mean"):
            for seed in range(args.seeds):
                with tempfile.TemporaryDirectory() as tmp:
                    dev = run_match(Path(tmp), summary, layers, seed, epochs)["dev"]
                results.append({"layers": layers, "epochs": epochs, "summary": summary, "seed": seed,
                                "accuracy": dev["accuracy"], "eval_loss": dev["eval_loss"]})
                print(json.dumps(results[-1]), flush=True)
    cells = {}
    for r in results:
        cells.setdefault((r["layers"], r["epochs"], r["summary"]), []).append(r["accuracy"])
    table = print_table(["layers", "epochs", "summary", "dev accuracy by seed", "lowest"],
                        [[layers, epochs, summary, " ".join(f"{a:.3f}" for a in accs), f"{min(accs):.3f}"]
                         for (layers, epochs, summary), accs in cells.items()])
    write_json(args.output, {"results": results, "table": table})
    return results


if __name__ == "__main__":
    main()
