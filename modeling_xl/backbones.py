"""The backbone of a config, chosen in one place: `attn_type="uni"` is the causal Transformer-XL
(`TransformerXLModel`), `"bi"` the XLNet-style bidirectional one (`TransformerXLPermutationModel`).

Used by the sequence classifier (its `transformer`) and by `AutoModel` (`TransformerXLAnyBackbone`, registered for
`TransformerXLConfig` on `import modeling_xl`, since transformers maps one config class to one model class).
"""

from __future__ import annotations

import os

from .configuration_transformer_xl import TransformerXLConfig
from .modeling_permutation_lm import TransformerXLPermutationModel
from .modeling_transformer_xl import TransformerXLModel

BACKBONES = {"uni": TransformerXLModel, "bi": TransformerXLPermutationModel}


def backbone_class(config: TransformerXLConfig) -> type:
    """`TransformerXLModel` for `attn_type="uni"`, `TransformerXLPermutationModel` for "bi"."""
    if config.attn_type not in BACKBONES:
        raise ValueError(f"attn_type={config.attn_type!r} is invalid; expected one of {sorted(BACKBONES)}")
    return BACKBONES[config.attn_type]


# where `from_pretrained` looks for the config (the rest of its keyword arguments are about the weights)
HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")


class TransformerXLAnyBackbone:
    """What `AutoModel` maps `TransformerXLConfig` to: `from_pretrained` and `from_config` build the backbone of the
    checkpoint's (or config's) `attn_type`. Never built itself."""

    config_class = TransformerXLConfig

    def __init__(self, *args, **kwargs):
        raise TypeError("TransformerXLAnyBackbone is not a model; expected AutoModel.from_pretrained / from_config, "
                        "or TransformerXLModel / TransformerXLPermutationModel")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        config = kwargs.get("config")  # AutoModel passes the config it loaded; a user may pass a path or nothing
        if not isinstance(config, TransformerXLConfig):
            source = config if isinstance(config, (str, os.PathLike)) else pretrained_model_name_or_path
            config = TransformerXLConfig.from_pretrained(source, **{k: kwargs[k] for k in HUB_KWARGS if k in kwargs})
        return backbone_class(config).from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)

    @classmethod
    def _from_config(cls, config, **kwargs):
        return backbone_class(config)._from_config(config, **kwargs)
