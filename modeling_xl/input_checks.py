"""Checks of input values (token ids in range, 0/1 masks) that work in eager mode and inside `torch.compile`.

Eager, on the CPU: the condition is read on the host and a failure raises `ValueError` naming the argument, the bad
value and what was expected. Compiled: reading a tensor on the host (`bool()`, `.item()`) breaks the graph, so the
check becomes `torch._assert_async` inside the graph instead: the compiled step raises `RuntimeError` with the same
text less the bad value (on CPU), or stops on a device-side assert (on CUDA), before the optimizer steps. On a GPU
(eager too) the check is `torch._assert_async` as well: reading the answer on the host would make every step wait
for the device; a bad id stops the run with a device-side assert instead of a `ValueError` (an id out of range would
stop it in the embedding lookup anyway).
"""

from __future__ import annotations

from typing import Callable

import torch


def require(condition: torch.Tensor, message: str, detailed: Callable[[], str] | None = None) -> None:
    """Raise unless every element of the boolean tensor `condition` is true. `message` names the argument and what
    was expected; in eager mode `detailed()`, when given, builds the error instead (it may read the offending value).
    """
    if torch.compiler.is_compiling() or condition.device.type not in ("cpu", "meta"):
        torch._assert_async(condition.all(), message)
        return
    if not bool(condition.all()):
        raise ValueError(message if detailed is None else detailed())


def ids_in_range(ids: torch.Tensor, vocab_size: int, ignore_index: int | None = None) -> torch.Tensor:
    """Boolean tensor: each id is in [0, vocab_size) (or equals `ignore_index`)."""
    inside = (ids >= 0) & (ids < vocab_size)
    return inside if ignore_index is None else inside | (ids == ignore_index)


def extreme_id(ids: torch.Tensor) -> int:
    """The id an out-of-range error shows: the lowest when it is negative, else the highest."""
    low = int(ids.min())
    return low if low < 0 else int(ids.max())
