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
import contextvars
import os
from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import ModelOutput

from .adaptive_softmax import AdaptiveEmbedding, AdaptiveLogSoftmax, needs_projections, resize_vocabulary
from .auto_map import auto_map_for, complete_auto_map, share_weight_files
from .configuration_transformer_xl import TransformerXLConfig
from .inference_cache import ProjectionCache
from .inference_cache import enabled as cache_enabled
from .input_checks import extreme_id, ids_in_range, require
from .dropout import Dropout, relu_dropout
from .kernel_registry import kernel
from .layer_norm import LayerNorm
from .relative_attention import RelativeMultiHeadAttention
from .relative_positions import causal_mask, relative_positions, sinusoid_table
from .size_estimate import check_model_fits


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


_MEMORY_GRADIENT = contextvars.ContextVar("memory_gradient", default=False)


@contextlib.contextmanager
def memory_gradient():
    """Inside, `update_memory` keeps the memory's graph: the gradient of a later segment's loss reaches the earlier
    segments that wrote its memory (backpropagation through every segment read). For one label per long document
    (`TransformerXLForSequenceClassification.forward_long`), where no earlier segment has a loss of its own; the
    activations of every segment are then kept until backward. Not read inside `torch.compile`d code (which keeps
    the memory detached), as `kernel_registry.reference_only` is not."""
    token = _MEMORY_GRADIENT.set(True)
    try:
        yield
    finally:
        _MEMORY_GRADIENT.reset(token)


def update_memory(mems, hiddens, mem_len: int):
    """New memory per layer: the last `mem_len` states of `[mem; hidden]`, detached (no gradient crosses segments;
    inside `memory_gradient()` it keeps the graph).

    Each is a tensor of its own, of exactly its size: a slice of a concatenation would keep all of `[mem; hidden]`
    alive. Never the hidden state itself: that may be the caller's `inputs_embeds` (refilled in place for the next
    segment, say), and in training it is saved for backward, so an in-place edit of the memory (resetting a row)
    would break or corrupt the gradient."""
    if mem_len == 0:
        return None
    if mems is None:
        mems = [None] * len(hiddens)

    def new_memory(m: torch.Tensor | None, h: torch.Tensor) -> torch.Tensor:
        from_mem = mem_len - h.size(1)  # how many of the old memory's last states stay
        if m is None or from_mem <= 0:
            return h[:, -mem_len:].clone()
        return torch.cat([m[:, -from_mem:], h], dim=1)

    if not torch.compiler.is_compiling() and _MEMORY_GRADIENT.get():  # compiled code: detached (dynamo cannot
        return tuple(new_memory(m, h) for m, h in zip(mems, hiddens))  # read a ContextVar; compiled steps are LM steps)
    with torch.no_grad():
        return tuple(new_memory(m, h) for m, h in zip(mems, hiddens))


def with_key_padding(mask: torch.Tensor, attention_mask: torch.Tensor, mlen: int) -> torch.Tensor:
    """Add padding keys to a [T, K] mask (True = hidden): returns [B, 1, T, K] (broadcast over heads).

    `attention_mask` [B, T] (the memory counts as real tokens) or [B, M+T] marks real tokens with 1 and padding with 0.
    A query always keeps its own key, as XLNet's content stream does, so a padding query attends to itself instead of
    to nothing. Example, T=3, M=0, causal, attention_mask=[[0, 1, 1]] (left padding; x = hidden):
        [. x x]      [. x x]
        [. . x]  ->  [x . x]
        [. . .]      [x . .]
    """
    qlen, klen = mask.shape
    batch = attention_mask.size(0)
    if attention_mask.dim() != 2 or attention_mask.size(1) not in (qlen, klen):
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}; expected [batch, seq_len={qlen}] "
                         f"or [batch, mem_len + seq_len={klen}]")
    real = attention_mask.to(device=mask.device, dtype=torch.bool)
    if real.size(1) == qlen and mlen > 0:  # the memory is all real tokens
        real = torch.cat([real.new_ones(batch, mlen), real], dim=1)  # [B, K]
    own_key = torch.arange(klen, device=mask.device)[None, :] == torch.arange(qlen, device=mask.device)[:, None] + mlen
    padding = ~real[:, None, :] & ~own_key  # [B, T, K]
    return (mask[None] | padding)[:, None]  # [B, 1, T, K]


def memory_like(mems: tuple[torch.Tensor, ...] | None, h: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """The memory in the hidden states' dtype (memory is detached state: one written by a float32 run can continue a
    bfloat16 model, and the other way round)."""
    if mems is None or mems[0].dtype == h.dtype:
        return mems
    return tuple(m.to(h.dtype) for m in mems)


def check_inputs(config, input_ids: torch.Tensor | None, inputs_embeds, mems, dtype: torch.dtype | None = None,
                 attention_mask: torch.Tensor | None = None) -> tuple[int, int]:
    """Validate the backbone inputs; returns (B, T). Errors name the argument, the value and what was expected.

    `dtype`: the model's; `inputs_embeds` must have it (no silent rounding). Memory of another floating dtype is
    converted to the model's (`memory_like`: a float32 run's memory continues in bfloat16); integer memory, a `None`
    entry and more positions than `config.mem_len` are errors. `attention_mask` holds 0/1 (or booleans)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("expected exactly one of input_ids and inputs_embeds")
    x = input_ids if input_ids is not None else inputs_embeds
    if x.dim() != (2 if input_ids is not None else 3):
        name = "input_ids" if input_ids is not None else "inputs_embeds"
        raise ValueError(f"{name} has shape {tuple(x.shape)}; expected [batch, seq_len]{'' if input_ids is not None else ', d_model]'}")
    batch, length = x.shape[:2]
    if batch == 0 or length == 0:
        raise ValueError(f"input has shape {tuple(x.shape)}; expected a non-empty batch and sequence")
    if inputs_embeds is not None:
        if inputs_embeds.size(-1) != config.d_model:
            raise ValueError(f"inputs_embeds has shape {tuple(inputs_embeds.shape)}; expected [batch, seq_len, "
                             f"d_model={config.d_model}]")
        if dtype is not None and inputs_embeds.dtype != dtype:
            raise ValueError(f"inputs_embeds has dtype {inputs_embeds.dtype}; expected the model's dtype {dtype} "
                             "(convert with inputs_embeds.to(model.dtype))")
    if attention_mask is not None and attention_mask.numel():
        expected = "expected 1 for real tokens and 0 for padding"
        require((attention_mask == 0) | (attention_mask == 1), f"attention_mask holds other values; {expected}",
                lambda: f"attention_mask holds {sorted({float(v) for v in attention_mask.unique()[:6].tolist()})}; "
                        f"{expected}")
    if input_ids is not None:
        if input_ids.dtype not in (torch.long, torch.int):
            raise ValueError(f"input_ids has dtype {input_ids.dtype}; expected integer token ids (torch.long or "
                             "torch.int)")
        expected = f"expected token ids in [0, vocab_size={config.vocab_size})"
        require(ids_in_range(input_ids, config.vocab_size), f"input_ids has ids outside the vocabulary; {expected}",
                lambda: f"input_ids contains {extreme_id(input_ids)}; {expected}")
    if mems is not None:
        if len(mems) != config.n_layer:
            raise ValueError(f"mems has {len(mems)} tensors; expected one per layer (n_layer={config.n_layer})")
        for i, m in enumerate(mems):
            if not isinstance(m, torch.Tensor):
                raise ValueError(f"mems[{i}] is {type(m).__name__}; expected a tensor [batch, mem_len, d_model] per "
                                 "layer (the mems a forward returned), or mems=None for no memory")
            if not m.is_floating_point():
                raise ValueError(f"mems[{i}] has dtype {m.dtype}; expected floating-point hidden states (the mems a "
                                 "forward returned)")
            if m.dim() == 3 and m.size(1) > config.mem_len:
                raise ValueError(f"mems[{i}] holds {m.size(1)} positions; expected at most mem_len="
                                 f"{config.mem_len} (set model.config.mem_len to use a longer memory)")
        mlen = mems[0].size(1) if mems[0].dim() == 3 else -1
        for i, m in enumerate(mems):
            if m.dim() != 3 or m.size(0) != batch or m.size(1) != mlen or m.size(2) != config.d_model:
                raise ValueError(
                    f"mems[{i}] has shape {tuple(m.shape)}; expected [batch={batch}, mem_len={mlen} (same for every "
                    f"layer), d_model={config.d_model}]"
                )
    return batch, length


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


# transformers 5's from_pretrained keyword arguments that say where and how to load, not what the model is: a legacy
# checkpoint (converted here, on CPU) has no use for them. The rest, config fields and `config=`, apply to it too.
LOADING_KWARGS = frozenset({
    "revision", "token", "cache_dir", "force_download", "local_files_only", "proxies", "subfolder", "trust_remote_code",
    "dtype", "torch_dtype", "use_safetensors", "weights_only", "low_cpu_mem_usage", "attn_implementation",
    "device_map", "ignore_mismatched_sizes", "fusion_config", "disable_mmap", "_commit_hash", "_from_auto",
    "_from_pipeline", "adapter_kwargs", "adapter_name", "allow_all_kernels", "device_mesh", "distributed_config",
    "experts_implementation", "generation_config", "gguf_file", "kernel_config", "key_mapping", "max_memory",
    "offload_buffers", "offload_folder", "output_loading_info", "quantization_config", "state_dict", "tp_plan",
    "tp_size", "tqdm_class", "use_kernels", "variant"})


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
        and transformers XLNet folders/repos (model_type "xlnet"), converted on the fly (see `legacy_conversion`,
        `xlnet_conversion`)."""
        from .legacy_conversion import find_legacy_files, legacy_model_and_new_weights, local_resolver

        path = str(pretrained_model_name_or_path)
        if os.path.isdir(path):
            resolve = local_resolver(path)
        else:
            from transformers.utils import cached_file

            def resolve(name):
                try:
                    return cached_file(path, name, _raise_exceptions_for_missing_entries=False,
                                       **{k: kwargs[k] for k in ("revision", "token", "cache_dir") if k in kwargs})
                except OSError:  # unreachable or unknown repo: the regular loader reports it
                    return None

        legacy = find_legacy_files(resolve)
        if legacy is not None:
            overrides = {k: v for k, v in kwargs.items() if k not in LOADING_KWARGS}
            model, new_weights = legacy_model_and_new_weights(
                cls, *legacy, dtype=kwargs.get("dtype", kwargs.get("torch_dtype")), device_map=kwargs.get("device_map"),
                **overrides)
            if kwargs.get("output_loading_info"):  # every weight was converted, but a head the checkpoint lacks
                return model, {"missing_keys": set(new_weights), "unexpected_keys": set(), "mismatched_keys": set(),
                               "error_msgs": []}
            return model
        from .legacy_conversion import resolve_device_map, resolve_dtype
        from .xlnet_conversion import from_xlnet, is_xlnet_checkpoint

        if is_xlnet_checkpoint(resolve):  # a transformers XLNet folder or repo: its weights are converted
            overrides = {k: v for k, v in kwargs.items() if k not in LOADING_KWARGS and k != "config"}
            config = kwargs.get("config")
            dtype = resolve_dtype(kwargs.get("dtype", kwargs.get("torch_dtype")))
            info = {}
            model = from_xlnet(cls, path, config=config if isinstance(config, TransformerXLConfig) else None,
                               ignore_mismatched_sizes=kwargs.get("ignore_mismatched_sizes", False), resolve=resolve,
                               loading_info=info, **overrides)
            if isinstance(dtype, torch.dtype):  # "auto": the converted weights' own type (float32 as saved)
                model = model.to(dtype)
            device = resolve_device_map(kwargs.get("device_map"))
            if device is not None:
                model = model.to(device)
            if kwargs.get("output_loading_info"):  # every backbone weight was converted (else from_xlnet raised)
                return model, {"missing_keys": set(info["missing_keys"]), "unexpected_keys": set(),
                               "mismatched_keys": set(info["mismatched_keys"]), "error_msgs": []}
            return model
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
        if isinstance(module, (nn.Linear, nn.Embedding)):
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
        self._position_table = None  # (key, table, (klen, slice)): see position_embeddings
        self._table_projections = [ProjectionCache() for _ in range(config.n_layer)]  # see offer_position_projections
        self.post_init()

    def get_input_embeddings(self):
        return self.word_emb

    def set_input_embeddings(self, value):
        self.word_emb = value

    def clear_inference_cache(self) -> None:
        """Drop what the layers keep for evaluation without gradients (see `forward`'s `use_cache`)."""
        self._position_table = None
        for cache in self._table_projections:
            cache.clear()
        for layer in self.layers:
            layer.attn.memory_cache.clear()
            layer.attn.position_cache.clear()

    def position_embeddings(self, klen: int, dtype: torch.dtype, device, use_cache: bool = False) -> torch.Tensor:
        """Sinusoid vectors of distances klen-1..0 (clamped), [K, d_model]. With `use_cache` the same table object is
        returned for the same length, so that the layers can reuse their projections of it (inference_cache): the
        last `klen` rows of one table of at least `mem_len + 1` rows (the length a one-token step reaches once the
        memory is full), so that generation, whose key length grows by one per step until then, reads its table
        from one place (`offer_position_projections`)."""
        key = (dtype, torch.device(device), self.config.clamp_len, self.config.d_model)
        kept = self._position_table if use_cache else None
        if kept is None or kept[0] != key or kept[1].size(0) < klen:
            length = max(klen, self.config.mem_len + 1) if use_cache else klen
            pos = relative_positions(length, clamp_len=self.config.clamp_len).to(device)
            kept = (key, sinusoid_table(pos, self.config.d_model, dtype), None)  # float64 model: float64 table
            if not use_cache:
                return kept[1]
        full = kept[1]
        if klen == full.size(0):
            table = full
        elif kept[2] is not None and kept[2][0] == klen:
            table = kept[2][1]
        else:  # distances klen-1..0 are the table's last rows (clamping is per distance)
            table = full[-klen:]
        self._position_table = (key, full, (klen, table))
        return table

    def offer_position_projections(self, pos_emb: torch.Tensor) -> None:
        """Without gradients, when `pos_emb` is a part of the kept position table (generation before the memory is
        full): hand each layer's position cache its projection W_R R as the matching rows of the projection of the
        whole table, computed once per layer and weights (kept in `_table_projections`), instead of letting every
        step project its own K rows again (K x d_model x d_model per layer and step: at batch 1 ten times the rest
        of a layer's products at the d_model 256, mem_len 128 benchmark shape). Rows of a product equal the product
        of the rows up to float rounding, as for the memory's keys and values (`inference_cache`)."""
        full = self._position_table[1] if self._position_table is not None else None
        if full is None or pos_emb is full or pos_emb.data_ptr() + pos_emb.nbytes != full.data_ptr() + full.nbytes:
            return
        if any(type(layer.attn.r_net.weight.data) is not torch.Tensor for layer in self.layers):
            return  # sharded weights (FSDP2 DTensors) are whole only inside each layer's own forward
        for layer, cache in zip(self.layers, self._table_projections):
            weights = (layer.attn.r_net.weight,)
            projected = cache.get(full, weights)
            if projected is None:
                projected = layer.attn.project_positions(full)  # [H, R, D]
                cache.put(full, projected, weights)
            layer.attn.position_cache.put(pos_emb, projected[:, -pos_emb.size(0):], weights)

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
        keys on top of the causal mask (used by sequence classification with padded batches).

        `use_cache` (default True) applies only without gradients (and outside `torch.inference_mode`): each layer
        keeps the keys and values it computed for the memory it returns, and reuses them when that memory comes back
        unchanged in the next call, instead of projecting it again (equal up to float rounding; see `inference_cache`,
        which also says what it cannot see). It holds keys and values of the memory in buffers with room to append
        the next segment's (`inference_cache.AppendRoom`): up to 3 (M + T) / M times the memory's size;
        `use_cache=False` drops them and recomputes, and so does every forward with gradients."""
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
            self.offer_position_projections(pos_emb)
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


class TransformerXLForCausalLM(TransformerXLPreTrainedModel, GenerationMixin):
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

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # memory is a tuple of per-layer tensors, not a key/value cache

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

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, *args, **kwargs):
        """`generate` carries our memory under `mems` (one of the state names transformers' beam search reorders
        through `_reorder_cache`). Set here because transformers moves the state under a name of its own that
        changed between releases: up to 5.23 `past_key_values`, read from an output's `mems`; from 5.24 `cache`,
        read only from an output field of that name, so the memory was dropped and every step re-read the whole
        sequence."""
        model_kwargs = super()._update_model_kwargs_for_generation(outputs, model_kwargs, *args, **kwargs)
        for name in ("past_key_values", "cache"):
            if name in model_kwargs and model_kwargs[name] is outputs.mems:
                del model_kwargs[name]
        if model_kwargs.get("use_cache") is False:  # no state carried: every step reads the whole sequence again
            return model_kwargs  # (after the caller's `mems`, if any)
        model_kwargs["mems"] = outputs.mems
        model_kwargs["mems_hold_input"] = True  # every token but the newest is in the memory now
        return model_kwargs

    def prepare_inputs_for_generation(self, input_ids, mems=None, attention_mask=None, mems_hold_input=False,
                                      **kwargs):
        """Once the memory holds the sequence (`mems_hold_input`, set by `_update_model_kwargs_for_generation` from
        the second step on) only the newest token is fed; at the first step the whole prompt is, after the caller's
        `mems` if any. The attention mask (which `generate` extends by one real token per step) is cut to the
        memory's tokens plus the fed ones, so that padding stays hidden once it is in memory."""
        if mems is not None and mems_hold_input:
            input_ids = input_ids[:, -1:]
        inputs = {"input_ids": input_ids, "mems": mems}
        if attention_mask is not None:
            mlen = 0 if mems is None else mems[0].size(1)
            missing = mlen + input_ids.size(1) - attention_mask.size(1)
            if missing > 0 and mems_hold_input:  # the caller's memory came before the prompt the mask covers: real
                ones = attention_mask.new_ones(attention_mask.size(0), missing)
                attention_mask = torch.cat([ones, attention_mask], 1)
            inputs["attention_mask"] = attention_mask[:, -(mlen + input_ids.size(1)):]
        for name in ("logits_to_keep", "output_attentions", "output_hidden_states", "use_cache"):
            if kwargs.get(name) is not None:
                inputs[name] = kwargs[name]
        return inputs

    def _sample(self, input_ids, logits_processor, stopping_criteria, generation_config, *args, **model_kwargs):
        """transformers' greedy/sampling loop; greedy decoding whose scores nothing else reads runs inside the
        "greedy_decoding" kernel's context: the log-probabilities of tail clusters that cannot hold the best token
        are left at -inf instead of computed, which gives the same tokens. Not with sampling, logits processors
        (they may lower the best token: repetition penalty, bad words, ...), nor when scores or logits are
        returned."""
        scores_returned = generation_config.return_dict_in_generate and (
            generation_config.output_scores or generation_config.output_logits)
        greedy = kernel("greedy_decoding", self.device.type)
        context = contextlib.nullcontext()
        if greedy is not None and not generation_config.do_sample and not logits_processor and not scores_returned:
            context = greedy(self.lm_head)
        with context:
            return super()._sample(input_ids, logits_processor, stopping_criteria, generation_config, *args,
                                   **model_kwargs)

    def _expand_inputs_for_generation(self, expand_size: int = 1, is_encoder_decoder: bool = False, input_ids=None,
                                      **model_kwargs):
        """As in transformers, and the caller's `mems` (a tuple, which transformers leaves alone) repeated row by row
        too, for `num_beams` / `num_return_sequences` > 1."""
        mems = model_kwargs.pop("mems", None)
        input_ids, model_kwargs = super()._expand_inputs_for_generation(expand_size, is_encoder_decoder, input_ids,
                                                                        **model_kwargs)
        if mems is not None:
            model_kwargs["mems"] = tuple(m.repeat_interleave(expand_size, dim=0) for m in mems)
        return input_ids, model_kwargs

    def _reorder_cache(self, mems, beam_idx):
        """Beam search: memory rows follow their beams, and so do the keys and values each layer keeps for its memory
        (`inference_cache`; without them every step would project the whole memory again)."""
        if mems is None:
            return None
        reordered = tuple(m.index_select(0, beam_idx.to(m.device)) for m in mems)
        if cache_enabled():
            for layer, old, new in zip(self.transformer.layers, mems, reordered):
                layer.attn.reorder_memory_projection(old, new, beam_idx.to(old.device))
        return reordered


def tied_weight_map(config) -> dict[str, str]:
    """{output parameter: input parameter} pairs tied as in the authors' code: the weights per cluster when
    `tie_word_embeddings`, the projections by `tie_projs` alone (whatever `tie_word_embeddings` says; with
    div_val == 1 every tied output projection shares the single input projection)."""
    emb, out = "transformer.word_emb", "lm_head"
    n_tables = 1 if config.div_val == 1 else len(config.cutoffs) + 1
    tied = {}
    if config.tie_word_embeddings:
        tied = {f"{out}.out_layers.{i}.weight": f"{emb}.emb_layers.{i}.weight" for i in range(n_tables)}
    if needs_projections(config):
        for i, tie in enumerate(config.tie_projs):
            if tie:
                tied[f"{out}.out_projs.{i}.weight"] = f"{emb}.emb_projs.{0 if config.div_val == 1 else i}.weight"
    return tied
