"""XLNet-style permutation language model on the Transformer-XL backbone (Yang et al. 2019).

Notation (batch-first everywhere): B batch, T segment length, M memory length, K = M + T keys, P predictions per row
(`num_predict`), d d_model, V vocabulary. The objective (Sec. 2.2, Eq. 3) maximises, over a factorization order z,
    sum_t log p(x_{z_t} | x_{z_<t}),   p(x | ...) = softmax(e(x)^T g_{z_t})
where the query stream g knows the position z_t but not the content x_{z_t} (Sec. 2.3, the two-stream update):
    g^n_{z_t} = Attn(Q = g^{n-1}_{z_t}, KV = h^{n-1}_{z_<t})      query stream (z_<t: not itself)
    h^n_{z_t} = Attn(Q = h^{n-1}_{z_t}, KV = h^{n-1}_{z_<=t})     content stream (sees itself)
with Transformer-XL's relative positions and memory, and the relative segment term (Sec. 2.5); the attention itself
is `two_stream_attention.two_stream_attention`, its masks `two_stream_attention.permutation_masks` (z_<t is what
`perm_mask` shows: the sampler hides every target from itself). Why two streams: a target must be predicted from its
position without seeing its own content, while it must show its content to the targets after it.

Layout: batch-first. `perm_mask[b, i, j] = 1`: position i may NOT see the content of position j. `target_mapping[b, m]`
is a one-hot row selecting the position of the m-th prediction (an all-zero row is padding). Memory (`mems`) is one
tensor [B, M, d_model] per layer: that layer's content-stream input, `cat(mem, h[:, :reuse_len])[-mem_len:]`.

Differences from the Transformer-XL backbone: a plain (unscaled) token embedding tied to the output layer; the query
stream g (from `mask_emb`) runs beside the content stream h through the same weights (`two_stream_attention`);
bidirectional relative positions (attn_type "bi", table K ... -T+1); the relative segment term; `bi_data`.

bi_data, as in XLNet's model code (and transformers' XLNetModel): rows [0, B/2) use the forward position table and
rows [B/2, B) the backward one (every distance negated). The model never reverses the tokens: the data pipeline puts
the reversed text in rows [B/2, B) (`modeling_xl.data.plm_layout`). The batch must therefore be even.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import ModelOutput

from .configuration_transformer_xl import TransformerXLConfig
from .dropout import Dropout
from .input_checks import check_inputs, ids_in_range, require
from .kernel_registry import kernel
from .memory import memory_like, update_memory
from .modeling_transformer_xl import PositionwiseFF, TransformerXLModelOutput, TransformerXLPreTrainedModel
from .precision import at_least_float32
from .relative_positions import relative_positions, sinusoid_table
from .two_stream_attention import Stream, TwoStreamAttention, permutation_masks, segment_mismatch


@dataclass
class TransformerXLPermutationLMOutput(ModelOutput):
    """loss: sum(CE * target_mask) / sum(target_mask); losses: CE * target_mask per prediction [B, P];
    logits: raw scores at the predictions [B, P, V] ([B, T, V] without target_mapping); mems, hidden_states (per layer
    the content stream, and the query stream when present), attentions ((content, query) probabilities per layer)."""

    loss: torch.FloatTensor | None = None
    losses: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    mems: tuple[torch.FloatTensor, ...] | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple | None = None


def check_permutation_inputs(config, batch: int, qlen: int, perm_mask, target_mapping, token_type_ids,
                             attention_mask, reuse_len) -> None:
    """Validate the permutation-LM inputs against the batch [B, T]; errors name the argument, value and expectation."""
    for name, x, shape, text in (
        ("perm_mask", perm_mask, (batch, qlen, qlen), f"[batch={batch}, seq_len={qlen}, seq_len={qlen}]"),
        ("token_type_ids", token_type_ids, (batch, qlen), f"[batch={batch}, seq_len={qlen}]"),
        ("attention_mask", attention_mask, (batch, qlen), f"[batch={batch}, seq_len={qlen}]"),
    ):
        if x is not None and tuple(x.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {text}")
    if target_mapping is not None:
        if target_mapping.dim() != 3 or target_mapping.size(0) != batch or target_mapping.size(2) != qlen:
            raise ValueError(f"target_mapping has shape {tuple(target_mapping.shape)}; expected "
                             f"[batch={batch}, num_predict, seq_len={qlen}]")
        require(((target_mapping == 0) | (target_mapping == 1)).all(-1) & (target_mapping.sum(-1) <= 1),
                "target_mapping has a row that is not one-hot; expected each row [b, m] to select one position (a 1, "
                "zeros elsewhere) or to be all zero (a padded prediction)")
    if config.bi_data and batch % 2:
        raise ValueError(f"batch size {batch} is odd; bi_data=True expects an even batch (rows [B/2, B) use the "
                         "backward position table)")
    if reuse_len is not None and config.mem_len > 0 and not 0 < reuse_len < qlen:
        raise ValueError(f"reuse_len={reuse_len} does not fit seq_len={qlen}; expected 0 < reuse_len < seq_len "
                         "(the first reuse_len tokens become the memory of the next step)")


def permutation_lm_loss(logits: torch.Tensor, labels: torch.Tensor, target_mask: torch.Tensor | None):
    """(loss, losses): losses = CE * weight per prediction, loss = sum(losses) / sum(weight), weight = target_mask
    (1 when None) times (labels != -100)."""
    weight = (labels != -100).to(logits.dtype)
    if target_mask is not None:
        weight = weight * target_mask.to(logits.dtype)
    ce = F.cross_entropy(at_least_float32(logits).flatten(0, 1), labels.flatten().long(), ignore_index=-100,
                         reduction="none")
    losses = ce.view_as(weight) * weight
    return losses.sum() / weight.sum().clamp(min=torch.finfo(weight.dtype).tiny), losses


class PermutationLMLayer(GradientCheckpointingLayer):
    """Two-stream attention, then the same feed-forward sublayer on each stream (on both streams' rows at once: one
    product per weight, one weight gradient instead of two summed)."""

    def __init__(self, config):
        super().__init__()
        self.attn = TwoStreamAttention(config)
        self.ff = PositionwiseFF(config)

    def forward(self, h, g, pos_emb, content, query, mem=None, shared_biases=None, output_attentions=False,
                content_output=True):
        """`content_output=False` (only with g): return (None, g', probs), the content stream left uncomputed."""
        out, probs = self.attn(h, g, pos_emb, content, query, mem, shared_biases, output_attentions, content_output)
        out = self.ff(out)  # [B, T + P, d]: the content stream's rows, then the query stream's (or g's alone)
        if g is None:
            return out, None, probs
        return (out[:, : h.size(1)], out[:, h.size(1) :], probs) if content_output else (None, out, probs)


class PermutationLMPreTrainedModel(TransformerXLPreTrainedModel):
    """Saves a remote-code `auto_map` naming the permutation-LM classes (the causal classes' files are copied too, as
    imports, but their weights would not match, so they are not listed). `_no_split_modules` names its layer class
    (FSDP's transformer-layer auto-wrap puts one layer in each unit)."""

    _no_split_modules = ["PermutationLMLayer"]
    saved_backbone = "bi"


class TransformerXLPermutationModel(PermutationLMPreTrainedModel):
    """The XLNet backbone: token embedding, `mask_emb`, n_layer two-stream layers with memory.

    Without `target_mapping` only the content stream runs and `last_hidden_state` is h [B, T, d] (fine-tuning,
    classification); with it, `last_hidden_state` is the query stream g at the predictions [B, P, d].
    """

    def __init__(self, config: TransformerXLConfig):
        super().__init__(config)
        if config.cutoffs or config.d_embed != config.d_model:
            raise ValueError(f"cutoffs={config.cutoffs}, d_embed={config.d_embed} are not supported by the "
                             f"permutation LM; expected adaptive=False (cutoffs []) and d_embed = d_model="
                             f"{config.d_model} (one embedding tied to the output layer, as in XLNet)")
        self.word_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.mask_emb = nn.Parameter(torch.zeros(1, 1, config.d_model))
        if not config.untie_r:  # one (u, v, s) triple shared by all layers
            self.r_w_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
            self.r_r_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
            self.r_s_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
        self.drop = Dropout(config.dropout)
        self.layers = nn.ModuleList(PermutationLMLayer(config) for _ in range(config.n_layer))
        self.post_init()

    def get_input_embeddings(self):
        return self.word_emb

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The token embedding, by the "embedding" kernel where there is one (the tied table's gradient deferred)."""
        lookup = kernel("embedding", input_ids.device.type)
        h = lookup(self.word_emb, input_ids) if lookup is not None else None
        return self.word_emb(input_ids) if h is None else h

    def set_input_embeddings(self, value):
        self.word_emb = value

    def position_embeddings(self, klen: int, qlen: int, dtype, device) -> torch.Tensor:
        """Sinusoids of the distances K ... -T+1 (bi) or K ... 0 (uni, XLNet's table), clamped: [S, R, d].
        With bi_data a second table holds the negated distances (the backward rows)."""
        if self.config.attn_type == "bi":
            pos = relative_positions(klen, qlen, self.config.clamp_len, bidirectional=True)
        else:
            pos = relative_positions(klen + 1, clamp_len=self.config.clamp_len)
        pos = pos.to(device)
        tables = torch.stack([pos, -pos]) if self.config.bi_data else pos[None]
        return sinusoid_table(tables.flatten(), self.config.d_model, dtype).view(len(tables), len(pos), -1)

    def streams(self, perm_mask, attention_mask, token_type_ids, target_mapping, batch, qlen, mlen, device):
        """The content `Stream` and, with `target_mapping`, the query `Stream` at the targets' positions."""
        content_mask, query_mask = permutation_masks(perm_mask, attention_mask, mlen, self.config.attn_type == "uni",
                                                     batch, qlen, device)
        mismatch = None if token_type_ids is None else segment_mismatch(token_type_ids, mlen)
        content = Stream(None if content_mask is None else content_mask[:, None], mismatch)
        if target_mapping is None:
            return content, None
        positions, present = target_mapping.argmax(-1), target_mapping.sum(-1)  # [B, P] each
        return content, content.rows(query_mask, positions, present)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        perm_mask: torch.Tensor | None = None,
        target_mapping: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mems: tuple[torch.FloatTensor, ...] | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        reuse_len: int | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> TransformerXLModelOutput | tuple:
        """`reuse_len` is how many leading tokens feed the next memory (None: all T). Left out, it is
        `config.reuse_len` (what pretraining used) where that fits the input (0 < reuse_len < seq_len), and all T for
        a shorter input, as transformers' XLNet does; given explicitly, it must fit (checked where there is a
        memory to feed, mem_len > 0)."""
        cfg = self.config
        output_attentions = cfg.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = cfg.output_hidden_states if output_hidden_states is None else output_hidden_states
        return_dict = cfg.return_dict if return_dict is None else return_dict
        batch, qlen = check_inputs(cfg, input_ids, inputs_embeds, mems)
        if reuse_len is None and cfg.reuse_len is not None and 0 < cfg.reuse_len < qlen:
            reuse_len = cfg.reuse_len
        check_permutation_inputs(cfg, batch, qlen, perm_mask, target_mapping, token_type_ids, attention_mask,
                                 reuse_len)
        mems = mems if mems is not None and mems[0].size(1) > 0 else None
        mlen = 0 if mems is None else mems[0].size(1)

        h = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        mems = memory_like(mems, h)
        content, query = self.streams(perm_mask, attention_mask, token_type_ids, target_mapping, batch, qlen, mlen,
                                      h.device)
        g = None if target_mapping is None else self.drop(self.mask_emb.expand(batch, target_mapping.size(1), -1))
        h = self.drop(h)
        pos_emb = self.drop(self.position_embeddings(mlen + qlen, qlen, h.dtype, h.device))
        shared = None if cfg.untie_r else (self.r_w_bias, self.r_r_bias, self.r_s_bias)

        hiddens, states, attentions = [], [], []
        for i, layer in enumerate(self.layers):
            hiddens.append(h)
            states.append(h if g is None else (h, g))
            # the last layer's content stream feeds nothing when the query stream is the output (and is not asked for)
            content_output = g is None or output_hidden_states or output_attentions or i < len(self.layers) - 1
            h, g, probs = layer(h, g, pos_emb, content, query, None if mems is None else mems[i], shared,
                                output_attentions=output_attentions, content_output=content_output)
            attentions.append(probs if g is not None else probs[0])
        states.append(h if g is None else (h, g))
        output = self.drop(h if g is None else g)

        out = TransformerXLModelOutput(
            last_hidden_state=output,
            mems=update_memory(mems, [x[:, :reuse_len] for x in hiddens], cfg.mem_len),
            hidden_states=tuple(states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )
        return out if return_dict else out.to_tuple()


class TransformerXLForPermutationLM(PermutationLMPreTrainedModel):
    """Permutation-LM pretraining head: logits only at the predictions, from the query stream; output layer tied to
    the token embedding, with its own bias. Without `target_mapping` it scores every position from the content stream
    (as transformers' XLNetLMHeadModel does)."""

    def __init__(self, config: TransformerXLConfig):
        super().__init__(config)
        self.transformer = TransformerXLPermutationModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=True)
        self._tied_weights_keys = {"lm_head.weight": "transformer.word_emb.weight"}
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head

    def output_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The tied output layer, by the "tied_output" kernel where there is one (its table's gradient deferred)."""
        tied = kernel("tied_output", hidden.device.type)
        logits = tied(self.lm_head, hidden) if tied is not None else None
        return self.lm_head(hidden) if logits is None else logits

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        perm_mask: torch.Tensor | None = None,
        target_mapping: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mems: tuple[torch.FloatTensor, ...] | None = None,
        labels: torch.LongTensor | None = None,
        target_mask: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        reuse_len: int | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> TransformerXLPermutationLMOutput | tuple:
        """labels [B, P] (the true token of each prediction; -100 ignored), target_mask [B, P] (0 for padded
        predictions); both [B, T] without target_mapping."""
        return_dict = self.config.return_dict if return_dict is None else return_dict
        # the tied table's gradient is built once, at the end of backward (the "tied_table_gradient" kernel)
        defer = kernel("tied_table_gradient", self.device.type)
        with (defer(self.transformer.word_emb, self.lm_head, input_ids, inputs_embeds) if defer is not None
              else contextlib.nullcontext()):
            outputs = self.transformer(input_ids, perm_mask, target_mapping, token_type_ids, attention_mask, mems,
                                       inputs_embeds, reuse_len, output_attentions, output_hidden_states,
                                       return_dict=True)
            logits = self.output_logits(outputs.last_hidden_state)  # [B, P, V]
        loss = losses = None
        if labels is not None:
            expected = tuple(logits.shape[:2])
            for name, x in (("labels", labels), ("target_mask", target_mask)):
                if x is not None and tuple(x.shape) != expected:
                    raise ValueError(f"{name} has shape {tuple(x.shape)}; expected [batch, num_predict] = {expected}")
            require(ids_in_range(labels, self.config.vocab_size, ignore_index=-100),
                    f"labels has ids outside [0, vocab_size={self.config.vocab_size}) (and not -100)")
            loss, losses = permutation_lm_loss(logits, labels, target_mask)
        out = TransformerXLPermutationLMOutput(loss=loss, losses=losses, logits=logits, mems=outputs.mems,
                                               hidden_states=outputs.hidden_states, attentions=outputs.attentions)
        return out if return_dict else out.to_tuple()
