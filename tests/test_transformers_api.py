"""The transformers names this library relies on that are not public API: each test fails with a message naming the
name, what we use it for, and the transformers release it was written against, so that a transformers that renames
one says so instead of silently changing behaviour (generation dropping the memory, say)."""

import inspect
import re

import pytest
import transformers
from transformers import GenerationMixin, PreTrainedModel

from modeling_xl.checkpoint_import import LOADING_KWARGS

WRITTEN_FOR = "transformers 5.24"

# (owner, private name, what TransformerXLForCausalLM / the heads override or call it for)
PRIVATE_NAMES = [
    (GenerationMixin, "_sample", "greedy decoding and top-k sampling inside the `greedy_decoding` / `top_k_decoding` kernel contexts"),
    (GenerationMixin, "_beam_search", "beam search inside the `top_k_decoding` kernel context"),
    (GenerationMixin, "_update_model_kwargs_for_generation", "carrying the memory between steps as `mems`"),
    (GenerationMixin, "_expand_inputs_for_generation", "repeating a caller's `mems` for beams and sequences"),
    (GenerationMixin, "_supports_default_dynamic_cache", "telling generate that the memory is not a key/value cache"),
    (PreTrainedModel, "get_correct_attn_implementation", "accepting attn_implementation='triton'"),
    (PreTrainedModel, "_init_weights", "initialising our parameters (and recomputing nothing non-persistent)"),
]


@pytest.mark.parametrize("owner,name,purpose", PRIVATE_NAMES, ids=[n for _, n, _ in PRIVATE_NAMES])
def test_private_names_we_override_still_exist(owner, name, purpose):
    assert hasattr(owner, name), (
        f"transformers {transformers.__version__} has no {owner.__name__}.{name}; modeling_xl overrides it for "
        f"{purpose} (written for {WRITTEN_FOR}): port the override to what replaced it")


def test_beam_search_still_reorders_through_the_model_hook():
    """Beam search must call the model's `_reorder_cache` for a state that is a plain tuple (our memory)."""
    source = inspect.getsource(GenerationMixin)
    assert "self._reorder_cache(" in source, (
        f"transformers {transformers.__version__}'s beam search no longer calls model._reorder_cache; modeling_xl "
        f"reorders its memory (and the keys/values kept for it) there (written for {WRITTEN_FOR})")


def test_beam_search_still_keeps_the_continuations_our_tail_skipping_reads():
    """Beam search's `_skipping_tails` reads each row's (1 + end-of-sequence ids, at least 2) x beams best tokens:
    transformers' `beams_to_keep`, taken per step as the top-k of the log-softmax of the scores."""
    source = inspect.getsource(GenerationMixin._beam_search)
    assert "beams_to_keep = max(2, 1 + n_eos_tokens) * num_beams" in source, (
        f"transformers {transformers.__version__}'s beam search keeps another number of continuations; "
        f"MemoryGenerationMixin._beam_search computes it as `beams_to_keep` was (written for {WRITTEN_FOR})")
    assert "log_softmax(logits" in source


def test_loading_kwargs_cover_the_installed_from_pretrained():
    """`LOADING_KWARGS` (the from_pretrained arguments a legacy checkpoint's conversion must not take for config
    fields) against the installed `PreTrainedModel.from_pretrained`: its named parameters and every keyword it pops
    from **kwargs."""
    function = PreTrainedModel.from_pretrained.__func__
    named = {p.name for p in inspect.signature(function).parameters.values()
             if p.kind is inspect.Parameter.KEYWORD_ONLY or p.default is not inspect.Parameter.empty}
    popped = set(re.findall(r'kwargs\.pop\(\s*"(\w+)"', inspect.getsource(function)))
    installed = (named | popped) - {"config"}  # `config=` is a model argument: it applies to a legacy folder too
    missing = installed - LOADING_KWARGS
    assert not missing, (f"transformers {transformers.__version__}'s from_pretrained takes {sorted(missing)}, which "
                         "modeling_xl.checkpoint_import.LOADING_KWARGS does not list: a legacy checkpoint would "
                         "take them as config fields; add them there")
    assert {"revision", "dtype", "attn_implementation", "device_map"} <= installed  # the parse found the arguments


def test_what_the_readme_says_transformers_5_lacks_still_holds():
    """README.md's first lines: transformers 5 has no Transformer-XL, its XLNet cannot checkpoint activations, and its
    permutation-LM collator departs from the paper's sampling (it replaces every predicted token's input by <mask>,
    where XLNet's data keeps the real ids and hides them through the permutation: docs/permutation_lm.md)."""
    import importlib.util

    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import DataCollatorForPermutationLanguageModeling, PreTrainedTokenizerFast, XLNetPreTrainedModel

    assert importlib.util.find_spec("transformers.models.transfo_xl") is None, "transformers has Transformer-XL again"
    assert not XLNetPreTrainedModel.supports_gradient_checkpointing, "transformers' XLNet checkpoints activations now"
    vocab = {"<pad>": 0, "<mask>": 1, "<unk>": 2, **{f"w{i}": i + 3 for i in range(20)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", mask_token="<mask>",
                                        unk_token="<unk>")
    torch.manual_seed(0)
    batch = DataCollatorForPermutationLanguageModeling(tokenizer)([torch.arange(3, 23) for _ in range(4)])
    predicted = batch["labels"] != -100
    assert predicted.any() and (batch["input_ids"][predicted] == tokenizer.mask_token_id).all(), (
        "transformers' permutation-LM collator no longer masks the inputs it predicts: README.md's claim is stale")
