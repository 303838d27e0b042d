"""Reuse of projections already computed for a tensor the model handed out, when gradients are off.

Evaluation reads a stream segment by segment and gives every layer back the memory the previous call returned. Each
layer then projects that memory to keys and values again: M memory tokens per segment of T, M/T times the work of the
segment's own projections (10x at the WikiText-103 evaluation setting, M = 640, T = 64). The same layer computed those
projections one call earlier, as part of `[memory; segment]`. `ProjectionCache` keeps them, keyed by the identity of
the tensor they belong to, and gives them back only when the layer is handed that very tensor again, unmodified, with
the same weights:

    cache.put(source, derived, weights)       # after the call that produced `source`
    cache.get(source, weights)                # -> `derived`, or None: compute as usual

A hit needs: gradients disabled (at put and get) and not in `torch.inference_mode()` (its tensors have no version
counter); the same Python object `source` (`out.mems[i]` passed back as is) at the same in-place version, storage,
dtype and device; the same weight tensors at the same in-place versions and storages (an optimizer step,
`load_state_dict`, `p.data = ...`, `.to(dtype)` all change one of them); and the same autocast state. Anything else
is a miss and the caller recomputes; the cache holds one entry (the latest), which it drops on a miss.

What it cannot see: writing into a weight or a memory tensor *in place through `.data`* (`p.data.mul_(2)`) bumps no
version counter. After such an edit call `model.transformer.clear_inference_cache()` or pass `use_cache=False`.
"""

from __future__ import annotations

import torch


def _autocast_state(device_type: str) -> tuple:
    return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)


class ProjectionCache:
    """One memoized value derived from `source` by `weights` (see the module docstring)."""

    def __init__(self):
        self._entry = None
        self.pending = None  # what the owner computed in its last call, until it knows the tensor it belongs to
        self.hits = 0  # how many times `get` returned a value (tests and profiling read it)

    def __deepcopy__(self, memo):  # copies of a model (and pickles, below) start with an empty cache
        return ProjectionCache()

    def __getstate__(self):
        return {"_entry": None, "pending": None, "hits": 0}

    @staticmethod
    def _state(source: torch.Tensor, weights) -> tuple:
        tensors = (source, *weights)
        return (tuple((t._version, t.data_ptr(), t.dtype, t.device) for t in tensors),
                _autocast_state(source.device.type))

    def put(self, source: torch.Tensor, derived, weights) -> None:
        if torch.is_grad_enabled():
            self._entry = None
            return
        # Aliases (`detach`) of the recorded tensors keep their storages allocated while the entry lives, so that no
        # new storage (after `p.data = ...` or `.half().float()`) can reuse one of their addresses and pass for it.
        aliases = tuple(t.detach() for t in (source, *weights))
        self._entry = (source, tuple(weights), self._state(source, weights), derived, aliases)

    def get(self, source: torch.Tensor, weights):
        entry, self._entry = self._entry, None
        if entry is None or torch.is_grad_enabled():
            return None
        kept_source, kept_weights, state, derived, _ = entry
        same_objects = kept_source is source and len(kept_weights) == len(weights) and all(
            kept is w for kept, w in zip(kept_weights, weights))
        if not same_objects or state != self._state(source, weights):
            return None
        self._entry = entry
        self.hits += 1
        return derived

    def clear(self) -> None:
        self._entry = self.pending = None


def enabled() -> bool:
    """Caches apply only without gradients, outside `torch.inference_mode()` (no version counters there) and outside
    torch.compile tracing (where they would break the graph)."""
    return (not torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
            and not torch.compiler.is_compiling())
