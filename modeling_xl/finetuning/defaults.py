"""Fine-tuning defaults that suit the model being tuned: the learning rate, epochs and warmup a run gets when it does
not name them, from the model's width (`d_model`) and whether it starts from pretrained weights (`--from_scratch`
or not), as the pretraining recipes follow the preset. Every one is overridable (`--learning_rate`,
`--num_train_epochs`, `--num_warmup_steps`); what was chosen, and why, goes into the run's `training_config.json`.

| model | learning rate | epochs | warmup |
|---|---|---|---|
| d_model <= 128 (the `tiny` preset), pretrained or from scratch | 1e-3 | 5 | 10% of the steps |
| d_model >= 768 (XLNet base / large), pretrained | 3e-5 | 3 | 10% of the steps |
| d_model >= 768, from scratch | 1e-4 | 3 | 10% of the steps |
| in between | geometric interpolation in d_model | 5 to 3, rounded on the same scale | 10% of the steps |

The small row was chosen on the grid of `benchmarks/bench_finetune_defaults.py` (learning rate 1e-4 to 3e-3, 1 to 5
epochs, the built-in topic task and SST-2, pretrained and from scratch; the table is in docs/finetuning.md). The
large rows are not measured here (no CPU run fine-tunes a 768-wide model in this project's budget): for a pretrained
model, the middle of the rates the XLNet authors fine-tuned their released models with (2e-5 to 5e-5: the commands
of zihangdai/xlnet's README for STS-B, SQuAD, RACE and IMDB); from scratch, the usual 1e-4 of a transformer of that
width trained from random weights. A pretrained model gets a smaller rate than one from scratch as it grows: it has
features to keep.
"""

from __future__ import annotations

import math

SMALL_WIDTH, LARGE_WIDTH = 128, 768
SMALL_RATE = {"pretrained": 1e-3, "from scratch": 1e-3}
LARGE_RATE = {"pretrained": 3e-5, "from scratch": 1e-4}
SMALL_EPOCHS, LARGE_EPOCHS = 5, 3
WARMUP_SHARE = 0.1


def _toward_large(d_model: int) -> float:
    """Where d_model lies from the small row (0) to the large one (1), on a log scale, clamped."""
    width = min(max(d_model, SMALL_WIDTH), LARGE_WIDTH)
    return math.log(width / SMALL_WIDTH) / math.log(LARGE_WIDTH / SMALL_WIDTH)


def default_learning_rate(d_model: int, pretrained: bool) -> float:
    """The table's rate for this width: the small and large rows, and between them the geometric interpolation in
    d_model (so doubling the width scales the rate by the same factor everywhere in the range)."""
    start = "pretrained" if pretrained else "from scratch"
    small, large = SMALL_RATE[start], LARGE_RATE[start]
    return float(f"{small * (large / small) ** _toward_large(d_model):.2g}")  # two significant digits


def default_epochs(d_model: int) -> int:
    """5 for the small row, 3 for the large one, rounded between."""
    return round(SMALL_EPOCHS + (LARGE_EPOCHS - SMALL_EPOCHS) * _toward_large(d_model))


def apply_defaults(args, config, batches_per_epoch: int) -> dict[str, str]:
    """Fill the schedule arguments left at None (`learning_rate`, `num_train_epochs`, `num_warmup_steps`) with this
    model's defaults, in place; returns {argument: why this value} for each one filled (empty when the user named
    them all)."""
    start = "from scratch" if args.from_scratch else "pretrained"
    model = f"d_model {config.d_model}, {start}"
    chosen = {}
    if args.learning_rate is None:
        args.learning_rate = default_learning_rate(config.d_model, not args.from_scratch)
        chosen["learning_rate"] = f"{args.learning_rate:g}: the default for {model} (modeling_xl.finetuning.defaults)"
    if args.num_train_epochs is None:
        args.num_train_epochs = default_epochs(config.d_model)
        chosen["num_train_epochs"] = (f"{args.num_train_epochs}: the default for d_model {config.d_model} "
                                      "(modeling_xl.finetuning.defaults)")
    if args.num_warmup_steps is None:
        steps = args.max_train_steps or args.num_train_epochs * batches_per_epoch
        args.num_warmup_steps = round(WARMUP_SHARE * steps)
        chosen["num_warmup_steps"] = (f"{args.num_warmup_steps}: {WARMUP_SHARE:.0%} of the run's {steps} steps "
                                      "(modeling_xl.finetuning.defaults)")
    return chosen
