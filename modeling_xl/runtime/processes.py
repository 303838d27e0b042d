"""A run's processes: which one is the launch's main process before any process group exists, the host memory the
training loop keeps, and the order in which a run's prepared objects are released at its end."""

from __future__ import annotations

import logging
import os

from .host_memory import keep_freed_memory

logger = logging.getLogger(__name__)


def is_launch_main_process() -> bool:
    """Global rank 0 of a launch (torchrun / accelerate set RANK), before any process group exists."""
    return int(os.environ.get("RANK", "0")) == 0


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
