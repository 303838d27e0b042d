#!/usr/bin/env python
"""Evaluate a Transformer-XL causal-LM checkpoint on a corpus split with long memory.

    python scripts/evaluate_lm.py outputs/tiny --dataset_name ../shared/data/wikitext-2 --split validation \
        --tgt_len 64 --mem_len 640 --mem_lens 0 64 160 320 640 --vanilla --context_len 640

Perplexity (word level) or bits per character (`--char_level`); a sweep over memory lengths (table + PNG plot);
`--vanilla` compares the paper's sliding-window baseline with state reuse on the same targets. Results go to
`lm_evaluation.json` and into a section of the checkpoint's README.md (model card). Library: `modeling_xl.evaluation.long_context`.
"""

import argparse
import json
import logging
import sys
from pathlib import Path

import torch

RESULTS_FILE, PLOT_FILE, CARD_SECTION = "lm_evaluation.json", "memory_sweep.png", "lm-evaluation"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_name_or_path", help="checkpoint folder (save_pretrained of a causal LM)")
    p.add_argument("--tokenizer_name", help="tokenizer folder (default: the checkpoint's)")
    p.add_argument("--dataset_name", default="builtin", help="Hub name, local file/folder, or 'builtin'")
    p.add_argument("--dataset_config_name")
    p.add_argument("--split", default="validation")
    p.add_argument("--text_column", default="text")
    p.add_argument("--max_eval_tokens", type=int, help="evaluate only the first N tokens of the split")
    p.add_argument("--tgt_len", type=int, default=64, help="evaluation segment length")
    p.add_argument("--mem_len", type=int, help="memory length (default: the checkpoint's mem_len)")
    p.add_argument("--clamp_len", type=int, default=-1)
    p.add_argument("--same_length", action="store_true")
    p.add_argument("--batch_size", type=int, default=1, help="number of contiguous streams")
    p.add_argument("--char_level", action="store_true", help="report bits per character (one char/byte per token)")
    p.add_argument("--mem_lens", type=int, nargs="+", help="memory lengths to sweep (table + plot)")
    p.add_argument("--vanilla", action="store_true", help="compare the sliding-window baseline with state reuse")
    p.add_argument("--context_len", type=int, default=640, help="vanilla window = state-reuse memory length")
    p.add_argument("--vanilla_targets", type=int, default=512, help="targets scored by both modes")
    p.add_argument("--vanilla_batch_size", type=int, default=16, help="windows per vanilla forward pass")
    p.add_argument("--output_dir", help="where results and the card section go (default: the checkpoint folder)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads")
    return p


def check_args(args) -> None:
    """Every numeric argument, before the model is loaded: a bad value must not cost a full evaluation first."""
    from modeling_xl.runtime.validators import check_int

    for name in ("tgt_len", "batch_size", "context_len", "vanilla_targets", "vanilla_batch_size"):
        check_int(name, getattr(args, name))
    check_int("max_eval_tokens", args.max_eval_tokens, minimum=2, allow_none=True)
    check_int("mem_len", args.mem_len, minimum=0, allow_none=True)
    check_int("threads", args.threads, allow_none=True)
    for mem_len in args.mem_lens or []:
        check_int("mem_lens", mem_len, minimum=0)
    if args.clamp_len < -1:
        raise ValueError(f"clamp_len={args.clamp_len} is invalid; expected -1 (no clamping) or a distance >= 0")
    if args.output_dir is not None and Path(args.output_dir).exists() and not Path(args.output_dir).is_dir():
        raise ValueError(f"output_dir={args.output_dir!r} is a file; expected a folder (new or existing) for "
                         f"{RESULTS_FILE} and the model card section")


def load(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import modeling_xl  # noqa: F401  (registers the Auto classes)

    folder = Path(args.model_name_or_path)
    if not (folder / "config.json").exists():
        raise ValueError(f"model_name_or_path={args.model_name_or_path!r} has no config.json; expected a checkpoint "
                         "folder written by save_pretrained")
    from tokenization import check_vocab_matches

    check_tokenizer_source(folder, args.tokenizer_name)
    try:
        config = json.loads((folder / "config.json").read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"model_name_or_path={args.model_name_or_path!r}: config.json is not valid JSON ({error}); "
                         "expected the file save_pretrained writes") from None
    if config.get("attn_type") == "bi":
        raise ValueError(f"model_name_or_path={args.model_name_or_path!r} is a permutation LM (bidirectional, "
                         "attn_type 'bi': pretrained with --objective plm, or converted from XLNet); expected a causal "
                         "LM (attn_type 'uni'): "
                         "this script scores left-to-right perplexity, which a permutation LM does not define (its "
                         "pretraining run reports its own validation loss in eval_results.json)")
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name or folder)
    # before any evaluation: an id past the softmax would fail only where the data happens to hold one
    check_vocab_matches(tokenizer, model.config, allow_larger_model=True,
                        context=f"tokenizer_name={args.tokenizer_name or str(folder)!r} does not fit the model")
    return model, tokenizer


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "tokenizer.model", "vocab.json")


def check_tokenizer_source(folder: Path, tokenizer_name: str | None) -> None:
    """Before any loading: a folder without a tokenizer (and no --tokenizer_name) is named, and a legacy
    transformers-4.x Transformer-XL folder is pointed to the converter, instead of transformers' advice to install
    sentencepiece or tiktoken."""
    if tokenizer_name is not None or any((folder / name).exists() for name in TOKENIZER_FILES):
        return
    try:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    if model_type == "transfo-xl":
        raise ValueError(f"model_name_or_path={str(folder)!r} is a legacy transformers-4.x Transformer-XL folder "
                         "without a tokenizer this version reads; expected a converted folder: run "
                         f"`python scripts/convert_transfo_xl.py {folder} {folder}-converted` (it converts vocab.pkl "
                         "too), then evaluate that folder")
    raise ValueError(f"model_name_or_path={str(folder)!r} has no tokenizer ({', '.join(TOKENIZER_FILES[:2])}); "
                     "expected a folder saved with its tokenizer, or --tokenizer_name")


def run(args) -> dict:
    from modeling_xl.evaluation.long_context import (
        check_vanilla_span,
        load_eval_tokens,
        memory_sweep,
        plot_sweep,
        results_markdown,
        reuse_vs_vanilla,
        sweep_table,
    )
    from modeling_xl.runtime.run_folder import replace_text, update_card_section

    check_args(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model, tokenizer = load(args)
    tokens = load_eval_tokens(tokenizer, args.dataset_name, args.dataset_config_name, args.split, args.text_column,
                              args.max_eval_tokens)
    if args.vanilla:
        check_vanilla_span(args.context_len, args.vanilla_targets, tokens.numel(), targets_name="vanilla_targets")
    out_dir = Path(args.output_dir or args.model_name_or_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    metric = "bpc" if args.char_level else "perplexity"
    settings = dict(tgt_len=args.tgt_len, clamp_len=args.clamp_len, same_length=args.same_length,
                    batch_size=args.batch_size, char_level=args.char_level)
    mem_len = model.config.mem_len if args.mem_len is None else args.mem_len
    results = {"model": str(args.model_name_or_path), "dataset": args.dataset_name, "split": args.split,
               "evaluation": memory_sweep(model, tokens, [mem_len], **settings)[0]}
    main_result = results["evaluation"]
    print(f"{metric}: {main_result[metric]:.4f} over {main_result['tokens']} tokens (tgt_len {args.tgt_len}, "
          f"mem_len {mem_len}, clamp_len {args.clamp_len}, same_length {main_result['same_length']})")
    if args.mem_lens:
        results["sweep"] = memory_sweep(model, tokens, args.mem_lens, **settings)
        results["sweep_plot"] = PLOT_FILE
        plot_sweep(results["sweep"], out_dir / PLOT_FILE, metric)
        print(sweep_table(results["sweep"], metric))
    if args.vanilla:
        results["vanilla"] = reuse_vs_vanilla(model, tokens, context_len=args.context_len,
                                              num_targets=args.vanilla_targets, tgt_len=args.tgt_len,
                                              clamp_len=args.clamp_len, vanilla_batch_size=args.vanilla_batch_size)
        v = results["vanilla"]
        print(f"vanilla: ppl {v['vanilla_perplexity']:.3f} in {v['vanilla_seconds']:.2f}s; state reuse: ppl "
              f"{v['reuse_perplexity']:.3f} in {v['reuse_seconds']:.2f}s; speed-up {v['speedup']:.1f}x")
    replace_text(out_dir / RESULTS_FILE, json.dumps(results, indent=2) + "\n")
    update_card_section(out_dir / "README.md", CARD_SECTION, results_markdown(results, metric))
    return results


def main(argv=None) -> int:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
