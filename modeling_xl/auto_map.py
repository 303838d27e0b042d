"""The `auto_map` of a saved remote-code folder: which Auto class loads which class from which copied file.

transformers writes only the saved class into `config.json`'s `auto_map`; `complete_auto_map` adds the others whose
weights the folder fits, so `AutoModel.from_pretrained(folder, trust_remote_code=True)` works on a language model's
folder too. Classes are named as `"file.Class"` strings and files are copied by path: this module imports no model.
`share_weight_files` gives the weights the permissions of the folder's other files.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from transformers.dynamic_module_utils import get_relative_import_files

# the backbone of each `attn_type`: causal Transformer-XL or the XLNet-style bidirectional one
BACKBONES = {"uni": "modeling_transformer_xl.TransformerXLModel",
             "bi": "modeling_permutation_lm.TransformerXLPermutationModel"}
LM_HEADS = {"uni": ("AutoModelForCausalLM", "modeling_transformer_xl.TransformerXLForCausalLM"),
            "bi": ("AutoModelForPreTraining", "modeling_permutation_lm.TransformerXLForPermutationLM")}
# every task head: a folder of any of them (or of a language model) can start any other (a new head on its backbone).
# `AutoModelForQuestionAnswering` maps to the span head that `run_qa.py` reads (start and end logits); XLNet's
# beam-search head maps to it only in the folders it saved itself.
TASK_HEADS = {
    "AutoModelForSequenceClassification": "modeling_classification.TransformerXLForSequenceClassification",
    "AutoModelForQuestionAnswering": "modeling_question_answering.TransformerXLForQuestionAnsweringSimple",
    "AutoModelForTokenClassification": "modeling_token_classification.TransformerXLForTokenClassification",
    "AutoModelForMultipleChoice": "modeling_multiple_choice.TransformerXLForMultipleChoice",
}


def auto_map_for(attn_type: str, lm_heads: bool = True) -> dict[str, str]:
    """The Auto classes a saved folder maps: `AutoModel` to the backbone of its `attn_type`; a language model's folder
    (`lm_heads`) also its LM head; every folder every task head (fine-tuning starts from any of them: a new head on
    the backbone). A task head's folder maps no LM head (its weights lack one)."""
    if attn_type not in BACKBONES:
        raise ValueError(f"attn_type={attn_type!r} is invalid; expected one of {sorted(BACKBONES)}")
    auto_map = {"AutoModel": BACKBONES[attn_type]}
    if lm_heads:
        auto_map.update([LM_HEADS[attn_type]])
    auto_map.update(TASK_HEADS)
    return auto_map


def copy_module_files(module: str, save_directory) -> None:
    """Copy `module`.py of this package and every file it imports relatively (as transformers copies a saved class's
    code), when this package has it."""
    source = Path(__file__).parent / f"{module}.py"
    if not source.exists():  # running from a saved folder that was saved without this module
        return
    for path in [source, *get_relative_import_files(source)]:
        shutil.copyfile(path, Path(save_directory) / Path(path).name)


def complete_auto_map(save_directory, auto_map: dict[str, str]) -> None:
    """Add `auto_map` entries to a saved remote-code config.json, copying beside it the code of the classes the
    saved class's files do not import (the other heads); every class whose file is in the folder is mapped. An entry
    transformers already wrote (the saved class's own) is kept."""
    path = os.path.join(save_directory, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    if "auto_map" not in config:
        return
    for module in sorted({reference.split(".")[0] for reference in auto_map.values()}):
        if not os.path.exists(os.path.join(save_directory, f"{module}.py")):
            copy_module_files(module, save_directory)
    for auto_class, reference in auto_map.items():
        if os.path.exists(os.path.join(save_directory, reference.split(".")[0] + ".py")):
            config["auto_map"].setdefault(auto_class, reference)
    # renamed over config.json once written: a kill keeps the old one (".tmp_*": never uploaded)
    temporary = os.path.join(save_directory, f".tmp_config.json.{os.getpid()}")
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def share_weight_files(save_directory) -> None:
    """Give the `*.safetensors` files of a saved folder the permissions of its `config.json`: safetensors writes them
    0600 (owner only) while every other file gets the process's default (0644 under the usual umask), so a folder
    copied to a shared disk or served would show its config and code but not its weights."""
    config = os.path.join(save_directory, "config.json")
    if not os.path.exists(config):
        return
    mode = os.stat(config).st_mode & 0o777
    for name in os.listdir(save_directory):
        if name.endswith(".safetensors"):
            os.chmod(os.path.join(save_directory, name), mode)
