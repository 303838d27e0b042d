"""Multiple choice on the Transformer-XL backbone: one score per (question, choice) pair, softmax over the choices.

Inputs [B, C, L] (each question with its C choices, each pair tokenized as one sequence) are flattened to [B*C, L],
read by the backbone, pooled (`config.summary_type`, counting only real tokens, so any padding side works), summarised
(Linear d -> d, tanh, dropout) and scored by `logits_proj` (Linear d -> 1): logits [B, C]. The names are transformers'
`XLNetForMultipleChoice`'s, so its weights import unchanged.

Questions with fewer choices than others in the batch: a choice whose `attention_mask` row is all zeros is absent. It
is not read (only the present rows go through the backbone) and its logit is the dtype's lowest value, so it gets no
probability; a label naming an absent choice is an error.

Shapes: B batch, C choices, L sequence length, d d_model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from .configuration_transformer_xl import TransformerXLConfig
from .task_model import SequenceSummary, TransformerXLTaskModel, check_class_ids, pool_hidden


@dataclass
class TransformerXLMultipleChoiceOutput(ModelOutput):
    """loss (with labels); logits [B, C]; mems (per layer [B*C, M, d]), hidden_states, attentions."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    mems: tuple[torch.FloatTensor, ...] | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


def flatten_choices(value: torch.Tensor | None, name: str, shape: tuple[int, ...]) -> torch.Tensor | None:
    """[B, C, L, ...] -> [B*C, L, ...], checking the leading [B, C, L] against `shape`."""
    if value is None:
        return None
    if tuple(value.shape[:3]) != shape:
        raise ValueError(f"{name} has shape {tuple(value.shape)}; expected [batch, num_choices, seq_len] = "
                         f"{list(shape)} like input_ids")
    return value.reshape(shape[0] * shape[1], *value.shape[2:])


class TransformerXLForMultipleChoice(TransformerXLTaskModel):
    """Backbone + pooling + sequence summary + `logits_proj` [d -> 1] per choice."""

    def __init__(self, config: TransformerXLConfig):
        super().__init__(config)
        self.sequence_summary = SequenceSummary(config)
        self.logits_proj = nn.Linear(config.d_model, 1)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mems: tuple[torch.FloatTensor, ...] | None = None,
        token_type_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_mems: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> TransformerXLMultipleChoiceOutput | tuple:
        """input_ids (or inputs_embeds) [B, C, L(, d)]; attention_mask, token_type_ids [B, C, L]; labels [B]: the
        index of the right choice."""
        x = input_ids if input_ids is not None else inputs_embeds
        if x is None or x.dim() < 3:
            raise ValueError(f"input_ids has shape {None if x is None else tuple(x.shape)}; expected [batch, "
                             "num_choices, seq_len]")
        shape = tuple(x.shape[:3])
        batch, choices = shape[:2]
        flat = {name: flatten_choices(value, name, shape) for name, value in
                (("input_ids", input_ids), ("inputs_embeds", inputs_embeds), ("attention_mask", attention_mask),
                 ("token_type_ids", token_type_ids))}
        present = present_choices(flat["attention_mask"], batch, choices)  # [B*C] or None
        keep = None if present is None or bool(present.all()) else present.nonzero().flatten()
        if keep is not None:
            if mems is not None or use_mems:
                raise ValueError("questions with absent choices (an all-zero attention_mask row) cannot use mems; "
                                 "expected the same number of choices in every question of the batch to use mems")
            flat = {name: None if value is None else value[keep] for name, value in flat.items()}
        outputs, segment_mask = self.read(flat["input_ids"], flat["attention_mask"], mems, flat["token_type_ids"],
                                          flat["inputs_embeds"], output_attentions, output_hidden_states)
        pooled = pool_hidden(outputs.last_hidden_state, segment_mask, self.config.summary_type)
        scores = self.logits_proj(self.sequence_summary(pooled)).squeeze(-1)  # [present rows]
        if keep is None:
            logits = scores.view(batch, choices)
        else:  # an absent choice scores the lowest value: never chosen, no probability
            logits = scores.new_full((batch * choices,), torch.finfo(scores.dtype).min)
            logits = logits.index_put((keep,), scores).view(batch, choices)
        loss = None if labels is None else choice_loss(logits, labels, present)
        return self.finish(TransformerXLMultipleChoiceOutput, outputs, mems, use_mems, return_dict, loss=loss,
                           logits=logits)


def present_choices(attention_mask: torch.Tensor | None, batch: int, choices: int) -> torch.Tensor | None:
    """[B*C] booleans: the choices with at least one real token (None without a mask: all present). Refuses a
    question with no present choice."""
    if attention_mask is None:
        return None
    present = attention_mask.ne(0).any(dim=1)
    missing = (~present.view(batch, choices)).all(dim=1)
    if bool(missing.any()):
        raise ValueError(f"attention_mask marks no real token in any choice of questions "
                         f"{missing.nonzero().flatten().tolist()}; expected at least one choice per question")
    return present


def choice_loss(logits: torch.Tensor, labels: torch.Tensor, present: torch.Tensor | None) -> torch.Tensor:
    """Cross-entropy of logits [B, C] against labels [B] (choice indices, -100 ignored), each naming a present
    choice."""
    batch, choices = logits.shape
    labels = labels.reshape(-1).to(logits.device)
    if labels.numel() != batch:
        raise ValueError(f"labels has {labels.numel()} values; expected one choice index per question ({batch})")
    check_class_ids(labels, choices, what="choice indices", bound="num_choices")
    if present is not None:
        chosen = present.view(batch, choices)[torch.arange(batch, device=labels.device), labels.clamp(min=0)]
        absent = (labels != -100) & ~chosen.to(labels.device)
        if bool(absent.any()):
            row = absent.nonzero().flatten()[0].item()
            raise ValueError(f"labels[{row}]={labels[row].item()} names an absent choice (its attention_mask row is "
                             "all zeros); expected the index of a present choice")
    return F.cross_entropy(logits.float(), labels.long(), ignore_index=-100)
