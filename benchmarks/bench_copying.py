r"""Does a pretrained causal LM use what its context already holds? The loss on the second copy of a repeated
paragraph against the first copy's.

A model that matches tokens to earlier ones (what transformer circuits work calls induction heads) predicts the
second copy almost without loss; a model that has not learned to match loses as much on it as on the first. A pair
task that needs the two texts compared (does this sentence answer this question?) asks for that matching, so this is
the check behind the pair results of docs/finetuning.md. The architecture can learn it
(`tests/test_modeling_transformer_xl.py::test_learns_to_copy_what_only_the_memory_holds`: a repeat is predicted
through the memory after 400 steps); this script measures whether pretraining taught it.

Held-out text: the first `--paragraphs` paragraphs of WikiText-2 validation with more than 60 words, each cut to its
first `--tokens` tokens by the checkpoint's own tokenizer and read twice in one row (`x x`, no memory). Reported per
checkpoint: the mean loss (nats per token) on the same tokens in each copy (the 6th to the last: the first copy's
opening tokens have too little context to compare), their difference, and the share of `<unk>` tokens.

    python benchmarks/bench_copying.py outputs/tiny outputs/tiny-unigram
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, REPO, print_table, set_threads, write_json  # noqa: E402

sys.path.insert(0, str(REPO))
WIKITEXT2_VALID = DATA / "wikitext-2" / "valid.txt"
SKIP = 5  # each copy's first SKIP tokens are left out of both means


def paragraphs(path: Path, count: int, min_words: int = 60) -> list[str]:
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    return [line for line in lines if len(line.split()) > min_words and not line.startswith("=")][:count]


@torch.no_grad()
def copy_losses(model, ids: list[int]) -> tuple[float, float]:
    """(mean loss on the first copy, on the second) of `ids ids` read as one row, over the same tokens of each:
    `ids[SKIP:]`."""
    n = len(ids)
    row = torch.tensor([ids + ids])
    logits = model(input_ids=row).logits[0, :-1].float()
    losses = torch.nn.functional.cross_entropy(logits, row[0, 1:], reduction="none")  # losses[i]: token i + 1
    return float(losses[SKIP - 1:n - 1].mean()), float(losses[n + SKIP - 1:2 * n - 1].mean())


def measure(checkpoint: str, texts: list[str], tokens: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import modeling_xl  # noqa: F401  (registers the architecture with the Auto classes)

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    first, second, unknown, total = [], [], 0, 0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:tokens]
        unknown += sum(i == tokenizer.unk_token_id for i in ids)
        total += len(ids)
        a, b = copy_losses(model, ids)
        first.append(a)
        second.append(b)
    first_mean, second_mean = sum(first) / len(first), sum(second) / len(second)
    return {"checkpoint": checkpoint, "first_copy_loss": first_mean, "second_copy_loss": second_mean,
            "gain": first_mean - second_mean, "unknown_share": unknown / total, "rows": len(texts),
            "tokens_per_copy": tokens}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="causal-LM output folders (scripts/pretrain.py)")
    parser.add_argument("--paragraphs", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=60, help="tokens per copy")
    parser.add_argument("--output", default="benchmarks/results/copying.json")
    args = parser.parse_args(argv)
    if args.tokens <= SKIP + 1:
        parser.error(f"--tokens {args.tokens}: expected more than {SKIP + 1} (the first {SKIP} of each copy are left "
                     "out of the means)")
    set_threads()
    texts = paragraphs(WIKITEXT2_VALID, args.paragraphs)
    if not texts:
        raise SystemExit(f"no paragraph of more than 60 words in {WIKITEXT2_VALID} (is ../shared/data there?)")
    results = [measure(checkpoint, texts, args.tokens) for checkpoint in args.checkpoints]
    table = print_table(["checkpoint", "first copy (nats/token)", "second copy", "gain", "<unk>"],
                        [[r["checkpoint"], f"{r['first_copy_loss']:.3f}", f"{r['second_copy_loss']:.3f}",
                          f"{r['gain']:.3f}", f"{r['unknown_share']:.1%}"] for r in results])
    write_json(args.output, {"results": results, "table": table})
    return results


if __name__ == "__main__":
    main()
