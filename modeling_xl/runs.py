"""Run helpers shared by every training script (pretraining and fine-tuning): argument checks, the output folder,
the step log, an earlier run's records, and the end of a run.

- `positive_int`, `choice`, `check_model_source`: argument checks that name the argument, the value and what was
  expected.
- `check_output_dir`: create the output folder and prove it writable, refusing one that holds an earlier run (what
  marks one is the caller's `earlier_run(folder)`) unless the run resumes or overwrites; `clear_run_records` deletes
  that earlier run's records for `--overwrite_output_dir`.
- `StepLog` / `read_log`: the append-only JSONL step log (`LOG_FILE`), cut back to the resumed step on resume.
- `keep_freed_host_memory`: on the CPU, glibc keeps the memory one step frees for the next (`host_memory`).
- `end_run`: release Accelerate's prepared objects, then end training (in that order, see there).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from .host_memory import keep_freed_memory

logger = logging.getLogger(__name__)

LOG_FILE = "train_log.jsonl"  # one JSON object per line: {"step", "loss", "lr", ...} or {"step", "eval_loss", ...}


# ---- argument checks ----------------------------------------------------------------------------------------------

def positive_int(name: str, value) -> None:
    """ValueError unless `value` is an integer > 0 (booleans are not integers here)."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name}={value!r} is invalid; expected a positive integer")


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


# ---- the output folder ---------------------------------------------------------------------------------------------

def check_output_dir(path: str, earlier_run: Callable[[Path], list[str]], *, resuming: bool = False,
                     overwrite: bool = False) -> Path:
    """Create the output folder and prove it is writable (before any training time is spent).

    A folder that holds an earlier run (`earlier_run(folder)` -> the names that mark one, e.g. pretraining's
    checkpoints/ and train_log.jsonl) is refused unless this run resumes from a checkpoint or `overwrite` is set: a
    fresh run there would mix its log with the old one, and pruning would delete its own checkpoints in favour of the
    old run's higher steps. Nothing is written before that check.
    """
    out = Path(path)
    earlier = earlier_run(out) if out.is_dir() else []
    if earlier and not resuming and not overwrite:
        saved_checkpoint = any("checkpoint" in name for name in earlier)  # else there is nothing to continue from
        resume = "--resume_from_checkpoint latest to continue that run, " if saved_checkpoint else ""
        raise ValueError(f"output_dir={path!r} already holds an earlier run ({', '.join(earlier)}); expected an empty "
                         f"or new folder, {resume}or --overwrite_output_dir to start afresh there (deletes its "
                         "checkpoints and logs)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        # a probe file of its own per process (every process of a multi-process run checks the same folder at once);
        # closing it deletes it
        tempfile.NamedTemporaryFile(dir=out, prefix=".write_test_").close()
    except OSError as error:
        raise ValueError(f"output_dir={path!r} is not writable ({error.strerror or error}); expected a folder you "
                         "can write to") from None
    return out


def clear_run_records(folder: Path, names: Iterable[str]) -> list[str]:
    """Delete what an earlier run wrote (`names` in `folder`) for `--overwrite_output_dir`; other files stay.
    Returns the names deleted."""
    deleted = []
    for name in names:
        path = Path(folder) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        deleted.append(name)
    return deleted


# ---- the step log --------------------------------------------------------------------------------------------------

class StepLog:
    """Append-only JSONL log in the output folder (main process only). On resume, entries after the resumed step
    are dropped first, so the file reads as one uninterrupted run. The file is created by the first record: a run
    that fails before it leaves none (which would otherwise mark the folder as holding an earlier run)."""

    def __init__(self, output_dir, enabled: bool, resume_step: int | None = None):
        self.path = Path(output_dir) / LOG_FILE
        self.enabled = enabled
        if enabled and self.path.exists():
            kept = [r for r in read_log(self.path) if resume_step is not None and r["step"] <= resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def write(self, record: dict) -> None:
        if self.enabled:
            with self.path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")


def read_log(path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---- the training loop's process ---------------------------------------------------------------------------------

def keep_freed_host_memory(device) -> None:
    """Called right before the training loop: on the CPU, glibc's malloc keeps the memory each step frees for the next
    instead of handing it back and page-faulting it in again (`host_memory.keep_freed_memory`; process-wide, for the
    rest of the process). Logs what was done, or why not."""
    if device.type != "cpu":
        return
    why_not = keep_freed_memory()
    if why_not is None:
        logger.info("host memory: glibc malloc keeps freed memory for reuse (modeling_xl.host_memory)")
    else:
        logger.info("host memory: glibc malloc left as it is: %s", why_not)


# ---- the end of a run ----------------------------------------------------------------------------------------------

def end_run(accelerator) -> None:
    """Release the accelerator's prepared objects, then end training (trackers, process group). Callers drop their
    own references to the prepared model first.

    The order matters under DDP with gloo. The wrapper's reducer holds the process group; when it is the last holder,
    the group dies in the reducer's destructor, which keeps the GIL while it joins gloo's worker threads. A worker
    still releasing a finished collective's Python tensor needs the GIL, so the process hangs at exit (a two-process
    test run left such a rank behind, its main thread in `~ProcessGroupGloo` under `Reducer` deallocation). Released
    first, the wrappers leave the group to `end_training`, and torch drops the GIL when the group itself is
    destroyed."""
    accelerator.free_memory()
    accelerator.end_training()
