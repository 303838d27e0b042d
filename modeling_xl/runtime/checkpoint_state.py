"""What a resume reads from a checkpoint, checked before (and while) it is read: every field of
`training_state.json` (`read_training_state`), whether its layout continues this run (`check_compatible`), and a named
error for a damaged file instead of the raw error of the library that read it (`load_error`).

A checkpoint is trusted only as far as it is checked: a hand-edited `"step": -5` would otherwise be accepted and the
step log cut back to nothing (the log keeps only records up to the resumed step), and a truncated `optimizer.bin`
would surface as a zip-file error that names neither the checkpoint nor a way out. Each error names the checkpoint,
the file and the field, and points to the previous complete checkpoint when there is one.
"""

from __future__ import annotations

import json
import numbers
import re
import zipfile
from pathlib import Path

from safetensors import SafetensorError, safe_open

STATE_FILE = "training_state.json"
_TRAILING_STEP = re.compile(r"(\d+)$")

# field -> (check, what was expected); absent fields are accepted (older versions wrote fewer of them), except `step`
_POSITIVE = (lambda v: _is_int(v) and v > 0, "a positive integer")
_NON_NEGATIVE = (lambda v: _is_int(v) and v >= 0, "an integer >= 0")
_HISTORY = (lambda v: isinstance(v, list) and all(isinstance(e, dict) and _is_int(e.get("step")) and e["step"] >= 0
                                                  for e in v),
            "a list of {'step': integer >= 0, metric: value} records")
FIELD_CHECKS = {
    "step": _NON_NEGATIVE,
    "tokens_seen": _NON_NEGATIVE,
    "train_batch_size": _POSITIVE,
    "num_processes": _POSITIVE,
    "gradient_accumulation_steps": _POSITIVE,
    "tgt_len": _POSITIVE,
    "tokenizer_vocab_size": _POSITIVE,
    "train_tokens": (lambda v: v is None or _is_int(v) and v >= 0, "null or an integer >= 0"),
    "objective": (lambda v: v in ("clm", "plm"), "'clm' or 'plm'"),
    "elapsed_seconds": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "eval_history": _HISTORY,
    "history": _HISTORY,  # fine-tuning's evaluation records
    "train_seconds": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "data_position": (lambda v: isinstance(v, dict) and _is_int(v.get("segments_consumed"))
                      and v["segments_consumed"] >= 0, "{'segments_consumed': integer >= 0}"),
    "seed": (lambda v: v is None or _is_int(v), "an integer"),
    "bi_data": (lambda v: isinstance(v, bool), "true or false"),
    "plm_sampling_version": _POSITIVE,
    "max_train_steps": _POSITIVE,
    "num_warmup_steps": _NON_NEGATIVE,
}


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: the message names the checkpoint, the file and what to do."""


def read_training_state(folder) -> dict:
    """`training_state.json` of checkpoint `folder` (step, layout, data position), parsed and validated
    (`validate_training_state`), after checking that the checkpoint's weights, optimizer, scheduler and per-process
    files are complete (`check_files_complete`): read before anything is written or loaded."""
    folder = Path(folder)
    path = folder / STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"checkpoint {str(folder)!r}: {STATE_FILE} cannot be read ({error}); expected the JSON "
                              f"object a run writes there{_previous_hint(folder)}") from None
    validate_training_state(state, folder)
    check_files_complete(folder)
    return state


def validate_training_state(state, folder) -> None:
    """CheckpointError unless `state` is a JSON object whose known fields have valid values, whose `step` matches the
    checkpoint folder's name (`step_0000040`, `checkpoint-40`) and bounds its data position and evaluation history."""
    folder = Path(folder)

    def fail(what: str) -> None:
        raise CheckpointError(f"checkpoint {str(folder)!r}: {STATE_FILE} {what}{_previous_hint(folder)}")

    if not isinstance(state, dict):
        fail(f"holds {json.dumps(state)[:40]} ({type(state).__name__}); expected a JSON object with the run's step "
             "and layout")
    if "step" not in state:
        fail("has no 'step'; expected the number of optimizer steps the checkpoint was written at")
    for key, (check, expected) in FIELD_CHECKS.items():
        if key in state and not check(state[key]):
            fail(f"has {key}={state[key]!r}; expected {expected}")
    step = state["step"]
    named = _TRAILING_STEP.search(folder.name)
    if named is not None and int(named.group(1)) != step:
        fail(f"has step={step}, but the folder is named for step {int(named.group(1))}; expected the same step")
    position = state.get("data_position", {}).get("segments_consumed")
    if position is not None and position != step:
        fail(f"has data_position.segments_consumed={position} for step={step}; expected the same value (one segment "
             "of every stream per step)")
    late = [e["step"] for key in ("eval_history", "history") for e in state.get(key, []) if e["step"] > step]
    if late:
        fail(f"has eval_history entries at steps {late} after its step={step}; expected none later than the "
             "checkpoint")


def check_files_complete(folder) -> None:
    """CheckpointError when a file of checkpoint `folder` is visibly incomplete: a safetensors file shorter than its
    header says, a torch archive without its zip directory (both what a truncated copy looks like). Reads headers and
    the zip directory only, so it costs nothing next to the load; `load_error` diagnoses anything subtler."""
    folder = Path(folder)
    for path in sorted(folder.iterdir()):
        problem = None
        if path.suffix == ".safetensors":
            problem = _safetensors_problem(path)
        elif path.suffix in (".bin", ".pt", ".pth") and not zipfile.is_zipfile(path):
            problem = "not a complete torch archive (truncated or overwritten)"
        if problem is not None:
            raise CheckpointError(f"checkpoint {str(folder)!r}: {path.name} is damaged ({problem}); expected a "
                                  f"complete checkpoint{_previous_hint(folder)}")


def _safetensors_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file's framing (8-byte header length, JSON header, data extents), or None."""
    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            header_len = int.from_bytes(handle.read(8), "little")
            if size < 8 or header_len > size - 8:
                return f"{size} bytes, shorter than its {header_len}-byte header"
            header = json.loads(handle.read(header_len))
    except (OSError, ValueError, UnicodeDecodeError) as error:
        return f"unreadable header: {error}"
    if not isinstance(header, dict):
        return "the header is not a JSON object"
    end = max((entry["data_offsets"][1] for key, entry in header.items()
               if key != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry), default=0)
    if size < 8 + header_len + end:
        return f"{size} bytes, but its header describes {8 + header_len + end}"
    return None


def damaged_file(folder) -> tuple[str, str] | None:
    """(file name, what is wrong) for the first file of checkpoint `folder` that cannot be read, or None. Reads
    safetensors headers and tensors, zip archives (torch's `.bin`) through their checksums, and JSON files; nothing is
    unpickled."""
    for path in sorted(Path(folder).iterdir()):
        if not path.is_file():
            continue
        try:
            if path.suffix == ".safetensors":
                with safe_open(str(path), framework="pt") as handle:
                    for key in handle.keys():
                        handle.get_tensor(key)
            elif path.suffix in (".bin", ".pt", ".pth") and zipfile.is_zipfile(path):
                with zipfile.ZipFile(path) as archive:
                    bad = archive.testzip()
                if bad is not None:
                    return path.name, f"entry {bad} fails its checksum"
            elif path.suffix in (".bin", ".pt", ".pth"):
                return path.name, "not a complete torch archive (truncated or overwritten)"
            elif path.suffix == ".json":
                json.loads(path.read_text(encoding="utf-8"))
        except (SafetensorError, OSError, ValueError, RuntimeError, zipfile.BadZipFile, UnicodeDecodeError) as error:
            return path.name, f"{type(error).__name__}: {error}"
    return None


def load_error(folder, error: BaseException, file_name: str | None = None) -> CheckpointError:
    """The CheckpointError for an `error` raised while loading checkpoint `folder` (the damaged file is looked for
    when `file_name` is not known)."""
    folder = Path(folder)
    found = (file_name, f"{type(error).__name__}: {error}") if file_name else damaged_file(folder)
    if found is None:
        return CheckpointError(f"checkpoint {str(folder)!r} could not be loaded ({type(error).__name__}: {error}); "
                               f"expected a checkpoint written by this version{_previous_hint(folder)}")
    name, problem = found
    return CheckpointError(f"checkpoint {str(folder)!r}: {name} is damaged ({problem}); expected a complete "
                           f"checkpoint{_previous_hint(folder)}")


def _previous_hint(folder: Path) -> str:
    """'; resume from the previous checkpoint instead: --resume_from_checkpoint <it>' when one exists."""
    named = _TRAILING_STEP.search(folder.name)
    if named is None or not folder.parent.is_dir():
        return ""
    prefix, step = folder.name[: named.start()], int(named.group(1))
    earlier = []
    for sibling in folder.parent.iterdir():
        match = _TRAILING_STEP.search(sibling.name)
        if (sibling.name.startswith(prefix) and sibling.name[: match.start() if match else 0] == prefix and match
                and int(match.group(1)) < step and (sibling / STATE_FILE).is_file()):
            earlier.append((int(match.group(1)), sibling))
    if not earlier:
        return "; no earlier checkpoint exists beside it: start afresh with --overwrite_output_dir"
    previous = max(earlier)[1]
    return f"; resume from the previous checkpoint instead: --resume_from_checkpoint {previous}"


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_compatible(state: dict, layout: dict, folder, max_train_steps: int, *, resumes: str = "the streams",
                     last_step: str | None = None) -> None:
    """The data position (and memories) of a checkpoint mean the same only with the same `layout`, and its step must
    be one this run reaches; say what differs. `resumes` names what the layout keeps the same in the message,
    `last_step` describes this run's last step (default `max_train_steps=N`)."""
    for key, value in layout.items():
        if state.get(key) != value:
            raise ValueError(f"resume_from_checkpoint={str(folder)!r} was written with {key}={state.get(key)!r}, "
                             f"this run has {key}={value!r}; expected the same value to continue {resumes} exactly")
    if state["step"] > max_train_steps:
        last_step = last_step or f"max_train_steps={max_train_steps}"
        raise ValueError(f"resume_from_checkpoint={str(folder)!r} is at step {state['step']}, past this run's "
                         f"{last_step}; expected a checkpoint at or before the last step (or a larger "
                         "--max_train_steps)")
