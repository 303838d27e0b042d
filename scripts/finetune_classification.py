#!/usr/bin/env python
"""Fine-tune a Transformer-XL checkpoint for sequence classification or regression with Accelerate.

    python scripts/finetune_classification.py --model_name_or_path outputs/tiny --dataset_name builtin \
        --output_dir outputs/tiny-topics                                            # offline 8-class task
    python scripts/finetune_classification.py --model_name_or_path outputs/tiny \
        --train_file ../shared/data/sst2/train.tsv --validation_file ../shared/data/sst2/dev.tsv \
        --text_column sentence --label_column label --output_dir outputs/tiny-sst2  # local files
    accelerate launch scripts/finetune_classification.py ... --dataset_name glue --dataset_config_name sst2

Task shapes: any number of classes (integer or string labels); text pairs (`--text_pair_column`); regression
(`--problem_type regression`, or fractional labels); multi-label (`--problem_type multi_label_classification`, a list
or `--label_delimiter`-joined labels; `--threshold`); whole long documents (`--long_document`). `--from_scratch`
trains the same architecture from random weights (the baseline); `--compare_with RUN_DIR` puts that run's dev scores
beside this one's in the model card. `--checkpointing_steps N` / `--resume_from_checkpoint latest` resume exactly.
Library: `modeling_xl.finetuning`; documentation: docs/finetuning.md.
"""

import sys

from modeling_xl.finetuning import FinetuneArguments
from modeling_xl.finetuning.classification import ClassificationJob
from modeling_xl.finetuning.command import command


def main(argv=None) -> int:
    return command(FinetuneArguments, ClassificationJob, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
