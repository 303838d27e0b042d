"""The routing capacity of the adaptive softmax's tail clusters for a run (`AdaptiveLogSoftmax.tail_capacity`): the
most targets of each tail cluster that one forward of the run reads, found in the run's own token stream.

With a capacity, each tail cluster scores only its own rows in a buffer of that many slots (`routed_log_probs`):
static shapes and no host synchronisation, so a whole training step compiles and captures once, and exact because no
forward of the run holds more targets of a cluster than its capacity (checked in the graph as well). Without one,
the compiled step scores every row with every cluster (`masked_log_probs`), and the eager GPU step selects each
cluster's rows with `nonzero`, which waits for the device.

Ordered streams (`data.streams.OrderedStreams`): row b's targets are tokens[b·n + 1 : (b + 1)·n + 1] (n the row
length), segment s of it the columns [s·L, (s + 1)·L); a forward reads `rows_per_forward` consecutive rows (a process's
accumulation chunk). Example: 2 tail clusters, a forward of 4 rows x 64 tokens whose busiest segment holds 9 targets
of cluster 1 and 3 of cluster 2 anywhere in the epoch: capacity (9, 3) before rounding up.
"""

from __future__ import annotations

import numpy as np

SEGMENTS_AT_A_TIME = 256  # segments counted per pass over the rows (bounds the memory of the count)


def stream_tail_counts(tokens, bounds: list[tuple[int, int]], num_streams: int, seg_len: int,
                       rows_per_forward: int) -> list[int]:
    """The most targets of each tail cluster (`bounds[1:]`, token ranges) in one forward of `rows_per_forward`
    consecutive rows x `seg_len` tokens of `tokens` laid out as `num_streams` ordered streams."""
    tokens = np.asarray(tokens)
    row_len = (tokens.size - 1) // num_streams
    segments = row_len // seg_len
    most = [0] * (len(bounds) - 1)
    targets = tokens[1: 1 + num_streams * row_len].reshape(num_streams, row_len)  # a view of a memmap: nothing read
    for first in range(0, segments, SEGMENTS_AT_A_TIME):
        last = min(first + SEGMENTS_AT_A_TIME, segments)
        window = np.asarray(targets[:, first * seg_len: last * seg_len]).reshape(num_streams, last - first, seg_len)
        for i, (lo, hi) in enumerate(bounds[1:]):
            per_row = ((window >= lo) & (window < hi)).sum(axis=2)  # [rows, segments]
            per_forward = per_row.reshape(num_streams // rows_per_forward, rows_per_forward, -1).sum(axis=1)
            most[i] = max(most[i], int(per_forward.max(initial=0)))
    return most


def tail_capacity(counts: list[int], multiple: int = 8) -> tuple[int, ...]:
    """Capacities from the largest counts: each rounded up to a multiple of `multiple` (aligned buffers), at least
    one slot."""
    return tuple(max(multiple, -(-count // multiple) * multiple) for count in counts)


def batch_tail_counts(batches, bounds: list[tuple[int, int]], label: str = "next_token_labels") -> list[int]:
    """The most targets of each tail cluster in one of `batches` (dicts holding `label`, -100 where ignored)."""
    most = [0] * (len(bounds) - 1)
    for batch in batches:
        targets = batch[label]
        for i, (lo, hi) in enumerate(bounds[1:]):
            most[i] = max(most[i], int(((targets >= lo) & (targets < hi)).sum()))
    return most


def run_tail_capacity(data, bounds: list[tuple[int, int]], rows_per_forward: int, seg_len: int
                      ) -> tuple[int, ...] | None:
    """The capacity covering every training forward (`rows_per_forward` rows x `seg_len` of every process) and
    every validation forward of a run's `PretrainData` (counted batch by batch: this process's); None when the
    training streams keep no token array (`--streaming`) or the softmax has no tail."""
    tokens = getattr(data.train, "tokens", None)
    if tokens is None or len(bounds) < 2:
        return None
    counts = stream_tail_counts(tokens, bounds, data.train.batch_size, seg_len, rows_per_forward)
    eval_counts = batch_tail_counts(data.validation, bounds)
    return tail_capacity([max(a, b) for a, b in zip(counts, eval_counts)])
