#!/usr/bin/env python
"""lm-evaluation-harness on a Transformer-XL folder, with memory: lm_eval's own command line, run with the model
class `transformer-xl` registered (`modeling_xl.harness`). Every argument is lm_eval's; without `--model` the model
is `transformer-xl`, whose segment and memory lengths default to the folder's evaluation settings (its pretraining
run's `eval_tgt_len`, `eval_mem_len`, ...; `tgt_len=`, `mem_len=`, `clamp_len=`, `same_length=` in `--model_args`
set them).

    python scripts/evaluate_harness.py --model_args pretrained=outputs/tiny --tasks my_task \
        --include_path my_tasks/                                     # our model: segments with memory
    python scripts/evaluate_harness.py --model_args pretrained=outputs/tiny,tgt_len=64,mem_len=640 --tasks my_task \
        --include_path my_tasks/
    python scripts/evaluate_harness.py --model hf --model_args pretrained=outputs/tiny,trust_remote_code=True \
        --tasks my_task --include_path my_tasks/                     # lm_eval's hf model, windows of 2048 tokens

Needs `pip install "modeling-xl[harness]"`. Documentation: docs/ecosystem.md.
"""

import logging
import sys

SUBCOMMANDS = ("run", "ls", "validate")  # lm_eval's (0.4.10 and later); without one it runs `run`


def with_default_model(argv: list[str]) -> list[str]:
    """`argv` with `--model transformer-xl` added to an evaluation that names no model."""
    from modeling_xl.harness import MODEL_NAME

    if argv and argv[0] in SUBCOMMANDS[1:]:
        return argv
    named = any(arg in ("--model", "-M") or arg.startswith("--model=") for arg in argv)
    if named or not argv or argv[0] in ("-h", "--help"):
        return argv
    return [*argv, "--model", MODEL_NAME]


def main(argv=None) -> int:
    try:
        from lm_eval.__main__ import cli_evaluate

        import modeling_xl.harness  # noqa: F401  (registers the model class with lm_eval)
    except ImportError as error:
        print(f"error: lm-evaluation-harness is not installed ({error}); expected `pip install "
              "\"modeling-xl[harness]\"`", file=sys.stderr)
        return 1
    handler = logging.StreamHandler()  # lm_eval shows its own logger only: ours says which settings it reads with
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("modeling_xl").addHandler(handler)
    logging.getLogger("modeling_xl").setLevel(logging.INFO)
    sys.argv = [sys.argv[0], *with_default_model(list(sys.argv[1:] if argv is None else argv))]
    cli_evaluate()  # lm_eval reads sys.argv
    return 0


if __name__ == "__main__":
    sys.exit(main())
