"""Per-process view of ordered streams: fixed rows, consecutive segments, random access by step (exact resume).

Transformer-XL batching (REFERENCE.md "Ordered streams"): a token stream of N tokens is cut into B contiguous rows of
n = (N - 1) // B tokens; step t reads positions [t·L, (t+1)·L) of every row, and its targets are the next tokens
(at a segment's last position: the first token of the next segment). Process r of W owns rows
[r·B/W, (r+1)·B/W) at every step, so its memories stay valid and together the processes read exactly the rows one
process would. A batch is a pure function of (step, rank): resuming needs only the step.
"""

from __future__ import annotations

import torch


def stream_rows(tokens: torch.Tensor, rows: int, pad_to: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs [rows, n], targets [rows, n]) with targets[b, i] the token after inputs[b, i] in the corpus.

    `pad_to` (evaluation) keeps every token: n = ceil((N - 1) / rows) rounded up to a multiple of `pad_to`, padded with
    input 0 and target -100. Without it the tail that does not fill every row is dropped (training).
    Example: tokens 0..10 (N = 11), rows 2 -> inputs [[0..4], [5..9]], targets [[1..5], [6..10]].
    """
    tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
    predictable = tokens.numel() - 1
    if predictable < rows:
        raise ValueError(f"the corpus has {tokens.numel()} tokens; expected at least {rows + 1} for {rows} streams")
    if pad_to is None:
        length = predictable // rows
        inputs = tokens[: rows * length].view(rows, length)
        targets = tokens[1 : rows * length + 1].view(rows, length)
        return inputs, targets
    length = -(-predictable // rows)
    length = -(-length // pad_to) * pad_to
    inputs = torch.zeros(rows * length, dtype=torch.long)
    targets = torch.full((rows * length,), -100, dtype=torch.long)
    inputs[:predictable] = tokens[:-1]
    targets[:predictable] = tokens[1:]
    # row-major fill would split the corpus into rows of `length` tokens; the last row(s) hold the padding
    return inputs.view(rows, length), targets.view(rows, length)


class RankStreams:
    """The rows of one process, segment by segment.

    `batch(step)` -> {"input_ids", "next_token_labels"} [rows_per_process, tgt_len] and "new_epoch" (True at the
    first segment of every pass over the corpus, when the memories must be dropped).
    """

    def __init__(self, tokens, num_streams: int, tgt_len: int, num_processes: int = 1, process_index: int = 0,
                 pad: bool = False):
        if num_streams % num_processes:
            raise ValueError(f"train_batch_size={num_streams} streams cannot be shared by {num_processes} processes; "
                             f"expected a multiple of {num_processes}")
        inputs, targets = stream_rows(tokens, num_streams, pad_to=tgt_len if pad else None)
        share = num_streams // num_processes
        rows = slice(process_index * share, (process_index + 1) * share)
        self.inputs, self.targets, self.tgt_len = inputs[rows], targets[rows], tgt_len
        self.segments_per_epoch = -(-inputs.size(1) // tgt_len) if pad else inputs.size(1) // tgt_len
        if self.segments_per_epoch == 0:
            raise ValueError(f"each of the {num_streams} streams has {inputs.size(1)} tokens, fewer than tgt_len="
                             f"{tgt_len}; expected a longer corpus, fewer streams or a shorter segment")

    def batch(self, step: int) -> dict:
        position = step % self.segments_per_epoch
        window = slice(position * self.tgt_len, (position + 1) * self.tgt_len)
        return {"input_ids": self.inputs[:, window], "next_token_labels": self.targets[:, window],
                "new_epoch": position == 0}

    def __iter__(self):
        """One pass (evaluation): every segment once, without the epoch flag."""
        for step in range(self.segments_per_epoch):
            batch = self.batch(step)
            batch.pop("new_epoch")
            yield batch
