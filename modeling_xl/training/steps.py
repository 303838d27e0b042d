"""One optimizer step with recurrence: chunks of rows, one memory per chunk, gradients equal to the full batch's.

The objective is a function `(model, batch_rows, mems) -> (summed NLL, number of targets, new mems)`, so the causal
LM and the permutation LM share the accumulation, the gradient synchronisation and the finiteness check.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch

from ..memory import carry_memory
from .accumulation import chunk_loss_weight, chunk_slices


class NonFiniteLossError(RuntimeError):
    """The global loss became NaN or inf; the run stops and the last good checkpoint stays as it is."""


def clm_objective(model, batch: dict, mems):
    """Transformer-XL causal LM on pre-shifted targets: position t predicts next_token_labels[:, t]."""
    labels = batch["next_token_labels"]
    out = model(input_ids=batch["input_ids"], mems=mems, next_token_labels=labels)
    return out.losses.float().sum(), (labels != -100).sum(), out.mems


def select_rows(batch: dict, rows: slice) -> dict:
    """The rows of every batch tensor (all batch tensors are batch-first)."""
    return {k: v[rows] for k, v in batch.items() if isinstance(v, torch.Tensor)}


def count_global_targets(accelerator, batch: dict, target_count) -> float:
    """Targets of the whole global batch (all processes), so every chunk can be weighted before its backward."""
    local = torch.as_tensor(float(target_count(batch)), dtype=torch.float64, device=accelerator.device).reshape(1)
    return float(accelerator.reduce(local, reduction="sum"))


def train_step(accelerator, model, optimizer, scheduler, batch: dict, memories: list, *, objective, target_count,
               max_grad_norm: float, step: int) -> float:
    """Forward/backward every chunk with its memory, check the global loss, clip, step. Returns the global mean loss.

    `memories[c]` becomes chunk c's new memory, written into the old one's tensors once the memory is full
    (`memory.carry_memory`: fixed addresses for a captured step). Gradients are synchronised only after the last chunk
    (DDP `no_sync` on the others); each chunk's NLL sum is weighted by W / (global targets) (see `chunk_loss_weight`),
    so the update equals the one of the full global batch in one piece.
    """
    rows = next(iter(batch.values())).shape[0]
    slices = chunk_slices(rows, len(memories))
    global_targets = count_global_targets(accelerator, batch, target_count)
    weight = chunk_loss_weight(global_targets, accelerator.num_processes)
    local_nll = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    for c, chunk in enumerate(slices):
        sync = c == len(slices) - 1
        with nullcontext() if sync else accelerator.no_sync(model):
            nll, _, new_memory = objective(model, select_rows(batch, chunk), memories[c])
            accelerator.backward(nll * weight)
        memories[c] = carry_memory(memories[c], new_memory)  # after the backward that read it: fixed storage
        local_nll += nll.detach().double()
    loss = float(accelerator.reduce(local_nll.reshape(1), reduction="sum")) / global_targets
    if not math.isfinite(loss):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteLossError(f"the training loss is {loss} at step {step + 1}")
    if max_grad_norm > 0:
        accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss
