"""Ordered streams for recurrent training and evaluation (Transformer-XL batching).

Layout (as the Transformer-XL reference's ordered iterator): a stream of N tokens gives N - 1 (input, next token) pairs; they are cut into
B contiguous rows of n pairs. Row b holds inputs x[b·n : (b+1)·n] and targets x[b·n+1 : (b+1)·n+1], so every row
carries its one-token lookahead: the target at a segment's last position is the first input of the next segment, and
the last target of row b is the first input of row b+1. Batch t holds columns [t·L, (t+1)·L) of every row, so row b of
batch t+1 continues row b of batch t and the memories stay meaningful. With W processes, process r owns rows
[r·B/W, (r+1)·B/W) at every step (per-process batch B/W); the processes together read exactly what one process would.

Example: tokens 0..10 (N = 11), B = 2, L = 2 -> n = 5, rows [0..4] / [5..9], two segments per epoch (the tail column
4 / 9 that does not fill a segment is dropped in training):
  batch 0: input_ids [[0, 1], [5, 6]], next_token_labels [[1, 2], [6, 7]]
  batch 1: input_ids [[2, 3], [7, 8]], next_token_labels [[3, 4], [8, 9]]

Batches are read window by window from the token array, which may be an `np.memmap` (nothing is copied up front);
`StreamingOrderedStreams` reads a corpus larger than memory from an iterator of token chunks instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch

from ..runtime.validators import check_int

IGNORE_INDEX = -100


def _as_flat_array(token_ids) -> np.ndarray:
    if isinstance(token_ids, torch.Tensor):
        token_ids = token_ids.detach().cpu().numpy()
    array = np.asarray(token_ids)
    if array.ndim != 1:
        raise ValueError(f"token_ids has shape {array.shape}; expected a 1-D stream of token ids")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"token_ids has dtype {array.dtype}; expected integer token ids")
    return array


def owned_rows(batch_size: int, rank: int, world_size: int) -> range:
    """Rows of process `rank`: [rank·B/W, (rank+1)·B/W). ValueError if B is not a multiple of W."""
    check_int("batch_size", batch_size, 1)
    check_int("world_size", world_size, 1)
    check_int("rank", rank, 0)
    if batch_size % world_size:
        raise ValueError(f"batch_size={batch_size} is not divisible by world_size={world_size}; expected a multiple of "
                         f"{world_size} so that every process owns the same number of rows")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank}; expected 0 <= rank < world_size={world_size}")
    share = batch_size // world_size
    return range(rank * share, (rank + 1) * share)


class OrderedStreams:
    """Training batches: `for batch in streams` yields the rest of the current epoch, in order.

    Epoch policy: a `for` loop resumes where the position stands; when the epoch is finished, the next `for` loop
    starts a new epoch (`epoch += 1`) over the same rows (nothing is shuffled). The consumer drops its memories at the
    first batch of an epoch: `streams.at_epoch_start` is True while that batch is in use (inside the loop body). The
    tail of each row that does not fill a whole segment is not used.
    `state_dict()` taken after processing batch k resumes at batch k + 1 (exact resume mid-epoch).
    """

    def __init__(self, token_ids, batch_size: int, tgt_len: int, rank: int = 0, world_size: int = 1):
        self.tokens = _as_flat_array(token_ids)
        self._init_layout(self.tokens.size, batch_size, tgt_len, rank, world_size)

    def _init_layout(self, num_tokens: int, batch_size: int, tgt_len: int, rank: int, world_size: int) -> None:
        check_int("tgt_len", tgt_len, 1)
        self.rows = owned_rows(batch_size, rank, world_size)
        self.batch_size, self.tgt_len, self.rank, self.world_size = batch_size, tgt_len, rank, world_size
        self.num_tokens = int(num_tokens)
        self.row_len = max(self.num_tokens - 1, 0) // batch_size
        if self.row_len < tgt_len:
            raise ValueError(f"the corpus has {self.num_tokens} tokens: {batch_size} rows of {self.row_len} tokens, "
                             f"shorter than one segment of tgt_len={tgt_len}; expected at least "
                             f"{batch_size * tgt_len + 1} tokens (a longer corpus, a smaller batch_size or tgt_len)")
        self.epoch, self.position = 0, 0

    def __len__(self) -> int:
        """Segments per epoch."""
        return self.row_len // self.tgt_len

    def batch(self, index: int) -> dict[str, torch.Tensor]:
        """Segment `index` of the epoch (random access; no state change)."""
        if not 0 <= index < len(self):
            raise IndexError(f"segment {index} out of range; expected 0 <= index < {len(self)}")
        starts = np.array([row * self.row_len + index * self.tgt_len for row in self.rows])
        windows = self.tokens[starts[:, None] + np.arange(self.tgt_len + 1)]  # [B/W, L+1]
        windows = torch.from_numpy(windows.astype(np.int64))
        return {"input_ids": windows[:, :-1], "next_token_labels": windows[:, 1:]}

    @property
    def at_epoch_start(self) -> bool:
        """True while the first batch of an epoch is in use (the position has moved past it): drop the memories."""
        return self.position == 1

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if self.position >= len(self):
            self.epoch, self.position = self.epoch + 1, 0
        while self.position < len(self):
            index = self.position
            self.position += 1  # advanced before the yield: a state_dict taken while batch k is used resumes at k+1
            yield self.batch(index)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "batch_size": self.batch_size,
                "tgt_len": self.tgt_len, "num_tokens": self.num_tokens}

    def load_state_dict(self, state: dict) -> None:
        """Restore the position. The stream layout must match; the number of processes may change."""
        missing = [key for key in self.state_dict() if key not in state]
        if missing:
            raise ValueError(f"state lacks {', '.join(missing)}; expected a dict from OrderedStreams.state_dict()")
        for key in ("batch_size", "tgt_len", "num_tokens"):
            if state[key] != getattr(self, key):
                raise ValueError(f"state has {key}={state[key]} but these streams have {key}={getattr(self, key)}; "
                                 f"expected the same corpus, batch_size and tgt_len as the saved run")
        if not 0 <= state["position"] <= len(self):
            raise ValueError(f"state position={state['position']}; expected 0..{len(self)}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    @classmethod
    def from_iterable(cls, open_chunks: Callable[[], Iterable], batch_size: int, tgt_len: int, *,
                      num_tokens: int | None = None, rank: int = 0, world_size: int = 1
                      ) -> StreamingOrderedStreams:
        """Streams over a corpus read from `open_chunks()` (a fresh iterator of token-id chunks per call)."""
        return StreamingOrderedStreams(open_chunks, batch_size, tgt_len, num_tokens=num_tokens, rank=rank,
                                       world_size=world_size)


def _as_chunk(chunk) -> np.ndarray:
    """One chunk of `open_chunks()` as int64: a 1-D sequence of integer token ids (an empty one is allowed)."""
    if isinstance(chunk, torch.Tensor):
        chunk = chunk.detach().cpu().numpy()
    array = np.asarray(chunk)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"open_chunks() gave a chunk of shape {array.shape} and dtype {array.dtype}; expected 1-D "
                         "integer token ids")
    return array.astype(np.int64, copy=False)


class _RowReader:
    """Reads one row's contiguous region from its own iterator of chunks, L+1 tokens at a time. `num_tokens` is the
    corpus length the layout assumes: running out of chunks before it is a ValueError, not a StopIteration (which a
    generator turns into "RuntimeError: generator raised StopIteration")."""

    def __init__(self, open_chunks, start: int, num_tokens: int):
        self.chunks = iter(open_chunks())
        self.num_tokens, self.read = num_tokens, 0  # tokens taken from the iterator so far
        self.buffer = np.zeros(0, dtype=np.int64)
        self._skip(start)

    def _wrong_count(self, holds: str) -> ValueError:
        return ValueError(f"num_tokens={self.num_tokens} but open_chunks() holds {holds} tokens; expected the "
                          "corpus's token count (or num_tokens=None to count it)")

    def _next_chunk(self) -> np.ndarray:
        try:
            chunk = _as_chunk(next(self.chunks))
        except StopIteration:
            raise self._wrong_count(f"only {self.read}") from None
        self.read += chunk.size
        return chunk

    def _fill(self, count: int) -> None:
        parts = [self.buffer]
        have = self.buffer.size
        while have < count:
            parts.append(self._next_chunk())
            have += parts[-1].size
        self.buffer = np.concatenate(parts)

    def _skip(self, count: int) -> None:
        while count > self.buffer.size:  # drop whole chunks without keeping them
            count -= self.buffer.size
            self.buffer = self._next_chunk()
        self.buffer = self.buffer[count:]

    def check_end(self) -> None:
        """Reads the rest of the iterator (for the last row: at most the dropped tail) and checks that the corpus
        ends at `num_tokens`; a longer corpus would otherwise be silently cut and laid out on the wrong rows."""
        for chunk in self.chunks:
            if self.read > self.num_tokens:  # stop here: the rest of a much longer corpus need not be read
                break
            self.read += _as_chunk(chunk).size
        if self.read > self.num_tokens:  # also when a chunk read for the last window already ran past the end
            raise self._wrong_count(f"more than {self.num_tokens} (at least {self.read})")
        if self.read < self.num_tokens:
            raise self._wrong_count(f"only {self.read}")

    def window(self, length: int) -> np.ndarray:
        """The next `length + 1` tokens; advances by `length` (the lookahead token stays for the next window)."""
        self._fill(length + 1)
        window = self.buffer[: length + 1]
        self.buffer = self.buffer[length:]
        return window


class StreamingOrderedStreams(OrderedStreams):
    """`OrderedStreams` over a corpus that does not fit in memory; same batches, same state_dict.

    `open_chunks()` must return a fresh iterator over the corpus in the same order every call, e.g.
    `lambda: (row["input_ids"] for row in tokenized_iterable_dataset)` for a streaming `datasets.IterableDataset`
    mapped through the tokenizer. Each owned row opens its own iterator and skips to its region (row b starts at
    token b·n), so memory is O(B/W · chunk size) and the token count N is needed up front: pass `num_tokens` when it
    is known (dataset metadata), otherwise one counting pass is made. Resuming skips each row to its position.
    A wrong `num_tokens` is a ValueError: when a row runs out of chunks, or, for a corpus longer than `num_tokens`,
    at the last batch of the epoch (checked by the process that owns the last row, which reads the dropped tail).
    """

    def __init__(self, open_chunks: Callable[[], Iterable], batch_size: int, tgt_len: int, *,
                 num_tokens: int | None = None, rank: int = 0, world_size: int = 1):
        if num_tokens is None:
            num_tokens = sum(_as_chunk(chunk).size for chunk in open_chunks())
        check_int("num_tokens", num_tokens, 0)
        self._open_chunks = open_chunks
        self._readers, self._reader_position = None, None
        self._init_layout(num_tokens, batch_size, tgt_len, rank, world_size)

    def batch(self, index: int) -> dict[str, torch.Tensor]:
        """Segment `index`; sequential access is cheap, a jump re-opens the row iterators."""
        if not 0 <= index < len(self):
            raise IndexError(f"segment {index} out of range; expected 0 <= index < {len(self)}")
        if self._readers is None or self._reader_position != index:
            self._readers = [_RowReader(self._open_chunks, row * self.row_len + index * self.tgt_len, self.num_tokens)
                             for row in self.rows]
        windows = torch.from_numpy(np.stack([reader.window(self.tgt_len) for reader in self._readers]))
        self._reader_position = index + 1
        if index == len(self) - 1 and self.rows[-1] == self.batch_size - 1:
            self._readers[-1].check_end()  # the last row's reader stands near the corpus end: check num_tokens there
        return {"input_ids": windows[:, :-1], "next_token_labels": windows[:, 1:]}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._readers = None


class EvalStreams:
    """Evaluation batches that cover every target exactly once (its own `tgt_len`, usually shorter than training's).

    The N - 1 (input, next token) pairs are cut into B rows of n = ceil((N - 1) / B) pairs; each row is read in
    ceil(n / L) segments. Positions past a row's end or past the corpus are padding: input `pad_token_id`, label -100
    (ignored by the loss), so every batch has the shape [B/W, L]. Row continuity is the same as in training.
    Example: tokens 0..6 (6 pairs), B = 2, L = 2 -> n = 3, rows [0, 1, 2] / [3, 4, 5], two segments:
      batch 0: input_ids [[0, 1], [3, 4]], next_token_labels [[1, 2], [4, 5]]
      batch 1: input_ids [[2, 0], [5, 0]], next_token_labels [[3, -100], [6, -100]]
    """

    def __init__(self, token_ids, batch_size: int, tgt_len: int, rank: int = 0, world_size: int = 1,
                 pad_token_id: int = 0):
        check_int("tgt_len", tgt_len, 1)
        check_int("pad_token_id", pad_token_id, 0)
        self.rows = owned_rows(batch_size, rank, world_size)
        self.tokens = _as_flat_array(token_ids)
        if self.tokens.size < 2:
            raise ValueError(f"the evaluation corpus has {self.tokens.size} tokens; expected at least 2 (one target)")
        self.batch_size, self.tgt_len, self.pad_token_id = batch_size, tgt_len, pad_token_id
        self.num_targets = self.tokens.size - 1
        self.row_len = -(-self.num_targets // batch_size)

    def __len__(self) -> int:
        return -(-self.row_len // self.tgt_len)

    def batch(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"segment {index} out of range; expected 0 <= index < {len(self)}")
        columns = index * self.tgt_len + np.arange(self.tgt_len)
        pairs = np.array(list(self.rows))[:, None] * self.row_len + columns  # [B/W, L] index of each pair
        valid = (columns < self.row_len) & (pairs < self.num_targets)
        safe = np.where(valid, pairs, 0)
        # int64 before `where`: with uint16 ids (a token cache) -100 would otherwise wrap to 65436
        inputs = np.where(valid, self.tokens[safe].astype(np.int64), self.pad_token_id)
        labels = np.where(valid, self.tokens[safe + 1].astype(np.int64), IGNORE_INDEX)
        return {"input_ids": torch.from_numpy(inputs), "next_token_labels": torch.from_numpy(labels)}

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for index in range(len(self)):
            yield self.batch(index)
