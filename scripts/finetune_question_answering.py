#!/usr/bin/env python
"""Fine-tune a Transformer-XL checkpoint for extractive question answering (SQuAD v1.1 style) with Accelerate.

    python scripts/finetune_question_answering.py --model_name_or_path outputs/tiny \
        --train_file squad_train.jsonl --validation_file squad_dev.jsonl --output_dir outputs/tiny-squad
    accelerate launch scripts/finetune_question_answering.py ... --dataset_name squad

Rows: id, question, context, answers = {"text": [...], "answer_start": [...]} (JSON lines, a JSON object whose
"data" holds them, or SQuAD's nested files). Contexts longer than `--max_length` are read in windows overlapping by
`--doc_stride` tokens; the answer is the best span over every window; exact match and F1 as SQuAD v1.1 defines them.
The causal backbone reads the question first, the bidirectional one XLNet's `context <sep> question <sep> <cls>`
(`--question_first` overrides). `--from_scratch`, `--compare_with`, `--checkpointing_steps`,
`--resume_from_checkpoint latest` as in finetune_classification.py. Library: `modeling_xl.finetuning.question_answering`;
documentation: docs/tasks.md.
"""

import sys

from modeling_xl.finetuning.command import command
from modeling_xl.finetuning.question_answering import QuestionAnsweringArguments, QuestionAnsweringJob


def main(argv=None) -> int:
    return command(QuestionAnsweringArguments, QuestionAnsweringJob, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
