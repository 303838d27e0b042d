"""Train a tokenizer on a corpus and save it as a folder that `AutoTokenizer.from_pretrained(dir)` loads.

Examples:
  python scripts/train_tokenizer.py --corpus ../shared/data/wikitext-2 --kind word --output out/wt2-tokenizer
  python scripts/train_tokenizer.py --corpus builtin --kind unigram --vocab-size 8000 --output out/unigram
  python scripts/train_tokenizer.py --corpus wikitext --config wikitext-103-raw-v1 --kind word --min-freq 3 ...
  python scripts/train_tokenizer.py --vocab-file legacy/vocab.pkl --output out/imported   (no training)

A folder that already holds a tokenizer is refused unless --overwrite is given (a model's folder keeps its model
either way). The tokenizer is written into a temporary folder beside --output and moved in once complete: a failure
leaves --output as it was.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from modeling_xl.data.corpora import load_corpus, ordered_splits
from modeling_xl.runtime.run_folder import staged_folder
from tokenization import (
    byte_level_tokenizer,
    tokenizer_from_vocab,
    train_char_level_tokenizer,
    train_unigram_tokenizer,
    train_word_level_tokenizer,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="builtin", help="Hub name, local file/folder, or 'builtin'")
    parser.add_argument("--config", default=None, help="Hub dataset config, e.g. wikitext-103-raw-v1")
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--kind", choices=("word", "char", "byte", "unigram"), default="word")
    parser.add_argument("--vocab-file", default=None, help="import a vocab.txt list or legacy vocab.pkl instead")
    parser.add_argument("--min-freq", type=int, default=0)
    parser.add_argument("--max-size", type=int, default=None, help="word level: most frequent words kept")
    parser.add_argument("--vocab-size", type=int, default=8000, help="unigram vocabulary size")
    parser.add_argument("--lowercase", action="store_true",
                        help="lowercase the corpus and every input (word and unigram); without it a word-level "
                             "tokenizer trained on a corpus with no uppercase letter still lowercases its input")
    parser.add_argument("--all-splits", action="store_true", help="count every split (Transformer-XL on WikiText)")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--output", required=True)
    parser.add_argument("--overwrite", action="store_true", help="replace a tokenizer already in --output")
    args = parser.parse_args(argv)
    if args.min_freq < 0:
        parser.error(f"--min-freq={args.min_freq} is invalid; expected an integer >= 0")
    for name in ("max_size", "vocab_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} is invalid; expected a positive integer")
    # options the chosen kind does not read: refused rather than silently ignored
    ignored = {"word": ("vocab_size",), "char": ("max_size", "vocab_size", "lowercase"),
               "byte": ("max_size", "vocab_size", "lowercase", "min_freq", "all_splits"),
               "unigram": ("max_size", "min_freq")}[args.kind]
    defaults = parser.parse_args(["--output", "x"])
    given = [name for name in ignored if getattr(args, name) != getattr(defaults, name)]
    if given and not args.vocab_file:
        parser.error(f"--kind {args.kind} does not use {', '.join('--' + n.replace('_', '-') for n in given)}; "
                     "expected only the options of that kind")
    return args


def build_tokenizer(args: argparse.Namespace):
    if args.vocab_file:
        return tokenizer_from_vocab(args.vocab_file, lowercase=args.lowercase or None)
    if args.kind == "byte":
        return byte_level_tokenizer()
    corpus = load_corpus(args.corpus, args.config, text_column=args.text_column, cache_dir=args.cache_dir)
    splits = ordered_splits(corpus) if args.all_splits else ["train"]  # train, valid, test: the reference's order
    lines = [line for split in splits for line in corpus[split][args.text_column] if line is not None]
    if args.kind == "word":
        return train_word_level_tokenizer(lines, min_freq=args.min_freq, max_size=args.max_size,
                                          lowercase=args.lowercase or None)
    if args.kind == "char":
        return train_char_level_tokenizer(lines, min_freq=max(args.min_freq, 1))
    return train_unigram_tokenizer(lines, vocab_size=args.vocab_size, lowercase=args.lowercase)


# what this script writes into --output (save_pretrained of a fast tokenizer, and the arguments), and what else of
# an earlier tokenizer there would be read with it (AutoTokenizer appends the tokens of added_tokens.json)
WRITES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
          "train_tokenizer_args.json")
TOKENIZER_FILES = (*WRITES, "added_tokens.json")


def check_output(output: Path, overwrite: bool) -> None:
    """Before any training: --output is a folder (new or existing) holding no tokenizer, unless --overwrite."""
    if output.exists() and not output.is_dir():
        raise ValueError(f"--output={str(output)!r} is a file; expected a folder (new or existing) for the tokenizer")
    present = [name for name in TOKENIZER_FILES if (output / name).exists()]
    if present and not overwrite:
        raise ValueError(f"--output={str(output)!r} already holds {', '.join(present)}; expected a folder without a "
                         "tokenizer, or --overwrite to replace it")


def save(tokenizer, args: argparse.Namespace, output: Path) -> None:
    """The tokenizer and the arguments, written whole into a folder beside `output`, then moved in (the files of an
    earlier tokenizer that this one does not write go, so none stays beside it; other files stay)."""
    with staged_folder(output, stale=TOKENIZER_FILES, label="train_tokenizer") as staging:
        tokenizer.save_pretrained(staging)
        (staging / "train_tokenizer_args.json").write_text(json.dumps(vars(args), indent=2) + "\n", encoding="utf-8")


def main(argv=None) -> None:
    args = parse_args(argv)
    output = Path(args.output)
    try:
        check_output(output, args.overwrite)
        tokenizer = build_tokenizer(args)
    except (ValueError, OSError) as error:  # a missing corpus, an empty one, a bad vocabulary file: one line
        sys.exit(f"error: {error}")
    try:
        save(tokenizer, args, output)
    except OSError as error:  # a full disk, a folder that cannot be written
        sys.exit(f"error: the tokenizer could not be saved in --output={args.output!r} ({error})")
    print(f"saved {args.kind if not args.vocab_file else 'imported'} tokenizer with {len(tokenizer)} tokens "
          f"to {output}")


if __name__ == "__main__":
    main()
