"""Import transformers XLNet checkpoints (`XLNetLMHeadModel`, `XLNetForSequenceClassification`, `XLNetModel`):
`from_xlnet(TransformerXLForPermutationLM, path_or_model)` (or the classifier, or the bare backbone).

An explicit key map, ours <- theirs, with `{}` standing for the layer index; every converted tensor is checked
against the shape our model expects. XLNet stores each attention projection as [d_model, H, D] (applied with
einsum); ours are `nn.Linear` weights: q, k, v fused into `qkv_net.weight` [3*H*D, d], `r_net.weight` [H*D, d],
`o_net.weight` [d, H*D]. The output layer is tied to the token embedding; only its bias (`lm_loss.bias`) is copied.

Config differences: XLNet always keeps per-layer biases (untie_r=True here); XLNet drops attention probabilities with
`dropout` (our `dropatt`); `mem_len=None` (keep every state) becomes 0 (no memory); `reuse_len` 0 becomes None.
"""

from __future__ import annotations

import logging
import os

import torch

from .configuration_transformer_xl import TransformerXLConfig

logger = logging.getLogger(__name__)


def _same(w):
    return w


def _heads_in(*weights):
    """XLNet input projections [d, H, D] (x @ W) -> one Linear weight [n*H*D, d] (x @ W^T), stacked in order."""
    return torch.cat([w.reshape(w.size(0), -1).t() for w in weights], dim=0)


def _heads_out(w):
    """XLNet output projection [d, H, D] (sum over H, D) -> Linear weight [d, H*D]."""
    return w.reshape(w.size(0), -1)


_OURS, _THEIRS = "transformer.layers.{}.", "transformer.layer.{}."
# ours -> (their keys, transform). Keys with `{}` repeat for every layer.
BACKBONE_KEY_MAP: dict[str, tuple[tuple[str, ...], callable]] = {
    "transformer.word_emb.weight": (("transformer.word_embedding.weight",), _same),
    "transformer.mask_emb": (("transformer.mask_emb",), _same),
    _OURS + "attn.qkv_net.weight": (tuple(_THEIRS + f"rel_attn.{p}" for p in "qkv"), _heads_in),
    _OURS + "attn.r_net.weight": ((_THEIRS + "rel_attn.r",), _heads_in),
    _OURS + "attn.o_net.weight": ((_THEIRS + "rel_attn.o",), _heads_out),
    **{_OURS + f"attn.{name}": ((_THEIRS + f"rel_attn.{name}",), _same)
       for name in ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed", "layer_norm.weight", "layer_norm.bias")},
    **{_OURS + f"ff.{name}": ((_THEIRS + f"ff.{name}",), _same)
       for name in ("layer_1.weight", "layer_1.bias", "layer_2.weight", "layer_2.bias", "layer_norm.weight",
                    "layer_norm.bias")},
}
LM_HEAD_KEY_MAP = {"lm_head.bias": (("lm_loss.bias",), _same)}  # lm_head.weight is tied to the embedding
# XLNetSequenceSummary (projection + tanh) and the logits layer; `TransformerXLForSequenceClassification` keeps
# transformers' names for them.
CLASSIFICATION_HEAD_KEY_MAP = {
    f"{module}.{p}": ((f"{module}.{p}",), _same)
    for module in ("sequence_summary.summary", "logits_proj") for p in ("weight", "bias")
}
TIED_SOURCE_KEYS = {"lm_loss.weight"}  # XLNet's tied output matrix: the embedding already carries it


def config_from_xlnet(xlnet_config, **overrides) -> TransformerXLConfig:
    """Our config for a transformers `XLNetConfig` (then `overrides`)."""
    if xlnet_config.ff_activation not in ("gelu", "relu"):
        raise ValueError(f"ff_activation={xlnet_config.ff_activation!r} is not supported; expected 'gelu' or 'relu'")
    if xlnet_config.summary_type not in ("last", "first", "mean"):
        raise ValueError(f"summary_type={xlnet_config.summary_type!r} is not supported; expected 'last', 'first' "
                         "or 'mean'")
    if xlnet_config.attn_type == "uni" and xlnet_config.same_length:
        raise ValueError("same_length=True with attn_type='uni' is not supported by the permutation LM; expected "
                         "same_length=False")
    values = dict(
        vocab_size=xlnet_config.vocab_size, d_model=xlnet_config.d_model, d_embed=xlnet_config.d_model,
        n_layer=xlnet_config.n_layer, n_head=xlnet_config.n_head, d_head=xlnet_config.d_head,
        d_inner=xlnet_config.d_inner, cutoffs=[], adaptive=False, div_val=1, pre_lnorm=False, untie_r=True,
        attn_type=xlnet_config.attn_type, bi_data=xlnet_config.bi_data, clamp_len=xlnet_config.clamp_len,
        mem_len=xlnet_config.mem_len or 0, reuse_len=xlnet_config.reuse_len or None,
        dropout=xlnet_config.dropout, dropatt=xlnet_config.dropout, layer_norm_epsilon=xlnet_config.layer_norm_eps,
        init_std=xlnet_config.initializer_range, ff_activation=xlnet_config.ff_activation,
        summary_type=xlnet_config.summary_type, classifier_dropout=xlnet_config.summary_last_dropout,
        id2label=dict(xlnet_config.id2label), pad_token_id=xlnet_config.pad_token_id,
        bos_token_id=xlnet_config.bos_token_id, eos_token_id=xlnet_config.eos_token_id, tie_word_embeddings=True,
    )
    return TransformerXLConfig(**{**values, **overrides})


def _expand(key_map: dict, n_layer: int) -> dict:
    """Replace `{}` by every layer index."""
    out = {}
    for ours, (theirs, fn) in key_map.items():
        for i in range(n_layer) if "{}" in ours else [None]:
            out[ours.format(i) if i is not None else ours] = (tuple(t.format(i) for t in theirs), fn)
    return out


def convert_with_map(state_dict: dict, key_map: dict, n_layer: int, expected: dict[str, tuple] | None = None,
                     required: bool = True) -> dict[str, torch.Tensor]:
    """Apply `key_map` to a source `state_dict`. A missing source key raises when `required` (otherwise the entry is
    skipped); a converted tensor whose shape differs from `expected[ours]` raises, naming both shapes."""
    out = {}
    for ours, (theirs, fn) in _expand(key_map, n_layer).items():
        missing = [t for t in theirs if t not in state_dict]
        if missing:
            if required:
                raise ValueError(f"XLNet state dict lacks {missing[0]!r}; expected it for our {ours!r}")
            continue
        try:
            tensor = fn(*(state_dict[t] for t in theirs))
        except RuntimeError as error:
            shapes = [tuple(state_dict[t].shape) for t in theirs]
            raise ValueError(f"XLNet {theirs} with shapes {shapes} cannot be converted to {ours!r}: {error}") from None
        if expected is not None and ours in expected and tuple(tensor.shape) != tuple(expected[ours]):
            raise ValueError(f"XLNet {theirs} converts to shape {tuple(tensor.shape)} for {ours!r}; expected "
                             f"{tuple(expected[ours])}")
        out[ours] = tensor.contiguous()
    return out


def convert_xlnet_state_dict(state_dict: dict, config: TransformerXLConfig) -> dict[str, torch.Tensor]:
    """Our state dict (backbone, plus lm_head bias and classification head when present) for an XLNet state dict.
    Keys of a bare `XLNetModel` (no `transformer.` prefix) are accepted; unknown source keys raise."""
    if not any(k.startswith("transformer.") for k in state_dict):
        state_dict = {f"transformer.{k}": v for k, v in state_dict.items()}
    d, hd = config.d_model, config.n_head * config.d_head
    expected = {"transformer.word_emb.weight": (config.vocab_size, d), "lm_head.bias": (config.vocab_size,)}
    for i in range(config.n_layer):
        expected.update({f"transformer.layers.{i}.attn.qkv_net.weight": (3 * hd, d),
                         f"transformer.layers.{i}.attn.r_net.weight": (hd, d),
                         f"transformer.layers.{i}.attn.o_net.weight": (d, hd),
                         f"transformer.layers.{i}.ff.layer_1.weight": (config.d_inner, d),
                         f"transformer.layers.{i}.ff.layer_2.weight": (d, config.d_inner)})
    out = convert_with_map(state_dict, BACKBONE_KEY_MAP, config.n_layer, expected)
    out.update(convert_with_map(state_dict, LM_HEAD_KEY_MAP, config.n_layer, expected, required=False))
    out.update(xlnet_classification_head_state_dict(state_dict, config))
    used = {t for theirs, _ in _expand({**BACKBONE_KEY_MAP, **LM_HEAD_KEY_MAP, **CLASSIFICATION_HEAD_KEY_MAP},
                                       config.n_layer).values() for t in theirs}
    unknown = sorted(set(state_dict) - used - TIED_SOURCE_KEYS)
    if unknown:
        raise ValueError(f"XLNet state dict has keys with no counterpart here: {unknown[:5]}; expected only the "
                         "backbone, lm_loss and sequence-classification (sequence_summary, logits_proj) weights")
    return out


def xlnet_classification_head_state_dict(state_dict: dict, config: TransformerXLConfig) -> dict[str, torch.Tensor]:
    """The sequence-summary projection and logits layer of an `XLNetForSequenceClassification` state dict:
    `sequence_summary.summary.{weight,bias}` [d, d], [d] and `logits_proj.{weight,bias}` [num_labels, d],
    [num_labels] (shape checked); {} when the state dict has no classification head."""
    d, n = config.d_model, config.num_labels
    expected = {"sequence_summary.summary.weight": (d, d), "sequence_summary.summary.bias": (d,),
                "logits_proj.weight": (n, d), "logits_proj.bias": (n,)}
    return convert_with_map(state_dict, CLASSIFICATION_HEAD_KEY_MAP, config.n_layer, expected, required=False)


def load_xlnet(path_or_model) -> tuple[object, dict[str, torch.Tensor]]:
    """(XLNetConfig, state dict) of a transformers XLNet model object or of a local folder saved by
    `save_pretrained` (model.safetensors, or pytorch_model.bin read with weights_only=True)."""
    from transformers import XLNetConfig

    if isinstance(path_or_model, torch.nn.Module):
        return path_or_model.config, {k: v.detach() for k, v in path_or_model.state_dict().items()}
    path = str(path_or_model)
    if not os.path.isdir(path):
        raise ValueError(f"path_or_model={path!r} is not a folder; expected an XLNet model or a local folder "
                         "holding config.json and model.safetensors (or pytorch_model.bin)")
    config = XLNetConfig.from_pretrained(path)
    safetensors_file, bin_file = os.path.join(path, "model.safetensors"), os.path.join(path, "pytorch_model.bin")
    if os.path.exists(safetensors_file):
        from safetensors.torch import load_file

        return config, load_file(safetensors_file)
    if os.path.exists(bin_file):
        return config, torch.load(bin_file, map_location="cpu", weights_only=True)
    raise ValueError(f"path_or_model={path!r} holds neither model.safetensors nor pytorch_model.bin")


def from_xlnet(model_class, path_or_model, **config_overrides):
    """A `model_class` instance with the weights of a transformers XLNet model (a model object or a saved folder):
    `TransformerXLForPermutationLM` from an `XLNetLMHeadModel`, `TransformerXLForSequenceClassification` from an
    `XLNetForSequenceClassification`, or the bare backbone `TransformerXLPermutationModel`; `config_overrides` set
    config fields. Every backbone parameter must come from the checkpoint (else ValueError); head weights the checkpoint
    lacks keep their initialisation (with a warning, as transformers does); head weights the model lacks are dropped."""
    xlnet_config, state_dict = load_xlnet(path_or_model)
    config = config_from_xlnet(xlnet_config, **config_overrides)
    model = model_class(config)
    converted = convert_xlnet_state_dict(state_dict, config)
    if "transformer.word_emb.weight" not in model.state_dict():  # the bare backbone
        converted = {k.removeprefix("transformer."): v for k, v in converted.items() if k.startswith("transformer.")}
    ours = model.state_dict()
    result = model.load_state_dict({k: v for k, v in converted.items() if k in ours}, strict=False)
    tied = getattr(model, "_tied_weights_keys", None) or {}
    missing = [k for k in result.missing_keys if k not in tied]
    backbone_missing = [k for k in missing if k.startswith("transformer.") or "transformer.word_emb.weight" not in ours]
    if backbone_missing:
        raise ValueError(f"{model_class.__name__} cannot take this XLNet checkpoint: no weights for "
                         f"{backbone_missing[:5]}")
    if missing:
        logger.warning("%s: newly initialised from no XLNet weights: %s", model_class.__name__, missing)
    return model.eval()


def convert_xlnet_checkpoint(src, out_dir, **config_overrides):
    """Convert an XLNet LM checkpoint (object or folder) and `save_pretrained` it to `out_dir` as a
    `TransformerXLForPermutationLM`; returns the model."""
    from .modeling_permutation_lm import TransformerXLForPermutationLM

    model = from_xlnet(TransformerXLForPermutationLM, src, **config_overrides)
    model.save_pretrained(out_dir)
    return model
