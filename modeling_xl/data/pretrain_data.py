"""What a pretraining run reads (`PretrainData`: the tokenizer, this process's training and validation rows, facts
for the card), made from token ids (`data_from_tokens`), and the facts about its corpus and tokenizer (`describe`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .sources import CorpusSource, StreamLayout, TokenizerRecipe
from .streams import EvalStreams, OrderedStreams
from .tokenizer_choice import is_character_level, tokenizer_kind, tokenizer_vocab_size


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


def _token_array(ids) -> np.ndarray:
    """Token ids as a 1-D numpy array without copying an array or memmap (a cached corpus stays on disk)."""
    if isinstance(ids, torch.Tensor):
        return ids.detach().cpu().numpy()
    return ids if isinstance(ids, np.ndarray) else np.asarray(ids, dtype=np.int64)


def data_from_tokens(tokenizer, train_ids, valid_ids, layout: StreamLayout, info: dict | None = None) -> PretrainData:
    """PretrainData from two 1-D token id sequences (training and validation), split over processes by `layout`."""
    vocab = tokenizer_vocab_size(tokenizer)
    train_ids, valid_ids = _token_array(train_ids), _token_array(valid_ids)
    for name, ids in (("training", train_ids), ("validation", valid_ids)):
        if isinstance(ids, np.memmap):  # a token cache, written by this tokenizer: not read through up front
            continue
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise ValueError(f"the {name} token ids reach {int(ids.max())}, outside the tokenizer's vocabulary of "
                             f"{vocab}; expected ids produced by the same tokenizer")
    where = dict(rank=layout.process_index, world_size=layout.num_processes)
    train = OrderedStreams(train_ids, layout.num_streams, layout.tgt_len, **where)
    validation = EvalStreams(valid_ids, layout.num_streams, layout.eval_tgt_len, **where)
    facts = {"train_tokens": len(train_ids), "eval_tokens": len(valid_ids), **(info or {})}
    return PretrainData(tokenizer, train, validation, facts)


def describe(corpus: CorpusSource, recipe: TokenizerRecipe, tokenizer, ids: dict, char_level: bool | None = None
             ) -> dict:
    """Facts about the data for logs and the model card (`char_level` overrides what the tokenizer says)."""
    from .corpora import BUILTIN_NAMES

    source = corpus.location
    if char_level is None and recipe.saved is not None:  # a saved tokenizer: what it is, not the recipe's kind
        char_level = is_character_level(tokenizer)
    elif char_level is None:
        char_level = recipe.kind in ("char", "byte")
    pretty = {"builtin": "the built-in offline corpus (English prose from the Python standard library's docstrings)"}
    builtin = source in BUILTIN_NAMES
    local = not builtin and os.path.exists(source)
    # a local file or folder is named by its base name (its path says nothing on another machine); only a Hub id
    # (`wikitext`, `user/name`) is linked from the card's `datasets:` metadata
    name = Path(source).resolve().name if local else source
    description = pretty.get(source, f"`{name}`" + (" (local files)" if local else "")
                             + (f" ({corpus.dataset_config_name})" if corpus.dataset_config_name else ""))
    return {
        "dataset_name": name,
        "dataset_pretty_name": name,
        "hub_dataset": None if local or builtin else source,
        "description": description,
        "tokenizer": f"{tokenizer_kind(tokenizer)}, {len(tokenizer):,} symbols"
                     + (", trained on the training split" if recipe.saved is None else ""),
        "char_level": char_level,
        "example_prompt": "The",
        "train_tokens": int(len(ids["train"])),
        "eval_tokens": int(len(ids["validation"])),
    }
