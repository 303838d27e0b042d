"""LoRA adapters (peft) for every fine-tuning task: `--lora_r` trains low-rank updates of the backbone's projections
and the task head's new layers whole, instead of every weight.

- `AdapterArguments`: `--lora_r`, `--lora_alpha`, `--lora_dropout`, `--lora_target_modules`, `--merge_lora` (part of
  every script's arguments) and their checks (`validate_adapter_arguments`).
- `lora_config(model, ...)`: the `LoraConfig` for a head. The targets default to peft's default for the model type
  (`modeling_xl.peft_defaults`: `qkv_net`, `o_net`); the head's new layers (`logits_proj`, `qa_outputs`, ...) are
  trained whole and saved with the adapter (`modules_to_save`), since peft's task types know only the names
  `classifier`, `score` and `qa_outputs`.
- `attach_adapter(model, args)`: the model wrapped by `get_peft_model` (or the model as it is without `--lora_r`);
  `trainable_parameters(model)` counts what the optimizer updates.
- `save_adapted(...)`: the adapter and the tokenizer at the top of the output folder; with `--merge_lora` the merged
  model there instead (a full model, loaded like any fine-tuned folder) and the adapter in `adapter/`.
- `card_section(...)`: how to load the folder, for the model card.

peft is an optional dependency (`pip install "modeling-xl[peft]"`); it is imported only when `--lora_r` is given.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..runtime.run_folder import update_card_section

logger = logging.getLogger(__name__)

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")  # what `save_pretrained` of a PeftModel writes
ADAPTER_DIR = "adapter"  # with --merge_lora: the adapter beside the merged model
CARD_SECTION = "lora-adapter"
# peft's task type per head class (None: the plain `PeftModel`, which passes every input through). The question
# answering heads take None: peft's QUESTION_ANS wrapper drops `token_type_ids`, which the XLNet-style heads read.
TASK_TYPES = {"TransformerXLForCausalLM": "CAUSAL_LM", "TransformerXLForSequenceClassification": "SEQ_CLS",
              "TransformerXLForTokenClassification": "TOKEN_CLS"}
AUTO_CLASSES = {"TransformerXLForCausalLM": "AutoModelForCausalLM",
                "TransformerXLForPermutationLM": "AutoModelForPreTraining",
                "TransformerXLForSequenceClassification": "AutoModelForSequenceClassification",
                "TransformerXLForQuestionAnsweringSimple": "AutoModelForQuestionAnswering",
                "TransformerXLForQuestionAnswering": "AutoModelForQuestionAnswering",
                "TransformerXLForTokenClassification": "AutoModelForTokenClassification",
                "TransformerXLForMultipleChoice": "AutoModelForMultipleChoice"}
# config fields a fine-tuned head's card need not restate to rebuild the head on the base folder
_BOOKKEEPING = {"architectures", "auto_map", "transformers_version", "dtype", "torch_dtype", "_name_or_path"}


@dataclass(kw_only=True)
class AdapterArguments:
    """The LoRA options of every fine-tuning script (keyword-only: they follow the task's own fields)."""

    lora_r: int | None = field(default=None, metadata={
        "help": "train a LoRA adapter of this rank (peft) instead of every weight; the head's new layers are trained "
                "whole. Needs `pip install \"modeling-xl[peft]\"`"})
    lora_alpha: float | None = field(default=None, metadata={
        "help": "LoRA scaling numerator: the update is (lora_alpha / lora_r) B A x (default: 2 x lora_r)"})
    lora_dropout: float = field(default=0.0, metadata={"help": "dropout on the adapter's input"})
    lora_target_modules: str | None = field(default=None, metadata={
        "help": "comma-separated module names (e.g. qkv_net,o_net,layer_1,layer_2) or 'all-linear' (default: "
                "peft's default for transformer-xl: qkv_net,o_net)"})
    merge_lora: bool = field(default=False, metadata={
        "help": "save the model with the adapter merged into its weights (a full model), the adapter in adapter/"})


def validate_adapter_arguments(args) -> None:
    """ValueError naming the argument, its value and what was expected; peft missing is named with the extra."""
    if args.lora_r is None:
        for name in ("lora_alpha", "lora_target_modules"):
            if getattr(args, name) is not None:
                raise ValueError(f"{name}={getattr(args, name)!r} is set without lora_r; expected --lora_r too "
                                 "(the adapter's rank)")
        if args.lora_dropout or args.merge_lora:
            name = "merge_lora" if args.merge_lora else "lora_dropout"
            raise ValueError(f"{name}={getattr(args, name)!r} is set without lora_r; expected --lora_r too")
        return
    if isinstance(args.lora_r, bool) or not isinstance(args.lora_r, int) or args.lora_r <= 0:
        raise ValueError(f"lora_r={args.lora_r!r} is invalid; expected a positive integer (the adapter's rank)")
    if args.lora_alpha is not None and not args.lora_alpha > 0:
        raise ValueError(f"lora_alpha={args.lora_alpha!r} is invalid; expected a positive number")
    if not 0.0 <= args.lora_dropout < 1.0:
        raise ValueError(f"lora_dropout={args.lora_dropout!r} is invalid; expected a probability in [0, 1)")
    if args.lora_target_modules is not None and not target_modules(args.lora_target_modules):
        raise ValueError(f"lora_target_modules={args.lora_target_modules!r} is invalid; expected module names "
                         "separated by commas (e.g. qkv_net,o_net) or 'all-linear'")
    try:
        import peft  # noqa: F401
    except ImportError:
        raise ValueError(f"lora_r={args.lora_r} needs peft, which is not installed; expected "
                         "`pip install \"modeling-xl[peft]\"` (or `pip install peft`)") from None


def target_modules(text: str | None) -> str | list[str] | None:
    """`--lora_target_modules` as peft takes it: None (the model type's default), "all-linear", or a list of names."""
    if text is None:
        return None
    if text.strip().lower() == "all-linear":
        return "all-linear"
    return [name.strip() for name in text.split(",") if name.strip()]


def head_modules(model) -> list[str]:
    """The task head's own layers: every child of the model with weights but the backbone (`base_model_prefix`).
    None for a language model, whose output layer is pretrained (and tied to the input embedding)."""
    if type(model).__name__ in ("TransformerXLForCausalLM", "TransformerXLForPermutationLM"):
        return []
    return [name for name, module in model.named_children()
            if name != model.base_model_prefix and next(module.parameters(), None) is not None]


def lora_config(model, r: int, alpha: float | None = None, dropout: float = 0.0, targets: str | None = None):
    """The `LoraConfig` of `model`'s head: its task type (`TASK_TYPES`), `targets` (`target_modules`: None for the
    model type's default), and the head's new layers trained and saved whole, all of them named before the adapter
    is built: with "all-linear", a layer peft's task type adds only afterwards (`classifier` of `TOKEN_CLS`) would
    already carry an adapter, which `modules_to_save` then refuses to wrap."""
    from peft import LoraConfig

    return LoraConfig(task_type=TASK_TYPES.get(type(model).__name__), r=r, lora_alpha=2 * r if alpha is None else alpha,
                      lora_dropout=dropout, target_modules=target_modules(targets),
                      modules_to_save=head_modules(model) or None)


def attach_adapter(model, args):
    """`get_peft_model(model, lora_config(...))` with `args.lora_r`; else `model` unchanged."""
    if getattr(args, "lora_r", None) is None:
        return model
    from peft import get_peft_model

    adapted = get_peft_model(model, lora_config(model, args.lora_r, args.lora_alpha, args.lora_dropout,
                                                args.lora_target_modules))
    counts = trainable_parameters(adapted)
    logger.info("LoRA r=%d on %s: %d of %d parameters trainable (%.2f%%)", args.lora_r, adapted_modules(adapted),
                counts["trainable"], counts["total"], 100 * counts["trainable"] / counts["total"])
    return adapted


def adapted_modules(model) -> list[str]:
    """The names (last component) of the modules that carry an adapter. Not peft's `target_modules`: "all-linear"
    expands to every linear layer's name, the head's included, which `modules_to_save` then keeps whole."""
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")})


def trainable_parameters(model) -> dict[str, int]:
    """{"trainable", "total"}: parameters the optimizer updates, and all of them (tied tables once; under an adapter
    the base weights once and the head's trained copies once: peft's own count)."""
    if hasattr(model, "get_nb_trainable_parameters"):
        trainable, total = model.get_nb_trainable_parameters()
        return {"trainable": int(trainable), "total": int(total)}
    return {"trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "total": sum(p.numel() for p in model.parameters())}


def is_adapted(model) -> bool:
    return hasattr(model, "peft_config")


def save_adapted(model, tokenizer, pad_id: int, output_dir, merge: bool = False) -> None:
    """The adapter (`ADAPTER_FILES`) and the tokenizer in `output_dir`; with `merge` the merged full model there (what
    a run without an adapter saves) and the adapter in `output_dir/adapter`. The tokenizer and the head carry the pad
    token fine-tuning used, as `card.save_model` gives them."""
    out = Path(output_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad_id)
    model.base_model.model.config.pad_token_id = tokenizer.pad_token_id
    folders = [out / ADAPTER_DIR] if merge else [out]
    if merge:  # a copy: the adapted model goes on to the final evaluation
        copy.deepcopy(model).merge_and_unload().save_pretrained(out)
        tokenizer.save_pretrained(out)
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)


def head_fields(config, base_path: str) -> dict:
    """The fields of a fine-tuned head's `config` that differ from the base folder's (labels, problem type, pooling,
    ...): what `from_pretrained(base, **fields)` needs to rebuild the same head before the adapter loads."""
    from ..configuration_transformer_xl import TransformerXLConfig

    tuned = config.to_dict()
    base = TransformerXLConfig.from_pretrained(base_path).to_dict()
    return {key: value for key, value in tuned.items() if key not in _BOOKKEEPING and base.get(key) != value}


def card_section(model, args, name: str) -> str:
    """The model card's section on loading the folder: the adapter onto its base (peft), or the merged model."""
    auto_class = AUTO_CLASSES[type(model.base_model.model).__name__]
    base_model = model.base_model.model
    fields = head_fields(base_model.config, args.model_name_or_path)
    extra = "".join(f"\n    {key}={value!r}," for key, value in fields.items())
    adapter = f"{name}/{ADAPTER_DIR}" if args.merge_lora else name
    counts = trainable_parameters(model)
    config = model.peft_config["default"]
    targets = ", ".join(adapted_modules(model))
    trained_whole = sorted(m for m in config.modules_to_save or () if hasattr(base_model, m))
    lines = ["## LoRA adapter", "",
             f"Fine-tuned with a LoRA adapter (peft; rank {config.r}, alpha {config.lora_alpha:g}, dropout "
             f"{config.lora_dropout:g}) on `{targets}`, the head's new layers "
             f"({', '.join(f'`{m}`' for m in trained_whole) or 'none'}) trained whole: "
             f"{counts['trainable']:,} of {counts['total']:,} parameters trained "
             f"({100 * counts['trainable'] / counts['total']:.2f}%).", ""]
    if args.merge_lora:
        lines += [f"This folder holds the merged model (the adapter added into the weights): load it as any "
                  f"fine-tuned folder, as above. The adapter alone is in `{ADAPTER_DIR}/`, for the base model "
                  f"`{args.model_name_or_path}`:", ""]
    else:
        lines += [f"This folder holds the adapter, not the full model (the code above needs a merged folder: "
                  f"`--merge_lora`). Load it onto its base model, `{args.model_name_or_path}` (needs "
                  "`pip install peft`):", ""]
    lines += ["```python", "from peft import PeftModel", f"from transformers import {auto_class}, AutoTokenizer", "",
              f'base = {auto_class}.from_pretrained(\n    "{args.model_name_or_path}", trust_remote_code=True,{extra}\n)',
              f'model = PeftModel.from_pretrained(base, "{adapter}")',
              f'tokenizer = AutoTokenizer.from_pretrained("{adapter}")',
              "model = model.merge_and_unload()  # optional: one plain model, as fast as the base", "```"]
    return "\n".join(lines)


def write_card_section(model, args, output_dir) -> None:
    """Add `card_section` to the folder's README.md (an adapted model only)."""
    if not is_adapted(model):
        return
    update_card_section(Path(output_dir) / "README.md", CARD_SECTION, card_section(model, args,
                                                                                Path(args.output_dir).name))
