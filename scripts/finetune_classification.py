#!/usr/bin/env python
"""Fine-tune a Transformer-XL checkpoint for sequence classification with Accelerate.

    accelerate launch scripts/finetune_classification.py --model_name_or_path outputs/tiny \
        --dataset_name glue --dataset_config_name sst2 --output_dir outputs/tiny-sst2          # Hub dataset
    python scripts/finetune_classification.py --model_name_or_path outputs/tiny \
        --train_file ../shared/data/sst2/train.tsv --validation_file ../shared/data/sst2/dev.tsv \
        --text_column sentence --label_column label --output_dir outputs/tiny-sst2             # local files

`--from_scratch` trains the same architecture from random weights (the baseline); `--compare_with RUN_DIR` puts that
run's dev scores beside this one's in the model card. `--checkpointing_steps N` writes `checkpoint-N/` folders;
`--resume_from_checkpoint latest` (or a folder) continues such a run exactly; `--overwrite_output_dir` starts afresh in
a folder that holds an earlier run. Library: `modeling_xl.training.classification`.
"""

import argparse
import dataclasses
import logging
import sys
import types
import typing

from modeling_xl.training.classification import FinetuneArguments, dev_accuracy_line, run_finetuning


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    hints = typing.get_type_hints(FinetuneArguments)
    for field in dataclasses.fields(FinetuneArguments):
        kind = hints[field.name]
        if isinstance(kind, types.UnionType):  # `X | None`
            kind = next(t for t in typing.get_args(kind) if t is not type(None))
        required = field.default is dataclasses.MISSING
        if kind is bool:
            parser.add_argument(f"--{field.name}", action="store_true")
        else:
            parser.add_argument(f"--{field.name}", type=kind, required=required,
                                default=None if required else field.default)
    return parser


def main(argv=None) -> int:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    args = FinetuneArguments(**vars(build_parser().parse_args(argv)))
    try:
        results = run_finetuning(args)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"dev: {dev_accuracy_line(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
