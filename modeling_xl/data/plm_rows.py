"""Permutation-LM samples laid out on demand from a token array that may be an `np.memmap` (a token cache).

`PLMRowLayout.sample(row, step)` returns what `plm_layout` (the eager reference, `plm_layout.py`) lays out for that
row and step, reading only the windows the sample needs: the reuse part, segment A, and segment B (a continuation
or a random window of the row, widened to sentence boundaries). Sentence boundaries are found by scanning the tokens
near a position for `<eos>` (or, without an eos token, every `sentence_len` tokens), never over the whole corpus, so a
process's memory does not grow with the corpus.

Boundary rule (the same as `sentence_ids_from_eos` + `sentence_boundaries` on the row): in a forward row a sentence
starts at local position i (1 <= i < n) when token i - 1 is `<eos>`; in a backward row (bi_data, the row read from its
end) when token i itself is `<eos>`. Example: row [5, 2, 7, 2, 8] with eos 2: forward boundaries [2, 4]; read
backwards, [8, 2, 7, 2, 5], boundaries [1, 3].
"""

from __future__ import annotations

import numpy as np

from .plm_layout import NUM_SPECIAL_TOKENS, SEGMENT_A, SEGMENT_B, SEGMENT_CLS, _check_layout_args, sample_rng

SCAN = 4096  # tokens read per step of a boundary scan


class RowText:
    """Tokens [start, start + length) of `tokens`, read forwards or backwards, in local positions 0..length-1."""

    def __init__(self, tokens, start: int, length: int, reverse: bool, eos_id: int | None, sentence_len: int):
        self.tokens, self.start, self.length, self.reverse = tokens, start, length, reverse
        self.eos_id, self.sentence_len = eos_id, sentence_len

    def ids(self, lo: int, hi: int) -> np.ndarray:
        """Local positions [lo, hi) as int64."""
        if self.reverse:
            end = self.start + self.length
            return np.asarray(self.tokens[end - hi : end - lo], dtype=np.int64)[::-1]
        return np.asarray(self.tokens[self.start + lo : self.start + hi], dtype=np.int64)

    def boundaries(self, lo: int, hi: int) -> np.ndarray:
        """Sorted local positions in [lo, hi) where a sentence starts (only 1 <= i < length can)."""
        lo, hi = max(lo, 1), min(hi, self.length)
        if lo >= hi:
            return np.zeros(0, dtype=np.int64)
        positions = np.arange(lo, hi)
        if self.eos_id is None:  # chunk_sentence_ids over the whole stream: a new sentence at every multiple
            globals_ = self.start + self.length - positions if self.reverse else self.start + positions
            return positions[globals_ % self.sentence_len == 0]
        window = self.ids(lo, hi) if self.reverse else self.ids(lo - 1, hi - 1)
        return positions[window == self.eos_id]

    def next_boundary(self, pos: int, stop: int) -> int:
        """The first boundary in [pos, stop), else stop."""
        while pos < stop:
            found = self.boundaries(pos, min(pos + SCAN, stop))
            if found.size:
                return int(found[0])
            pos += SCAN
        return stop

    def prev_boundary(self, pos: int) -> int:
        """The last boundary at or before pos, else 0."""
        while pos >= 1:
            found = self.boundaries(max(pos - SCAN + 1, 1), pos + 1)
            if found.size:
                return int(found[-1])
            pos -= SCAN
        return 0


def trim_lengths(a_len: int, b_len: int, total_len: int) -> tuple[int, int]:
    """The lengths `split_a_and_b`'s loop leaves: while too long, the longer of A and B loses a token (B on a tie).
    Example: (10, 4, 6) -> (3, 3): A loses 6 tokens to reach B's 4, then B and A lose one each (B first)."""
    excess = a_len + b_len - total_len
    if excess <= 0:
        return a_len, b_len
    if a_len > b_len:
        cut = min(a_len - b_len, excess)
        a_len, excess = a_len - cut, excess - cut
    elif b_len > a_len:
        cut = min(b_len - a_len, excess)
        b_len, excess = b_len - cut, excess - cut
    return a_len - excess // 2, b_len - (excess + 1) // 2


def split_a_and_b_rows(row: RowText, begin: int, total_len: int, rng: np.random.Generator):
    """`plm_layout.split_a_and_b` on a `RowText` (same draws from `rng`, same result), reading only windows."""
    data_len = row.length
    if begin + total_len >= data_len:
        raise ValueError(f"begin + total_len must be < len(row)={data_len}, got {begin} + {total_len}")
    cut_points = row.boundaries(begin + 1, begin + total_len)
    end = row.next_boundary(begin + total_len, data_len)
    if len(cut_points) == 0 or rng.random() < 0.5:
        is_next = 0
        a_end = int(rng.choice(cut_points)) if len(cut_points) else end
        b_len = max(1, total_len - (a_end - begin))
        b_begin = int(rng.integers(0, data_len - b_len))
        b_end = b_begin + b_len
        b_begin = row.prev_boundary(b_begin)
        b_end = row.next_boundary(b_end, data_len - 1)  # b_end <= data_len - 1: the loop stops there too
    else:
        is_next = 1
        a_end = int(rng.choice(cut_points))
        b_begin, b_end = a_end, end
    a_len, b_len = trim_lengths(a_end - begin, b_end - b_begin, total_len)
    return row.ids(begin, begin + a_len), row.ids(b_begin, b_begin + b_len), is_next


class PLMRowLayout:
    """`plm_layout` one sample at a time. Rows: the stream cut into B (B/2 with bi_data) rows of `row_len` tokens;
    with bi_data rows [B/2, B) are rows [0, B/2) read backwards. `num_steps` samples per row."""

    def __init__(self, tokens, batch_size: int, seq_len: int, reuse_len: int, sep_id: int, cls_id: int, seed: int,
                 *, eos_id: int | None = None, sentence_len: int = 64, bi_data: bool = False):
        if np.ndim(tokens) != 1:
            raise ValueError(f"stream must be 1-D token ids, got shape {tuple(np.shape(tokens))}")
        num_rows = _check_layout_args(len(tokens), batch_size, seq_len, reuse_len, bi_data)
        self.row_len = len(tokens) // num_rows
        self.seq_len, self.reuse_len, self.sep_id, self.cls_id, self.seed = seq_len, reuse_len, sep_id, cls_id, seed
        self.total_len = seq_len - reuse_len - NUM_SPECIAL_TOKENS
        self.num_steps = (self.row_len - seq_len) // reuse_len + 1
        self.rows = [RowText(tokens, (b % num_rows) * self.row_len, self.row_len, b >= num_rows, eos_id, sentence_len)
                     for b in range(batch_size)]

    def sample(self, row: int, step: int) -> dict:
        """input_ids, token_type_ids [seq_len] and is_next, reverse, row, step of row `row` at step `step`."""
        if not 0 <= step < self.num_steps:
            raise IndexError(f"step {step} out of range; expected 0 <= step < {self.num_steps}")
        text, start = self.rows[row], step * self.reuse_len
        a, b, is_next = split_a_and_b_rows(text, start + self.reuse_len, self.total_len,
                                           sample_rng(self.seed, row, step))
        ids = np.concatenate([text.ids(start, start + self.reuse_len), a, [self.sep_id], b, [self.sep_id],
                              [self.cls_id]])
        segments = np.array([SEGMENT_A] * (self.reuse_len + len(a) + 1) + [SEGMENT_B] * (len(b) + 1)
                            + [SEGMENT_CLS], dtype=np.int64)
        return {"input_ids": ids, "token_type_ids": segments, "is_next": is_next, "reverse": int(text.reverse),
                "row": row, "step": step}
