"""Model building for pretraining: config from a preset / config file / checkpoint, vocabulary check, optimizer."""

from __future__ import annotations

import logging

import torch
from transformers import get_scheduler

from ..configuration_transformer_xl import TransformerXLConfig
from ..runtime.validators import local_folder_hint
from ..size_estimate import check_model_fits

logger = logging.getLogger(__name__)


def build_config(args, vocab_size: int, eos_token_id: int | None = None) -> TransformerXLConfig:
    """The architecture: a preset resized to the tokenizer, or a given config/checkpoint (whose vocabulary must match).

    The training recurrence (`mem_len`, `clamp_len`, `same_length`) and dropout come from the arguments, the end of
    text (`eos_token_id`, where `generate` stops) from the tokenizer: None for one without an end token (character
    and byte level), whose id 0 is an ordinary symbol (a space, a byte), not the configuration's default.
    """
    overrides = {"mem_len": args.mem_len, "clamp_len": args.clamp_len, "same_length": args.same_length,
                 "eos_token_id": eos_token_id}
    overrides.update({k: getattr(args, k) for k in ("dropout", "dropatt") if getattr(args, k) is not None})
    architecture = {}
    if args.objective == "plm":
        from .plm_objective import plm_config_overrides

        architecture = plm_config_overrides(args)
        overrides.update(reuse_len=architecture.pop("reuse_len"), bi_data=architecture.pop("bi_data"))
    source = args.model_name_or_path or args.config_name
    if source is not None:  # a saved model keeps its architecture; only recurrence, dropout and plm layout change
        try:
            config = TransformerXLConfig.from_pretrained(source)
        except OSError as error:
            name = "model_name_or_path" if args.model_name_or_path else "config_name"
            raise ValueError(f"{name}={source!r} could not be loaded ({error}){local_folder_hint(source)}; expected a "
                             "folder with config.json written by save_pretrained") from None
        if config.vocab_size != vocab_size:
            raise ValueError(
                f"the tokenizer has {vocab_size} tokens but the model's vocab_size={config.vocab_size} ({source}); "
                "expected the same vocabulary: pass the tokenizer the model was trained with (--tokenizer_name)"
            )
        for key, value in overrides.items():
            setattr(config, key, value)
        config.validate_architecture()
        return config
    preset = TransformerXLConfig.from_preset(args.preset)
    if args.objective == "plm":  # one tied embedding, no adaptive clusters, bidirectional attention
        return TransformerXLConfig.from_preset(args.preset, vocab_size=vocab_size, d_embed=preset.d_model,
                                               **architecture, **overrides)
    cutoffs = [c for c in preset.cutoffs if c < vocab_size]
    if cutoffs != preset.cutoffs:
        logger.info("preset %s: cutoffs %s -> %s for a vocabulary of %d", args.preset, preset.cutoffs, cutoffs, vocab_size)
    tie_projs = preset.tie_projs[: len(cutoffs) + 1]
    return TransformerXLConfig.from_preset(args.preset, vocab_size=vocab_size, cutoffs=cutoffs, tie_projs=tie_projs,
                                           adaptive=preset.adaptive and bool(cutoffs), **overrides)


def build_model(args, config: TransformerXLConfig, model_class=None):
    """A fresh model of `model_class` (default: TransformerXLForCausalLM), or the weights of model_name_or_path."""
    if model_class is None:
        from ..modeling_transformer_xl import TransformerXLForCausalLM as model_class
    check_model_fits(config, training=True)  # weights, gradients and Adam's moments, before any is allocated
    if args.model_name_or_path is not None:
        model = model_class.from_pretrained(args.model_name_or_path, config=config)
        # the saved generation_config.json of the source model may hold another end token (build_config's)
        model.generation_config.eos_token_id = config.eos_token_id
    else:
        model = model_class(config)
    if args.gradient_checkpointing:
        enable_checkpointing(model)
    return model


def enable_checkpointing(model) -> None:
    """Activation checkpointing of every layer: `activation_checkpointing_enable` where transformers has it (its
    older name `gradient_checkpointing_enable` warns that it goes away in transformers 6)."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def fused_supported(params) -> bool:
    """torch's fused Adam/AdamW (one kernel for the whole update, several times faster than the default on the CPU)
    takes floating-point parameters on CPU or CUDA; anything else keeps the default implementation."""
    return bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def build_optimizer(args, model) -> torch.optim.Optimizer:
    """Adam or AdamW (fused where supported); with weight decay, biases, LayerNorm weights and the relative-position
    biases are not decayed."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        exempt = param.dim() < 2 or "layer_norm" in name or name.endswith(("r_w_bias", "r_r_bias", "r_s_bias"))
        (no_decay if exempt else decay).append(param)
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = dict(lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon,
                  fused=fused_supported(decay + no_decay))
    if args.optimizer == "adam":
        return torch.optim.Adam([{"params": decay + no_decay}], **kwargs)
    return torch.optim.AdamW(groups, **kwargs)


def build_scheduler(args, optimizer):
    """transformers.get_scheduler: linear warmup, then cosine/linear decay over max_train_steps (paper: cosine)."""
    return get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=args.num_warmup_steps,
                         num_training_steps=args.max_train_steps)
