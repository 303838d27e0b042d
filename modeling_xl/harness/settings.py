"""The segment length, memory length, clamp length and same-length flag a folder is evaluated with.

A pretraining run writes its evaluation settings into `training_config.json` (`eval_tgt_len`, `eval_mem_len`,
`eval_clamp_len`, `eval_same_length`: what its validation perplexity was measured with, e.g. 64 / 128 / -1 / true for
the `tiny` recipe). A folder without them (converted, fine-tuned, or saved by hand) falls back to
`scripts/evaluate_lm.py`'s defaults: segments of 64 tokens and the model's own `mem_len`, `clamp_len` and
`same_length`. Values given explicitly win over both.
"""

from __future__ import annotations

import json
from pathlib import Path

MODEL_NAME = "transformer-xl"  # the name lm_eval knows the model class by (`--model transformer-xl`)
TRAINING_CONFIG = "training_config.json"
DEFAULT_TGT_LEN = 64  # scripts/evaluate_lm.py's --tgt_len
FIELDS = ("tgt_len", "mem_len", "clamp_len", "same_length")


def evaluation_settings(folder, config, **given) -> dict:
    """{"tgt_len", "mem_len", "clamp_len", "same_length", "source"}: each from `given` when not None, else from the
    folder's pretraining run (`training_config.json`'s `eval_*`), else the defaults above; `source` says where the
    unnamed ones came from. ValueError naming a value outside its range."""
    unknown = set(given) - set(FIELDS)
    if unknown:
        raise TypeError(f"evaluation_settings got {sorted(unknown)}; expected some of {list(FIELDS)}")
    saved, source = {}, "defaults (scripts/evaluate_lm.py's segment length, the model's memory)"
    path = Path(folder) / TRAINING_CONFIG
    if Path(folder).is_dir() and path.is_file():
        try:
            run = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON ({error}); expected the file a pretraining run writes") \
                from None
        saved = {name: run[f"eval_{name}"] for name in FIELDS if run.get(f"eval_{name}") is not None}
        if saved:
            source = f"{path.name} (the pretraining run's evaluation settings)"
    defaults = {"tgt_len": DEFAULT_TGT_LEN, "mem_len": config.mem_len, "clamp_len": config.clamp_len,
                "same_length": config.same_length}
    settings = {name: given[name] if given.get(name) is not None else saved.get(name, defaults[name])
                for name in FIELDS}
    check(settings)
    return {**settings, "source": source if any(given.get(name) is None for name in FIELDS) else "given"}


def check(settings: dict) -> None:
    """ValueError naming the setting, its value and the range."""
    for name, minimum in (("tgt_len", 1), ("mem_len", 0), ("clamp_len", -1)):
        value = settings[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            expected = {1: "a positive integer", 0: "an integer >= 0", -1: "-1 (no clamping) or an integer >= 0"}
            raise ValueError(f"{name}={value!r} is invalid; expected {expected[minimum]}")
    if not isinstance(settings["same_length"], bool):
        raise ValueError(f"same_length={settings['same_length']!r} is invalid; expected true or false")
