"""Configuration of the Transformer-XL family (backbone, causal LM, permutation LM, classification)."""

from __future__ import annotations

import numbers

import numpy as np
from transformers import PreTrainedConfig

# model_type of the transformers-4.x Transformer-XL, which transformers 5 no longer knows
LEGACY_MODEL_TYPE = "transfo-xl"
XLNET_MODEL_TYPE = "xlnet"

# Paper hyperparameters (Dai et al. 2019, Table 1 and the released scripts). `train_*` and `eval_*` entries are the
# segment/memory lengths the scripts use; the model itself only reads `mem_len`, `clamp_len` and `same_length`.
PRESETS: dict[str, dict] = {
    # Small enough for unit tests: every code path (adaptive softmax with two tail clusters, div_val 2) in milliseconds.
    "debug": dict(
        vocab_size=97, d_model=16, d_embed=16, n_layer=2, n_head=2, d_head=8, d_inner=32,
        cutoffs=[20, 50], div_val=2, mem_len=8, clamp_len=-1, dropout=0.0, dropatt=0.0,
    ),
    # CPU-sized model that learns a few-million-token corpus in minutes on 2 cores. Pre-LN: at this size, with a
    # short schedule, post-LN sat on the unigram plateau for the whole run (context unused) while pre-LN left it.
    "tiny": dict(
        vocab_size=8000, d_model=128, d_embed=128, n_layer=4, n_head=4, d_head=32, d_inner=512,
        cutoffs=[2000, 4000], div_val=2, mem_len=64, clamp_len=-1, dropout=0.1, dropatt=0.0, pre_lnorm=True,
    ),
    "wt103-base": dict(
        vocab_size=267735, d_model=410, d_embed=410, n_layer=16, n_head=10, d_head=41, d_inner=2100,
        cutoffs=[20000, 40000, 200000], div_val=1, mem_len=150, clamp_len=-1, dropout=0.1, dropatt=0.0,
    ),
    "wt103-large": dict(
        vocab_size=267735, d_model=1024, d_embed=1024, n_layer=18, n_head=16, d_head=64, d_inner=4096,
        cutoffs=[20000, 40000, 200000], div_val=4, mem_len=384, clamp_len=-1, dropout=0.2, dropatt=0.2,
    ),
    "enwik8-base": dict(
        vocab_size=204, d_model=512, d_embed=512, n_layer=12, n_head=8, d_head=64, d_inner=2048,
        cutoffs=[], adaptive=False, div_val=1, mem_len=512, clamp_len=-1, dropout=0.1, dropatt=0.0,
    ),
    "enwik8-large": dict(
        vocab_size=204, d_model=1024, d_embed=1024, n_layer=24, n_head=8, d_head=128, d_inner=3072,
        cutoffs=[], adaptive=False, div_val=1, mem_len=768, clamp_len=-1, dropout=0.15, dropatt=0.15,
    ),
    # XLNet (Yang et al. 2019, Table 7; the released xlnet-{base,large}-cased): SentencePiece vocabulary of 32000, GELU,
    # bidirectional attention; dropout also on attention probabilities. Pretraining used seq 512, reuse 256, mem 384.
    "xlnet-base": dict(
        vocab_size=32000, d_model=768, n_layer=12, n_head=12, d_head=64, d_inner=3072, cutoffs=[], adaptive=False,
        attn_type="bi", ff_activation="gelu", mem_len=384, reuse_len=256, clamp_len=-1, dropout=0.1, dropatt=0.1,
        layer_norm_epsilon=1e-12,
    ),
    "xlnet-large": dict(
        vocab_size=32000, d_model=1024, n_layer=24, n_head=16, d_head=64, d_inner=4096, cutoffs=[], adaptive=False,
        attn_type="bi", ff_activation="gelu", mem_len=384, reuse_len=256, clamp_len=-1, dropout=0.1, dropatt=0.1,
        layer_norm_epsilon=1e-12,
    ),
}

class TransformerXLConfig(PreTrainedConfig):
    r"""Hyperparameters of a Transformer-XL model (field names as in the paper's code and transformers 4.x).

    Args:
        vocab_size: number of tokens.
        d_model: width of the residual stream.
        d_embed: width of the (largest) embedding cluster; defaults to d_model.
        n_layer, n_head, d_head, d_inner: depth, heads, per-head width, feed-forward width.
        cutoffs: boundaries of the adaptive input/softmax clusters (sorted, each below vocab_size). Empty: one softmax.
        div_val: cluster i embeds in `d_embed // div_val**i` dimensions.
        tie_projs: per cluster, whether the output projection is tied to the input one (default `[False, True, ...]`).
        adaptive: use cutoffs; False means a single full softmax.
        pre_lnorm: LayerNorm before each sublayer (True) or after the residual sum (False, the paper's default).
        untie_r: one (u, v) bias pair per layer (True) or shared by all layers.
        mem_len: how many past hidden states each layer keeps as memory (0: no recurrence).
        clamp_len: relative distances beyond this use the same position vector (-1: no clamping).
        same_length: every query attends to the same number of keys: the newest mem_len, its own included
            (`relative_attention.causal_mask`).
        dropout, dropatt: dropout on activations and on attention probabilities.
        init_std, proj_init_std: normal init std of weights and of adaptive projections.
        attn_type, n_token_type, bi_data, ...: used by the permutation-LM head (see `modeling_permutation_lm`).
        reuse_len: permutation LM: how many leading tokens of a sample feed the next memory (None: all of them).
    """

    model_type = "transformer-xl"
    keys_to_ignore_at_inference = ["mems"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
        "intermediate_size": "d_inner",
    }

    vocab_size: int = 267735
    d_model: int = 410
    d_embed: int | None = None
    n_layer: int = 16
    n_head: int = 10
    d_head: int = 41
    d_inner: int = 2100
    cutoffs: list[int] | None = None
    div_val: int = 1
    tie_projs: list[bool] | None = None
    adaptive: bool = True
    pre_lnorm: bool = False
    untie_r: bool = True
    mem_len: int = 150
    clamp_len: int = -1
    same_length: bool = False
    dropout: float = 0.1
    dropatt: float = 0.0
    init_std: float = 0.02
    proj_init_std: float = 0.01
    layer_norm_epsilon: float = 1e-5
    # Permutation-LM / XLNet fields (see modeling_permutation_lm).
    attn_type: str = "uni"
    n_token_type: int = 0
    bi_data: bool = False
    reuse_len: int | None = None
    ff_activation: str = "relu"
    # Sequence-classification fields (see modeling_classification).
    summary_type: str = "last"
    classifier_dropout: float = 0.1
    # XLNet's question-answering head (see modeling_question_answering): candidates kept by its beam search.
    start_n_top: int = 5
    end_n_top: int = 5
    eos_token_id: int | list[int] | None = 0
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        if self.d_embed is None:
            self.d_embed = self.d_model
        for field in ("cutoffs", "tie_projs"):
            value = getattr(self, field)
            if value is not None and not isinstance(value, (list, tuple)):
                raise ValueError(f"{field}={value!r} is invalid; expected a list (or None)")
        self.cutoffs = list(self.cutoffs) if (self.cutoffs and self.adaptive) else []
        if self.tie_projs is None:
            self.tie_projs = [False] + [True] * len(self.cutoffs)
        self.tie_projs = list(self.tie_projs)
        super().__post_init__(**kwargs)
        self.validate_architecture()

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        """As in transformers, then validated again: `from_pretrained(..., mem_len=-3)` sets its keyword arguments
        after the config was built and checked."""
        result = super().from_dict(config_dict, **kwargs)
        (result[0] if isinstance(result, tuple) else result).validate_architecture()
        return result

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """As in transformers, plus the config.json of a legacy transformers-4.x Transformer-XL checkpoint (model_type
        "transfo-xl") or of a transformers XLNet model ("xlnet"), converted (`convert_config`, `config_from_xlnet`)
        with the keyword arguments as overrides."""
        config_dict, unused = cls.get_config_dict(pretrained_model_name_or_path, **kwargs)
        if config_dict.get("model_type") == XLNET_MODEL_TYPE:
            from transformers import XLNetConfig

            return config_from_xlnet(XLNetConfig.from_dict(config_dict), **unused)
        if config_dict.get("model_type") != LEGACY_MODEL_TYPE:
            return super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        return LegacyTransfoXLConfig.from_dict(config_dict, **unused)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "TransformerXLConfig":
        """A config with a named preset's hyperparameters (`debug`, `tiny`, `wt103-base`, ...), then `overrides`."""
        if name not in PRESETS:
            raise ValueError(f"preset={name!r} is unknown; expected one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    def validate_architecture(self) -> None:
        """Raise a ValueError naming the field, its value and what was expected."""
        for field in ("vocab_size", "d_model", "d_embed", "n_layer", "n_head", "d_head", "d_inner"):
            value = getattr(self, field)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"{field}={value!r} is invalid; expected a positive integer")
        if self.d_model % 2:
            raise ValueError(f"d_model={self.d_model} is invalid; expected an even number (the sinusoid position "
                             "table pairs a sine and a cosine per frequency)")
        for field in ("adaptive", "pre_lnorm", "untie_r", "same_length", "bi_data"):
            if not isinstance(getattr(self, field), (bool, np.bool_)):
                raise ValueError(f"{field}={getattr(self, field)!r} is invalid; expected True or False")
        for field in ("pad_token_id", "bos_token_id"):
            value = getattr(self, field, None)
            if value is None:
                continue
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{field}={value!r} is invalid; expected None or an integer token id")
            if not 0 <= value < self.vocab_size:
                raise ValueError(f"{field}={value!r} is invalid; expected None or a token id in "
                                 f"[0, vocab_size={self.vocab_size})")
        self._validate_adaptive()
        if not _is_int(self.mem_len) or self.mem_len < 0:
            raise ValueError(f"mem_len={self.mem_len!r} is invalid; expected an integer >= 0")
        if not _is_int(self.clamp_len) or (self.clamp_len < 0 and self.clamp_len != -1):
            raise ValueError(f"clamp_len={self.clamp_len!r} is invalid; expected -1 (no clamping) or an integer >= 0")
        for field in ("dropout", "dropatt", "classifier_dropout"):
            value = getattr(self, field)
            if not _is_number(value) or not 0.0 <= value < 1.0:
                raise ValueError(f"{field}={value!r} is invalid; expected a probability in [0, 1)")
        for field in ("init_std", "proj_init_std", "layer_norm_epsilon"):
            value = getattr(self, field)
            if not _is_number(value) or not value > 0:
                raise ValueError(f"{field}={value!r} is invalid; expected a positive number")
        if self.n_token_type is not None and (not _is_int(self.n_token_type) or self.n_token_type < 0):
            raise ValueError(f"n_token_type={self.n_token_type!r} is invalid; expected an integer >= 0")
        if self.reuse_len is not None and (not _is_int(self.reuse_len) or self.reuse_len < 1):
            raise ValueError(f"reuse_len={self.reuse_len!r} is invalid; expected None or an integer >= 1")
        if self.attn_type not in ("uni", "bi"):
            raise ValueError(f"attn_type={self.attn_type!r} is invalid; expected 'uni' or 'bi'")
        if self.summary_type not in ("last", "first", "mean"):
            raise ValueError(f"summary_type={self.summary_type!r} is invalid; expected 'last', 'first' or 'mean'")
        if self.ff_activation not in ("relu", "gelu"):
            raise ValueError(f"ff_activation={self.ff_activation!r} is invalid; expected 'relu' or 'gelu'")
        for field in ("start_n_top", "end_n_top"):
            value = getattr(self, field, 5)
            if not _is_int(value) or value < 1:
                raise ValueError(f"{field}={value!r} is invalid; expected a positive integer")


    def _validate_adaptive(self) -> None:
        """The adaptive input and softmax: strictly increasing `cutoffs` below vocab_size, one `tie_projs` flag per
        cluster, and a width of at least 1 for every cluster (`d_embed // div_val**i`)."""
        if not isinstance(self.cutoffs, list) or not isinstance(self.tie_projs, list):
            raise ValueError(f"cutoffs={self.cutoffs!r}, tie_projs={self.tie_projs!r} are invalid; expected lists")
        if not _is_int(self.div_val) or self.div_val < 1:
            raise ValueError(f"div_val={self.div_val!r} is invalid; expected an integer >= 1")
        cutoffs = self.cutoffs
        if any(not _is_int(c) or c <= 0 for c in cutoffs):
            raise ValueError(f"cutoffs={cutoffs!r} is invalid; expected positive integers")
        if sorted(set(cutoffs)) != cutoffs:
            raise ValueError(f"cutoffs={cutoffs!r} is invalid; expected strictly increasing values")
        if cutoffs and cutoffs[-1] >= self.vocab_size:
            raise ValueError(
                f"cutoffs={cutoffs!r} is invalid; expected every cutoff below vocab_size={self.vocab_size}"
            )
        if len(self.tie_projs) != len(cutoffs) + 1:
            raise ValueError(
                f"tie_projs={self.tie_projs!r} is invalid; expected one flag per cluster ({len(cutoffs) + 1})"
            )
        for i in range(len(cutoffs) + 1):
            if self.d_embed // self.div_val**i < 1:
                raise ValueError(
                    f"div_val={self.div_val} is too large for d_embed={self.d_embed}: cluster {i} would have "
                    "no dimensions; expected d_embed // div_val**i >= 1 for every cluster"
                )


# the architecture fields a legacy config.json must give (everything else has the transformers-4.x default)
LEGACY_REQUIRED = ("vocab_size", "d_model", "n_layer", "n_head", "d_head", "d_inner")


def convert_config(legacy: dict, **overrides) -> TransformerXLConfig:
    """Our config from a legacy config.json dict (rejects variants the paper's released models never used), with
    `overrides` (config fields, e.g. the evaluation's `mem_len` / `clamp_len`) applied and validated."""
    if legacy.get("model_type") != LEGACY_MODEL_TYPE:
        raise ValueError(f"model_type={legacy.get('model_type')!r}; expected {LEGACY_MODEL_TYPE!r}")
    missing = [key for key in LEGACY_REQUIRED if key not in legacy]
    if missing:
        raise ValueError(f"the legacy Transformer-XL config.json has no {', '.join(missing)}; expected every "
                         f"architecture field ({', '.join(LEGACY_REQUIRED)}) as transformers 4.x writes them")
    if legacy.get("attn_type", 0) != 0:
        raise ValueError(f"attn_type={legacy['attn_type']!r} is not supported; expected 0 (relative attention)")
    if legacy.get("sample_softmax", -1) > 0:
        raise ValueError(f"sample_softmax={legacy['sample_softmax']!r} is not supported; expected -1")
    cutoffs = list(legacy.get("cutoffs", []))
    tie_projs = legacy.get("tie_projs")
    if tie_projs is None:
        tie_projs = [False] + [bool(legacy.get("proj_share_all_but_first", True))] * len(cutoffs)
    fields = dict(
        vocab_size=legacy["vocab_size"], d_model=legacy["d_model"], d_embed=legacy.get("d_embed", legacy["d_model"]),
        n_layer=legacy["n_layer"], n_head=legacy["n_head"], d_head=legacy["d_head"], d_inner=legacy["d_inner"],
        cutoffs=cutoffs, div_val=legacy.get("div_val", 1), tie_projs=list(tie_projs), adaptive=True,
        pre_lnorm=legacy.get("pre_lnorm", False), untie_r=legacy.get("untie_r", True),
        mem_len=legacy.get("mem_len", 0) or 0, clamp_len=legacy.get("clamp_len", -1),
        same_length=legacy.get("same_length", False), dropout=legacy.get("dropout", 0.1),
        dropatt=legacy.get("dropatt", 0.0), init_std=legacy.get("init_std", 0.02),
        proj_init_std=legacy.get("proj_init_std", 0.01), layer_norm_epsilon=legacy.get("layer_norm_epsilon", 1e-5),
        eos_token_id=legacy.get("eos_token_id", 0), tie_word_embeddings=legacy.get("tie_word_embeddings", True),
    )
    if fields["clamp_len"] < 0:
        fields["clamp_len"] = -1
    known = {*TransformerXLConfig().to_dict(), "num_labels"}  # num_labels: a PreTrainedConfig argument (id2label)
    unknown = sorted(set(overrides) - set(fields) - known)
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not a TransformerXLConfig field; expected config fields as keyword "
                         "arguments when loading a legacy Transformer-XL checkpoint")
    return TransformerXLConfig(**{**fields, **overrides})


class LegacyTransfoXLConfig(TransformerXLConfig):
    """The reader of a legacy config.json (model_type "transfo-xl", which transformers 5 no longer knows) for
    `AutoConfig` and the `AutoModel*` classes, registered on `import modeling_xl`. `from_dict` returns the converted
    `TransformerXLConfig` (keyword arguments that are config fields override it), so the Auto classes pick this
    package's models, whose `from_pretrained` converts the weights. No config of this class is ever built."""

    model_type = LEGACY_MODEL_TYPE

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        return_unused = kwargs.pop("return_unused_kwargs", False)
        for private in ("_from_auto", "_from_pipeline", "_commit_hash"):  # loading bookkeeping, as in transformers
            kwargs.pop(private, None)
        fields = {*TransformerXLConfig().to_dict(), "num_labels"}
        overrides = {key: kwargs.pop(key) for key in list(kwargs) if key in fields}
        config = convert_config(config_dict, **overrides)
        return (config, kwargs) if return_unused else config


def config_from_xlnet(xlnet_config, **overrides) -> TransformerXLConfig:
    """Our config for a transformers `XLNetConfig` (then `overrides`). XLNet always keeps per-layer biases
    (untie_r=True here); it drops attention probabilities with `dropout` (our `dropatt`); `mem_len=None` (keep every
    state) becomes 0 (no memory); `reuse_len` 0 becomes None."""
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
        start_n_top=xlnet_config.start_n_top, end_n_top=xlnet_config.end_n_top,
        id2label=dict(xlnet_config.id2label), pad_token_id=xlnet_config.pad_token_id,
        bos_token_id=xlnet_config.bos_token_id, eos_token_id=xlnet_config.eos_token_id, tie_word_embeddings=True,
    )
    if "num_labels" in overrides or "id2label" in overrides:  # the caller's labels replace the checkpoint's
        values.pop("id2label")
    return TransformerXLConfig(**{**values, **overrides})


def _is_int(value) -> bool:
    """An int and not a bool (`True` is an int to Python, never a length)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
