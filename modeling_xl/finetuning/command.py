"""The command line of every fine-tuning script: parse the task's arguments dataclass, run its job, print the dev
line; a bad input ends the process with status 1 and one `error: ...` line (arguments, rows, folders, metrics)."""

from __future__ import annotations

import logging
import sys

from ..runtime.cli import dataclass_parser
from .card import run_line
from .loop import run_job
from .tasks import MetricError


def command(arguments_class, job_class, description: str | None, argv=None) -> int:
    """`scripts/finetune_*.py`'s main: 0 after a run, 1 with the error on stderr."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    args = arguments_class(**vars(dataclass_parser(arguments_class, description).parse_args(argv)))
    job = job_class(args)
    try:
        results = run_job(job)
    except (ValueError, OSError, MetricError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"dev: {run_line(job.summary(results['dev']), results)}")
    return 0
