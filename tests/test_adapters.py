"""PEFT (LoRA) adapters on every head (`modeling_xl.peft_defaults`, `modeling_xl.finetuning.adapters`): default
targets without `target_modules`, "all-linear" without the tied output tables, the adapter live in every projection
(merged equals unmerged), memory and recurrence under an adapter, `--lora_r` through fine-tuning, and the saved
adapter reloaded in a fresh process that cannot import this package. Skipped where peft is not installed
(`pip install "modeling-xl[peft]"`), except the checks that the model needs no peft."""

import copy
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from unittest import mock

import pytest
import torch

from modeling_xl import (
    TransformerXLConfig,
    TransformerXLForCausalLM,
    TransformerXLForMultipleChoice,
    TransformerXLForPermutationLM,
    TransformerXLForQuestionAnswering,
    TransformerXLForQuestionAnsweringSimple,
    TransformerXLForSequenceClassification,
    TransformerXLForTokenClassification,
)
from modeling_xl.peft_defaults import LORA_TARGET_MODULES, register_lora_targets

needs_peft = pytest.mark.skipif(importlib.util.find_spec("peft") is None,
                                reason="peft is not installed (pip install \"modeling-xl[peft]\")")
V = 40


def uni_config(**overrides):
    return TransformerXLConfig.from_preset("debug", **{"vocab_size": V, "cutoffs": [10, 25], "num_labels": 3,
                                                       "mem_len": 16, **overrides})


def bi_config(**overrides):
    return TransformerXLConfig.from_preset("debug", **{"vocab_size": V, "adaptive": False, "cutoffs": [],
                                                       "tie_projs": [False], "attn_type": "bi", "num_labels": 3,
                                                       "mem_len": 16, **overrides})


# (head, config, peft task type, extra inputs): every head of the package
HEADS = {
    "causal_lm": (TransformerXLForCausalLM, uni_config, "CAUSAL_LM"),
    "permutation_lm": (TransformerXLForPermutationLM, bi_config, None),
    "sequence_classification": (TransformerXLForSequenceClassification, uni_config, "SEQ_CLS"),
    "question_answering_simple": (TransformerXLForQuestionAnsweringSimple, uni_config, "QUESTION_ANS"),
    "question_answering_beam": (TransformerXLForQuestionAnswering, bi_config, "QUESTION_ANS"),
    "token_classification": (TransformerXLForTokenClassification, uni_config, "TOKEN_CLS"),
    "multiple_choice": (TransformerXLForMultipleChoice, uni_config, None),
}


def inputs_for(kind: str) -> dict:
    ids = torch.randint(1, V, (2, 7))
    if kind == "multiple_choice":
        return {"input_ids": ids[None].expand(2, 2, 7).clone()}
    if kind == "permutation_lm":  # the query stream too: its queries are the adapted projection's first rows
        return {"input_ids": ids, "perm_mask": (torch.rand(2, 7, 7) > 0.5).float(),
                "target_mapping": torch.nn.functional.one_hot(torch.tensor([[1, 4], [2, 5]]), 7).float()}
    return {"input_ids": ids}


def float_outputs(out) -> list[torch.Tensor]:
    """Every floating tensor an output holds (memories included), in order."""
    found = []
    for value in out.values():
        for tensor in (value if isinstance(value, tuple) else (value,)):
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                found.append(tensor)
    return found


# ---- the model needs no peft ---------------------------------------------------------------------------------------

def test_without_peft_registering_does_nothing_and_a_broken_peft_is_only_logged(caplog):
    with mock.patch.dict(sys.modules, {"peft": None}):  # as where peft is not installed: find_spec says None
        assert register_lora_targets() is False
    with mock.patch("importlib.util.find_spec", return_value=object()), \
            mock.patch("importlib.import_module", side_effect=AttributeError("no attribute 'X' in transformers")):
        assert register_lora_targets() is False
    assert "peft is installed but failed to import (AttributeError" in caplog.text


@pytest.mark.parametrize("overrides, match", [
    (dict(lora_r=0), r"lora_r=0 is invalid; expected a positive integer"),
    (dict(lora_r=4, lora_alpha=-1.0), r"lora_alpha=-1.0 is invalid"),
    (dict(lora_r=4, lora_dropout=1.0), r"lora_dropout=1.0 is invalid; expected a probability in \[0, 1\)"),
    (dict(lora_r=4, lora_target_modules=" , "), r"lora_target_modules=' , ' is invalid"),
    (dict(merge_lora=True), r"merge_lora=True is set without lora_r"),
    (dict(lora_alpha=16.0), r"lora_alpha=16.0 is set without lora_r"),
])
def test_bad_lora_arguments_are_named(tmp_path, overrides, match):
    from modeling_xl.finetuning import FinetuneArguments
    from modeling_xl.finetuning.adapters import validate_adapter_arguments

    args = FinetuneArguments(model_name_or_path=str(tmp_path), output_dir=str(tmp_path / "out"), **overrides)
    with pytest.raises(ValueError, match=match):
        validate_adapter_arguments(args)


def test_lora_without_peft_names_the_extra(tmp_path):
    from modeling_xl.finetuning import FinetuneArguments
    from modeling_xl.finetuning.adapters import validate_adapter_arguments

    args = FinetuneArguments(model_name_or_path=str(tmp_path), output_dir=str(tmp_path / "out"), lora_r=4)
    with mock.patch.dict(sys.modules, {"peft": None}), pytest.raises(ValueError, match=r"modeling-xl\[peft\]"):
        validate_adapter_arguments(args)


# ---- default targets, all-linear, the adapter live everywhere -----------------------------------------------------

@needs_peft
@pytest.mark.parametrize("kind", sorted(HEADS))
def test_lora_without_target_modules_adapts_the_attention_of_every_head(kind):
    """`LoraConfig(task_type=...)` names no targets: peft takes this model type's default (`qkv_net`, `o_net` of every
    layer). The adapter changes the output, and merging it into the weights gives the same output: the projections
    that read only rows of their weight (the memory's keys and values, XLNet's query stream) run the adapter too."""
    from peft import LoraConfig, get_peft_model

    head, config, task_type = HEADS[kind]
    model = head(config()).eval()
    inputs = inputs_for(kind)
    with torch.no_grad():
        base = float_outputs(model(**inputs))
    adapted = get_peft_model(model, LoraConfig(task_type=task_type, r=4, init_lora_weights=False)).eval()
    targeted = {name for name, module in adapted.named_modules() if hasattr(module, "lora_A")}
    expected = {f"base_model.model.transformer.layers.{i}.attn.{name}" for i in range(config().n_layer)
                for name in LORA_TARGET_MODULES}
    assert targeted == expected
    with torch.no_grad():
        unmerged = float_outputs(adapted(**inputs))
        merged = float_outputs(copy.deepcopy(adapted).merge_and_unload()(**inputs))
    assert any((a - b).abs().max() > 1e-4 for a, b in zip(unmerged, base)), "the adapter changed nothing"
    for got, want in zip(merged, unmerged):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@needs_peft
def test_all_linear_leaves_the_tied_output_tables_alone():
    """peft's "all-linear" leaves out the one module `get_output_embeddings()` returns; the adaptive softmax's
    per-cluster tables are not linear layers (`adaptive_softmax.OutputTable`), so none of them is adapted; naming one
    is refused instead of adding an adapter nothing reads."""
    from peft import LoraConfig, get_peft_model

    for model in (TransformerXLForCausalLM(uni_config()), TransformerXLForPermutationLM(bi_config())):
        adapted = get_peft_model(model, LoraConfig(target_modules="all-linear", r=2))
        targeted = {name.split(".")[-1] for name, module in adapted.named_modules() if hasattr(module, "lora_A")}
        assert targeted == {"qkv_net", "r_net", "o_net", "layer_1", "layer_2"}
        assert not any("lm_head" in name for name, module in adapted.named_modules() if hasattr(module, "lora_A"))
    with pytest.raises(ValueError, match="OutputTable"):
        get_peft_model(TransformerXLForCausalLM(uni_config()), LoraConfig(target_modules=["out_layers.0"], r=2))


@needs_peft
def test_memory_generation_and_long_documents_under_an_adapter():
    """Under an adapter: two segments with memory equal one long read; `generate` (which carries the memory) gives
    the merged model's tokens; turning the adapter off gives the base model's output even for a memory the
    adapted model returned (no projection cached for it is reused); `forward_long` equals the merged model's."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = TransformerXLForCausalLM(uni_config()).eval()
    reference = copy.deepcopy(base)
    adapted = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", r=4, init_lora_weights=False)).eval()
    merged = copy.deepcopy(adapted).merge_and_unload()
    ids = torch.randint(1, V, (2, 12))
    with torch.no_grad():
        whole = adapted(input_ids=ids).logits
        first = adapted(input_ids=ids[:, :5])
        second = adapted(input_ids=ids[:, 5:], mems=first.mems)
        torch.testing.assert_close(torch.cat([first.logits, second.logits], 1), whole, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(merged(input_ids=ids[:, 5:], mems=first.mems).logits, second.logits,
                                   rtol=1e-4, atol=1e-5)
        with adapted.disable_adapter():  # the same memory tensor again, the adapter off
            off = adapted(input_ids=ids[:, 5:], mems=first.mems).logits
        torch.testing.assert_close(off, reference(input_ids=ids[:, 5:], mems=first.mems).logits)
    prompt = ids[:1, :4]
    want = merged.generate(prompt, max_new_tokens=8, do_sample=False, eos_token_id=None)
    assert adapted.generate(input_ids=prompt, max_new_tokens=8, do_sample=False, eos_token_id=None).tolist() == \
        want.tolist()

    classifier = TransformerXLForSequenceClassification(uni_config()).eval()
    adapted = get_peft_model(classifier, LoraConfig(task_type="SEQ_CLS", r=4, init_lora_weights=False,
                                                    modules_to_save=["sequence_summary", "logits_proj"])).eval()
    documents = torch.randint(1, V, (2, 30))
    with torch.no_grad():
        long = adapted(input_ids=documents, segment_len=8).logits
        torch.testing.assert_close(copy.deepcopy(adapted).merge_and_unload().forward_long(documents, segment_len=8)
                                   .logits, long, rtol=1e-4, atol=1e-5)


@needs_peft
@pytest.mark.parametrize("kind", sorted(HEADS))
def test_the_head_layers_are_trained_whole_and_saved(kind):
    """`adapters.lora_config`: the task head's new layers (peft's task types know only `classifier`, `score`,
    `qa_outputs`) are trained and saved whole; a language model's tied output layer is not."""
    from peft import get_peft_model
    from peft.utils import get_peft_model_state_dict

    from modeling_xl.finetuning.adapters import adapted_modules, lora_config, trainable_parameters

    head, config, _ = HEADS[kind]
    model = head(config())
    new_layers = [name for name, module in model.named_children()
                  if name not in ("transformer", "lm_head") and next(module.parameters(), None) is not None]
    adapted = get_peft_model(model, lora_config(model, r=2))
    saved = {key.removeprefix("base_model.model."): value for key, value in get_peft_model_state_dict(adapted).items()}
    for name in new_layers:
        assert any(key.startswith(f"{name}.") for key in saved), (name, sorted(saved)[:5])
    assert not any(key.startswith("lm_head") for key in saved)
    trained = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert trainable_parameters(adapted)["trainable"] == trained == sum(value.numel() for value in saved.values())
    everything = get_peft_model(head(config()), lora_config(head(config()), r=2, targets="all-linear"))
    assert adapted_modules(everything) == ["layer_1", "layer_2", "o_net", "qkv_net", "r_net"]  # no head layer


# ---- fine-tuning with --lora_r, reloaded in a fresh process without the package -----------------------------------

REMOTE = textwrap.dedent("""
    import json, sys, torch
    sys.modules["modeling_xl"] = sys.modules["tokenization"] = None  # the code must come from the model folder
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    lm, adapter, merged, fields, ids, out = sys.argv[1:7]
    fields = {k: ({int(i): v for i, v in val.items()} if k == "id2label" else val)
              for k, val in json.loads(open(fields).read()).items()}
    ids = torch.load(ids, weights_only=True)
    base = AutoModelForSequenceClassification.from_pretrained(lm, trust_remote_code=True, **fields)
    assert type(base).__module__.startswith("transformers_modules"), type(base).__module__
    model = PeftModel.from_pretrained(base, adapter).eval()
    full = AutoModelForSequenceClassification.from_pretrained(merged, trust_remote_code=True).eval()
    causal = get_peft_model(AutoModelForCausalLM.from_pretrained(lm, trust_remote_code=True),
                            LoraConfig(task_type="CAUSAL_LM"))  # the folder's code registered the default targets
    with torch.no_grad():
        result = {"adapter": model(input_ids=ids).logits, "merged": full(input_ids=ids).logits,
                  "targets": sorted(causal.peft_config["default"].target_modules)}
    torch.save(result, out)
""")


@needs_peft
def test_finetuning_with_lora_saves_an_adapter_that_reloads_equal_in_a_fresh_process(tmp_path, one_thread):
    """`--lora_r`: the folder holds the adapter (and the tokenizer, card, results), reloaded onto the base folder in a
    process that cannot import this package (the base's remote code) with the logits of the run's model;
    `--merge_lora` (the same run again) writes a full model with the same logits; the results and card report the
    trainable parameters."""
    from peft import PeftModel
    from test_finetuning import finetune_args, vocabulary_lines
    from transformers import AutoModelForSequenceClassification

    from modeling_xl.finetuning import run_finetuning
    from modeling_xl.finetuning.adapters import head_fields
    from tokenization import train_word_level_tokenizer

    tokenizer = train_word_level_tokenizer(vocabulary_lines())
    TransformerXLForCausalLM(TransformerXLConfig.from_preset("debug", vocab_size=len(tokenizer), cutoffs=[10])) \
        .save_pretrained(tmp_path / "lm")
    tokenizer.save_pretrained(tmp_path / "lm")
    runs = {}
    for name, merge in (("adapter", False), ("merged", True)):
        args = finetune_args(tmp_path, tmp_path / "lm", output_dir=str(tmp_path / name), lora_r=4, merge_lora=merge,
                             max_train_steps=12, eval_steps=None, checkpointing_steps=None, learning_rate=1e-2)
        torch.manual_seed(0)
        runs[name] = run_finetuning(args)
    adapter, merged = tmp_path / "adapter", tmp_path / "merged"
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "README.md"} <= {
        p.name for p in adapter.iterdir()}
    assert not (adapter / "config.json").exists() and not (adapter / "model.safetensors").exists()
    assert (merged / "model.safetensors").exists() and (merged / "adapter" / "adapter_config.json").exists()
    counts = runs["adapter"]["parameters"]
    assert 0 < counts["trainable"] < counts["total"] / 2, counts
    card = (adapter / "README.md").read_text()
    assert "## LoRA adapter" in card and f"{counts['trainable']:,} of {counts['total']:,}" in card
    assert "PeftModel.from_pretrained(base, \"adapter\")" in card

    fields = head_fields(TransformerXLConfig.from_pretrained(merged), str(tmp_path / "lm"))  # as the card writes
    assert fields["id2label"] == {0: "0", 1: "1"} and f"id2label={fields['id2label']!r}" in card
    base = AutoModelForSequenceClassification.from_pretrained(tmp_path / "lm", **fields)
    model = PeftModel.from_pretrained(base, adapter).eval()
    ids = torch.randint(1, len(tokenizer), (3, 9))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    (tmp_path / "fields.json").write_text(json.dumps(fields))
    torch.save(ids, tmp_path / "ids.pt")
    (tmp_path / "remote.py").write_text(REMOTE)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(tmp_path / "remote.py"), str(tmp_path / "lm"), str(adapter),
                           str(merged), str(tmp_path / "fields.json"), str(tmp_path / "ids.pt"),
                           str(tmp_path / "out.pt")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(tmp_path / "out.pt", weights_only=True)
    torch.testing.assert_close(got["adapter"], want)
    torch.testing.assert_close(got["merged"], want, rtol=1e-4, atol=1e-5)
    assert got["targets"] == sorted(LORA_TARGET_MODULES)


@needs_peft
def test_a_lora_run_resumed_from_its_checkpoint_ends_with_the_same_adapter(tmp_path, one_thread):
    """`--checkpointing_steps` / `--resume_from_checkpoint` with `--lora_r`: Accelerate's state of the adapted model
    (adapter, head copies, optimizer, RNG) resumes exactly: the adapter saved at the end is bit-equal."""
    import shutil

    from safetensors.torch import load_file
    from test_finetuning import finetune_args, vocabulary_lines

    from modeling_xl.finetuning import run_finetuning
    from tokenization import train_word_level_tokenizer

    tokenizer = train_word_level_tokenizer(vocabulary_lines())
    TransformerXLForCausalLM(TransformerXLConfig.from_preset("debug", vocab_size=len(tokenizer), cutoffs=[10])) \
        .save_pretrained(tmp_path / "lm")
    tokenizer.save_pretrained(tmp_path / "lm")
    common = dict(lora_r=4, max_train_steps=8, eval_steps=None, checkpointing_steps=4, learning_rate=1e-2)
    run_finetuning(finetune_args(tmp_path, tmp_path / "lm", output_dir=str(tmp_path / "whole"), **common))
    shutil.copytree(tmp_path / "whole" / "checkpoint-4", tmp_path / "resumed" / "checkpoint-4")  # as if stopped
    run_finetuning(finetune_args(tmp_path, tmp_path / "lm", output_dir=str(tmp_path / "resumed"), **common,
                                 resume_from_checkpoint="latest"))
    whole = load_file(tmp_path / "whole" / "adapter_model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "adapter_model.safetensors")
    assert whole.keys() == resumed.keys() and any("lora_A" in key for key in whole)
    for key in whole:
        assert torch.equal(whole[key], resumed[key]), key
