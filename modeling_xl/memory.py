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


def carry_memory(kept: tuple[torch.Tensor, ...] | None, new: tuple[torch.Tensor, ...] | None):
    """The memory the next step reads: `new`, written into the tensors of `kept` (the memory this step read) where
    they fit, so that from the moment the memory is full every training step reads it from the same storage.

    `update_memory` returns new tensors at every step. A step captured as a CUDA graph (torch.compile's
    "reduce-overhead") needs its inputs at fixed addresses, and its outputs live in the graph's pool, overwritten by
    its next replay; copying each new memory into one fixed buffer per layer serves both. Call it after the backward
    of the step that read `kept` (its graph may have saved them). Where nothing fits (no memory yet, a memory still
    filling: its length grows, another dtype or device, or storage shared with `kept`) `new` itself is kept; on CUDA
    a copy of it, outside any graph's memory pool (a later replay would overwrite the graph's own output), marked as
    a static address for CUDA graphs. Returns the tensors to pass as the next `mems`.

    Example: mem_len 4, segments of 2: step 1 reads None and keeps its new [B, 2, d]; step 2 reads it and keeps the
    new [B, 4, d]; steps 3, 4, ... write into that one."""
    if kept is None or new is None or len(kept) != len(new) or any(
            k.shape != n.shape or k.dtype != n.dtype or k.device != n.device
            or k.untyped_storage().data_ptr() == n.untyped_storage().data_ptr() for k, n in zip(kept, new)):
        if new is not None and any(n.is_cuda for n in new):
            new = tuple(n.clone() if n.is_cuda else n for n in new)
            for n in new:
                if n.is_cuda:
                    torch._dynamo.mark_static_address(n, guard=False)
        return new
    with torch.no_grad():
        for k, n in zip(kept, new):
            k.copy_(n)
    return kept
