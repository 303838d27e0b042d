"""The memory of Transformer-XL (Dai et al. 2019, Sec. 3.2): per layer, the hidden states of the previous segment(s)
that the next segment attends to, `[SG(mem); h]`. One function writes it (`update_memory`); it is passed in and
returned, never kept in a module.

Notation: B batch, T segment length, M memory length, d d_model. `mems` is a tuple with one tensor [B, M, d] per
layer: the *input* of that layer on the previous segment(s).
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

_MEMORY_GRADIENT = contextvars.ContextVar("memory_gradient", default=False)


@contextlib.contextmanager
def memory_gradient():
    """Inside, `update_memory` keeps the memory's graph: the gradient of a later segment's loss reaches the earlier
    segments that wrote its memory (backpropagation through every segment read). For one label per long document
    (`TransformerXLForSequenceClassification.forward_long`), where no earlier segment has a loss of its own; the
    activations of every segment are then kept until backward. Not read inside `torch.compile`d code (which keeps
    the memory detached), as `kernel_registry.reference_only` is not."""
    token = _MEMORY_GRADIENT.set(True)
    try:
        yield
    finally:
        _MEMORY_GRADIENT.reset(token)


def update_memory(mems, hiddens, mem_len: int):
    """New memory per layer: the last `mem_len` states of `[mem; hidden]`, detached (no gradient crosses segments;
    inside `memory_gradient()` it keeps the graph).

    Each is a tensor of its own, of exactly its size: a slice of a concatenation would keep all of `[mem; hidden]`
    alive. Never the hidden state itself: that may be the caller's `inputs_embeds` (refilled in place for the next
    segment, say), and in training it is saved for backward, so an in-place edit of the memory (resetting a row)
    would break or corrupt the gradient."""
    if mem_len == 0:
        return None
    if mems is None:
        mems = [None] * len(hiddens)

    def new_memory(m: torch.Tensor | None, h: torch.Tensor) -> torch.Tensor:
        from_mem = mem_len - h.size(1)  # how many of the old memory's last states stay
        if m is None or from_mem <= 0:
            return h[:, -mem_len:].clone()
        return torch.cat([m[:, -from_mem:], h], dim=1)

    if not torch.compiler.is_compiling() and _MEMORY_GRADIENT.get():  # compiled code: detached (dynamo cannot
        return tuple(new_memory(m, h) for m, h in zip(mems, hiddens))  # read a ContextVar; compiled steps are LM steps)
    with torch.no_grad():
        return tuple(new_memory(m, h) for m, h in zip(mems, hiddens))


def memory_like(mems: tuple[torch.Tensor, ...] | None, h: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """The memory in the hidden states' dtype (memory is detached state: one written by a float32 run can continue a
    bfloat16 model, and the other way round)."""
    if mems is None or mems[0].dtype == h.dtype:
        return mems
    return tuple(m.to(h.dtype) for m in mems)
