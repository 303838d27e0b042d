"""Token classification (tagging: named entities, parts of speech) on the Transformer-XL backbone.

Backbone -> dropout (`config.classifier_dropout`) -> `classifier` (Linear d -> num_labels) at every token; the name
is transformers' `XLNetForTokenClassification`'s, so its weights import unchanged. Loss: cross-entropy over the tokens
whose label is not -100 (scripts label a word's first sub-token and give -100 to the rest and to special tokens).

Long documents: with `segment_len`, a document [B, N] is tagged `segment_len` tokens at a time with the memory
(`config.mem_len`) carried from segment to segment, so each token's tag can depend on up to n_layer * mem_len tokens
before its segment. Unlike sequence classification, every segment is trained (each has labels); the memory is
detached (Dai et al. 2019, Sec. 3.2), so a segment's gradient stays within it.

Shapes: B batch, T segment length, N document length, d d_model, C num_labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from .configuration_transformer_xl import TransformerXLConfig
from .dropout import Dropout
from .task_model import SegmentMemory, TransformerXLTaskModel, check_class_ids, check_documents


@dataclass
class TransformerXLTokenClassifierOutput(ModelOutput):
    """loss (with labels); logits [B, T, C] ([B, N, C] with segment_len); mems, hidden_states, attentions."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    mems: tuple[torch.FloatTensor, ...] | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


class TransformerXLForTokenClassification(TransformerXLTaskModel):
    """Backbone + dropout + `classifier` [d -> num_labels] at every token."""

    def __init__(self, config: TransformerXLConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.dropout = Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.d_model, config.num_labels)
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
        segment_len: int | None = None,
        **kwargs,
    ) -> TransformerXLTokenClassifierOutput | tuple:
        """`labels` [B, T]: a class id per token, -100 where no tag is predicted. With `segment_len`, the documents
        (input_ids [B, N], attention_mask and labels alike) are tagged segment by segment with memory
        (`forward_long`), through the same call (so a wrapper such as DDP sees it)."""
        if segment_len is not None:
            self.check_long_call(input_ids, mems, inputs_embeds=inputs_embeds)
            out = self.forward_long(input_ids, attention_mask, token_type_ids, labels, segment_len)
            return_dict = self.config.return_dict if return_dict is None else return_dict
            return out if return_dict else out.to_tuple()
        outputs, _ = self.read(input_ids, attention_mask, mems, token_type_ids, inputs_embeds, output_attentions,
                               output_hidden_states)
        logits = self.classifier(self.dropout(outputs.last_hidden_state))  # [B, T, C]
        loss = None if labels is None else self.tagging_loss(logits, labels)
        return self.finish(TransformerXLTokenClassifierOutput, outputs, mems, use_mems, return_dict, loss=loss,
                           logits=logits)

    def tagging_loss(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy over the labelled tokens (labels [B, T] of class ids or -100); checked first."""
        if tuple(labels.shape) != tuple(logits.shape[:2]):
            raise ValueError(f"labels has shape {tuple(labels.shape)}; expected one label per token "
                             f"{tuple(logits.shape[:2])} (-100 where a token has no tag)")
        labels = labels.to(logits.device)
        check_class_ids(labels, self.num_labels, what="tag ids")
        if reduction == "mean":
            return self.loss_function(logits, labels, self.config)
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten().long(), ignore_index=-100,
                               reduction=reduction)

    def forward_long(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                     token_type_ids: torch.LongTensor | None = None, labels: torch.LongTensor | None = None,
                     segment_len: int = 128) -> TransformerXLTokenClassifierOutput:
        """Tag documents [B, N] `segment_len` tokens at a time, left to right, with memory; logits [B, N, C] and the
        mean loss over every labelled token of the documents. Padding must be at the end of each row (right
        padding): every segment's real tokens then continue the memory; a segment with no real token in a row is
        skipped by its mask (the memory then keeps that row's last real states, as its mask says)."""
        attention_mask = check_documents(input_ids, segment_len, attention_mask, token_type_ids=token_type_ids,
                                         labels=labels)
        real = attention_mask.ne(0)
        if bool((real[:, :-1].long() < real[:, 1:].long()).any()):
            raise ValueError("attention_mask has padding before real tokens; expected right padding (real tokens "
                             "first) for segment-by-segment tagging")
        if self.config.attn_type == "bi" and bool((~real).any()):
            raise ValueError("documents of different lengths in one batch: the bidirectional backbone "
                             "(attn_type='bi') cannot hide memory positions; expected equal lengths (or batch size 1)")
        memory, logits, losses, count = SegmentMemory(), [], [], 0
        for start in range(0, input_ids.size(1), segment_len):
            window = slice(start, start + segment_len)
            segment_real = real[:, window]
            key_mask = memory.key_mask(segment_real.long())
            active = segment_real.any(dim=1)
            attended = key_mask
            if not bool(active.all()):  # rows already finished: one visible dummy key keeps their attention finite
                attended = key_mask.clone()
                attended[~active, -1] = 1
            outputs = self.encode(input_ids[:, window], attended, memory.mems,
                                  None if token_type_ids is None else token_type_ids[:, window])
            segment_logits = self.classifier(self.dropout(outputs.last_hidden_state))
            logits.append(segment_logits)
            if labels is not None:
                segment_labels = labels[:, window].masked_fill(~segment_real, -100)
                losses.append(self.tagging_loss(segment_logits, segment_labels, reduction="sum"))
                count += int(segment_labels.ne(-100).sum())
            memory.advance(outputs.mems, key_mask)
        loss = torch.stack(losses).sum() / max(count, 1) if labels is not None else None
        return TransformerXLTokenClassifierOutput(loss=loss, logits=torch.cat(logits, dim=1))
