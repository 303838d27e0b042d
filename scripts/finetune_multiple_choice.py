#!/usr/bin/env python
"""Fine-tune a Transformer-XL checkpoint for multiple choice (ARC, RACE, SWAG-like) with Accelerate.

    python scripts/finetune_multiple_choice.py --model_name_or_path outputs/tiny \
        --train_file ../shared/data/arc_easy/train.jsonl --validation_file ../shared/data/arc_easy/validation.jsonl \
        --output_dir outputs/tiny-arc
    accelerate launch scripts/finetune_multiple_choice.py ... --dataset_name ai2_arc --dataset_config_name ARC-Easy

Rows: a question, a list of choices (any number from 2, different from row to row if need be) and the right
choice's index, letter or text (`--question_column`, `--choices_column`, `--label_column`; `--context_column` for a
passage read before the question). Accuracy on the dev split. `--from_scratch`, `--compare_with`,
`--checkpointing_steps`, `--resume_from_checkpoint latest` as in finetune_classification.py.
Library: `modeling_xl.finetuning.multiple_choice`; documentation: docs/tasks.md.
"""

import sys

from modeling_xl.finetuning.command import command
from modeling_xl.finetuning.multiple_choice import MultipleChoiceArguments, MultipleChoiceJob


def main(argv=None) -> int:
    return command(MultipleChoiceArguments, MultipleChoiceJob, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
