"""XLNet permutation-LM sampling: span targets, one local permutation per half, perm_mask / target_mapping.

Follows the XLNet paper (Yang et al. 2019, sections 2.3-2.4, appendix A.2) and the behaviour of zihangdai/xlnet
``data_utils.py`` (``_sample_mask``, ``_local_perm``, the parser of ``get_dataset``). Every function is pure: all
randomness comes from an explicit ``numpy.random.Generator``.

Notation: L = seq_len, R = reuse_len, K = num_predict, P = perm_size. A sample is ``reuse (R) ++ A <sep> B <sep>
<cls>``; "half 0" is ``[0, R)`` and "half 1" is ``[R, L)``. Half 0 gets ``K - K // 2`` targets, half 1 gets ``K // 2``.

Masks follow transformers ``XLNetLMHeadModel``:
- ``perm_mask[i, j] = 1``: position i may NOT see the content of position j (0: it may).
- ``target_mapping[k, j] = 1``: the k-th prediction is at position j (one-hot rows, all-zero padded rows).
Memory is the model's business: the memory for step t + 1 is ``cat(mems, h[:, :R])[-mem_len:]`` of step t, valid
because half 0 never sees half 1 and because the reuse part of step t + 1 continues that of step t (plm_layout).

Deviations from the original, on purpose:
- <sep>/<cls> are never selected: a span covering one is dropped and the random fill skips them, so every sample has
  exactly K real targets (the original could select them and then drop them, leaving padded target rows).
- No SentencePiece word-start alignment: a span is n tokens (what the original's inner loop yields in practice,
  since it tests the start piece at ``beg`` rather than ``end``); our tokens need not be SentencePiece pieces.
- Targets are drawn online with the permutation (fresh each epoch); the original fixed them when writing tfrecords.
- Randomness comes from ``plm_example_rng(seed, epoch, example_id)``, never from global RNGs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from .plm_layout import NUM_SPECIAL_TOKENS, plm_layout

if TYPE_CHECKING:
    import datasets


@dataclass(frozen=True)
class PLMSamplingConfig:
    """Permutation-LM sampling settings (defaults: XLNet-Large pretraining, K = 85 of 512 ~ 1/6)."""

    sep_id: int
    cls_id: int
    seq_len: int = 512
    reuse_len: int = 256
    num_predict: int = 85
    perm_size: int = 256
    max_gram: int = 5
    mask_alpha: int = 6
    mask_beta: int = 1

    def __post_init__(self):
        if not 0 < self.reuse_len < self.seq_len:
            raise ValueError(f"reuse_len must satisfy 0 < reuse_len < seq_len={self.seq_len}, got {self.reuse_len}")
        second_half = self.seq_len - self.reuse_len - NUM_SPECIAL_TOKENS  # predictable tokens after the reuse part
        if second_half < 2:
            raise ValueError(
                f"seq_len - reuse_len must be >= 5 to hold A <sep> B <sep> <cls>, "
                f"got seq_len={self.seq_len}, reuse_len={self.reuse_len}"
            )
        for name, half_len in (("reuse_len", self.reuse_len), ("seq_len - reuse_len", self.seq_len - self.reuse_len)):
            if self.perm_size < 1 or half_len % self.perm_size:
                raise ValueError(f"perm_size must be >= 1 and divide {name}={half_len}, got {self.perm_size}")
        if self.num_predict < 1:
            raise ValueError(f"num_predict must be >= 1, got {self.num_predict}")
        half0, half1 = self.num_predict_per_half
        if half0 > self.reuse_len or half1 > second_half:
            raise ValueError(
                f"num_predict={self.num_predict} is larger than the halves can hold: it needs {half0} targets in the "
                f"reuse half (reuse_len={self.reuse_len}) and {half1} in the second half ({second_half} tokens "
                f"besides <sep> <sep> <cls>)"
            )
        if self.max_gram < 1:
            raise ValueError(f"max_gram must be >= 1, got {self.max_gram}")
        if self.mask_beta < 1 or self.mask_alpha < self.mask_beta:
            raise ValueError(
                f"mask_alpha and mask_beta must satisfy mask_alpha >= mask_beta >= 1, "
                f"got mask_alpha={self.mask_alpha}, mask_beta={self.mask_beta}"
            )

    @property
    def num_predict_per_half(self) -> tuple[int, int]:
        """(targets in the reuse half, targets in the second half), as in the original."""
        return self.num_predict - self.num_predict // 2, self.num_predict // 2


def span_length_probs(max_gram: int) -> np.ndarray:
    """p(n) ∝ 1/n for n = 1..max_gram. Example: max_gram=2 -> [2/3, 1/3]."""
    inverse = 1.0 / np.arange(1, max_gram + 1)
    return inverse / inverse.sum()


def sample_target_spans(
    length: int,
    num_predict: int,
    rng: np.random.Generator,
    *,
    max_gram: int = 5,
    mask_alpha: int = 6,
    mask_beta: int = 1,
    selectable: np.ndarray | None = None,
) -> np.ndarray:
    """Spans ``[begin, end)`` (int64 [S, 2]) chosen left to right as in ``_sample_mask``, up to num_predict tokens.

    Each step draws a span length n ∝ 1/n (cut to the tokens still needed), a context of ``ctx = n * mask_alpha //
    mask_beta`` tokens split at random into ``left`` (uniform in [0, ctx)) and ``right = ctx - left``; the span is
    ``[cur + left, cur + left + n)`` and the cursor moves past it and its right context. Sampling stops when the span
    would reach the end of the segment (``end >= length``, as in the original) or num_predict tokens are covered.
    A span that covers a non-``selectable`` position (<sep>/<cls>) is dropped (the cursor still moves), so special
    tokens are never targets. Spans never touch: at least one context token separates them.

    Example: length 30, n = 2, ctx = 12 split left 5 / right 7: span [5, 7), cursor 14; next n = 1, ctx = 6, left 0:
    span [14, 15), cursor 21; next n = 3, ctx 18, left 8: 29 + 3 >= 30 -> stop. Spans [[5, 7], [14, 15]].
    """
    lengths, probs = np.arange(1, max_gram + 1), span_length_probs(max_gram)
    spans, covered, cursor = [], 0, 0
    while cursor < length and covered < num_predict:
        n = min(int(rng.choice(lengths, p=probs)), num_predict - covered)
        context = n * mask_alpha // mask_beta
        left = int(rng.integers(context))
        begin, end = cursor + left, cursor + left + n
        if end >= length:
            break
        if selectable is None or selectable[begin:end].all():
            spans.append((begin, end))
            covered += n
        cursor = end + context - left
    return np.asarray(spans, dtype=np.int64).reshape(-1, 2)


def sample_target_mask(
    length: int,
    num_predict: int,
    rng: np.random.Generator,
    *,
    max_gram: int = 5,
    mask_alpha: int = 6,
    mask_beta: int = 1,
    selectable: np.ndarray | None = None,
    reverse: bool = False,
) -> np.ndarray:
    """Boolean [length] with exactly ``num_predict`` targets: spans (``sample_target_spans``), then random fill.

    The fill picks uniformly among the remaining selectable positions (as the original's rejection loop does).
    ``reverse`` (bi_data backward rows) samples on the flipped segment and flips the result back, as the original.
    Example: length 10, num_predict 3, spans [[2, 4]] -> fill one of the 8 others, e.g. [0,0,1,1,0,0,0,1,0,0].
    """
    selectable = np.ones(length, dtype=bool) if selectable is None else np.asarray(selectable, dtype=bool)
    if selectable.shape != (length,):
        raise ValueError(f"selectable must have shape ({length},), got {selectable.shape}")
    if num_predict > selectable.sum():
        raise ValueError(f"num_predict={num_predict} is larger than the {int(selectable.sum())} selectable positions")
    if reverse:
        selectable = selectable[::-1]
    spans = sample_target_spans(
        length, num_predict, rng, max_gram=max_gram, mask_alpha=mask_alpha, mask_beta=mask_beta, selectable=selectable
    )
    mask = np.zeros(length, dtype=bool)
    for begin, end in spans:
        mask[begin:end] = True
    remaining = np.flatnonzero(selectable & ~mask)
    mask[rng.choice(remaining, size=num_predict - int(mask.sum()), replace=False)] = True
    return mask[::-1].copy() if reverse else mask


def sample_block_permutation(length: int, perm_size: int, rng: np.random.Generator) -> np.ndarray:
    """Factorization-order rank of each position (int64 [length]): blocks of ``perm_size`` stay in order, and one
    random shuffle of the offsets is shared by every block (``_local_perm``).

    Example: length 6, perm_size 3, shuffle [2, 0, 1] -> ranks [2, 0, 1, 5, 3, 4]: position 1 is predicted first,
    then 2, then 0, then (second block) 4, 5, 3.
    """
    if perm_size < 1 or length % perm_size:
        raise ValueError(f"perm_size must be >= 1 and divide length={length}, got {perm_size}")
    offsets = rng.permutation(perm_size)
    block_starts = np.arange(length // perm_size)[:, None] * perm_size
    return (block_starts + offsets[None, :]).reshape(-1).astype(np.int64)


def permutation_mask(rank: np.ndarray, is_target: np.ndarray, is_functional: np.ndarray) -> np.ndarray:
    """perm_mask (bool [L, L], True = may NOT see) of one half from its ranks, as ``_local_perm`` builds it.

    Rule (the original's ``rev_index`` gives context tokens the ``smallest_index`` -1, so they come before everything):
    - context tokens (neither target nor functional) are visible to every position;
    - a target or functional j is visible to i only when i is not context and j comes earlier in the order,
      ``rank[j] < rank[i]``; a functional token (<sep>/<cls>) also sees itself (it is an input, never predicted),
      a target never sees itself.
    So context tokens see each other bidirectionally and nothing else; targets see context plus earlier targets and
    earlier <sep>/<cls>; <sep>/<cls> are "ordered" like targets but are never predicted.

    Example (T = target, F = functional, C = context), ranks [0, 1, 2, 3], kinds [T, C, F, T]:
        i\\j  0 1 2 3        row 0 (T, rank 0): sees context 1 only
        0    1 0 1 1        row 1 (C): sees context only (itself)
        1    1 0 1 1        row 2 (F, rank 2): sees 0 (earlier), 1, itself
        2    0 0 0 1        row 3 (T, rank 3): sees 0, 1, 2, not itself
        3    0 0 0 1
    """
    is_target = np.asarray(is_target, dtype=bool) & ~np.asarray(is_functional, dtype=bool)
    is_context = ~(is_target | np.asarray(is_functional, dtype=bool))
    key_order = np.where(is_context, -1, rank)  # context keys come first, all tied (the original's smallest_index)
    query_order = np.where(is_target, key_order, key_order + 1)  # +1: a non-target query also sees its own key
    return query_order[:, None] <= key_order[None, :]  # context keys (-1) are below every query (>= 0): visible


def join_half_masks(mask_reuse: np.ndarray, mask_rest: np.ndarray) -> np.ndarray:
    """[[reuse, 1], [0, rest]]: the reuse half never sees the second half; the second half sees all the reuse half.

    Example: 1x1 halves [[1]] and [[0]] -> [[1, 1], [0, 0]].
    """
    reuse_len, rest_len = len(mask_reuse), len(mask_rest)
    top = np.concatenate([mask_reuse, np.ones((reuse_len, rest_len), dtype=bool)], axis=1)
    bottom = np.concatenate([np.zeros((rest_len, reuse_len), dtype=bool), mask_rest], axis=1)
    return np.concatenate([top, bottom], axis=0)


def targets_to_mapping(is_target: np.ndarray, num_predict: int) -> tuple[np.ndarray, np.ndarray]:
    """target_mapping float32 [num_predict, L] (targets in position order) and target_mask float32 [num_predict].

    Rows past the number of targets are all zero and have target_mask 0. Example: is_target [0, 1, 0, 1], K = 3 ->
    mapping rows [0,1,0,0], [0,0,0,1], [0,0,0,0]; target_mask [1, 1, 0].
    """
    positions = np.flatnonzero(is_target)
    if len(positions) > num_predict:
        raise ValueError(f"num_predict={num_predict} is smaller than the {len(positions)} targets")
    mapping = np.zeros((num_predict, len(is_target)), dtype=np.float32)
    mapping[np.arange(len(positions)), positions] = 1.0
    target_mask = (np.arange(num_predict) < len(positions)).astype(np.float32)
    return mapping, target_mask


def sample_plm_example(
    input_ids: np.ndarray, config: PLMSamplingConfig, rng: np.random.Generator, reverse: bool = False
) -> dict[str, np.ndarray]:
    """Targets, permutation and masks for one laid-out sample (``reuse ++ A <sep> B <sep> <cls>``).

    Returns perm_mask float32 [L, L], target_mapping float32 [K, L], target_mask float32 [K], labels int64 [K]
    (the true tokens; 0 on padded rows), is_target bool [L].
    """
    input_ids = np.asarray(input_ids, dtype=np.int64)
    if input_ids.shape != (config.seq_len,):
        raise ValueError(f"input_ids must have shape ({config.seq_len},), got {tuple(input_ids.shape)}")
    is_functional = (input_ids == config.sep_id) | (input_ids == config.cls_id)
    reuse = config.reuse_len
    masks, is_target = [], []
    for (begin, end), half_predict in zip(((0, reuse), (reuse, config.seq_len)), config.num_predict_per_half):
        half_target = sample_target_mask(
            end - begin,
            half_predict,
            rng,
            max_gram=config.max_gram,
            mask_alpha=config.mask_alpha,
            mask_beta=config.mask_beta,
            selectable=~is_functional[begin:end],
            reverse=reverse,
        )
        rank = sample_block_permutation(end - begin, config.perm_size, rng)
        masks.append(permutation_mask(rank, half_target, is_functional[begin:end]))
        is_target.append(half_target)
    is_target = np.concatenate(is_target)
    target_mapping, target_mask = targets_to_mapping(is_target, config.num_predict)
    labels = np.zeros(config.num_predict, dtype=np.int64)
    labels[: int(is_target.sum())] = input_ids[is_target]
    return {
        "perm_mask": join_half_masks(*masks).astype(np.float32),
        "target_mapping": target_mapping,
        "target_mask": target_mask,
        "labels": labels,
        "is_target": is_target,
    }


def plm_example_rng(seed: int, epoch: int, example_id: int) -> np.random.Generator:
    """The generator for one example: a pure function of (seed, epoch, example_id), so a batch does not depend on
    the DataLoader workers, on batch composition or on what was drawn before (exact resume)."""
    return np.random.default_rng([seed, epoch, example_id])


class PLMCollator:
    """``collate_fn`` turning laid-out examples (``build_plm_dataset`` rows) into a permutation-LM batch.

    Targets and permutations are drawn afresh at every epoch (online, like the original's parser), from
    ``plm_example_rng(seed, epoch, example_id)``; call ``set_epoch`` between passes. Output (B examples):
        input_ids long [B, L] (real tokens, never <mask>), token_type_ids long [B, L] (0 = reuse/A, 1 = B, 2 = <cls>),
        attention_mask float [B, L] (1 = real token; always 1: samples are never padded),
        perm_mask float [B, L, L], target_mapping float [B, K, L], target_mask float [B, K], labels long [B, K].
    Example rows must hold ``input_ids``, ``token_type_ids``, ``example_id`` and optionally ``reverse`` (bi_data).
    """

    def __init__(self, config: PLMSamplingConfig, seed: int = 0, epoch: int = 0):
        self.config, self.seed, self.epoch = config, seed, epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        features = {key: [] for key in ("perm_mask", "target_mapping", "target_mask", "labels")}
        for example in examples:
            rng = plm_example_rng(self.seed, self.epoch, int(example["example_id"]))
            sample = sample_plm_example(example["input_ids"], self.config, rng, bool(example.get("reverse", 0)))
            for key in features:
                features[key].append(sample[key])
        input_ids = torch.as_tensor(np.stack([np.asarray(e["input_ids"]) for e in examples]), dtype=torch.long)
        batch = {
            "input_ids": input_ids,
            "token_type_ids": torch.as_tensor(np.stack([np.asarray(e["token_type_ids"]) for e in examples])).long(),
            "attention_mask": torch.ones(input_ids.shape, dtype=torch.float32),
        }
        batch.update({key: torch.as_tensor(np.stack(value)) for key, value in features.items()})
        return batch


def build_plm_dataset(
    stream,
    batch_size: int,
    config: PLMSamplingConfig,
    seed: int = 0,
    sentence_ids: np.ndarray | None = None,
    sentence_len: int = 64,
    bi_data: bool = False,
    max_steps: int | None = None,
) -> "datasets.Dataset":
    """The laid-out samples of ``plm_layout`` as a ``datasets.Dataset`` (step-major, plus ``example_id``); with
    ``max_steps``, only the first max_steps steps (each the same as in the whole layout).

    Read it in order, ``DataLoader(ds, batch_size=batch_size, shuffle=False, collate_fn=PLMCollator(config, seed))``,
    so that batch t holds step t of every row and row b of batch t + 1 continues row b of batch t.
    Columns: input_ids, token_type_ids [L]; is_next, reverse, row, step, example_id (ints).
    """
    import datasets  # local: the sampling functions above do not need it

    layout = plm_layout(
        np.asarray(stream),
        batch_size,
        config.seq_len,
        config.reuse_len,
        config.sep_id,
        config.cls_id,
        seed,
        sentence_ids=sentence_ids,
        sentence_len=sentence_len,
        bi_data=bi_data,
        max_steps=max_steps,
    )
    layout["example_id"] = np.arange(len(layout["input_ids"]), dtype=np.int64)
    return datasets.Dataset.from_dict({key: value.tolist() for key, value in layout.items()}).with_format("numpy")
