"""Sequence classification on the Transformer-XL backbone (and XLNet-style bidirectional checkpoints).

Pipeline: backbone -> pool one vector per sequence (`summary_type`: last / first / mean real token) -> XLNet's sequence
summary (Linear d_model -> d_model, tanh, dropout) -> Linear to `num_labels`. The head's parameter names follow
transformers' `XLNetForSequenceClassification` (`sequence_summary.summary`, `logits_proj`), so imported XLNet weights
need no renaming for the head.

Padding: `attention_mask` (1 = real token, 0 = padding) hides padding keys in attention and from the pooling. XLNet
fine-tunes with left padding and `<cls>` last; then "last" is simply position T-1, and with right padding it is the
last real token. Long documents: `forward_long` reads a document segment by segment, carrying memory, and classifies
from the last segment, so every token of a document longer than one segment can influence the label.

Shapes: B batch, T segment length, N document length, M memory length, d d_model, C num_labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from .configuration_transformer_xl import TransformerXLConfig
from .memory import memory_gradient
from .task_model import (
    SegmentMemory,
    SequenceSummary,
    TransformerXLTaskModel,
    check_class_ids,
    check_documents,
    pool_hidden,
)


@dataclass
class TransformerXLSequenceClassifierOutput(ModelOutput):
    """loss (with labels); logits [B, C]; mems for a following segment; hidden_states / attentions on request."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    mems: tuple[torch.FloatTensor, ...] | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


def left_align(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move every row's real tokens to the end, keeping their order (padding first), for segment-wise reading.

    Example: ids [[5, 6, 0, 0]], mask [[1, 1, 0, 0]] -> ids [[0, 0, 5, 6]], mask [[0, 0, 1, 1]].
    """
    order = torch.sort(attention_mask.to(torch.int8), dim=1, stable=True).indices  # zeros first, then ones
    return input_ids.gather(1, order), attention_mask.gather(1, order)


def infer_problem_type(num_labels: int, labels: torch.Tensor) -> str:
    """As transformers: one output -> regression; integer labels -> single label; float labels -> multi label."""
    if num_labels == 1:
        return "regression"
    if labels.dtype in (torch.long, torch.int, torch.int16, torch.int8, torch.uint8):
        return "single_label_classification"
    return "multi_label_classification"


def classification_loss(logits: torch.Tensor, labels: torch.Tensor, problem_type: str) -> torch.Tensor:
    """MSE (regression), cross-entropy (single label, class ids) or BCE-with-logits (multi label, 0/1 per class)."""
    batch, num_labels = logits.shape
    labels = labels.to(logits.device)
    if problem_type == "regression":
        if labels.numel() != batch * num_labels:
            raise ValueError(f"labels has shape {tuple(labels.shape)}; expected {batch} x {num_labels} regression "
                             "targets")
        return F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype).view_as(logits.squeeze(-1)))
    if problem_type == "single_label_classification":
        labels = labels.view(-1)
        if labels.numel() != batch:
            raise ValueError(f"labels has shape {tuple(labels.shape)}; expected one class id per sequence ({batch})")
        check_class_ids(labels, num_labels)
        return F.cross_entropy(logits, labels.long(), ignore_index=-100)
    if problem_type == "multi_label_classification":
        if tuple(labels.shape) != (batch, num_labels):
            raise ValueError(f"labels has shape {tuple(labels.shape)}; expected [batch={batch}, num_labels="
                             f"{num_labels}] of 0/1 targets")
        return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
    raise ValueError(f"problem_type={problem_type!r} is invalid; expected 'regression', "
                     "'single_label_classification' or 'multi_label_classification'")


class TransformerXLForSequenceClassification(TransformerXLTaskModel):
    """Backbone + pooling (`config.summary_type`) + sequence summary + `logits_proj` [d -> num_labels]."""

    def __init__(self, config: TransformerXLConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.sequence_summary = SequenceSummary(config)
        self.logits_proj = nn.Linear(config.d_model, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mems: tuple[torch.FloatTensor, ...] | None = None,
        token_type_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.Tensor | None = None,
        use_mems: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        segment_len: int | None = None,
        detach_memory: bool = False,
        **kwargs,
    ) -> TransformerXLSequenceClassifierOutput | tuple:
        """`attention_mask` [B, T] (or [B, M+T] with memory) 1 = real token; `labels` [B] class ids, [B, C] 0/1
        targets (multi label) or [B] / [B, 1] floats (regression, num_labels == 1). With `segment_len`, the
        documents are read `segment_len` tokens at a time with memory (`forward_long`), through the same call (so
        a wrapper such as DDP sees it). `mems` come back with `use_mems=True` or when `mems` were passed in (as
        XLNet's `use_mems`): a classification is usually one call, and per-layer memories in the output would be
        split by row by transformers' pipelines. `detach_memory`: see `forward_long`."""
        return_dict = self.config.return_dict if return_dict is None else return_dict
        if segment_len is not None:
            self.check_long_call(input_ids, mems, token_type_ids=token_type_ids)
            out = self.forward_long(input_ids, attention_mask=attention_mask, labels=labels, segment_len=segment_len,
                                    detach_memory=detach_memory)
            return out if return_dict else out.to_tuple()
        outputs, segment_mask = self.read(input_ids, attention_mask, mems, token_type_ids, inputs_embeds,
                                          output_attentions, output_hidden_states)
        pooled = pool_hidden(outputs.last_hidden_state, segment_mask, self.config.summary_type)  # [B, d]
        logits = self.logits_proj(self.sequence_summary(pooled))  # [B, C]
        loss = None
        if labels is not None:
            if self.config.problem_type is None:
                self.config.problem_type = infer_problem_type(self.num_labels, labels)
            loss = classification_loss(logits, labels, self.config.problem_type)
        return self.finish(TransformerXLSequenceClassifierOutput, outputs, mems, use_mems, return_dict, loss=loss,
                           logits=logits)

    def forward_long(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        segment_len: int = 128,
        detach_memory: bool = False,
    ) -> TransformerXLSequenceClassifierOutput:
        """Classify documents [B, N] longer than one segment: read them `segment_len` tokens at a time with memory
        (`config.mem_len`) and classify from the last segment.

        Each row's real tokens are moved to the end (`left_align`), and the first segment is the short one (N mod
        `segment_len` tokens), so the last segment holds the end of every document and nothing is padded. A shorter
        row's padding stays hidden as memory too (`task_model.SegmentMemory`; the bidirectional backbone cannot hide
        memory, so there every row of a batch must have the same length).
        Gradients: the one loss is at the end of the document, so the memory keeps its graph
        (`memory.memory_gradient`) and the gradient reaches every segment, as one long read's would; the activations
        of every segment are kept until backward. `detach_memory=True` is the paper's memory (Dai et al. 2019, Sec.
        3.2): earlier segments run without gradient, only the last segment's forward is trained. It costs one
        segment's activations, but evidence that only earlier segments hold is then learned only as far as their
        untrained features show it: a cue in the first of 2 segments, debug model, 150 steps, 5 draws: 0.22-0.59
        accuracy detached (chance 0.25) against 0.50-0.99 for one long read
        (tests/test_finetuning.py::test_long_document_learns_evidence_that_truncation_cuts, docs/testing.md).
        """
        attention_mask = check_documents(input_ids, segment_len, attention_mask)
        lengths = attention_mask.ne(0).sum(dim=1)
        if bool((lengths == 0).any()):
            empty = (lengths == 0).nonzero().flatten().tolist()
            raise ValueError(f"documents {empty} are empty (no real token in attention_mask); expected at least one "
                             "token per document")
        input_ids, attention_mask = left_align(input_ids, attention_mask.ne(0).long())
        doc_len = input_ids.size(1)
        edges = [0, *range(doc_len % segment_len or segment_len, doc_len, segment_len), doc_len]
        memory = SegmentMemory()
        reading = torch.no_grad if detach_memory or not torch.is_grad_enabled() else memory_gradient
        for start, end in zip(edges[:-2], edges[1:-1]):  # every segment but the last
            key_mask = memory.key_mask(attention_mask[:, start:end])  # [B, M+T]
            with reading():
                memory.advance(self.encode(input_ids[:, start:end], key_mask, memory.mems).mems, key_mask)
        window = slice(edges[-2], None)
        return self(input_ids[:, window], attention_mask=memory.key_mask(attention_mask[:, window]), mems=memory.mems,
                    labels=labels, return_dict=True)
