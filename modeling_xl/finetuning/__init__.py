"""Fine-tuning library behind `scripts/finetune_classification.py`: arguments -> data (labels, pairs, collate) ->
task (loss, predictions, metrics per problem type) -> loop -> checkpoints -> model card.

- `arguments`: `FinetuneArguments` and their checks;
- `labels`, `data`: the label space and every row checked (file, row, column), tokenization, left-padding collate;
- `tasks`: `SingleLabelTask`, `MultiLabelTask`, `RegressionTask` (transformers' `problem_type`s);
- `builtin_task`: the offline eight-topic task (`--dataset_name builtin` / `builtin-long`);
- `loop`: `run_finetuning`; `checkpoints`: `checkpoint-N/` and their exact resume; `card`: saved folder and card.
"""

from .arguments import FinetuneArguments
from .card import dev_line
from .loop import run_finetuning
from .tasks import MetricError, task_for

__all__ = ["FinetuneArguments", "MetricError", "dev_line", "run_finetuning", "task_for"]
