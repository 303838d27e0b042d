"""Is the output folder one folder for every process? Checked before training.

Checkpoints are written by every process into one folder (Accelerate's state by the main process, each process's
memories and RNG by itself) and renamed into place by the main process. On several machines with `--output_dir` on a
node-local disk, the other machines' files land in their own folders and a resume finds no checkpoint for them; nothing
would say so until then. Here the main process writes a file with a random token and every process looks for it.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import torch
from accelerate.utils import broadcast_object_list


def check_shared_folder(accelerator, folder) -> None:
    """Raise ValueError on every process when some process does not see the file the main process wrote in `folder`.
    All processes call this (collective); one process: nothing to check."""
    if accelerator.num_processes == 1:
        return
    token = [secrets.token_hex(8) if accelerator.is_main_process else None]
    broadcast_object_list(token, from_process=0)
    marker = Path(folder) / f".shared_check_{token[0]}"
    if accelerator.is_main_process:
        marker.write_text(token[0])
    accelerator.wait_for_everyone()
    try:
        seen = marker.is_file() and marker.read_text() == token[0]
    except OSError:
        seen = False
    blind = accelerator.gather(torch.tensor([0 if seen else 1], device=accelerator.device))
    accelerator.wait_for_everyone()  # every process has looked before the file goes
    if accelerator.is_main_process:
        marker.unlink(missing_ok=True)
    missing = [rank for rank, flag in enumerate(blind.tolist()) if flag]
    if missing:
        raise ValueError(
            f"output_dir={str(folder)!r} is not one shared folder: process(es) {missing} of {accelerator.num_processes} "
            "do not see the file the main process wrote there (a node-local disk on another machine?), so their "
            "checkpoint files would land where no resume finds them; expected --output_dir on storage every machine "
            "mounts at the same path (NFS, Lustre, a mounted bucket)")
