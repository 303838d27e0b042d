"""Import of transformers-4.x Transformer-XL checkpoints (model_type "transfo-xl") into this package's format.

Nothing is unpickled: safetensors files are read as tensors, `pytorch_model.bin` with `torch.load(weights_only=True)`.
The legacy layout differs from ours only in names (and in keeping `pos_emb.inv_freq`, which we recompute), so the
conversion is an explicit key map with `{}` as the layer/cluster number and a shape check of every tensor.
"""

from __future__ import annotations

import json
import os
import re

import torch
from transformers.utils import logging

# the config side of the conversion lives with the config (`TransformerXLConfig.from_pretrained` reads legacy folders)
from .configuration_transformer_xl import (
    LEGACY_MODEL_TYPE,
    LegacyTransfoXLConfig,  # noqa: F401 (importable here as before)
    TransformerXLConfig,
    convert_config,
)

logger = logging.get_logger(__name__)

# legacy name -> our name; `{}` stands for a layer or cluster number.
KEY_MAP = {
    "transformer.word_emb.emb_layers.{}.weight": "transformer.word_emb.emb_layers.{}.weight",
    "transformer.word_emb.emb_projs.{}": "transformer.word_emb.emb_projs.{}.weight",
    "transformer.r_w_bias": "transformer.r_w_bias",
    "transformer.r_r_bias": "transformer.r_r_bias",
    "transformer.layers.{}.dec_attn.qkv_net.weight": "transformer.layers.{}.attn.qkv_net.weight",
    "transformer.layers.{}.dec_attn.r_net.weight": "transformer.layers.{}.attn.r_net.weight",
    "transformer.layers.{}.dec_attn.o_net.weight": "transformer.layers.{}.attn.o_net.weight",
    "transformer.layers.{}.dec_attn.r_w_bias": "transformer.layers.{}.attn.r_w_bias",
    "transformer.layers.{}.dec_attn.r_r_bias": "transformer.layers.{}.attn.r_r_bias",
    "transformer.layers.{}.dec_attn.layer_norm.weight": "transformer.layers.{}.attn.layer_norm.weight",
    "transformer.layers.{}.dec_attn.layer_norm.bias": "transformer.layers.{}.attn.layer_norm.bias",
    "transformer.layers.{}.pos_ff.CoreNet.0.weight": "transformer.layers.{}.ff.layer_1.weight",
    "transformer.layers.{}.pos_ff.CoreNet.0.bias": "transformer.layers.{}.ff.layer_1.bias",
    "transformer.layers.{}.pos_ff.CoreNet.3.weight": "transformer.layers.{}.ff.layer_2.weight",
    "transformer.layers.{}.pos_ff.CoreNet.3.bias": "transformer.layers.{}.ff.layer_2.bias",
    "transformer.layers.{}.pos_ff.layer_norm.weight": "transformer.layers.{}.ff.layer_norm.weight",
    "transformer.layers.{}.pos_ff.layer_norm.bias": "transformer.layers.{}.ff.layer_norm.bias",
    "crit.cluster_weight": "lm_head.cluster_weight",
    "crit.cluster_bias": "lm_head.cluster_bias",
    "crit.out_layers.{}.weight": "lm_head.out_layers.{}.weight",
    "crit.out_layers.{}.bias": "lm_head.out_layers.{}.bias",
    "crit.out_projs.{}": "lm_head.out_projs.{}.weight",
}
# Recomputed from the config (a non-persistent buffer in our model).
DROPPED_KEYS = ("transformer.pos_emb.inv_freq",)
_PATTERNS = [(re.compile("^" + re.escape(k).replace(r"\{\}", r"(\d+)") + "$"), v) for k, v in KEY_MAP.items()]


def convert_key(legacy_key: str) -> str | None:
    """Our name for a legacy key; None for keys we drop. Unknown keys raise (nothing is silently lost)."""
    if legacy_key in DROPPED_KEYS:
        return None
    for pattern, target in _PATTERNS:
        match = pattern.match(legacy_key)
        if match:
            return target.replace("{}", match.group(1)) if match.groups() else target
    raise ValueError(f"legacy checkpoint key {legacy_key!r} is not a known Transformer-XL weight; expected one of "
                     f"the patterns {sorted(KEY_MAP)}")


def convert_state_dict(
    legacy_state: dict[str, torch.Tensor], expected: dict[str, torch.Size], tied=(), skip_prefixes=()
) -> dict[str, torch.Tensor]:
    """Rename every legacy tensor and check it against the shape in `expected` (our name -> shape).

    Keys whose new name starts with one of `skip_prefixes` are dropped (the softmax when loading a bare backbone);
    parameters in `tied` may be absent (they are filled by tying).
    """
    converted = {}
    for key, tensor in legacy_state.items():
        name = convert_key(key)
        if name is None or name.startswith(tuple(skip_prefixes)):
            continue
        if name not in expected and re.fullmatch(r"transformer\.layers\.\d+\.attn\.r_[wr]_bias", name):
            continue  # shared (untie_r=False) biases repeated under every layer by the legacy model
        if name not in expected:
            raise ValueError(f"legacy key {key!r} maps to {name!r}, which this config does not have; the checkpoint "
                             "and its config.json disagree")
        if tuple(tensor.shape) != tuple(expected[name]):
            raise ValueError(f"legacy key {key!r} has shape {tuple(tensor.shape)}; expected "
                             f"{tuple(expected[name])} for {name!r}")
        converted[name] = tensor
    for target, source in dict(tied).items():  # safetensors keeps one copy of tied tensors, either one
        if source not in converted and target in converted:
            converted[source] = converted[target]
    missing = sorted(set(expected) - set(converted) - set(tied))
    if missing:
        raise ValueError(f"legacy checkpoint lacks weights for {missing}")
    return converted


def is_legacy_checkpoint(config_dict: dict) -> bool:
    return config_dict.get("model_type") == LEGACY_MODEL_TYPE


def read_legacy_weights(path: str) -> dict[str, torch.Tensor]:
    """Tensors of `model.safetensors` or `pytorch_model.bin` (weights_only: no arbitrary objects are unpickled)."""
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # weights_only refuses pickled objects that are not plain tensors
        raise ValueError(f"{path} could not be read as plain tensors (weights_only=True): {err}") from err


def load_legacy_model(cls, config_path: str, weights_path: str, dtype: torch.dtype | None = None,
                      config: TransformerXLConfig | None = None, **overrides):
    """Build `cls` (our causal LM or bare backbone) from a legacy config.json and weights file. `config` replaces the
    converted config (its shapes must match the weights), `overrides` set config fields (as `from_pretrained`'s
    keyword arguments do)."""
    return legacy_model_and_new_weights(cls, config_path, weights_path, dtype, config, **overrides)[0]


def legacy_model_and_new_weights(cls, config_path: str, weights_path: str, dtype: torch.dtype | str | None = None,
                                 config: TransformerXLConfig | None = None, device_map=None, **overrides):
    """`load_legacy_model`, and the names of the weights the checkpoint has none for (a classifier's new head).
    `dtype` as `from_pretrained` takes it: a torch dtype, its name ("bfloat16") or "auto" (the checkpoint's);
    `device_map` a device ("cuda", "cpu", `torch.device`, an index); "auto" or a per-module map is not applied to a
    converted checkpoint (a warning says so)."""
    dtype = resolve_dtype(dtype)
    if config is not None:
        if not isinstance(config, TransformerXLConfig):
            raise ValueError(f"config is a {type(config).__name__}; expected a TransformerXLConfig")
        config = TransformerXLConfig(**{**config.to_dict(), **overrides}) if overrides else config
    else:
        with open(config_path, encoding="utf-8") as f:
            config = convert_config(json.load(f), **overrides)
    model = cls(config)
    is_backbone = not hasattr(model, "transformer")
    prefix = "transformer." if is_backbone else ""
    shapes = {prefix + k: v.shape for k, v in model.state_dict().items()}
    # what a legacy checkpoint holds: the backbone, and the softmax where the model has one (not a classifier's head)
    expected = {k: v for k, v in shapes.items() if k.startswith(("transformer.", "lm_head."))}
    new_head = sorted(set(shapes) - set(expected))
    tied = getattr(model, "all_tied_weights_keys", {}) or {}
    converted = convert_state_dict(read_legacy_weights(weights_path), expected, tied,
                                   skip_prefixes=() if hasattr(model, "lm_head") else ("lm_head.",))
    if dtype == "auto":  # the checkpoint's own floating-point type
        dtype = next((v.dtype for v in converted.values() if v.is_floating_point()), None)
    if new_head:
        logger.warning("%s: a legacy Transformer-XL checkpoint has no weights for %s; they are newly initialised "
                       "(train them before use)", cls.__name__, ", ".join(new_head))
    model.load_state_dict({k[len(prefix):]: v for k, v in converted.items()}, strict=False)
    model.tie_weights()
    if dtype is not None:
        model = model.to(dtype)
    device = resolve_device_map(device_map)
    if device is not None:
        model = model.to(device)
    return model.eval(), new_head


DISPATCH_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def resolve_device_map(device_map):
    """The one device a `from_pretrained` device_map names ("cuda", 0, `torch.device`, {"": "cuda:0"}), else None:
    a dispatch strategy ("auto", "balanced", ...) or a per-module map is not applied to a converted checkpoint (a
    warning says so; the model stays on the CPU). Anything else is a ValueError naming device_map."""
    if device_map is None:
        return None
    if isinstance(device_map, dict) and set(device_map) == {""}:
        device_map = device_map[""]
    if isinstance(device_map, str) and device_map in DISPATCH_STRATEGIES or isinstance(device_map, dict):
        logger.warning("device_map=%r is not applied to a converted legacy checkpoint; the model is on the CPU "
                       "(move it with .to(device))", device_map)
        return None
    try:
        return torch.device(device_map)
    except (RuntimeError, TypeError):
        raise ValueError(f"device_map={device_map!r} is invalid; expected a device ('cpu', 'cuda:0', an index), "
                         f"{{'': device}}, or one of {list(DISPATCH_STRATEGIES)}") from None


def resolve_dtype(dtype):
    """A `from_pretrained` dtype: None, "auto", a torch dtype or the name of one (ValueError otherwise)."""
    if dtype is None or dtype == "auto" or isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, dtype, None) if isinstance(dtype, str) else None
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(f"dtype={dtype!r} is invalid; expected a floating-point torch dtype, its name "
                         "('float32', 'bfloat16', ...) or 'auto'")
    return resolved


def find_legacy_files(resolve) -> tuple[str, str] | None:
    """(config path, weights path) if `resolve(filename)` finds a legacy checkpoint, else None."""
    config_path = resolve("config.json")
    if config_path is None:
        return None
    with open(config_path, encoding="utf-8") as f:
        if not is_legacy_checkpoint(json.load(f)):
            return None
    for name in ("model.safetensors", "pytorch_model.bin"):
        weights = resolve(name)
        if weights is not None:
            return config_path, weights
    raise ValueError(f"legacy Transformer-XL config found at {config_path} but neither model.safetensors nor "
                     "pytorch_model.bin beside it")


def local_resolver(directory: str):
    def resolve(name):
        path = os.path.join(directory, name)
        return path if os.path.isfile(path) else None

    return resolve
