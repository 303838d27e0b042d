"""Checkpoints of a fine-tuning run (`scripts/finetune_classification.py`) and their exact resume.

A checkpoint is `<output_dir>/checkpoint-N/` (N = optimizer steps done), as in the transformers example scripts:
Accelerate's state (weights, optimizer, scheduler, every process's RNG) plus `training_state.json` (step, evaluation
history, training time, and the layout the data position depends on), and `epoch_rng_rank{r}.safetensors`: the RNG
states process r's current epoch drew its shuffled order from. The step says where to continue (epoch = step //
batches per epoch, then `step % batches per epoch` batches into it); a resume draws that epoch's order again from the
saved states, skips the batches already read, and then continues with the RNG of the checkpoint (dropout included).
It is written into `.tmp_checkpoint-N/` and renamed when complete, so a crash during a save leaves the previous
checkpoint usable.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from .checkpointing import STATE_FILE, write_checkpoint
from .checkpointing import check_compatible as check_stream_compatible
from .feedback import LOG_FILE

_NAME = re.compile(r"^checkpoint-(\d+)$")


def epoch_start_rng(train_loader) -> dict[str, torch.Tensor]:
    """The RNG states an epoch's order is drawn from when its iterator starts: the global torch RNG (the shuffle
    seed of a single process) and, with several processes, the sampler's synchronised generator."""
    from accelerate.data_loader import get_sampler

    states = {"torch": torch.get_rng_state()}
    generator = getattr(get_sampler(train_loader), "generator", None)
    if generator is not None:
        states["sampler"] = generator.get_state()
    return states


def set_rng(train_loader, states: dict[str, torch.Tensor]) -> None:
    from accelerate.data_loader import get_sampler

    torch.set_rng_state(states["torch"])
    if "sampler" in states:
        get_sampler(train_loader).generator.set_state(states["sampler"])


def list_checkpoints(output_dir) -> list[Path]:
    """Complete `checkpoint-N` folders (with their training state), oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name)) and (p / STATE_FILE).is_file()]
    return [p for _, p in sorted(found)]


def earlier_run(folder: Path, results_file: str) -> list[str]:
    """Names in `folder` that an earlier fine-tuning run wrote (checkpoints, step log, results)."""
    names = sorted((p.name for p in folder.iterdir() if _NAME.match(p.name) and p.is_dir()),
                   key=lambda name: int(name.split("-")[1]))
    return names + [name for name in (LOG_FILE, results_file) if (folder / name).exists()]


def resolve_checkpoint(output_dir, requested: str) -> Path:
    """`latest` -> the newest complete checkpoint of output_dir; otherwise the given folder (checked)."""
    if requested == "latest":
        found = list_checkpoints(output_dir)
        if not found:
            raise ValueError(f"resume_from_checkpoint='latest' found no checkpoint-N folder with {STATE_FILE} in "
                             f"{output_dir}; expected a previous run with --checkpointing_steps in this output_dir")
        return found[-1]
    path = Path(requested)
    if not (path / STATE_FILE).is_file():
        raise ValueError(f"resume_from_checkpoint={requested!r} is not a fine-tuning checkpoint; expected a "
                         f"checkpoint-N folder with {STATE_FILE} (checkpoints of versions before resume support lack "
                         "it and cannot be resumed) or 'latest'")
    return path


def check_compatible(state: dict, layout: dict, folder, max_steps: int) -> None:
    """The data position of a checkpoint means the same batches only with the same layout (examples, seed, batch,
    processes), and its step must be one this run reaches (`checkpointing.check_compatible`)."""
    check_stream_compatible(state, layout, folder, max_steps, resumes="on the same batches",
                            last_step=f"{max_steps} steps (--max_train_steps / --num_train_epochs)")


def read_epoch_rng(folder, process_index: int) -> dict[str, torch.Tensor]:
    return load_file(str(Path(folder) / f"epoch_rng_rank{process_index}.safetensors"))


def save_checkpoint(accelerator, output_dir, step: int, state: dict, epoch_rng: dict[str, torch.Tensor]) -> Path:
    """Write `checkpoint-{step}` atomically (all processes call this, `checkpointing.write_checkpoint`). Returns its
    folder."""
    final = Path(output_dir) / f"checkpoint-{step}"
    write_checkpoint(accelerator, final, step, state, "epoch_rng", epoch_rng)
    return final
