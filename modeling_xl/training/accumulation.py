"""Gradient accumulation along the stream (row) dimension, with one memory per chunk.

Transformer-XL's `batch_chunk` (kimiyoung/transformer-xl `train.py`): a process's rows are cut into chunks of
consecutive rows; chunk c always holds the same rows, so its memory (`mems[c]`) stays the continuation of exactly
those rows. Each chunk's summed NLL is divided by the token count of the *whole global batch* (times the number of
processes, because DDP averages gradients over processes), so the accumulated gradient equals the gradient of the
full-batch mean loss.
"""

from __future__ import annotations

import torch


def chunk_slices(rows: int, chunks: int) -> list[slice]:
    """Consecutive row slices of equal size.

    Example: chunk_slices(8, 2) -> [slice(0, 4), slice(4, 8)]: rows 0-3 form chunk 0 at every step.
    """
    if chunks < 1 or rows % chunks:
        raise ValueError(f"gradient_accumulation_steps={chunks} does not divide the {rows} rows of this process; "
                         "expected a divisor")
    size = rows // chunks
    return [slice(i * size, (i + 1) * size) for i in range(chunks)]


def chunk_loss_weight(global_tokens: int, num_processes: int) -> float:
    """Factor turning a chunk's summed NLL into its share of the global mean loss under DDP's gradient averaging.

    DDP averages gradients over W processes, so each process backpropagates W x (its NLL sum) / (global token count);
    the average over processes is then (sum over every token of the global batch) / (global token count).
    Example: 2 processes, 4 rows x 8 tokens each -> global 64 tokens; weight 2 / 64 = 1 / 32.
    """
    if global_tokens <= 0:
        raise ValueError(f"global_tokens={global_tokens}; expected at least one target token in the global batch")
    return num_processes / global_tokens


def count_targets(next_token_labels: torch.Tensor) -> torch.Tensor:
    """Number of targets that are not ignored (-100), as a 1-element float tensor (ready for an all-reduce)."""
    return (next_token_labels != -100).sum().to(torch.float64).reshape(1)
