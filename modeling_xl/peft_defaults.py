"""What peft adapts in this model type when a `LoraConfig` names no `target_modules`.

peft looks the default up by `config.model_type` in one table, `TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`
(`peft.utils`; read by `LoraModel._prepare_adapter_config` when `get_peft_model` or `model.add_adapter` builds the
adapter). `register_lora_targets` adds "transformer-xl" to that table. `modeling_transformer_xl` calls it on import,
so it runs wherever the model code runs: with this package installed, and in a folder loaded with
`trust_remote_code=True` where it is not (this file is copied beside the weights with the other model files). peft is
optional: without it nothing happens.

The default is the fused query/key/value projection of every attention layer (`attn.qkv_net`, in the causal and the
permutation-LM backbone alike), and the attention output (`attn.o_net`): what every head shares, as peft's defaults for
other models name their attention projections only. A task head's new layers are not LoRA targets: they are trained
whole (`modules_to_save`).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging

logger = logging.getLogger(__name__)

MODEL_TYPE = "transformer-xl"
LORA_TARGET_MODULES = ("qkv_net", "o_net")


def register_lora_targets(model_type: str = MODEL_TYPE) -> bool:
    """Add `LORA_TARGET_MODULES` to peft's table of default LoRA targets under `model_type` (an entry already there
    is kept: a user's own choice wins). Returns whether the table holds it; False when peft is not installed, or
    installed but failing to import (logged: loading the model must not depend on it)."""
    if importlib.util.find_spec("peft") is None:
        return False
    try:  # by name: transformers' check of a remote-code folder's imports would otherwise require peft
        table = importlib.import_module("peft.utils").TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    except Exception as error:  # noqa: BLE001 (an incompatible peft raises anything while importing)
        logger.warning("peft is installed but failed to import (%s: %s); LoRA without target_modules will not know "
                       "model_type %r", type(error).__name__, error, model_type)
        return False
    table.setdefault(model_type, list(LORA_TARGET_MODULES))
    return True
