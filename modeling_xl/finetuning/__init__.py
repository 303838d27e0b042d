"""Fine-tuning library behind `scripts/finetune_*.py`: one loop (`loop.run_job`) drives a `job.Job` per task.

- `arguments`: `CommonArguments` (every task), `FinetuneArguments` (classification) and their checks;
- `loop`: `run_job` / `run_finetuning`; `checkpoints`: `checkpoint-N/` and their exact resume; `card`: saved folder
  and model cards; `command`: every script's `main`; `coverage`: the `<unk>` check;
- jobs: `classification` (with `labels`, `data`, `tasks`: the label space, rows, problem types; `builtin_task`: the
  offline eight-topic task), `question_answering`, `token_classification`, `multiple_choice`.
"""

from .arguments import FinetuneArguments
from .card import dev_line
from .loop import run_finetuning
from .tasks import MetricError, task_for

__all__ = ["FinetuneArguments", "MetricError", "dev_line", "run_finetuning", "task_for"]
