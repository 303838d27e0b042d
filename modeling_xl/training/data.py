"""Data for a pretraining run: tokenizer, this process's training rows, its validation rows, facts for the card."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..data.streams import EvalStreams, OrderedStreams


@dataclass
class PretrainData:
    """Everything the loop reads. `train` / `validation` hold only this process's rows.

    `train` has `len()` (segments per epoch) and `batch(index)` (random access, e.g. `OrderedStreams`), so the batch
    of step t is a pure function of t: resuming needs only the step. `validation` is iterable (e.g. `EvalStreams`).
    """

    tokenizer: object
    train: OrderedStreams
    validation: EvalStreams
    info: dict = field(default_factory=dict)  # dataset_name, description, train_tokens, eval_tokens, char_level, ...

    def train_batches(self, start_step: int, max_steps: int, device):
        """(step, batch on device) for step in [start_step, max_steps). Passes over the corpus repeat in order;
        `batch["new_epoch"]` is True at the first segment of each pass (the memories must then be dropped)."""
        for step in range(start_step, max_steps):
            epoch, index = divmod(step, len(self.train))
            if hasattr(self.train, "set_epoch"):  # samplers that draw afresh every epoch (permutation LM)
                self.train.set_epoch(epoch)
            batch = {k: v.to(device) for k, v in self.train.batch(index).items()}
            yield step, {**batch, "new_epoch": index == 0}

    def validation_batches(self, device):
        for batch in self.validation:
            yield {k: v.to(device) for k, v in batch.items()}


def unknown_share(data: PretrainData, max_batches: int = 32) -> float | None:
    """The share of the tokenizer's unknown token among the first `max_batches` training batches' input ids (None
    without an unknown token or batches)."""
    unk = getattr(data.tokenizer, "unk_token_id", None)
    if unk is None or len(data.train) == 0:
        return None
    hits = total = 0
    for index in range(min(len(data.train), max_batches)):
        ids = data.train.batch(index)["input_ids"]
        hits, total = hits + int((ids == unk).sum()), total + ids.numel()
    return hits / total if total else None


# a tokenizer from elsewhere (--tokenizer_name, --model_name_or_path) that leaves more of the corpus unknown is warned
# about: the loss and perplexity are then mostly about predicting <unk> (WikiText-2's own vocabulary leaves 2.6%)
UNKNOWN_WARNING_SHARE = 0.10


def tokenizer_vocab_size(tokenizer) -> int:
    """Ids the model must accept: len(tokenizer), or more when the vocabulary has gaps (highest id + 1)."""
    return max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)


def _token_array(ids) -> np.ndarray:
    """Token ids as a 1-D numpy array without copying an array or memmap (a cached corpus stays on disk)."""
    if isinstance(ids, torch.Tensor):
        return ids.detach().cpu().numpy()
    return ids if isinstance(ids, np.ndarray) else np.asarray(ids, dtype=np.int64)


def data_from_tokens(tokenizer, train_ids, valid_ids, *, num_streams: int, tgt_len: int, eval_tgt_len: int,
                     num_processes: int = 1, process_index: int = 0, info: dict | None = None) -> PretrainData:
    """PretrainData from two 1-D token id sequences (training and validation), split over processes."""
    vocab = tokenizer_vocab_size(tokenizer)
    train_ids, valid_ids = _token_array(train_ids), _token_array(valid_ids)
    for name, ids in (("training", train_ids), ("validation", valid_ids)):
        if isinstance(ids, np.memmap):  # a token cache, written by this tokenizer: not read through up front
            continue
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise ValueError(f"the {name} token ids reach {int(ids.max())}, outside the tokenizer's vocabulary of "
                             f"{vocab}; expected ids produced by the same tokenizer")
    train = OrderedStreams(train_ids, num_streams, tgt_len, rank=process_index, world_size=num_processes)
    validation = EvalStreams(valid_ids, num_streams, eval_tgt_len, rank=process_index, world_size=num_processes)
    facts = {"train_tokens": len(train_ids), "eval_tokens": len(valid_ids), **(info or {})}
    return PretrainData(tokenizer, train, validation, facts)
