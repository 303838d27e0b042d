"""Sequence layout for XLNet-style permutation-LM pretraining (issue 3, item 4).

Every training sample has length ``seq_len`` and the layout of the XLNet pretraining data
(Yang et al. 2019, section 2.4 and appendix A.2; zihangdai/xlnet ``create_tfrecords``)::

    [ reuse part: reuse_len tokens | A <sep> B <sep> <cls> ]
      continues the row's stream     A continues the reuse part; B is the real continuation of A
                                     (is_next = 1) or a random segment of the same row (is_next = 0)

The stream is cut into ``batch_size`` contiguous rows (like the ordered streams of Transformer-XL). Sample ``t`` of
row ``b`` starts at token ``t * reuse_len`` of that row, so the reuse part of step ``t + 1`` is exactly the
continuation of the reuse part of step ``t``. The model keeps ``cat(mems, h[:, :reuse_len])[-mem_len:]`` as the
memory for step ``t + 1``; that memory is meaningful because consecutive reuse parts are consecutive text. (The
A segment of step ``t`` overlaps the reuse part of step ``t + 1``, exactly as in the original.)

Sentence boundaries. A and B are cut at sentence boundaries. The original reads them from the line structure of the
raw text (``sent_ids`` flip at each line). A flat token stream has no lines, so by default we approximate sentences by
fixed chunks of ``sentence_len`` tokens (``chunk_sentence_ids``); callers with real boundaries (e.g. one ``<eos>`` per
line in WikiText) pass ``sentence_ids_from_eos(stream, eos_id)`` or any array whose value changes at a boundary.

bi_data. With ``bi_data=True`` the stream is cut into ``batch_size // 2`` rows and rows ``[B/2, B)`` are the same
rows read backwards (as in the original), flagged ``reverse = 1``; the model uses reversed relative positions there.

Segment ids (``token_type_ids``) follow the original: reuse part, A and its <sep> are 0; B and its <sep> are 1;
<cls> is 2.
"""

from __future__ import annotations

import numpy as np

SEGMENT_A, SEGMENT_B, SEGMENT_CLS = 0, 1, 2
# Which samples a (stream, seed, settings) gives; recorded in checkpoints, so that a resume never continues a run on
# other samples than it started with. 1: the A/B choices drawn step by step from one generator (until 2026-11-25);
# 2: drawn from `sample_rng(seed, row, step)`, so any row and step can be laid out alone.
SAMPLING_VERSION = 2
NUM_SPECIAL_TOKENS = 3  # <sep> after A, <sep> after B, <cls>


def chunk_sentence_ids(num_tokens: int, sentence_len: int) -> np.ndarray:
    """Sentence ids for a stream without line structure: a new "sentence" every ``sentence_len`` tokens.

    Example: ``chunk_sentence_ids(7, 3) -> [0, 0, 0, 1, 1, 1, 0]`` (ids alternate; only changes matter).
    """
    if sentence_len < 1:
        raise ValueError(f"sentence_len must be >= 1, got {sentence_len}")
    return ((np.arange(num_tokens) // sentence_len) % 2).astype(np.int64)


def sentence_ids_from_eos(stream: np.ndarray, eos_id: int) -> np.ndarray:
    """Sentence ids that change right after every ``eos_id`` token (a sentence ends with its ``<eos>``).

    Example: stream ``[5, 9, 2, 7, 2, 8]`` with ``eos_id=2`` -> ``[0, 0, 0, 1, 1, 0]``.
    """
    stream = np.asarray(stream)
    starts = np.concatenate([[0], (stream[:-1] == eos_id).astype(np.int64)])
    return (np.cumsum(starts) % 2).astype(np.int64)


def sentence_boundaries(sentence_ids: np.ndarray) -> np.ndarray:
    """Sorted indices i where a new sentence starts (``sentence_ids[i] != sentence_ids[i - 1]``)."""
    return np.flatnonzero(sentence_ids[1:] != sentence_ids[:-1]) + 1


def split_a_and_b(
    row: np.ndarray,
    sentence_ids: np.ndarray,
    begin: int,
    total_len: int,
    rng: np.random.Generator,
    boundaries: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Cut segments A and B (``len(A) + len(B) == total_len``) from ``row`` with A starting at ``begin``.

    Behaviour of the original ``_split_a_and_b``: ``cut points`` are the sentence boundaries strictly inside
    ``(begin, begin + total_len)``; ``end`` is the first boundary at or after ``begin + total_len`` (or the row end).
    - With probability 1/2 (always when there is no cut point) B is random (``is_next = 0``): A ends at a random cut
      point (or at ``end``), B is a random window of the row of the remaining length, widened to sentence boundaries.
    - Otherwise (``is_next = 1``) A ends at a random cut point and B runs from there to ``end``.
    Then the longer of A and B loses tokens on its right until the total is ``total_len``.
    ``boundaries`` (``sentence_boundaries(sentence_ids)``) may be passed to avoid recomputing them per call.

    Example: row of 20 tokens, a boundary every 4 tokens, ``begin=0``, ``total_len=10``: cut points ``[4, 8]``,
    ``end=12``; is_next with A end 4 gives ``A=row[0:4]``, ``B=row[4:12]`` -> B trimmed to ``row[4:10]``.
    """
    data_len = len(row)
    if begin + total_len >= data_len:
        raise ValueError(f"begin + total_len must be < len(row)={data_len}, got {begin} + {total_len}")
    if boundaries is None:
        boundaries = sentence_boundaries(sentence_ids)
    first, stop = np.searchsorted(boundaries, [begin + 1, begin + total_len])
    cut_points = boundaries[first:stop]
    end = int(boundaries[stop]) if stop < len(boundaries) else data_len

    a_begin = begin
    if len(cut_points) == 0 or rng.random() < 0.5:
        is_next = 0
        a_end = int(rng.choice(cut_points)) if len(cut_points) else end
        b_len = max(1, total_len - (a_end - a_begin))
        b_begin = int(rng.integers(0, data_len - b_len))  # inclusive upper bound data_len - 1 - b_len
        b_end = b_begin + b_len
        while b_begin > 0 and sentence_ids[b_begin - 1] == sentence_ids[b_begin]:
            b_begin -= 1
        while b_end < data_len - 1 and sentence_ids[b_end - 1] == sentence_ids[b_end]:
            b_end += 1
    else:
        is_next = 1
        a_end = int(rng.choice(cut_points))
        b_begin, b_end = a_end, end

    while (a_end - a_begin) + (b_end - b_begin) > total_len:
        if a_end - a_begin > b_end - b_begin:
            a_end -= 1
        else:
            b_end -= 1
    return row[a_begin:a_end], row[b_begin:b_end], is_next


def sample_rng(seed: int, row: int, step: int) -> np.random.Generator:
    """The generator of the A/B choice of one sample: a pure function of (seed, row, step)."""
    return np.random.default_rng([seed, row, step])


def _check_layout_args(num_tokens: int, batch_size: int, seq_len: int, reuse_len: int, bi_data: bool) -> int:
    """Validate the layout arguments; return the number of rows the stream is cut into."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if bi_data and batch_size % 2:
        raise ValueError(f"batch_size must be even with bi_data=True (half the rows are reversed), got {batch_size}")
    if not 0 < reuse_len < seq_len:
        raise ValueError(f"reuse_len must satisfy 0 < reuse_len < seq_len={seq_len}, got {reuse_len}")
    if seq_len - reuse_len < NUM_SPECIAL_TOKENS + 2:
        raise ValueError(
            f"seq_len - reuse_len must be >= 5 to hold A <sep> B <sep> <cls> with non-empty A and B, "
            f"got seq_len={seq_len}, reuse_len={reuse_len}"
        )
    num_rows = batch_size // 2 if bi_data else batch_size
    if num_tokens // num_rows < seq_len:
        raise ValueError(
            f"stream of {num_tokens} tokens is too short: {num_rows} rows need at least seq_len={seq_len} "
            f"tokens each, i.e. >= {num_rows * seq_len} tokens"
        )
    return num_rows


def _rows_of(stream: np.ndarray, sentence_ids: np.ndarray, num_rows: int, bi_data: bool):
    """(rows [B, L], their sentence ids [B, L], reverse [B]): the stream cut into `num_rows` contiguous rows; with
    `bi_data` the same rows again, read backwards (rows [B/2, B))."""
    row_len = len(stream) // num_rows
    rows = stream[: num_rows * row_len].reshape(num_rows, row_len)
    row_sentences = sentence_ids[: num_rows * row_len].reshape(num_rows, row_len)
    reverse = np.zeros(num_rows, dtype=np.int64)
    if bi_data:
        rows = np.concatenate([rows, rows[:, ::-1]])
        row_sentences = np.concatenate([row_sentences, row_sentences[:, ::-1]])
        reverse = np.concatenate([reverse, np.ones(num_rows, dtype=np.int64)])
    return rows, row_sentences, reverse


def plm_layout(
    stream: np.ndarray,
    batch_size: int,
    seq_len: int,
    reuse_len: int,
    sep_id: int,
    cls_id: int,
    seed: int,
    sentence_ids: np.ndarray | None = None,
    sentence_len: int = 64,
    bi_data: bool = False,
    max_steps: int | None = None,
) -> dict[str, np.ndarray]:
    """Lay a flat token stream out as permutation-LM samples, step-major: sample ``t * batch_size + b`` = row b, step t.

    Args:
        stream: 1-D token ids. sentence_ids: same length, value changes at sentence boundaries (default:
        ``chunk_sentence_ids(len(stream), sentence_len)``). seed: the A/B choice of row b at step t is drawn from
        ``sample_rng(seed, b, t)``, so a sample depends only on the stream and (seed, row, step): any row and step
        can be laid out alone (``plm_rows.PLMRowLayout`` does so lazily from a memory-mapped corpus). max_steps:
        lay out only the first max_steps steps (the rows are still cut from the whole stream).
    Returns (N = num_steps * batch_size):
        input_ids int64 [N, seq_len], token_type_ids int64 [N, seq_len], is_next int64 [N],
        reverse int64 [N] (1 for bi_data backward rows), row int64 [N], step int64 [N].
    Example: 2 rows, seq_len 8, reuse_len 4: row 0 step 0 = ``s[0:4] ++ A <sep> B <sep> <cls>`` with A from s[4:],
    row 0 step 1 = ``s[4:8] ++ ...``; row 1 starts at ``s[len(s) // 2]``.
    """
    stream = np.asarray(stream, dtype=np.int64)
    if stream.ndim != 1:
        raise ValueError(f"stream must be 1-D token ids, got shape {tuple(stream.shape)}")
    if sentence_ids is None:
        sentence_ids = chunk_sentence_ids(len(stream), sentence_len)
    sentence_ids = np.asarray(sentence_ids)
    if sentence_ids.shape != stream.shape:
        raise ValueError(f"sentence_ids must have the stream's shape {stream.shape}, got {sentence_ids.shape}")
    num_rows = _check_layout_args(len(stream), batch_size, seq_len, reuse_len, bi_data)
    rows, row_sentences, reverse = _rows_of(stream, sentence_ids, num_rows, bi_data)
    row_len = rows.shape[1]
    total_len = seq_len - reuse_len - NUM_SPECIAL_TOKENS
    num_steps = (row_len - seq_len) // reuse_len + 1
    if max_steps is not None:
        num_steps = min(num_steps, max_steps)
    boundaries = [sentence_boundaries(row_sentences[b]) for b in range(batch_size)]
    out = {key: [] for key in ("input_ids", "token_type_ids", "is_next", "reverse", "row", "step")}
    for step in range(num_steps):
        start = step * reuse_len
        for b in range(batch_size):
            a, b_seg, is_next = split_a_and_b(
                rows[b], row_sentences[b], start + reuse_len, total_len, sample_rng(seed, b, step), boundaries[b]
            )
            ids = np.concatenate([rows[b, start : start + reuse_len], a, [sep_id], b_seg, [sep_id], [cls_id]])
            segments = [SEGMENT_A] * (reuse_len + len(a) + 1) + [SEGMENT_B] * (len(b_seg) + 1) + [SEGMENT_CLS]
            out["input_ids"].append(ids)
            out["token_type_ids"].append(segments)
            out["is_next"].append(is_next)
            out["reverse"].append(reverse[b])
            out["row"].append(b)
            out["step"].append(step)
    return {key: np.asarray(value, dtype=np.int64) for key, value in out.items()}
