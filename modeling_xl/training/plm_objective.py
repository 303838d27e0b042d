"""`--objective plm`: XLNet-style permutation LM (Yang et al. 2019) on the same loop as the causal LM.

Samples come from `modeling_xl.data.plm_sampling` (layout `reuse ++ A <sep> B <sep> <cls>`, span targets, one local
permutation per half). The layout is step-major, so batch t holds step t of every row; process r takes rows
[r·B/W, (r+1)·B/W) of each step, like the ordered streams of the causal LM, and each accumulation chunk carries its
memory `cat(mem, h[:, :reuse_len])[-mem_len:]` to the next step (the model computes it).
"""

from __future__ import annotations

import torch

from ..evaluation.stream_scoring import perplexity, recurrence_settings
from .data_sources import plm_rows


def plm_settings(args) -> dict:
    """seq_len, reuse_len, num_predict, perm_size and max_gram of `data_sources.plm_rows` (what a checkpoint records
    of the sampling)."""
    return plm_rows(args).sampling()


def plm_step(model, batch: dict, mems):
    """Summed cross-entropy over real predictions, their number, the new memory (from the reuse part)."""
    out = model(input_ids=batch["input_ids"], perm_mask=batch["perm_mask"], target_mapping=batch["target_mapping"],
                token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"], mems=mems,
                labels=batch["labels"], target_mask=batch["target_mask"])
    return out.losses.float().sum(), batch["target_mask"].sum(), out.mems


def plm_target_count(batch) -> int:
    return int(batch["target_mask"].sum())


@torch.no_grad()
def plm_evaluate(model, config, data, args, device, max_segments, reduce) -> dict:
    """Permutation-LM NLL per predicted token on the validation layout (fixed samples), memory carried."""
    was_training = model.training
    model.eval()
    nll = torch.zeros((), dtype=torch.float64, device=device)
    count = torch.zeros((), dtype=torch.float64, device=device)
    mems = None
    with recurrence_settings(config, args.eval_mem_len, args.eval_clamp_len, args.eval_same_length):
        for index, batch in enumerate(data.validation_batches(device)):
            if max_segments is not None and index >= max_segments:
                break
            loss_sum, targets, mems = plm_step(model, batch, mems)
            nll += loss_sum.double()
            count += targets.double()
    model.train(was_training)
    totals = torch.stack([nll, count])
    if reduce is not None:
        totals = reduce(totals)
    nll, count = float(totals[0]), int(round(float(totals[1])))
    return {"eval_loss": nll / max(count, 1), "perplexity": perplexity(nll, count), "eval_tokens": count}


def plm_model_class():
    from ..modeling_permutation_lm import TransformerXLForPermutationLM

    return TransformerXLForPermutationLM


def plm_config_overrides(args) -> dict:
    """A permutation LM uses one embedding tied to its output layer (no adaptive softmax) and bidirectional
    relative attention."""
    return dict(adaptive=False, cutoffs=[], tie_projs=[False], attn_type="bi", reuse_len=plm_rows(args).reuse_len,
                bi_data=args.bi_data)
