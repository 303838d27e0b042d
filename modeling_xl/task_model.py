"""What every task head shares: the backbone of the config's `attn_type`, the attention-mask checks, the call into
the backbone, the pooled summary, and how outputs and memories come back.

Heads on top (`modeling_classification`, `modeling_question_answering`, `modeling_token_classification`,
`modeling_multiple_choice`) add only their layers and their loss. Their parameter names follow transformers' XLNet
heads (`sequence_summary.summary`, `logits_proj`, `qa_outputs`, `classifier`, `start_logits`, `end_logits`,
`answer_class`), so weights imported from transformers' XLNet need no renaming (`xlnet_conversion`).

Padding: `attention_mask` (1 = real token, 0 = padding) hides padding keys in attention and from pooling. With
memory, the causal backbone takes a key mask over [memory; segment]; the bidirectional one (XLNet's) only over the
segment, its memory being always visible.

Every head's `forward` takes (input_ids, attention_mask, mems, token_type_ids, inputs_embeds, <its targets>, use_mems,
output_attentions, output_hidden_states, return_dict) in this order, starts with `read` (the mask checks and the
backbone) and ends with `finish`. Heads that read documents longer than one segment (`forward_long`: classification,
tagging) share `check_documents` and `SegmentMemory`.

Shapes: B batch, T segment length, N document length, M memory length, d d_model.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.utils import ModelOutput

from .backbones import backbone_class
from .configuration_transformer_xl import TransformerXLConfig
from .dropout import Dropout
from .modeling_transformer_xl import TransformerXLPreTrainedModel


def pool_hidden(hidden: torch.Tensor, attention_mask: torch.Tensor | None, summary_type: str) -> torch.Tensor:
    """One vector per sequence from hidden [B, T, d] -> [B, d], counting only real tokens (mask 1).

    Example, T=4, hidden rows h0..h3, attention_mask [0, 1, 1, 1] (left padding):
        last -> h3, first -> h1, mean -> (h1 + h2 + h3) / 3.
    With right padding [1, 1, 0, 0]: last -> h1, first -> h0, mean -> (h0 + h1) / 2. Without a mask every token is
    real (last -> h3, as XLNet's `hidden[:, -1]`).
    """
    if attention_mask is None:
        real = torch.ones(hidden.shape[:2], dtype=torch.bool, device=hidden.device)
    else:
        real = attention_mask.to(device=hidden.device, dtype=torch.bool)
    positions = torch.arange(hidden.size(1), device=hidden.device).expand_as(real)  # [B, T]
    if summary_type == "last":
        index = torch.where(real, positions, -1).amax(dim=1)
    elif summary_type == "first":
        index = torch.where(real, positions, hidden.size(1)).amin(dim=1)
    elif summary_type == "mean":
        weights = real.to(hidden.dtype).unsqueeze(-1)  # [B, T, 1]
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
    else:
        raise ValueError(f"summary_type={summary_type!r} is invalid; expected 'last', 'first' or 'mean'")
    index = index.clamp(0, hidden.size(1) - 1)  # an all-padding row (rejected earlier) would not index out of range
    return hidden[torch.arange(hidden.size(0), device=hidden.device), index]


class SequenceSummary(nn.Module):
    """XLNet's summary of the pooled vector: dropout(tanh(Linear_{d->d}(x)))."""

    def __init__(self, config):
        super().__init__()
        self.summary = nn.Linear(config.d_model, config.d_model)
        self.activation = nn.Tanh()
        self.last_dropout = Dropout(config.classifier_dropout)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.last_dropout(self.activation(self.summary(pooled)))


def check_class_ids(labels: torch.Tensor, num_classes: int, what: str = "class ids", bound: str = "num_labels"
                    ) -> None:
    """ValueError naming the first label outside [0, num_classes) that is not -100 (ignored)."""
    bad = (labels != -100) & ((labels < 0) | (labels >= num_classes))
    if bool(bad.any()):
        raise ValueError(f"labels contains {labels[bad][0].item()}; expected {what} in [0, {bound}={num_classes}) "
                         "(or -100 to ignore)")


def check_documents(input_ids: torch.Tensor, segment_len, attention_mask: torch.Tensor | None = None,
                    **same_shape: torch.Tensor | None) -> torch.Tensor:
    """The checks of `forward_long`: documents input_ids [B, N > 0], a positive `segment_len`, an attention_mask (all
    ones when None, returned) and every tensor of `same_shape` (None: absent) shaped like input_ids."""
    if input_ids.dim() != 2 or input_ids.size(1) == 0:
        raise ValueError(f"input_ids has shape {tuple(input_ids.shape)}; expected [batch, doc_len > 0]")
    if not isinstance(segment_len, int) or isinstance(segment_len, bool) or segment_len <= 0:
        raise ValueError(f"segment_len={segment_len!r} is invalid; expected a positive integer")
    attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    for name, value in (("attention_mask", attention_mask), *same_shape.items()):
        if value is not None and tuple(value.shape) != tuple(input_ids.shape):
            raise ValueError(f"{name} has shape {tuple(value.shape)}; expected the shape of input_ids "
                             f"{tuple(input_ids.shape)}")
    return attention_mask


class SegmentMemory:
    """The memory carried from one segment of a batch of long documents to the next, with the key mask of its
    positions (1 = a real token's state, 0 = padding's), so that padding read into the memory stays hidden:
        key_mask = memory.key_mask(segment_mask)        # [B, M + T]
        out = model.encode(segment, key_mask, memory.mems)
        memory.advance(out.mems, key_mask)               # keeps the last M keys' mask"""

    def __init__(self):
        self.mems, self.mask = None, None

    def key_mask(self, segment_mask: torch.Tensor) -> torch.Tensor:
        """[B, M] memory mask and [B, T] segment mask -> [B, M+T] (no memory: the segment's mask)."""
        return segment_mask if self.mask is None else torch.cat([self.mask, segment_mask], dim=1)

    def advance(self, mems, key_mask: torch.Tensor) -> None:
        """The next memory `mems` holds the last M of the positions `key_mask` describes."""
        self.mems = mems
        self.mask = None if mems is None else key_mask[:, -mems[0].size(1):]


class TransformerXLTaskModel(TransformerXLPreTrainedModel):
    """A backbone (`transformer`, the one of `config.attn_type`) for a task head. Saved folders map `AutoModel` and
    every task head's Auto class (a head of another task starts from the same backbone), not the LM heads, whose
    weights a task folder lacks. Losses are batch means: `Trainer` scales them for gradient accumulation itself."""

    _keys_to_ignore_on_load_unexpected = [r"pos_emb\.inv_freq", r"^lm_head\.", r"^lm_loss\."]
    saved_backbone = None  # the config's attn_type
    accepts_loss_kwargs = False

    def __init__(self, config: TransformerXLConfig):
        super().__init__(config)
        self.transformer = backbone_class(config)(config)

    def get_input_embeddings(self):
        return self.transformer.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.transformer.set_input_embeddings(value)

    @staticmethod
    def segment_mask(x: torch.Tensor | None, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """The segment's part [B, T] of `attention_mask` ([B, T] or [B, M+T]), checked: 2-D, one row per sequence,
        at least one real token per row."""
        if attention_mask is None or x is None:
            return None
        if attention_mask.dim() != 2 or attention_mask.size(0) != x.size(0) or attention_mask.size(1) < x.size(1):
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}; expected [batch={x.size(0)}, "
                             f"seq_len={x.size(1)}] (or memory + seq_len)")
        segment = attention_mask[:, -x.size(1):]
        empty = (segment == 0).all(dim=1)
        if bool(empty.any()):
            raise ValueError(f"attention_mask marks no real token in sequences {empty.nonzero().flatten().tolist()}; "
                             "expected at least one real token per sequence")
        return segment

    def read(self, input_ids, attention_mask, mems, token_type_ids, inputs_embeds, output_attentions=None,
             output_hidden_states=None):
        """What every head's forward starts with: `attention_mask` checked (`segment_mask`), then the backbone
        (`encode`). Returns (the backbone's output, the segment's part of attention_mask [B, T] or None)."""
        segment_mask = self.segment_mask(input_ids if input_ids is not None else inputs_embeds, attention_mask)
        outputs = self.encode(input_ids, attention_mask, mems, token_type_ids, inputs_embeds, output_attentions,
                              output_hidden_states)
        return outputs, segment_mask

    @staticmethod
    def check_long_call(input_ids, mems, **unsupported) -> None:
        """`forward(..., segment_len=...)` reads documents with `forward_long`, which builds its own memory: it takes
        input_ids, not `mems` nor any of `unsupported` (name -> value, None when absent)."""
        given = [name for name, value in {"mems": mems, **unsupported}.items() if value is not None]
        if given or input_ids is None:
            what = ", ".join(given) if given else "no input_ids"
            raise ValueError(f"segment_len is set with {what}; expected input_ids (with attention_mask and labels): "
                             "forward_long reads the documents with a memory of its own")

    def encode(self, input_ids=None, attention_mask=None, mems=None, token_type_ids=None, inputs_embeds=None,
               output_attentions=None, output_hidden_states=None):
        """Run the backbone. The causal backbone takes a key mask over [memory; segment]; the bidirectional one (as
        XLNet) only over the segment, its memory always being visible, so padding must not have entered its memory."""
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        if attention_mask is not None and self.config.attn_type == "bi":
            x = input_ids if input_ids is not None else inputs_embeds
            if bool((attention_mask[:, : attention_mask.size(1) - x.size(1)] == 0).any()):
                raise ValueError("attention_mask hides memory positions, which the bidirectional backbone "
                                 "(attn_type='bi') cannot do (XLNet's memory is always visible); expected documents "
                                 "without padding in memory (equal lengths in a batch, or batch size 1)")
            attention_mask = attention_mask[:, -x.size(1):]
        return self.transformer(input_ids=input_ids, mems=mems, inputs_embeds=inputs_embeds,
                                output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                                return_dict=True, attention_mask=attention_mask, **extra)

    def finish(self, output_class: type[ModelOutput], backbone_output, mems, use_mems: bool | None,
               return_dict: bool | None, **fields):
        """`output_class(**fields)` with the backbone's memories, hidden states and attentions (a tuple unless
        `return_dict`). `mems` come back with `use_mems=True` or when `mems` were passed in (as XLNet's `use_mems`):
        per-layer memories in the output would otherwise be split by row by transformers' pipelines."""
        keep_mems = use_mems if use_mems is not None else mems is not None
        output = output_class(**fields, mems=backbone_output.mems if keep_mems else None,
                              hidden_states=backbone_output.hidden_states, attentions=backbone_output.attentions)
        return_dict = self.config.return_dict if return_dict is None else return_dict
        return output if return_dict else output.to_tuple()
