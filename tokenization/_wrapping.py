"""Turn a `tokenizers.Tokenizer` into a transformers tokenizer that saves as a plain folder.

The folder holds only `tokenizer.json` + `tokenizer_config.json` (class `TokenizersBackend` / `PreTrainedTokenizerFast`),
so `AutoTokenizer.from_pretrained(dir)` loads it with nothing of this project installed.
"""

from __future__ import annotations

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast


def wrap_tokenizer(tokenizer: Tokenizer, **special_tokens) -> PreTrainedTokenizerFast:
    """`special_tokens`: `unk_token=`, `eos_token=`, `pad_token=`, ..., `padding_side=`, `additional_special_tokens=`."""
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special_tokens)


def declare_task_tokens(tokenizer) -> list[str]:
    """Give a tokenizer that has an end-of-text token but no pad, separator or summary token (the word-level one:
    its vocabulary has `<eos>` only) that token in those roles, so task scripts can pad batches, join pairs and find
    a summary position: transformers' `run_qa.py` (its "no answer" position is the first `cls_token`), `run_ner.py`,
    `run_swag.py`, `DataCollatorWithPadding`. No symbol is added (the model's vocabulary is unchanged); padding stays
    hidden by `attention_mask`. Returns the roles it set. A label collator that ignores the pad id, such as
    `DataCollatorForLanguageModeling`, then ignores `<eos>` targets too (it needs a pad token anyway)."""
    if tokenizer.eos_token is None:
        return []
    roles = [role for role in ("pad_token", "sep_token", "cls_token") if getattr(tokenizer, role) is None]
    for role in roles:
        setattr(tokenizer, role, tokenizer.eos_token)
    return roles


def check_vocab_matches(tokenizer, config, *, allow_larger_model: bool = False, context: str | None = None) -> None:
    """Raise ValueError unless the tokenizer's vocabulary fits the model's `config.vocab_size`.

    Transformer-XL's adaptive softmax partitions exactly `vocab_size` ids with `cutoffs`, so by default the sizes must be
    equal; `allow_larger_model=True` accepts a model with unused extra rows (never a smaller one: ids would overflow).
    `context` opens the message (e.g. "tokenizer_name='tok' does not fit the model"): where the tokenizer came from.
    """
    tokens = len(tokenizer)
    model = getattr(config, "vocab_size", None)
    if model is None:
        raise ValueError(f"config {type(config).__name__} has no vocab_size; expected a model configuration")
    if tokens == model or (allow_larger_model and tokens < model):
        return
    relation = "at most" if allow_larger_model else "exactly"
    prefix = "" if context is None else f"{context}: "
    raise ValueError(f"{prefix}tokenizer vocabulary has {tokens} tokens but config.vocab_size={model}; expected "
                     f"{relation} {model} tokens. Build the model with vocab_size={tokens} or use the tokenizer it was "
                     "trained with")
