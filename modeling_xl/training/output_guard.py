"""What a run may do to its output folder: one run at a time, never over the model it starts from, never over a
user's files, and every file it will replace checked before the first step.

- `OutputDirLock`: an exclusive `flock` on `<output_dir>/.run.lock` for the run's lifetime. The kernel drops the lock
  when the process ends, however it ends (exit, exception, SIGKILL), so a lock file left by a dead run never blocks.
  A run that ends normally removes the file; one killed leaves it behind, unlocked, for the next run to take over.
  Folders the lock had to create are removed again on release if they are still empty (a run that failed before
  writing anything leaves nothing behind).
  Only the launch's main process (global rank 0) takes it: the other ranks of the same run write where it tells them.
- `check_not_a_source`: output_dir must not be the folder of the model, config or tokenizer the run starts from.
- `check_foreign_files`: a folder that holds no earlier run but a model, tokenizer or card (`config.json`,
  `tokenizer.json`, `README.md`, ...) is somebody's: refused unless `--overwrite_output_dir`.
- `check_replaceable`: every file of the final save that already exists must be replaceable (not read-only, not a
  folder), found now rather than after all of training.
"""

from __future__ import annotations

import os
from pathlib import Path

LOCK_FILE = ".run.lock"

# what save_pretrained of a model and its tokenizer, and the card, write at the top of an output folder (pretraining
# and fine-tuning alike); `*.py` files (the remote code save_pretrained copies) are checked as well
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
               "pytorch_model.bin", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "chat_template.jinja", "README.md")
# what the final save of a pretraining run writes: the model files and the run's records
FINAL_FILES = (*MODEL_FILES, "eval_results.json", "train_log.jsonl", "loss_curve.png", "training_config.yaml",
               "training_config.json")
# what marks a folder as holding somebody's model, tokenizer or model card
FOREIGN_MARKERS = ("config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                   "tokenizer.json", "tokenizer_config.json", "README.md")


class OutputDirLockedError(ValueError):
    """Another live process holds the output folder."""


class OutputDirLock:
    """Exclusive lock of an output folder; `with OutputDirLock(path):` or `acquire()` / `release()`.

    `enabled=False` (the other ranks of a multi-process run) makes it a no-op. Where `fcntl` does not exist
    (Windows) nothing is locked.
    """

    def __init__(self, output_dir, enabled: bool = True):
        self.path = Path(output_dir) / LOCK_FILE
        self.enabled = enabled
        self._handle = None
        self._created: list[Path] = []  # the folders `_open` made, deepest first

    def acquire(self) -> "OutputDirLock":
        if not self.enabled:
            return self
        try:
            import fcntl
        except ImportError:  # no flock on this platform: nothing to hold
            return self
        while self._handle is None:
            handle = self._open()
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                handle.close()
                raise OutputDirLockedError(
                    f"output_dir={str(self.path.parent)!r} is in use by another run (process {holder}, lock "
                    f"{self.path}); expected one run per output folder: wait for it to finish, stop it, or choose "
                    "another --output_dir (the lock goes with its process, so a crashed run never blocks)") from None
            if self._is_current(handle):
                self._handle = handle
            else:  # the holder released (and removed) the file between our open and our flock: lock the new one
                handle.close()
        self._handle.seek(0)
        self._handle.truncate()
        self._handle.write(f"{os.getpid()}\n")
        self._handle.flush()
        return self

    def release(self) -> None:
        """Remove the lock file, then let go of the lock (in this order: a process that opened the old file before
        the removal finds, once it holds the lock, that the file is gone, and starts over with a new one)."""
        if self._handle is not None:
            try:
                self.path.unlink()
            except OSError:
                pass
            self._handle.close()  # closing the descriptor releases the flock
            self._handle = None
            for folder in self._created:  # only empty ones: whatever a run wrote stays
                try:
                    folder.rmdir()
                except OSError:
                    break
            self._created = []

    def _open(self):
        for attempt in range(3):  # a run releasing the folder may remove it between our mkdir and open: again
            folder, missing = self.path.parent, []
            while not folder.exists() and folder != folder.parent:
                missing.append(folder)
                folder = folder.parent
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._created = self._created or missing
                return open(self.path, "a+")
            except FileNotFoundError:
                if attempt == 2:
                    raise ValueError(f"output_dir={str(self.path.parent)!r} kept disappearing while it was being "
                                     "created; expected a folder nothing else removes") from None
            except OSError as error:
                raise ValueError(f"output_dir={str(self.path.parent)!r} is not writable ({error.strerror or error}); "
                                 "expected a folder you can write to") from None

    def _is_current(self, handle) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            return False

    def __enter__(self) -> "OutputDirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def is_launch_main_process() -> bool:
    """Global rank 0 of a launch (torchrun / accelerate set RANK), before any process group exists."""
    return int(os.environ.get("RANK", "0")) == 0


def check_not_a_source(output_dir, sources: dict[str, str | None]) -> None:
    """ValueError when output_dir is the local folder of one of `sources` ({argument name: value}): the final save
    would write over the model, config or tokenizer the run starts from."""
    out = Path(output_dir).resolve()
    for name, value in sources.items():
        if value is None or not os.path.exists(value):
            continue
        folder = Path(value).resolve()
        folder = folder if folder.is_dir() else folder.parent
        if folder == out:
            raise ValueError(f"output_dir={str(output_dir)!r} is the folder of {name}={value!r}; the run's final "
                             f"save would write over it; expected another --output_dir")


def check_foreign_files(output_dir, holds_earlier_run: bool, overwrite: bool) -> None:
    """ValueError when output_dir holds a model, tokenizer or card but no earlier run of ours (whose own outputs a
    resume or --overwrite_output_dir may replace) and --overwrite_output_dir is not set."""
    out = Path(output_dir)
    if holds_earlier_run or overwrite or not out.is_dir():
        return
    found = [name for name in FOREIGN_MARKERS if (out / name).exists()]
    if found:
        raise ValueError(f"output_dir={str(output_dir)!r} holds {', '.join(found)} but no earlier run; the final save "
                         "would replace them; expected an empty or new folder, or --overwrite_output_dir to replace "
                         "them")


def check_replaceable(output_dir, names=FINAL_FILES) -> None:
    """ValueError naming every file of the final save that exists and could not be replaced (read-only, a folder)."""
    out = Path(output_dir)
    if not out.is_dir():
        return
    candidates = [out / name for name in names] + sorted(out.glob("*.py"))
    blocked = []
    for path in candidates:
        if path.is_dir() and not path.is_symlink():
            blocked.append(f"{path.name} (a folder)")
        elif path.exists() and not os.access(path, os.W_OK):
            blocked.append(f"{path.name} (read-only)")
    if blocked:
        raise ValueError(f"output_dir={str(output_dir)!r}: {', '.join(blocked)} cannot be replaced by the final save; "
                         "expected writable files there (fix their permissions, remove them, or choose another "
                         "--output_dir) -- found before training so that no training time is lost")


def check_output_contents(output_dir, args, holds_earlier_run: bool) -> None:
    """The three checks above for a pretraining run's `args` (before any data or model is built)."""
    check_not_a_source(output_dir, {name: getattr(args, name, None)
                                    for name in ("model_name_or_path", "config_name", "tokenizer_name")})
    check_foreign_files(output_dir, holds_earlier_run, args.overwrite_output_dir)
    check_replaceable(output_dir)
