"""Transformer-XL backbone and causal-LM head (Dai et al. 2019) for transformers 5.

Notation (batch-first everywhere): B batch, T segment length, M memory length, K = M + T keys, d d_model,
H heads, D d_head, V vocabulary.

One layer n (the summary equations at the end of Sec. 3.3), with SG the stop-gradient:
    h~ = [SG(mem^{n-1}); h^{n-1}]                       memory and segment, [B, K, d]
    q, k, v = h^{n-1} W_q, h~ W_k, h~ W_v               queries from the segment only
    A = (q + u) k^T + rel_shift((q + v) (W_R R)^T)      `relative_attention.relative_attention`
    a = LayerNorm(h^{n-1} + softmax(A / sqrt(D), causal mask) v W_o)
    h^n = LayerNorm(a + FF(a))                          (pre-LN: the LayerNorms move in front of each sublayer)
Why a memory: each segment attends to the previous segments' states without backpropagating into them, so the
context grows with depth and evaluation reuses states instead of recomputing them (Sec. 3.2).
Memory (`mems`) is a tuple with one tensor [B, M, d] per layer: the *input* of that layer on the previous segment(s),
`update_memory`: cat(mem, h)[-mem_len:], detached. It is passed in and returned; without gradients each layer also
caches the keys and values of the memory it last returned (`inference_cache`), reused only when that same tensor
comes back unmodified.
The output is the adaptive softmax (`adaptive_softmax`, Grave et al. 2017) tied to the adaptive input.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import ModelOutput

from .adaptive_softmax import AdaptiveEmbedding, AdaptiveLogSoftmax, OutputTable, resize_vocabulary, tied_weight_map
from .auto_map import auto_map_for, complete_auto_map, share_weight_files
from .checkpoint_import import import_checkpoint
from .configuration_transformer_xl import TransformerXLConfig
from .dropout import Dropout, relu_dropout
from .inference_cache import PositionTable
from .inference_cache import enabled as cache_enabled
from .input_checks import check_inputs, ids_in_range, require
from .kernel_registry import kernel
from .layer_norm import LayerNorm
from .memory import memory_like, update_memory
from .memory_generation import MemoryGenerationMixin
from .peft_defaults import register_lora_targets
from .relative_attention import RelativeMultiHeadAttention
from .relative_positions import causal_mask, with_key_padding
from .size_estimate import check_model_fits
from .static_decoding import DecodeState

register_lora_targets()  # peft's default LoRA targets for this model_type, when peft is installed


@dataclass
class TransformerXLModelOutput(ModelOutput):
    """last_hidden_state [B, T, d]; mems: n_layer tensors [B, M', d] for the next segment (None when mem_len == 0);
    hidden_states: n_layer + 1 tensors [B, T, d] on request; attentions: n_layer tensors [B, H, T, K] on request."""

    last_hidden_state: torch.FloatTensor | None = None
    mems: tuple[torch.FloatTensor, ...] | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class TransformerXLCausalLMOutput(ModelOutput):
    """loss: mean NLL over predicted tokens; losses: per-token NLL [B, T] ([B, T-1] with `labels`), 0 where ignored;
    logits: log-probabilities [B, T, V] (only without labels); mems, hidden_states, attentions as the backbone."""

    loss: torch.FloatTensor | None = None
    losses: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    mems: tuple[torch.FloatTensor, ...] | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


class PositionwiseFF(nn.Module):
    """Feed-forward sublayer with residual and LayerNorm: LN(x + FF(x)) or x + FF(LN(x))."""

    def __init__(self, config):
        super().__init__()
        self.layer_1 = nn.Linear(config.d_model, config.d_inner)
        self.layer_2 = nn.Linear(config.d_inner, config.d_model)
        self.layer_norm = LayerNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.drop = Dropout(config.dropout)
        self.act = nn.ReLU() if config.ff_activation == "relu" else nn.GELU()
        self.pre_lnorm = config.pre_lnorm

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self.layer_norm(h) if self.pre_lnorm else h
        if isinstance(self.act, nn.ReLU):  # the "relu_dropout" kernel: on the CPU one node that saves its output
            inner = relu_dropout(self.layer_1(x), self.drop.p, self.training)
        else:
            inner = self.drop(self.act(self.layer_1(x)))
        out = h + self.drop(self.layer_2(inner))
        return out if self.pre_lnorm else self.layer_norm(out)


class TransformerXLLayer(GradientCheckpointingLayer):
    """One decoder layer: relative attention over [memory; segment], then the feed-forward sublayer."""

    def __init__(self, config):
        super().__init__()
        self.attn = RelativeMultiHeadAttention(config)
        self.ff = PositionwiseFF(config)

    def forward(self, h, pos_emb, attn_mask, mem=None, r_w_bias=None, r_r_bias=None, output_attentions=False,
                use_cache=False):
        h, probs = self.attn(h, pos_emb, attn_mask, mem, r_w_bias, r_r_bias, output_attentions, use_cache)
        return self.ff(h), probs


class TransformerXLPreTrainedModel(PreTrainedModel):
    config_class = TransformerXLConfig
    config: TransformerXLConfig
    base_model_prefix = "transformer"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TransformerXLLayer"]
    _supports_sdpa = True
    _keys_to_ignore_on_load_unexpected = [r"pos_emb\.inv_freq"]
    saved_backbone = "uni"  # which backbone a saved folder maps `AutoModel` to (`save_pretrained`)

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False) -> str:
        """transformers' check of `attn_implementation`, plus "triton": the flash-style relative attention
        (`relative_attention_triton`, opt-in; where it cannot run, the default path: see
        `kernel_registry.attention_implementation`)."""
        if requested_attention == "triton":
            return requested_attention
        return super().get_correct_attn_implementation(requested_attention, is_init_check)

    def __init__(self, config: TransformerXLConfig, *inputs, **kwargs):
        config.validate_architecture()  # also what was set after the config was built (`config.mem_len = -5`)
        check_model_fits(config)  # before any parameter is built: a config of 10**9 layers is refused by its estimate
        super().__init__(config, *inputs, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """As in transformers, plus legacy transformers-4.x Transformer-XL folders/repos (model_type "transfo-xl")
        and transformers XLNet folders/repos (model_type "xlnet"), converted on the fly (`checkpoint_import`)."""
        imported = import_checkpoint(cls, pretrained_model_name_or_path, kwargs)
        if imported is not None:
            return imported
        return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """As in transformers; then the weights get the folder's permissions, and a remote-code folder's
        `auto_map` every Auto class its weights fit (`auto_map.auto_map_for`): the backbone of `saved_backbone`
        (None: the config's `attn_type`), the LM heads of a language model's folder, every task head."""
        super().save_pretrained(save_directory, *args, **kwargs)
        share_weight_files(save_directory)
        if self._auto_class is not None and kwargs.get("is_main_process", True):
            kind = self.saved_backbone or self.config.attn_type
            complete_auto_map(save_directory, auto_map_for(kind, lm_heads=self.saved_backbone is not None))

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True):
        """As in transformers, for the adaptive input (and the adaptive softmax of a causal LM): tokens are added to
        or removed from the end of the last cluster (`adaptive_softmax.resize_vocabulary`), so the cutoffs and every
        kept token's vectors stay. Returns the input embedding module. Models with a plain embedding table (the
        permutation LM) resize as in transformers."""
        embedding = self.get_input_embeddings()
        if new_num_tokens is not None:
            for name in ("pad_token_id", "bos_token_id"):  # the config would no longer load
                value = getattr(self.config, name, None)
                if value is not None and value >= new_num_tokens:
                    raise ValueError(f"new_num_tokens={new_num_tokens} would drop config.{name}={value}; expected more "
                                     f"than {value} tokens (or set config.{name} first)")
        if not isinstance(embedding, AdaptiveEmbedding):
            return super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        if new_num_tokens is None:
            return embedding
        if pad_to_multiple_of is not None:
            if not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of <= 0:
                raise ValueError(f"pad_to_multiple_of={pad_to_multiple_of!r} is invalid; expected a positive integer")
            new_num_tokens = -(-new_num_tokens // pad_to_multiple_of) * pad_to_multiple_of
        softmax = getattr(self, "lm_head", None)
        resize_vocabulary(embedding, softmax if isinstance(softmax, AdaptiveLogSoftmax) else None, self.config,
                          new_num_tokens, mean_resizing)
        return embedding

    @torch.no_grad()
    def _init_weights(self, module):
        std, proj_std = self.config.init_std, self.config.proj_init_std
        if isinstance(module, (nn.Linear, nn.Embedding, OutputTable)):
            module.weight.normal_(0.0, std)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
        elif type(module).__name__ == "Projection":
            module.weight.normal_(0.0, proj_std)
        elif type(module).__name__ == "AdaptiveLogSoftmax" and module.n_clusters:
            module.cluster_weight.normal_(0.0, std)
            module.cluster_bias.zero_()
        for name in ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed", "mask_emb"):
            param = module._parameters.get(name) if hasattr(module, "_parameters") else None
            if param is not None:
                param.normal_(0.0, std)


class TransformerXLModel(TransformerXLPreTrainedModel):
    """The backbone: adaptive input embedding, relative positions, n_layer decoder layers with memory."""

    def __init__(self, config: TransformerXLConfig):
        if config.attn_type != "uni":
            raise ValueError(f"attn_type={config.attn_type!r} is the bidirectional XLNet-style backbone; "
                             "TransformerXLModel is the causal one (expected 'uni'): use "
                             "TransformerXLPermutationModel, or AutoModel, which picks the backbone by attn_type")
        super().__init__(config)
        self.word_emb = AdaptiveEmbedding(config)
        self.drop = Dropout(config.dropout)
        if not config.untie_r:  # one (u, v) pair shared by all layers
            self.r_w_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
            self.r_r_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
        self.layers = nn.ModuleList(TransformerXLLayer(config) for _ in range(config.n_layer))
        self.position_table = PositionTable(config, config.n_layer)
        self.post_init()

    def get_input_embeddings(self):
        return self.word_emb

    def set_input_embeddings(self, value):
        self.word_emb = value

    def clear_inference_cache(self) -> None:
        """Drop what the layers keep for evaluation without gradients (see `forward`'s `use_cache`)."""
        self.position_table.clear()
        for layer in self.layers:
            layer.attn.clear_cache()

    def position_embeddings(self, klen: int, dtype: torch.dtype, device, use_cache: bool = False) -> torch.Tensor:
        """Sinusoid vectors of distances klen-1..0 (clamped), [K, d_model] (`inference_cache.PositionTable`)."""
        return self.position_table(klen, dtype, device, use_cache)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        mems: tuple[torch.FloatTensor, ...] | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> TransformerXLModelOutput | tuple:
        """`attention_mask` (optional, 1 = real token, 0 = padding) [B, T] or [B, M+T] (memory included) hides padding
        keys on top of the causal mask. `use_cache` (default True; only without gradients): each layer keeps the keys
        and values of the memory it returns and reuses them when that memory comes back unchanged (`inference_cache`);
        `use_cache=False` drops them and recomputes, as every forward with gradients does."""
        cfg = self.config
        output_attentions = cfg.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = cfg.output_hidden_states if output_hidden_states is None else output_hidden_states
        return_dict = cfg.return_dict if return_dict is None else return_dict
        batch, qlen = check_inputs(cfg, input_ids, inputs_embeds, mems, dtype=self.dtype, attention_mask=attention_mask)
        if attention_mask is not None and attention_mask.size(0) != batch:
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}; expected [batch={batch}, "
                             f"seq_len={qlen}] or [batch={batch}, mem_len + seq_len]")
        mems = mems if mems is not None and mems[0].size(1) > 0 else None

        h = self.word_emb(input_ids) if inputs_embeds is None else inputs_embeds
        mlen = 0 if mems is None else mems[0].size(1)
        mems = memory_like(mems, h)
        mask = causal_mask(qlen, mlen, cfg.same_length, cfg.mem_len, device=h.device)
        if attention_mask is not None:
            mask = with_key_padding(mask, attention_mask, mlen)
        cached = (use_cache is None or use_cache) and cache_enabled()
        if not cached and not torch.compiler.is_compiling():
            self.clear_inference_cache()  # use_cache=False or training: nothing evaluation kept stays alive
        pos_emb = self.drop(self.position_embeddings(mlen + qlen, h.dtype, h.device, use_cache=cached))
        if cached:
            self.position_table.offer_projections(pos_emb, [layer.attn for layer in self.layers])
        h = self.drop(h)
        shared_bias = (None, None) if cfg.untie_r else (self.r_w_bias, self.r_r_bias)

        hiddens, attentions = [], []
        for i, layer in enumerate(self.layers):
            hiddens.append(h)
            h, probs = layer(h, pos_emb, mask, None if mems is None else mems[i], *shared_bias,
                             output_attentions=output_attentions, use_cache=cached)
            attentions.append(probs)
        h = self.drop(h)

        new_mems = update_memory(mems, hiddens, cfg.mem_len)
        if cached:
            for i, layer in enumerate(self.layers):
                layer.attn.keep_memory_projection(None if new_mems is None else new_mems[i])
        out = TransformerXLModelOutput(
            last_hidden_state=h,
            mems=new_mems,
            hidden_states=(*hiddens, h) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )
        return out if return_dict else out.to_tuple()


class TransformerXLForCausalLM(TransformerXLPreTrainedModel, MemoryGenerationMixin):
    """Transformer-XL with the adaptive softmax on top (weights tied to the adaptive input)."""

    def __init__(self, config: TransformerXLConfig):
        super().__init__(config)
        self.transformer = TransformerXLModel(config)
        self.lm_head = AdaptiveLogSoftmax(config)
        self._tied_weights_keys = tied_weight_map(config)
        self.post_init()

    def get_output_embeddings(self):
        """The adaptive softmax. Its `weight` is the head cluster's table, the input embedding's `weight` when tied, so
        FSDP2 (Accelerate) keeps every tied table and projection in one unit; the tie itself is `_tied_weights_keys`."""
        return self.lm_head

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        """What transformers ties, saves once and loads: `tied_weight_map` of the current config. transformers ties
        nothing when `tie_word_embeddings` is False; the projections follow `tie_projs` alone, as in the authors'
        code and the legacy model."""
        if all_submodels:
            return super().get_expanded_tied_weights_keys(all_submodels=True)
        return tied_weight_map(self.config)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        mems: tuple[torch.FloatTensor, ...] | None = None,
        labels: torch.LongTensor | None = None,
        next_token_labels: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        use_cache: bool | None = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> TransformerXLCausalLMOutput | tuple:
        """`labels` [B, T] are shifted inside (position t predicts labels[:, t+1]); `next_token_labels` [B, T] are
        already aligned (position t predicts next_token_labels[:, t]; at a segment's last position that is the first
        token of the next segment). -100 is ignored. Without labels, `logits` holds log-probabilities of the last
        `logits_to_keep` positions (0: all). `attention_mask` (1 = real token, 0 = padding) [B, T] or [B, M+T] hides
        padding keys, `use_cache`: see `TransformerXLModel.forward`."""
        return_dict = self.config.return_dict if return_dict is None else return_dict
        if isinstance(mems, DecodeState):  # generation's one-token steps (`static_decoding`)
            out = self._decode(input_ids, mems, labels, next_token_labels, inputs_embeds)
            return out if return_dict else out.to_tuple()
        if labels is not None and next_token_labels is not None:
            raise ValueError("expected at most one of labels and next_token_labels, got both")
        with self._tied_table_gradient(input_ids, inputs_embeds, labels, next_token_labels):
            out = self._forward(input_ids, mems, labels, next_token_labels, inputs_embeds, output_attentions,
                                output_hidden_states, logits_to_keep, use_cache, attention_mask)
        return out if return_dict else out.to_tuple()

    def _forward(self, input_ids, mems, labels, next_token_labels, inputs_embeds, output_attentions,
                 output_hidden_states, logits_to_keep, use_cache, attention_mask) -> TransformerXLCausalLMOutput:
        outputs = self.transformer(input_ids, mems, inputs_embeds, output_attentions, output_hidden_states,
                                   return_dict=True, attention_mask=attention_mask, use_cache=use_cache)
        hidden = outputs.last_hidden_state  # [B, T, d]
        batch, qlen = hidden.shape[:2]
        loss = losses = logits = None
        if labels is not None or next_token_labels is not None:
            name, targets = ("labels", labels) if labels is not None else ("next_token_labels", next_token_labels)
            if tuple(targets.shape) != (batch, qlen):
                raise ValueError(f"{name} has shape {tuple(targets.shape)}; expected [batch={batch}, seq_len={qlen}]")
            if targets.is_floating_point() or targets.dtype == torch.bool or targets.is_complex():
                raise ValueError(f"{name} has dtype {targets.dtype}; expected integer token ids (torch.long), -100 "
                                 "where ignored")
            if labels is not None:
                hidden, targets = hidden[:, :-1], labels[:, 1:]
            targets = targets.reshape(-1)
            valid = targets != -100
            require(ids_in_range(targets, self.config.vocab_size, ignore_index=-100),
                    f"{name} has ids outside [0, vocab_size={self.config.vocab_size}) (and not -100)")
            losses = self.lm_head(hidden.reshape(-1, hidden.size(-1)), targets).view(batch, -1)
            loss = losses.sum() / valid.sum().clamp(min=1)
        else:
            kept = hidden[:, -logits_to_keep:] if logits_to_keep else hidden
            logits = self.lm_head(kept.reshape(-1, kept.size(-1))).view(batch, kept.size(1), -1)
        return TransformerXLCausalLMOutput(loss=loss, losses=losses, logits=logits, mems=outputs.mems,
                                           hidden_states=outputs.hidden_states, attentions=outputs.attentions)

    def _decode(self, input_ids, state: DecodeState, labels, next_token_labels, inputs_embeds):
        """One token per row, input_ids [B, 1], through the ring-buffer memory `state` (advanced in place):
        log-probabilities [B, 1, V]."""
        batch = state.real.size(0)
        if input_ids is None or input_ids.dim() != 2 or tuple(input_ids.shape) != (batch, 1):
            raise ValueError(f"input_ids has shape {None if input_ids is None else tuple(input_ids.shape)}; expected "
                             f"[batch={batch}, 1]: a DecodeState advances one token per row")
        if labels is not None or next_token_labels is not None or inputs_embeds is not None:
            raise ValueError("labels, next_token_labels and inputs_embeds are not taken with a DecodeState (generation "
                             "only); expected mems as a tuple of tensors to train or score")
        require(ids_in_range(input_ids, self.config.vocab_size), "input_ids has ids outside the vocabulary")
        hidden = state.step(input_ids)  # [B, 1, d]
        logits = self.lm_head(hidden.reshape(-1, hidden.size(-1))).view(hidden.size(0), 1, -1)
        return TransformerXLCausalLMOutput(logits=logits, mems=state)

    def _tied_table_gradient(self, input_ids, inputs_embeds, labels, next_token_labels):
        """The "tied_table_gradient" kernel's context when the loss's softmax shares one table with the input lookup
        of this forward (the table's gradient is then built at the end of backward instead of at its start, when
        every activation is alive: the peak of a training step); else a context that does nothing."""
        word_emb = self.transformer.word_emb
        defer = kernel("tied_table_gradient", self.device.type)
        if (defer is None or self.config.div_val != 1 or (labels is None and next_token_labels is None)
                or not isinstance(word_emb, AdaptiveEmbedding)):
            return contextlib.nullcontext()
        return defer(word_emb.emb_layers[0], self.lm_head.out_layers[0], input_ids, inputs_embeds)


