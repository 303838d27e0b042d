"""Argument checks shared by every script and library entry point: each error names the argument, the value and
what was expected, e.g. `check_int("tgt_len", 0)` -> "tgt_len=0 is invalid; expected a positive integer"."""

from __future__ import annotations

import os
from typing import Iterable

import numpy as np


def check_int(name: str, value, minimum: int = 1, allow_none: bool = False) -> None:
    """ValueError unless `value` is an integer >= `minimum` (numpy integers too; booleans are not integers here), or
    None when `allow_none`."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name}={value!r} is invalid; expected {expected}")


def positive_int(name: str, value) -> None:
    """ValueError unless `value` is an integer > 0."""
    check_int(name, value, 1)


def choice(name: str, value, choices: Iterable) -> None:
    """ValueError unless `value` is one of `choices`."""
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"{name}={value!r} is invalid; expected one of {choices}")


def check_model_source(name: str, value: str | None) -> None:
    """ValueError when `value` is meant as a local path and does not exist (absolute, relative with ./ ../, or more
    than one "/"), when it starts with "~" (which nothing expands on the way to `from_pretrained`), or, for
    model_name_or_path, when it is a file (a folder's config.json or weights). Otherwise transformers would read it as
    a Hub id and fail on its characters or on the network."""
    if value is None:
        return
    if value.startswith("~"):
        raise ValueError(f"{name}={value!r} starts with '~', which is not expanded here; expected the full path "
                         f"({os.path.expanduser(value)!r})")
    if name == "model_name_or_path" and os.path.isfile(value):
        raise ValueError(f"{name}={value!r} is a file; expected the folder save_pretrained wrote (the one holding "
                         "config.json)")
    if os.path.exists(value):
        return
    expected = "expected a local folder (written by save_pretrained) or a Hub id 'name' / 'user/name'"
    if value.startswith(("/", ".")) or value.count("/") > 1 or os.sep != "/" and os.sep in value:
        raise ValueError(f"{name}={value!r} does not exist; {expected}")



def local_folder_hint(value: str | None) -> str:
    """For a 'user/name' that failed to load and whose 'user' is a local folder (`outputs/tiny` before that run
    wrote it): a sentence saying the local folder is missing, to append to the loading error; else "". (Such a name
    may still be a Hub id, so it is not refused before the lookup.)"""
    if not value or "/" not in value or os.path.exists(value) or not os.path.isdir(value.split("/")[0]):
        return ""
    first, rest = value.split("/", 1)
    return f"; and there is no local folder {value!r}: {first!r} (from {os.getcwd()!r}) holds no {rest!r}"
