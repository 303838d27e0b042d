#!/usr/bin/env python
"""Convert a transformers-4.x Transformer-XL checkpoint (model_type "transfo-xl") into this package's format.

    python scripts/convert_transfo_xl.py LEGACY_DIR OUT_DIR [--dtype float32|bfloat16|float16] [--overwrite]

LEGACY_DIR holds config.json and model.safetensors or pytorch_model.bin (read with weights_only=True: nothing is
unpickled). OUT_DIR receives safetensors weights, config.json and the model code, loadable with
`AutoModelForCausalLM.from_pretrained(OUT_DIR, trust_remote_code=True)`; it must be another folder than LEGACY_DIR
(converting in place would overwrite the legacy files), and a folder that already holds a model or tokenizer is
refused unless `--overwrite` is given (then a tokenizer there that the legacy folder does not replace is deleted, and
the model card, so that no tokenizer or card of another model stays beside the converted weights; other files, such
as an earlier training run's records, are kept). A legacy vocabulary found beside the
weights is converted into a fast tokenizer; a pickled `vocab.pkl` is read by a restricted parser, never unpickled.
Everything is written into a temporary folder first and moved into OUT_DIR only once the whole conversion succeeded
(with `--overwrite`, only then is the old model removed): a failed conversion leaves OUT_DIR as it was.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from modeling_xl import TransformerXLForCausalLM  # noqa: E402
from modeling_xl.legacy_conversion import find_legacy_files, load_legacy_model, local_resolver  # noqa: E402
from modeling_xl.runtime.run_folder import staged_folder  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("legacy_dir", help="folder of the transformers-4.x Transformer-XL checkpoint")
    parser.add_argument("out_dir", help="folder to write the converted model to")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--overwrite", action="store_true", help="write over a model already in out_dir")
    return parser.parse_args(argv)


# what marks a folder as holding a model or a tokenizer (written by save_pretrained)
MODEL_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.pkl")


def convert(legacy_dir: str, out_dir: str, dtype: str = "float32", overwrite: bool = False
            ) -> TransformerXLForCausalLM:
    """Convert into a temporary folder beside out_dir, then move it into place only once complete: a conversion that
    fails (bad weights, a bad vocabulary) leaves out_dir as it was."""
    if not os.path.isdir(legacy_dir):
        raise ValueError(f"legacy_dir={legacy_dir!r} is not a folder; expected a transformers-4.x checkpoint folder")
    if os.path.realpath(out_dir) == os.path.realpath(legacy_dir):  # save_pretrained would overwrite the source
        raise ValueError(f"out_dir={out_dir!r} is the legacy_dir itself; expected another folder (converting in place "
                         "would overwrite the legacy config.json and weights)")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"out_dir={out_dir!r} is a file; expected a folder (new or empty) for the converted model")
    present = [name for name in MODEL_FILES + TOKENIZER_FILES if os.path.exists(os.path.join(out_dir, name))]
    if present and not overwrite:
        raise ValueError(f"out_dir={out_dir!r} already holds {', '.join(present)}; expected an empty or new folder, "
                         "or --overwrite to write the converted model over it")
    files = find_legacy_files(local_resolver(legacy_dir))
    if files is None:
        raise ValueError(f"legacy_dir={legacy_dir!r} has no config.json with model_type 'transfo-xl'")
    # nothing of another model stays beside these weights (its tokenizer, its card); other files (a training run's
    # records) stay
    with staged_folder(out_dir, stale=MODEL_FILES + TOKENIZER_FILES + ("README.md",), label="convert") as staging:
        model = load_legacy_model(TransformerXLForCausalLM, *files, dtype=getattr(torch, dtype))
        model.save_pretrained(staging)
        convert_vocabulary(legacy_dir, str(staging))
    return model


LEGACY_VOCAB_FILES = ("vocab.pkl", "vocab.txt", "vocab.bin")


def convert_vocabulary(legacy_dir: str, out_dir: str) -> str | None:
    """Turn a legacy vocabulary beside the checkpoint (if any) into a fast tokenizer saved in out_dir.

    `vocab.pkl` (transformers <= 4.35) is read by a restricted opcode parser, never unpickled; returns the file used.
    """
    from tokenization import tokenizer_from_vocab

    for name in LEGACY_VOCAB_FILES:
        path = os.path.join(legacy_dir, name)
        if os.path.isfile(path):
            tokenizer_from_vocab(path).save_pretrained(out_dir)
            return path
    return None


def main(argv=None):
    args = parse_args(argv)
    try:
        convert(args.legacy_dir, args.out_dir, args.dtype, args.overwrite)
    except ValueError as err:
        sys.exit(f"error: {err}")
    print(f"converted {args.legacy_dir} -> {args.out_dir}")


if __name__ == "__main__":
    main()
