"""Span question answering on the Transformer-XL backbone (XLNet-style bidirectional or causal).

Two heads, as transformers' XLNet has them (same parameter and output names, so imported XLNet weights and
transformers' post-processing apply unchanged):

- `TransformerXLForQuestionAnsweringSimple` (what `AutoModelForQuestionAnswering` builds, and what `run_qa.py` reads):
  one Linear d -> 2 gives start and end logits per token; loss = mean of the two cross-entropies, positions outside
  the window (>= T) ignored.
- `TransformerXLForQuestionAnswering`: XLNet's SQuAD head (Yang et al. 2019, the released `run_squad.py`).
      start logit_i  = w_s . h_i                                       masked where p_mask_i = 1
      end logit_j|s  = w_e . LayerNorm(tanh(W_0 [h_j; h_s]))           conditioned on the start state h_s
      answer class   = w_c . tanh(W_1 [h_start; h_cls])                is_impossible, from the <cls> state
  Training conditions the end on the true start. Inference keeps the `start_n_top` likeliest starts and, for each,
  the `end_n_top` likeliest ends (a beam of start_n_top x end_n_top spans); the answer class reads the expected
  start state (the start-probability-weighted mean of h). As in transformers, the `*_log_probs` fields hold
  probabilities (softmax outputs), so its beam-search post-processing applies unchanged.
  Speed: W_0 [h_j; h_s] is computed as W_0^h h_j + W_0^s h_s: one product per token and one per start candidate,
  added with broadcasting, instead of a product over the [B, T, start_n_top, 2d] concatenation.

Layout: XLNet reads `P <sep> Q <sep> <cls>` (left padding, <cls> last). The causal backbone sees only what precedes a
token, so it should read the question first (`Q <sep> P`): `scripts/` choose that by the config's `attn_type`.

Shapes: B batch, T segment length, d d_model, k = start_n_top, e = end_n_top.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from .configuration_transformer_xl import TransformerXLConfig
from .task_model import TransformerXLTaskModel


@dataclass
class TransformerXLQuestionAnsweringSimpleOutput(ModelOutput):
    """loss (with start and end positions); start_logits, end_logits [B, T]; mems, hidden_states, attentions."""

    loss: torch.FloatTensor | None = None
    start_logits: torch.FloatTensor | None = None
    end_logits: torch.FloatTensor | None = None
    mems: tuple[torch.FloatTensor, ...] | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class TransformerXLQuestionAnsweringOutput(ModelOutput):
    """Training: loss. Inference: start_top_log_probs, start_top_index [B, k]; end_top_log_probs, end_top_index
    [B, e * k] (row r = end rank r // k of start candidate r % k); cls_logits [B]. As transformers' XLNet, the
    `*_log_probs` are probabilities."""

    loss: torch.FloatTensor | None = None
    start_top_log_probs: torch.FloatTensor | None = None
    start_top_index: torch.LongTensor | None = None
    end_top_log_probs: torch.FloatTensor | None = None
    end_top_index: torch.LongTensor | None = None
    cls_logits: torch.FloatTensor | None = None
    mems: tuple[torch.FloatTensor, ...] | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


def exclude(logits: torch.Tensor, p_mask: torch.Tensor | None) -> torch.Tensor:
    """Logits with the positions where p_mask is 1 set to -1e30 (-65500 in float16), as XLNet masks them."""
    if p_mask is None:
        return logits
    floor = -65500.0 if logits.dtype == torch.float16 else -1e30
    return torch.where(p_mask.to(logits.device) != 0, torch.full_like(logits, floor), logits)


def check_positions(positions: torch.Tensor, batch: int, name: str, upper: int | None = None) -> torch.Tensor:
    """positions [B] (or [B, 1]) as a flat long tensor; with `upper`, ValueError naming a position outside
    [0, upper)."""
    positions = positions.reshape(-1) if positions.dim() > 1 else positions
    if positions.dim() != 1 or positions.numel() != batch:
        raise ValueError(f"{name} has shape {tuple(positions.shape)}; expected one position per sequence ({batch})")
    if upper is not None:
        bad = (positions < 0) | (positions >= upper)
        if bool(bad.any()):
            raise ValueError(f"{name} contains {positions[bad][0].item()}; expected token positions in [0, {upper}) "
                             "(the answer inside the window)")
    return positions.long()


class StartLogits(nn.Module):
    """w_s . h_t for every token: [B, T, d] -> [B, T]."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.d_model, 1)

    def forward(self, hidden: torch.Tensor, p_mask: torch.Tensor | None = None) -> torch.Tensor:
        return exclude(self.dense(hidden).squeeze(-1), p_mask)


class EndLogits(nn.Module):
    """End logits conditioned on start states: w_e . LayerNorm(tanh(W_0 [h_j; h_s])) for every token j and start s.
    `dense_0` is transformers' Linear 2d -> d over the concatenation; it is applied as two products (token part,
    start part) added with broadcasting."""

    def __init__(self, config):
        super().__init__()
        self.dense_0 = nn.Linear(2 * config.d_model, config.d_model)
        self.activation = nn.Tanh()
        self.LayerNorm = nn.LayerNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.dense_1 = nn.Linear(config.d_model, 1)

    def forward(self, hidden: torch.Tensor, start_states: torch.Tensor, p_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        """hidden [B, T, d]; start_states [B, k, d] -> logits [B, T, k] (p_mask [B, T] excludes tokens)."""
        d = hidden.size(-1)
        token_part = F.linear(hidden, self.dense_0.weight[:, :d], self.dense_0.bias)  # [B, T, d]
        start_part = F.linear(start_states, self.dense_0.weight[:, d:])  # [B, k, d]
        x = self.LayerNorm(self.activation(token_part.unsqueeze(2) + start_part.unsqueeze(1)))  # [B, T, k, d]
        logits = self.dense_1(x).squeeze(-1)  # [B, T, k]
        return exclude(logits, None if p_mask is None else p_mask.unsqueeze(-1))


class AnswerClass(nn.Module):
    """Answerability logit from a start state and the <cls> state: w_c . tanh(W_1 [h_start; h_cls]) -> [B]."""

    def __init__(self, config):
        super().__init__()
        self.dense_0 = nn.Linear(2 * config.d_model, config.d_model)
        self.activation = nn.Tanh()
        self.dense_1 = nn.Linear(config.d_model, 1, bias=False)

    def forward(self, start_state: torch.Tensor, cls_state: torch.Tensor) -> torch.Tensor:
        return self.dense_1(self.activation(self.dense_0(torch.cat([start_state, cls_state], dim=-1)))).squeeze(-1)


def rows(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """hidden [B, T, d] at one position per row (index [B]) -> [B, d], or several (index [B, k]) -> [B, k, d]."""
    if index.dim() == 1:
        return hidden[torch.arange(hidden.size(0), device=hidden.device), index]
    return hidden.gather(1, index.unsqueeze(-1).expand(-1, -1, hidden.size(-1)))


class TransformerXLForQuestionAnsweringSimple(TransformerXLTaskModel):
    """Backbone + `qa_outputs` (Linear d -> 2): start and end logits per token."""

    def __init__(self, config: TransformerXLConfig):
        super().__init__(config)
        self.qa_outputs = nn.Linear(config.d_model, 2)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mems: tuple[torch.FloatTensor, ...] | None = None,
        token_type_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        use_mems: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> TransformerXLQuestionAnsweringSimpleOutput | tuple:
        """`start_positions`, `end_positions` [B]: the answer's first and last token; a position outside the window
        (>= T, as transformers clamps it) is ignored in the loss."""
        outputs, _ = self.read(input_ids, attention_mask, mems, token_type_ids, inputs_embeds, output_attentions,
                               output_hidden_states)
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).unbind(dim=-1)  # [B, T] each
        loss = None
        if start_positions is not None and end_positions is not None:
            batch = start_logits.size(0)
            start = check_positions(start_positions, batch, "start_positions").to(start_logits.device)
            end = check_positions(end_positions, batch, "end_positions").to(end_logits.device)
            loss = self.loss_function(start_logits, end_logits, start, end)
        return self.finish(TransformerXLQuestionAnsweringSimpleOutput, outputs, mems, use_mems, return_dict,
                           loss=loss, start_logits=start_logits.contiguous(), end_logits=end_logits.contiguous())


class TransformerXLForQuestionAnswering(TransformerXLTaskModel):
    """XLNet's SQuAD head: start logits, end logits conditioned on the start, an answer class from <cls>; beam search
    over `config.start_n_top` x `config.end_n_top` spans at inference."""

    def __init__(self, config: TransformerXLConfig):
        super().__init__(config)
        self.start_n_top = config.start_n_top
        self.end_n_top = config.end_n_top
        self.start_logits = StartLogits(config)
        self.end_logits = EndLogits(config)
        self.answer_class = AnswerClass(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mems: tuple[torch.FloatTensor, ...] | None = None,
        token_type_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        is_impossible: torch.Tensor | None = None,
        cls_index: torch.LongTensor | None = None,
        p_mask: torch.Tensor | None = None,
        use_mems: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> TransformerXLQuestionAnsweringOutput | tuple:
        """`p_mask` [B, T]: 1 where no answer may start or end (question, special tokens, padding). `cls_index` [B]:
        where <cls> is (default: the last token). Training (`start_positions` and `end_positions` [B], inside the
        window): loss = (CE_start + CE_end) / 2, plus 0.5 * BCE(answer class, `is_impossible`) when `is_impossible`
        and `cls_index` are given, as XLNet."""
        outputs, _ = self.read(input_ids, attention_mask, mems, token_type_ids, inputs_embeds, output_attentions,
                               output_hidden_states)
        hidden = outputs.last_hidden_state  # [B, T, d]
        batch, length = hidden.shape[:2]
        if p_mask is not None and tuple(p_mask.shape) != (batch, length):
            raise ValueError(f"p_mask has shape {tuple(p_mask.shape)}; expected [batch={batch}, seq_len={length}]")
        if cls_index is not None:
            cls_index = check_positions(cls_index, batch, "cls_index", length).to(hidden.device)
        cls_state = hidden[:, -1] if cls_index is None else rows(hidden, cls_index)  # [B, d]
        start_logits = self.start_logits(hidden, p_mask)  # [B, T]
        if start_positions is not None and end_positions is not None:
            fields = {"loss": self.span_loss(hidden, start_logits, start_positions, end_positions, p_mask, cls_state,
                                             None if cls_index is None else is_impossible)}
        else:
            fields = self.beam(hidden, start_logits, p_mask, cls_state)
        return self.finish(TransformerXLQuestionAnsweringOutput, outputs, mems, use_mems, return_dict, **fields)

    def span_loss(self, hidden, start_logits, start_positions, end_positions, p_mask, cls_state, is_impossible):
        """Training: (CE_start + CE_end) / 2, the end logits conditioned on the true start state; plus 0.5 *
        BCE(answer class, `is_impossible`) when given, as XLNet."""
        batch, length = hidden.shape[:2]
        start = check_positions(start_positions, batch, "start_positions", length).to(hidden.device)
        end = check_positions(end_positions, batch, "end_positions", length).to(hidden.device)
        start_state = rows(hidden, start)  # [B, d]
        end_logits = self.end_logits(hidden, start_state.unsqueeze(1), p_mask).squeeze(-1)  # [B, T]
        loss = (F.cross_entropy(start_logits, start) + F.cross_entropy(end_logits, end)) / 2
        if is_impossible is not None:
            target = is_impossible.reshape(-1).to(device=hidden.device, dtype=start_logits.dtype)
            loss = loss + 0.5 * F.binary_cross_entropy_with_logits(self.answer_class(start_state, cls_state), target)
        return loss

    def beam(self, hidden, start_logits, p_mask, cls_state) -> dict:
        """Inference: the `start_n_top` most probable starts, for each the `end_n_top` most probable ends
        conditioned on it, and the answer class from the start-probability-weighted state."""
        length = hidden.size(1)
        start_probs = start_logits.softmax(dim=-1)  # [B, T]
        top_start_probs, top_start = start_probs.topk(min(self.start_n_top, length), dim=-1)  # [B, k]
        end_probs = self.end_logits(hidden, rows(hidden, top_start), p_mask).softmax(dim=1)  # [B, T, k]
        top_end_probs, top_end = end_probs.topk(min(self.end_n_top, length), dim=1)  # [B, e, k]
        expected_start = torch.einsum("btd,bt->bd", hidden, start_probs)  # [B, d]
        return dict(start_top_log_probs=top_start_probs, start_top_index=top_start,
                    end_top_log_probs=top_end_probs.flatten(1), end_top_index=top_end.flatten(1),
                    cls_logits=self.answer_class(expected_start, cls_state))
