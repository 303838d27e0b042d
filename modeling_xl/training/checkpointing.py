"""Checkpoints for exact resume: `accelerator.save_state` plus what Accelerate does not save.

A checkpoint is a folder `<output_dir>/checkpoints/step_NNNNNNN/` holding
- Accelerate's state (model weights as safetensors, optimizer, scheduler, per-process RNG, grad scaler);
- `training_state.json`: step, data position (segments consumed), tokens seen, the batch layout it was written with,
  what identifies the training stream (`train_tokens`, `tokenizer_vocab_size`) and the training time so far;
- `memories_rank{r}.safetensors`: process r's memories, one per accumulation chunk (`chunk{c}.layer{l}`), and its
  torch RNG state (restored after Accelerate's, so dropout continues exactly).
It is written into `.tmp_step_NNNNNNN/` and renamed into place only when complete (`os.replace` is atomic on one
filesystem), so a crash during a save leaves the previous checkpoint usable. Files are only ever read with
safetensors / JSON / `torch.load(weights_only=True)` (Accelerate's loader), never unpickled.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from ..runtime.checkpoint_state import load_error
from ..runtime.run_folder import PRETRAINING_CHECKPOINTS, write_checkpoint

CHECKPOINTS = PRETRAINING_CHECKPOINTS.subfolder
list_checkpoints = PRETRAINING_CHECKPOINTS.list  # complete checkpoints of an output folder, oldest first
resolve_checkpoint = PRETRAINING_CHECKPOINTS.resolve  # "latest" or a folder -> the checkpoint to resume from


def memories_to_tensors(memories: list, rng_state: torch.Tensor) -> dict[str, torch.Tensor]:
    """{'chunk{c}.layer{l}': tensor} for every chunk that has a memory, plus 'rng_state'."""
    tensors = {"rng_state": rng_state}
    for c, mems in enumerate(memories):
        for layer, m in enumerate(mems or ()):
            tensors[f"chunk{c}.layer{layer}"] = m.detach().contiguous().cpu()
    return tensors


def tensors_to_memories(tensors: dict[str, torch.Tensor], num_chunks: int, device) -> list:
    """Inverse of `memories_to_tensors` (without the RNG state): a list of per-chunk tuples (or None)."""
    memories = []
    for c in range(num_chunks):
        layers = sorted((int(k.rsplit("layer", 1)[1]), v) for k, v in tensors.items() if k.startswith(f"chunk{c}."))
        memories.append(tuple(v.to(device) for _, v in layers) if layers else None)
    return memories


def save_checkpoint(accelerator, output_dir, step: int, state: dict, memories: list, keep: int | None) -> Path:
    """Write the checkpoint of `step` atomically (all processes call this), keep the newest `keep`. Returns its
    final folder."""
    final = PRETRAINING_CHECKPOINTS.folder(output_dir, step)
    write_checkpoint(accelerator, final, step, state, "memories", memories_to_tensors(memories, torch.get_rng_state()))
    if accelerator.is_main_process:
        PRETRAINING_CHECKPOINTS.prune(output_dir, keep)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, folder: Path, num_chunks: int, device, saved: dict | None = None,
                    layout: dict | None = None) -> list:
    """Restore Accelerate's state, this process's memories and RNG; returns the memories (one entry per chunk).
    With the checkpoint's training state `saved` and this run's `layout`, the memories are taken from the processes
    and chunks that held the same streams (another number of processes, see `process_layout`). A damaged file is a
    `CheckpointError` naming the checkpoint, the file and the previous checkpoint."""
    try:
        accelerator.load_state(str(folder))
    except Exception as error:  # whatever the reading library raises: name the file instead
        raise load_error(folder, error) from None
    if saved is not None and layout is not None:
        from .process_layout import load_memories

        try:
            memories, rng_state = load_memories(folder, saved, layout, accelerator.process_index, device)
        except Exception as error:
            raise load_error(folder, error) from None
        if rng_state is not None:
            torch.set_rng_state(rng_state)
        return memories
    memories_file = Path(folder) / f"memories_rank{accelerator.process_index}.safetensors"
    try:
        tensors = load_file(str(memories_file))
    except Exception as error:
        raise load_error(folder, error, memories_file.name) from None
    torch.set_rng_state(tensors.pop("rng_state"))
    return tensors_to_memories(tensors, num_chunks, device)


def schedule_change(state: dict, max_train_steps: int, num_warmup_steps: int, lr_scheduler_type: str) -> str | None:
    """What a resume with another `max_train_steps` or `num_warmup_steps` does to the learning rate, or None when
    nothing changes (the same values, a schedule that does not read them, or a checkpoint that did not record them):
    the scheduler is rebuilt for this run's values and continues at the checkpoint's step, so the rates from there on
    are the new schedule's."""
    reads = {"constant": (), "constant_with_warmup": ("num_warmup_steps",)}.get(
        lr_scheduler_type, ("max_train_steps", "num_warmup_steps"))
    now = {"max_train_steps": max_train_steps, "num_warmup_steps": num_warmup_steps}
    changed = [key for key in reads if state.get(key) is not None and state[key] != now[key]]
    if not changed:
        return None
    before = ", ".join(f"{key}={state[key]}" for key in changed)
    after = ", ".join(f"{key}={now[key]}" for key in changed)
    return (f"the checkpoint at step {state['step']} was written by a run of {before}; this run has {after}, so the "
            f"{lr_scheduler_type} learning-rate schedule is rebuilt for them and the rates from step "
            f"{state['step'] + 1} on are the new schedule's, not a continuation of the old one")


def check_same_stream(state: dict, stream: dict, folder) -> None:
    """The memories and the data position of a checkpoint belong to one token stream: a changed corpus (another file,
    an edited file) or another tokenizer gives a different `train_tokens` or `tokenizer_vocab_size`; another
    objective, or for the permutation LM another seed or sampling setting (reuse_len, num_predict, perm_size,
    max_gram, bi_data, the sampling version), other samples. A field the checkpoint does not carry (written before it
    was stored) is not checked, except the permutation LM's sampling version: a checkpoint without it was written with
    version 1 (`plm_layout.SAMPLING_VERSION`)."""
    if state.get("objective") == "plm" and "plm_sampling_version" in stream:
        state = {"plm_sampling_version": 1, **state}
    for key, value in stream.items():
        if key in state and state[key] != value:
            raise ValueError(f"resume_from_checkpoint={str(folder)!r} was written with {key}={state[key]!r}, this "
                             f"run's training data has {key}={value!r}; expected the corpus, tokenizer, objective "
                             "and sampling settings of the run that wrote it (the memories and data position belong "
                             "to its token stream)")
