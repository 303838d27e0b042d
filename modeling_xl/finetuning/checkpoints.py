"""Checkpoints of a fine-tuning run (`scripts/finetune_classification.py`) and their exact resume.

A checkpoint is `<output_dir>/checkpoint-N/` (N = optimizer steps done), as in the transformers example scripts:
Accelerate's state (weights, optimizer, scheduler, every process's RNG) plus `training_state.json` (step, evaluation
history, training time, and the layout the data position depends on), and `rng_rank{r}.safetensors`: the RNG states
process r's current epoch drew its shuffled order from, and the shuffle generator's state at the checkpoint (several
processes shuffle with a generator Accelerate shares between them and does not save). The step says where to continue
(epoch = step // batches per epoch, then `step % batches per epoch` batches into it); a resume draws that epoch's order
again from the saved states, skips the batches already read, and then continues with the states of the checkpoint
(dropout and the next epochs' order included). It is written into `.tmp_checkpoint-N/` and renamed when complete, so a
crash during a save leaves the previous checkpoint usable.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from ..runtime.checkpoint_state import check_compatible as check_stream_compatible
from ..runtime.run_folder import FINETUNING_CHECKPOINTS, LOG_FILE, write_checkpoint


def _shuffle_generator(train_loader) -> torch.Generator | None:
    """The generator a prepared loader shuffles with when several processes share one order (Accelerate keeps it as
    `synchronized_generator`); None for one process, whose shuffle seed comes from the global torch RNG."""
    return getattr(train_loader, "synchronized_generator", None)


def rng_states(train_loader) -> dict[str, torch.Tensor]:
    """The RNG states the loader's order (and dropout) draw from: the global torch RNG and the shuffle generator."""
    states = {"torch": torch.get_rng_state()}
    generator = _shuffle_generator(train_loader)
    if generator is not None:
        states["sampler"] = generator.get_state()
    return states


def set_rng(train_loader, states: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(states["torch"])
    generator = _shuffle_generator(train_loader)
    if generator is not None and "sampler" in states:
        generator.set_state(states["sampler"])


def checkpoint_rng(epoch_start: dict[str, torch.Tensor], train_loader) -> dict[str, torch.Tensor]:
    """What a checkpoint keeps besides Accelerate's state: the states the current epoch's order was drawn from
    (`epoch.*`) and the states now (`now.*`; Accelerate restores the torch RNG but not the shuffle generator)."""
    return {**{f"epoch.{k}": v for k, v in epoch_start.items()},
            **{f"now.{k}": v for k, v in rng_states(train_loader).items()}}


def split_checkpoint_rng(tensors: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """(epoch-start states, states at the checkpoint) from `checkpoint_rng`'s tensors."""
    return ({k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith("epoch.")},
            {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith("now.")})


def is_finetuning_checkpoint(folder: Path) -> bool:
    """A `checkpoint-N` folder this tool wrote (its training state and RNG file), not, say, a Trainer checkpoint or
    a saved model someone named so."""
    return (folder in FINETUNING_CHECKPOINTS.list(folder.parent)
            and (folder / "rng_rank0.safetensors").is_file())


def earlier_run(folder: Path, results_file: str) -> list[str]:
    """Names in `folder` that an earlier fine-tuning run wrote (its checkpoints, step log, resolved arguments,
    results: `results_file`, or the results file of a run of another task)."""
    from .arguments import TASK_RESULTS_FILES, TRAINING_CONFIG

    names = sorted((p.name for p in folder.iterdir() if p.is_dir() and is_finetuning_checkpoint(p)),
                   key=lambda name: int(name.split("-")[1]))
    results = [results_file] + sorted(set(TASK_RESULTS_FILES.values()) - {results_file})
    return names + [name for name in (LOG_FILE, TRAINING_CONFIG, *results) if (folder / name).exists()]


def check_compatible(state: dict, layout: dict, folder, max_steps: int) -> None:
    """The data position of a checkpoint means the same batches only with the same layout (examples, seed, batch,
    processes), and its step must be one this run reaches (`checkpoint_state.check_compatible`)."""
    check_stream_compatible(state, layout, folder, max_steps, resumes="on the same batches",
                            last_step=f"{max_steps} steps (--max_train_steps / --num_train_epochs)")


def read_checkpoint_rng(folder, process_index: int) -> dict[str, torch.Tensor]:
    """This process's `checkpoint_rng` tensors of a checkpoint."""
    return load_file(str(Path(folder) / f"rng_rank{process_index}.safetensors"))


def save_checkpoint(accelerator, output_dir, step: int, state: dict, rng: dict[str, torch.Tensor]) -> Path:
    """Write `checkpoint-{step}` atomically (all processes call this, `run_folder.write_checkpoint`). Returns its
    folder."""
    final = FINETUNING_CHECKPOINTS.folder(output_dir, step)
    write_checkpoint(accelerator, final, step, state, "rng", rng)
    return final
