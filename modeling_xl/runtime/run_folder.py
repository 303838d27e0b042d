"""The output folder of a run (pretraining and fine-tuning alike): one run at a time, never over the model it starts
from, never over a user's files, every file it will replace checked before the first step; the step log; and the
checkpoint folders a resume continues from.

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
- `check_output_dir`: create the folder and prove it writable, refusing one that holds an earlier run unless the run
  resumes or overwrites; `clear_run_records` deletes that earlier run's records for `--overwrite_output_dir`.
- `StepLog` / `read_log`: the append-only JSONL step log (`LOG_FILE`), cut back to the resumed step on resume.
- `replace_text`: a file of the folder written whole or not at all (the step log cut back, results, cards).
- `CheckpointLayout`: where a run's checkpoints live and how `latest` resolves (`PRETRAINING_CHECKPOINTS`:
  `checkpoints/step_NNNNNNN/`; `FINETUNING_CHECKPOINTS`: `checkpoint-N/`); `write_checkpoint` writes one atomically.
  What a checkpoint holds is read and checked by `checkpoint_state`.
- `staged_folder` / `move_into_place`: a folder written whole beside the output folder (a conversion, a tokenizer),
  then moved into it.
- `update_card_section` / `card_sections`: the named sections later tools add to the folder's card (README.md:
  `scripts/evaluate_lm.py`'s results, a LoRA adapter's loading code), written whole or not at all.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from safetensors.torch import save_file

from .checkpoint_state import STATE_FILE

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


LOG_FILE = "train_log.jsonl"  # one JSON object per line: {"step", "loss", "lr", ...} or {"step", "eval_loss", ...}


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


class StepLog:
    """Append-only JSONL log in the output folder (main process only). On resume, entries after the resumed step
    are dropped first, so the file reads as one uninterrupted run. The file is created by the first record: a run
    that fails before it leaves none (which would otherwise mark the folder as holding an earlier run)."""

    def __init__(self, output_dir, enabled: bool, resume_step: int | None = None):
        self.path = Path(output_dir) / LOG_FILE
        self.enabled = enabled
        if enabled and self.path.exists():
            kept = [r for r in read_log(self.path) if resume_step is not None and r["step"] <= resume_step]
            replace_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))  # a kill here keeps the old log

    def write(self, record: dict) -> None:
        if self.enabled:
            with self.path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")


def read_log(path) -> list[dict]:
    """The records of a step log. A last line without its newline is a record a kill cut while it was written: it is
    left out (the run it belonged to resumes from a checkpoint before it)."""
    path = Path(path)
    if not path.is_file():
        return []
    text = path.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines.pop()
    return [json.loads(line) for line in lines if line.strip()]


def replace_text(path, text: str) -> None:
    """Write `text` (UTF-8) to `path` through a file beside it that is renamed over it once written: a failure while
    writing (a full disk, text the encoding cannot hold, a kill) leaves the file as it was, or absent. A link is
    followed (its target is replaced), the file keeps its permissions, and a file without write permission is refused
    as a plain write would be. The temporary file is `.tmp_<name>.<pid>`: one a kill leaves behind is never uploaded
    (`training.publishing.upload_file_list`)."""
    path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = None
    if path.exists():
        if not os.access(path, os.W_OK):
            raise PermissionError(errno.EACCES, "the file is not writable; expected one this run may replace",
                                  str(path))
        mode = stat.S_IMODE(path.stat().st_mode)
    temporary = path.with_name(f".tmp_{path.name}.{os.getpid()}")
    try:
        temporary.write_text(text, encoding="utf-8", newline="")
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def staged_folder(out_dir, stale: Iterable[str] = (), label: str = "staged"):
    """A temporary folder beside out_dir's real path (so on its file system: a link's target's) to write a complete
    folder into: on a normal exit it is moved into out_dir (`move_into_place`, `stale` as there), on an error it is
    removed and out_dir stays as it was."""
    real = Path(os.path.realpath(out_dir))
    real.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".tmp_{label}_{real.name}_", dir=real.parent))
    try:
        yield staging
        move_into_place(staging, real, stale)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def move_into_place(staging, out_dir, stale: Iterable[str] = ()) -> None:
    """A complete folder `staging` (on out_dir's file system: made beside out_dir's real path) becomes `out_dir`:
    renamed when out_dir does not exist (atomic; with the permissions a new folder gets, not a temporary folder's
    0700); otherwise each new file is renamed in, then the `stale` files of out_dir that staging did not replace are
    removed (what must not stay beside the new files, e.g. another model's tokenizer); out_dir's other files stay."""
    staging, out_dir = Path(staging), Path(out_dir)
    if not out_dir.exists():
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)
        os.replace(staging, out_dir)
        return
    new = {p.name for p in staging.iterdir()}
    for name in sorted(new):
        target = out_dir / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(staging / name, target)
    for name in stale:
        if name not in new and (out_dir / name).is_file():
            (out_dir / name).unlink()


def card_sections(text: str) -> list[tuple[str, str]]:
    """(name, markdown) of every `update_card_section` section in a card's text, in order."""
    return [(name, body.strip()) for name, body in
            re.findall(r"<!-- (\S+):start -->\n(.*?)<!-- \1:end -->", text, flags=re.S)]


def update_card_section(readme_path, name: str, markdown: str) -> None:
    """Write `markdown` into README.md between `<!-- name:start -->` and `<!-- name:end -->`: replaced when the
    section exists, appended otherwise (the rest of the card is kept; a missing card is created). Markers left
    unpaired by a hand edit are a ValueError, and the card is not touched. The new card is written beside the old one
    and renamed over it (`replace_text`)."""
    path = Path(readme_path)
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{markdown.strip()}\n{end}\n"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    starts, ends = text.count(start), text.count(end)
    if (starts, ends) == (1, 1) and text.index(start) < text.index(end):
        before, rest = text.split(start, 1)
        after = rest.split(end, 1)[1].lstrip("\n")
        text = before + block + after
    elif (starts, ends) == (0, 0):
        text = text.rstrip("\n") + ("\n\n" if text else "") + block
    else:  # a marker was edited by hand: guessing where the section ends could delete the user's text
        raise ValueError(f"{path} holds {start!r} {starts} time(s) and {end!r} {ends} time(s); expected each once, "
                         f"start before end (or neither). Fix the markers by hand; the card was not changed")
    replace_text(path, text)


def write_checkpoint(accelerator, final: Path, step: int, state: dict, name: str, tensors: dict) -> None:
    """Accelerate's state, this process's `tensors` (`{name}_rank{r}.safetensors`) and the training state (with
    `step`) into `final`, through a temporary folder renamed once complete: a crash during a save leaves the previous
    checkpoint usable. All processes call this."""
    tmp = final.with_name(f".tmp_{final.name}")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    save_file(tensors, str(tmp / f"{name}_rank{accelerator.process_index}.safetensors"))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step}, indent=2))
        if final.exists():  # re-saving a step (after a resume): the new copy replaces it only once complete
            old = final.with_name(f".old_{final.name}")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    accelerator.wait_for_everyone()




def check_sources_survive(sources: dict[str, str | None], doomed: Iterable[Path]) -> None:
    """--overwrite_output_dir must not delete what the run starts from: ValueError when a local folder or file of
    `sources` ({argument name: value}) lies in one of the `doomed` paths (an earlier run's records)."""
    for name, value in sources.items():
        if value and Path(value).exists():
            inside = [p for p in doomed if Path(value).resolve().is_relative_to(Path(p).resolve())]
            if inside:
                raise ValueError(f"{name}={value!r} lies in {inside[0]}, which --overwrite_output_dir would delete "
                                 "(an earlier run's record); expected a model and tokenizer outside it")


def prepare_output_dir(output_dir: str, earlier_run: Callable[[Path], list[str]], final_files: Iterable[str],
                       sources: dict[str, str | None], *, resuming: bool, overwrite: bool) -> Path:
    """Every check of a run's output folder, before any data or model is built (pretraining and fine-tuning):
    not the folder of a source ({argument name: value} the run starts from), created and writable, holding no
    earlier run (`earlier_run(folder)` -> the names that mark one) unless the run resumes or overwrites, no foreign
    model or card unless it overwrites, every file of the final save (`final_files`) replaceable, and with
    `overwrite`, no source inside the earlier run's records it will delete. Returns the folder."""
    check_not_a_source(output_dir, sources)
    out = check_output_dir(output_dir, earlier_run, resuming=resuming, overwrite=overwrite)
    earlier = earlier_run(out)
    check_foreign_files(out, bool(earlier), overwrite)
    check_replaceable(out, final_files)
    if overwrite:
        check_sources_survive(sources, [out / name for name in earlier])
    return out


@dataclass(frozen=True)
class CheckpointLayout:
    """Where a run keeps the checkpoint of step N: `<output_dir>/<subfolder>/<name_format.format(N)>` (no
    subfolder: the output folder itself). A checkpoint is complete once it holds `training_state.json`
    (`write_checkpoint` renames it into place only then)."""

    subfolder: str
    name_format: str
    pattern: str  # the names of its checkpoint folders, the step as group 1
    description: str  # how error messages name its checkpoints

    def root(self, output_dir) -> Path:
        return Path(output_dir) / self.subfolder if self.subfolder else Path(output_dir)

    def folder(self, output_dir, step: int) -> Path:
        return self.root(output_dir) / self.name_format.format(step)

    def list(self, output_dir) -> list[Path]:
        """Complete checkpoints (temporary folders of interrupted saves are ignored), oldest first."""
        root = self.root(output_dir)
        if not root.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in root.iterdir()
                 if (m := re.match(self.pattern, p.name)) and (p / STATE_FILE).is_file()]
        return [p for _, p in sorted(found)]

    def resolve(self, output_dir, requested: str) -> Path:
        """`latest` -> the newest complete checkpoint of output_dir; otherwise the given folder (checked)."""
        if requested == "latest":
            found = self.list(output_dir)
            if not found:
                raise ValueError(f"resume_from_checkpoint='latest' found no checkpoint ({self.description} with "
                                 f"{STATE_FILE}) in {self.root(output_dir)}; expected a previous run with "
                                 "--checkpointing_steps in this output_dir")
            return found[-1]
        path = Path(requested)
        if not (path / STATE_FILE).is_file():
            raise ValueError(f"resume_from_checkpoint={requested!r} is not a checkpoint folder; expected "
                             f"{self.description} with {STATE_FILE} (e.g. {self.folder(output_dir, 100)}) or 'latest'")
        return path

    def prune(self, output_dir, keep: int | None) -> None:
        """Delete all but the newest `keep` checkpoints (None: keep every one)."""
        if keep is not None:
            for old in self.list(output_dir)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)


PRETRAINING_CHECKPOINTS = CheckpointLayout("checkpoints", "step_{:07d}", r"^step_(\d+)$",
                                           "a checkpoints/step_NNNNNNN folder")
FINETUNING_CHECKPOINTS = CheckpointLayout("", "checkpoint-{}", r"^checkpoint-(\d+)$", "a checkpoint-N folder")
