"""Stream scoring of a causal LM with memory: perplexity = exp(total NLL / total tokens), bits per character.

The one home of the scoring that training's validation (`evaluate_causal_lm`, `training.objectives`) and the
long-context evaluation (`modeling_xl.evaluation`, `scripts/evaluate_lm.py`) share.

The paper evaluates with a shorter segment and a much longer memory than in training (e.g. WT103 base: train 150/150,
evaluate tgt_len 64 / mem_len 640 / clamp_len 400 / same_length). `recurrence_settings` switches the model's
`mem_len`, `clamp_len` and `same_length` for the evaluation and always restores the training values.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterable

import torch


def perplexity(total_nll: float, total_tokens: int) -> float:
    """exp(total NLL / total tokens) over the whole stream (not a mean of per-segment perplexities).

    Example: two segments with NLL sums 10 and 30 over 10 and 10 tokens -> exp(40 / 20) = e^2 ~ 7.389.
    """
    if total_tokens <= 0:
        raise ValueError(f"total_tokens={total_tokens}; expected at least one evaluated token")
    return math.exp(min(total_nll / total_tokens, 700.0))


def bits_per_character(total_nll: float, total_chars: int) -> float:
    """NLL in bits per character: total NLL (nats) / ln 2 / characters. Example: 100 chars, 69.3 nats -> ~1.0 bpc."""
    if total_chars <= 0:
        raise ValueError(f"total_chars={total_chars}; expected at least one evaluated character")
    return total_nll / math.log(2) / total_chars


@contextmanager
def recurrence_settings(config, mem_len: int, clamp_len: int, same_length: bool):
    """Temporarily set `config.mem_len / clamp_len / same_length` (the model reads them at every forward)."""
    saved = (config.mem_len, config.clamp_len, config.same_length)
    config.mem_len, config.clamp_len, config.same_length = mem_len, clamp_len, same_length
    try:
        yield config
    finally:
        config.mem_len, config.clamp_len, config.same_length = saved


@torch.no_grad()
def stream_nll(model, batches: Iterable[dict], device, max_segments: int | None = None) -> tuple[float, int]:
    """(summed NLL, number of targets) over consecutive segments, carrying memory from one segment to the next.

    Each batch holds `input_ids` [B, T] and `next_token_labels` [B, T] (-100 = not a target); row b of batch t + 1
    continues row b of batch t. Targets are summed in float64 so long streams do not lose precision.
    """
    was_training = model.training
    model.eval()
    total_nll = torch.zeros((), dtype=torch.float64, device=device)
    total_tokens = torch.zeros((), dtype=torch.float64, device=device)
    mems = None
    try:
        for index, batch in enumerate(batches):
            if max_segments is not None and index >= max_segments:
                break
            input_ids = torch.as_tensor(batch["input_ids"], device=device)
            labels = torch.as_tensor(batch["next_token_labels"], device=device)
            out = model(input_ids=input_ids, mems=mems, next_token_labels=labels)
            mems = out.mems
            total_nll += out.losses.double().sum()
            total_tokens += (labels != -100).sum()
    finally:
        model.train(was_training)
    return float(total_nll), int(total_tokens)


def evaluate_causal_lm(model, config, batches: Iterable[dict], *, eval_mem_len: int, eval_clamp_len: int,
                       eval_same_length: bool, device, reduce=None, max_segments: int | None = None,
                       chars_per_token: float | None = None) -> dict:
    """Evaluate with the evaluation recurrence settings, switched on `config` (the config the model reads; `model`
    may be a DDP/FSDP wrapper). `reduce(tensor)` sums across processes (None: one process).

    Returns {"eval_loss", "perplexity", "eval_tokens"} and, when `chars_per_token` is given (character-level data),
    "bpc" (NLL per character in bits).
    """
    with recurrence_settings(config, eval_mem_len, eval_clamp_len, eval_same_length):
        nll, tokens = stream_nll(model, batches, device, max_segments)
    if reduce is not None:
        totals = reduce(torch.tensor([nll, float(tokens)], dtype=torch.float64, device=device))
        nll, tokens = float(totals[0]), int(round(float(totals[1])))
    result = {"eval_loss": nll / max(tokens, 1), "perplexity": perplexity(nll, tokens), "eval_tokens": tokens}
    if chars_per_token is not None:
        result["bpc"] = bits_per_character(nll, int(round(tokens * chars_per_token)))
    return result
