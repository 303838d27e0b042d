"""Import transformers XLNet checkpoints (`XLNetLMHeadModel`, `XLNetModel` and every task head:
`XLNetForSequenceClassification`, `...ForQuestionAnsweringSimple`, `...ForQuestionAnswering`,
`...ForTokenClassification`, `...ForMultipleChoice`): `from_xlnet(TransformerXLForPermutationLM, path_or_model)`
(or the matching head, or the bare backbone). `TransformerXLPreTrainedModel.from_pretrained` calls it for a folder
or Hub repo whose config.json says model_type "xlnet", so every script imports XLNet folders as they are.

An explicit key map for the backbone, ours <- theirs, with `{}` standing for the layer index; every converted tensor
is checked against the shape our model expects. XLNet stores each attention projection as [d_model, H, D] (applied
with einsum); ours are `nn.Linear` weights: q, k, v fused into `qkv_net.weight` [3*H*D, d], `r_net.weight` [H*D, d],
`o_net.weight` [d, H*D]. The output layer is tied to the token embedding; only its bias (`lm_loss.bias`) is copied.
Task heads keep transformers' module names here (`HEAD_PREFIXES`), so their weights are copied as they are.

Config differences: see `configuration_transformer_xl.config_from_xlnet`.
"""

from __future__ import annotations

import copy
import json
import logging
import os

import torch

from .configuration_transformer_xl import XLNET_MODEL_TYPE, TransformerXLConfig, config_from_xlnet  # noqa: F401

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
# transformers' XLNet task heads; ours carry the same module names, so these keys are copied unchanged.
HEAD_PREFIXES = ("sequence_summary.", "logits_proj.", "qa_outputs.", "classifier.", "start_logits.", "end_logits.",
                 "answer_class.")
TIED_SOURCE_KEYS = {"lm_loss.weight"}  # XLNet's tied output matrix: the embedding already carries it


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
    out.update(xlnet_head_state_dict(state_dict))
    used = {t for theirs, _ in _expand({**BACKBONE_KEY_MAP, **LM_HEAD_KEY_MAP}, config.n_layer).values()
            for t in theirs}
    unknown = sorted(set(state_dict) - used - TIED_SOURCE_KEYS - set(out))
    if unknown:
        raise ValueError(f"XLNet state dict has keys with no counterpart here: {unknown[:5]}; expected only the "
                         f"backbone, lm_loss and task-head weights (keys starting with {', '.join(HEAD_PREFIXES)})")
    return out


def xlnet_head_state_dict(state_dict: dict) -> dict[str, torch.Tensor]:
    """The task-head weights of an XLNet state dict (keys under `HEAD_PREFIXES`), unchanged: our heads use
    transformers' names. {} for a language model or a bare backbone. Shapes are checked against the model they load
    into (`from_xlnet`)."""
    return {k: v for k, v in state_dict.items() if k.startswith(HEAD_PREFIXES)}


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def read_weights(resolve, where: str) -> dict[str, torch.Tensor]:
    """The state dict of a saved folder or repo, `resolve(name)` giving a local path or None: model.safetensors, the
    shards of model.safetensors.index.json, or pytorch_model.bin (read with weights_only=True: nothing unpickled)."""
    from safetensors.torch import load_file

    for name in WEIGHT_FILES:
        path = resolve(name)
        if path is None:
            continue
        if name == "model.safetensors":
            return load_file(path)
        if name == "pytorch_model.bin":
            return torch.load(path, map_location="cpu", weights_only=True)
        with open(path, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        state = {}
        for shard in shards:
            shard_path = resolve(shard)
            if shard_path is None:
                raise ValueError(f"{where}: model.safetensors.index.json names {shard!r}, which is absent")
            state.update(load_file(shard_path))
        return state
    raise ValueError(f"{where} holds none of {', '.join(WEIGHT_FILES)}; expected the weights beside config.json")


def load_xlnet(path_or_model, resolve=None) -> tuple[object, dict[str, torch.Tensor]]:
    """(XLNetConfig, state dict) of a transformers XLNet model object, of a local folder saved by `save_pretrained`,
    or of any folder or repo through `resolve(file name) -> local path or None` (as `from_pretrained` resolves)."""
    from transformers import XLNetConfig

    if isinstance(path_or_model, torch.nn.Module):
        return path_or_model.config, {k: v.detach() for k, v in path_or_model.state_dict().items()}
    path = str(path_or_model)
    if resolve is None:
        if not os.path.isdir(path):
            raise ValueError(f"path_or_model={path!r} is not a folder; expected an XLNet model or a local folder "
                             "holding config.json and model.safetensors (or pytorch_model.bin)")

        def resolve(name):
            return os.path.join(path, name) if os.path.exists(os.path.join(path, name)) else None

    config_file = resolve("config.json")
    if config_file is None:
        raise ValueError(f"path_or_model={path!r} has no config.json; expected a folder saved by save_pretrained")
    config = XLNetConfig.from_json_file(config_file)
    return config, read_weights(resolve, f"path_or_model={path!r}")


def is_xlnet_checkpoint(resolve) -> bool:
    """Whether the config.json that `resolve` finds says model_type "xlnet" (a transformers XLNet folder)."""
    config_file = resolve("config.json")
    if config_file is None:
        return False
    try:
        with open(config_file, encoding="utf-8") as f:
            return json.load(f).get("model_type") == XLNET_MODEL_TYPE
    except (OSError, ValueError):  # unreadable: the regular loader reports it
        return False


def from_xlnet(model_class, path_or_model, config=None, ignore_mismatched_sizes: bool = False, resolve=None,
               loading_info: dict | None = None, **config_overrides):
    """A `model_class` instance with the weights of a transformers XLNet model (a model object or a saved folder):
    `TransformerXLForPermutationLM` from an `XLNetLMHeadModel`, a task head from the XLNet head of the same task
    (`XLNetForSequenceClassification` -> `TransformerXLForSequenceClassification`, ...), or the bare backbone
    `TransformerXLPermutationModel`. `config` (ours) replaces the converted one; `config_overrides` set its fields.

    Every backbone parameter must come from the checkpoint (else ValueError naming the first missing ones). Head
    weights the checkpoint lacks keep their initialisation (with a warning, as transformers does); head weights the
    model lacks are dropped; a head weight of another shape (another number of labels) raises, unless
    `ignore_mismatched_sizes` (then it is newly initialised, with a warning). `loading_info`, when given, receives
    the newly initialised (`missing_keys`) and the replaced (`mismatched_keys`) weights' names."""
    xlnet_config, state_dict = load_xlnet(path_or_model, resolve)
    if config is None:
        config = config_from_xlnet(xlnet_config, **config_overrides)
    else:
        config = copy.deepcopy(config)
        for key, value in config_overrides.items():
            setattr(config, key, value)
        config.validate_architecture()
    model = model_class(config)
    converted = convert_xlnet_state_dict(state_dict, config)
    if "transformer.word_emb.weight" not in model.state_dict():  # the bare backbone
        converted = {k.removeprefix("transformer."): v for k, v in converted.items() if k.startswith("transformer.")}
    ours = model.state_dict()
    mismatched = {k: (tuple(v.shape), tuple(ours[k].shape)) for k, v in converted.items()
                  if k in ours and v.shape != ours[k].shape}
    if mismatched and not ignore_mismatched_sizes:
        key, (theirs, wanted) = next(iter(mismatched.items()))
        raise ValueError(f"XLNet weight {key!r} has shape {theirs}; {model_class.__name__} expects {wanted} (another "
                         "number of labels?); expected the same head shape, or ignore_mismatched_sizes=True for a new "
                         "head")
    if mismatched:
        logger.warning("%s: XLNet weights of another shape, newly initialised: %s", model_class.__name__, mismatched)
    result = model.load_state_dict({k: v for k, v in converted.items() if k in ours and k not in mismatched},
                                   strict=False)
    tied = getattr(model, "_tied_weights_keys", None) or {}
    missing = [k for k in result.missing_keys if k not in tied]
    backbone_missing = [k for k in missing if k.startswith("transformer.") or "transformer.word_emb.weight" not in ours]
    if backbone_missing:
        raise ValueError(f"{model_class.__name__} cannot take this XLNet checkpoint: no weights for "
                         f"{backbone_missing[:5]}")
    if missing:
        logger.warning("%s: newly initialised from no XLNet weights: %s", model_class.__name__, missing)
    if loading_info is not None:
        loading_info.update(missing_keys=missing, mismatched_keys=sorted(mismatched))
    return model.eval()
