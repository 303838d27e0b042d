#!/usr/bin/env python
"""Fine-tune a Transformer-XL checkpoint for token classification (NER, part-of-speech tagging) with Accelerate.

    python scripts/finetune_token_classification.py --model_name_or_path outputs/tiny \
        --train_file ../shared/data/ud_ewt/train.jsonl --validation_file ../shared/data/ud_ewt/dev.jsonl \
        --label_column upos_tags --output_dir outputs/tiny-upos
    accelerate launch scripts/finetune_token_classification.py ... --dataset_name conll2003

Rows: a list of words (`--tokens_column`, default tokens) and one tag per word (`--label_column`, default the first
of ner_tags, pos_tags, upos_tags, tags, labels); a word's tag labels its first sub-token. Token accuracy always;
entity precision / recall / F1 (seqeval's default semantics) for BIO tags. `--long_document` tags whole documents
`--max_length` tokens at a time with the memory carried across segments instead of cutting them. `--from_scratch`,
`--compare_with`, `--checkpointing_steps`, `--resume_from_checkpoint latest` as in finetune_classification.py.
Library: `modeling_xl.finetuning.token_classification`; documentation: docs/tasks.md.
"""

import sys

from modeling_xl.finetuning.command import command
from modeling_xl.finetuning.token_classification import TokenClassificationArguments, TokenClassificationJob


def main(argv=None) -> int:
    return command(TokenClassificationArguments, TokenClassificationJob, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
