"""The end of a run: prepared wrappers first, then trackers and the process group."""

from __future__ import annotations


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
