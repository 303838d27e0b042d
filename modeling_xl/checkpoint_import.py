"""Checkpoints of other formats loaded through `from_pretrained`: `import_checkpoint(cls, path, kwargs)` is the one
call. It finds a legacy transformers-4.x Transformer-XL folder or repo (model_type "transfo-xl",
`legacy_conversion`) or a transformers XLNet one (model_type "xlnet", `xlnet_conversion`) and returns the converted
model (with transformers' loading info when `output_loading_info`), or None for a folder of our own format.
"""

from __future__ import annotations

import os

import torch

from .configuration_transformer_xl import TransformerXLConfig
from .legacy_conversion import (
    find_legacy_files,
    legacy_model_and_new_weights,
    local_resolver,
    resolve_device_map,
    resolve_dtype,
)
from .xlnet_conversion import from_xlnet, is_xlnet_checkpoint

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


def checkpoint_resolver(path: str, kwargs: dict):
    """`resolve(file name) -> local path or None` for a local folder, or for a Hub repo through transformers' cache
    (revision, token and cache_dir from `kwargs`)."""
    if os.path.isdir(path):
        return local_resolver(path)
    from transformers.utils import cached_file

    def resolve(name):
        try:
            return cached_file(path, name, _raise_exceptions_for_missing_entries=False,
                               **{k: kwargs[k] for k in ("revision", "token", "cache_dir") if k in kwargs})
        except OSError:  # unreachable or unknown repo: the regular loader reports it
            return None

    return resolve


def import_checkpoint(cls, pretrained_model_name_or_path, kwargs: dict):
    """`cls` (a model class of this package) converted from a legacy Transformer-XL or a transformers XLNet
    checkpoint at `pretrained_model_name_or_path`, with `from_pretrained`'s `kwargs`; None when it is neither (the
    regular loader then reads it). With `output_loading_info`, (model, info) as transformers returns it."""
    path = str(pretrained_model_name_or_path)
    resolve = checkpoint_resolver(path, kwargs)
    legacy = find_legacy_files(resolve)
    if legacy is not None:
        return _import_legacy(cls, legacy, kwargs)
    if is_xlnet_checkpoint(resolve):
        return _import_xlnet(cls, path, resolve, kwargs)
    return None


def _loading_info(missing, mismatched=()) -> dict:
    return {"missing_keys": set(missing), "unexpected_keys": set(), "mismatched_keys": set(mismatched),
            "error_msgs": []}


def _import_legacy(cls, files: tuple[str, str], kwargs: dict):
    overrides = {k: v for k, v in kwargs.items() if k not in LOADING_KWARGS}
    model, new_weights = legacy_model_and_new_weights(
        cls, *files, dtype=kwargs.get("dtype", kwargs.get("torch_dtype")), device_map=kwargs.get("device_map"),
        **overrides)
    if kwargs.get("output_loading_info"):  # every weight was converted, but a head the checkpoint lacks
        return model, _loading_info(new_weights)
    return model


def _import_xlnet(cls, path: str, resolve, kwargs: dict):
    overrides = {k: v for k, v in kwargs.items() if k not in LOADING_KWARGS and k != "config"}
    config = kwargs.get("config")
    info = {}
    model = from_xlnet(cls, path, config=config if isinstance(config, TransformerXLConfig) else None,
                       ignore_mismatched_sizes=kwargs.get("ignore_mismatched_sizes", False), resolve=resolve,
                       loading_info=info, **overrides)
    dtype = resolve_dtype(kwargs.get("dtype", kwargs.get("torch_dtype")))
    if isinstance(dtype, torch.dtype):  # "auto": the converted weights' own type (float32 as saved)
        model = model.to(dtype)
    device = resolve_device_map(kwargs.get("device_map"))
    if device is not None:
        model = model.to(device)
    if kwargs.get("output_loading_info"):  # every backbone weight was converted (else from_xlnet raised)
        return model, _loading_info(info["missing_keys"], info["mismatched_keys"])
    return model
