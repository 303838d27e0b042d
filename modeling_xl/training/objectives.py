"""Training objectives: what a step computes and how the validation split is scored.

- `clm`: Transformer-XL causal LM over ordered streams (`TransformerXLForCausalLM`, `next_token_labels`).
- `plm`: XLNet-style permutation LM (`TransformerXLForPermutationLM`, samples from `modeling_xl.data.plm_sampling`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..evaluation.stream_scoring import evaluate_causal_lm
from .steps import clm_objective


@dataclass
class Objective:
    name: str
    model_class: type
    step_fn: Callable  # (model, batch rows, mems) -> (summed NLL, target count, new mems)
    target_count: Callable  # batch -> number of targets in it
    evaluate: Callable  # (model, config, data, args, device, max_segments, reduce) -> metrics dict
    tokens_per_row: int  # new tokens of its text each row reads per step (counted by tokens/s and tokens_seen)


def _clm_targets(batch) -> int:
    return int((batch["next_token_labels"] != -100).sum())


def _clm_evaluate(model, config, data, args, device, max_segments, reduce) -> dict:
    return evaluate_causal_lm(
        model, config, data.validation_batches(device), eval_mem_len=args.eval_mem_len, eval_clamp_len=args.eval_clamp_len,
        eval_same_length=args.eval_same_length, device=device, reduce=reduce, max_segments=max_segments,
        chars_per_token=1.0 if data.info.get("char_level") else None,
    )


def objective_for(args, data) -> Objective:
    """The `--objective` of a run (`clm` or `plm`); the permutation-LM code is imported only when it is chosen."""
    if args.objective == "clm":
        from ..modeling_transformer_xl import TransformerXLForCausalLM

        return Objective("clm", TransformerXLForCausalLM, clm_objective, _clm_targets, _clm_evaluate, args.tgt_len)
    from .plm_objective import plm_evaluate, plm_model_class, plm_settings, plm_step, plm_target_count

    # Each step moves every row reuse_len tokens further through its text: only the reuse part of a sample is new (its
    # A part is the next step's reuse part, its B part a continuation or a random segment), so tokens/s and
    # tokens_seen count reuse_len per row and step.
    return Objective("plm", plm_model_class(), plm_step, plm_target_count, plm_evaluate,
                     plm_settings(args)["reuse_len"])
