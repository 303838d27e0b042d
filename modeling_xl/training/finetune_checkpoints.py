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

import json
import os
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .checkpointing import STATE_FILE
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


def read_training_state(folder) -> dict:
    return json.loads((Path(folder) / STATE_FILE).read_text())


def check_compatible(state: dict, layout: dict, folder, max_steps: int) -> None:
    """The data position of a checkpoint means the same batches only with the same layout (examples, seed, batch,
    processes), and its step must be one this run reaches; say what differs."""
    for key, value in layout.items():
        if state.get(key) != value:
            raise ValueError(f"resume_from_checkpoint={str(folder)!r} was written with {key}={state.get(key)!r}, "
                             f"this run has {key}={value!r}; expected the same value to continue on the same batches")
    if state["step"] > max_steps:
        raise ValueError(f"resume_from_checkpoint={str(folder)!r} is at step {state['step']}, past this run's "
                         f"{max_steps} steps; expected a checkpoint at or before the last step (or a larger "
                         "--max_train_steps / --num_train_epochs)")


def read_epoch_rng(folder, process_index: int) -> dict[str, torch.Tensor]:
    return load_file(str(Path(folder) / f"epoch_rng_rank{process_index}.safetensors"))


def save_checkpoint(accelerator, output_dir, step: int, state: dict, epoch_rng: dict[str, torch.Tensor]) -> Path:
    """Write `checkpoint-{step}` atomically (all processes call this). Returns its folder."""
    final = Path(output_dir) / f"checkpoint-{step}"
    tmp = final.with_name(f".tmp_{final.name}")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    save_file(epoch_rng, str(tmp / f"epoch_rng_rank{accelerator.process_index}.safetensors"))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step}, indent=2))
        if final.exists():  # re-saving a step after a resume: the old copy goes only once the new one is complete
            old = final.with_name(f".old_{final.name}")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    accelerator.wait_for_everyone()
    return final
