"""Resuming with another number of processes: allowed when every accumulation chunk holds the same streams.

The global batch of B streams is cut into W processes x A chunks of B / (W·A) consecutive streams; global chunk
g = r·A + c (process r, chunk c) always holds streams [g·s, (g+1)·s), s = B / (W·A), and carries its own memory. A
checkpoint written with (W, A) continues exactly under (W', A') when B and s are the same (W·A = W'·A'): chunk g's
memory moves from process g // A, chunk g % A of the checkpoint to process g // A', chunk g % A'.

Example: 2 processes x 1 chunk of 4 streams (B = 8) -> 1 process x 2 chunks of 4: process 0's memory becomes chunk 0,
process 1's chunk 1. Dropout masks are drawn per process, so with dropout a changed layout continues the data and the
memories exactly but draws other masks.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

PROCESS_KEYS = ("num_processes", "gradient_accumulation_steps")


def describe(layout: dict) -> str:
    """'train_batch_size=8 over 2 process(es) x 1 chunk(s) of 4 streams'."""
    batch, processes, chunks = (layout.get(k) for k in ("train_batch_size", *PROCESS_KEYS))
    rows = batch // (processes * chunks) if batch and processes and chunks else "?"
    return f"train_batch_size={batch} over {processes} process(es) x {chunks} chunk(s) of {rows} streams"


def check_process_layout(saved: dict, layout: dict, folder) -> None:
    """A changed number of processes or chunks is fine when the global batch and the streams of every chunk stay the
    same; otherwise a ValueError naming both layouts."""
    if all(saved.get(k) == layout[k] for k in PROCESS_KEYS):
        return
    old_chunks = saved.get("num_processes", 0) * saved.get("gradient_accumulation_steps", 0)
    new_chunks = layout["num_processes"] * layout["gradient_accumulation_steps"]
    if saved.get("train_batch_size") != layout["train_batch_size"] or old_chunks != new_chunks:
        raise ValueError(
            f"resume_from_checkpoint={str(folder)!r} was written with {describe(saved)}, this run has "
            f"{describe(layout)}; expected the same train_batch_size and streams per chunk (num_processes x "
            f"gradient_accumulation_steps = {old_chunks}, e.g. 2 processes -> 1 process with "
            "--gradient_accumulation_steps 2) so that every memory continues its own streams")


def load_memories(folder, saved: dict, layout: dict, process_index: int, device) -> tuple[list, torch.Tensor | None]:
    """This process's memories (one entry per chunk, a tuple of layer tensors or None) from the checkpoint's files,
    and the torch RNG state to restore (the same process index's, None when the checkpoint had no such process)."""
    old_chunks = saved.get("gradient_accumulation_steps", layout["gradient_accumulation_steps"])
    new_chunks = layout["gradient_accumulation_steps"]
    files: dict[int, dict[str, torch.Tensor]] = {}

    def tensors(rank: int) -> dict[str, torch.Tensor]:
        if rank not in files:
            files[rank] = load_file(str(Path(folder) / f"memories_rank{rank}.safetensors"))
        return files[rank]

    memories = []
    for c in range(new_chunks):
        g = process_index * new_chunks + c
        old_rank, old_chunk = divmod(g, old_chunks)
        found = tensors(old_rank)
        layers = sorted((int(k.rsplit("layer", 1)[1]), v) for k, v in found.items()
                        if k.startswith(f"chunk{old_chunk}."))
        memories.append(tuple(v.to(device) for _, v in layers) if layers else None)
    own = Path(folder) / f"memories_rank{process_index}.safetensors"
    rng = tensors(process_index).get("rng_state") if own.is_file() else None
    return memories, rng
