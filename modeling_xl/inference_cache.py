"""Reuse of projections already computed for a tensor the model handed out, when gradients are off.

Evaluation reads a stream segment by segment and gives every layer back the memory the previous call returned. Each
layer then projects that memory to keys and values again: M memory tokens per segment of T, M/T times the work of the
segment's own projections (10x at the WikiText-103 evaluation setting, M = 640, T = 64). The same layer computed those
projections one call earlier, as part of `[memory; segment]`. `ProjectionCache` keeps them, keyed by the identity of
the tensor they belong to, and gives them back only when the layer is handed that very tensor again, unmodified, with
the same weights:

    cache.put(source, derived, weights)       # after the call that produced `source`
    cache.get(source, weights)                # -> `derived`, or None: compute as usual

A hit needs: gradients disabled (at put and get), the same Python object `source` (`out.mems[i]` passed back as is),
its in-place version unchanged, the same weight tensors at the same in-place versions (an optimizer step or
`load_state_dict` bumps them), and the same autocast state. Anything else is a miss and the caller recomputes, so the
cache never changes a result; it holds one entry (the latest), which it drops on a miss.
"""

from __future__ import annotations

import weakref

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
        return source._version, tuple(w._version for w in weights), _autocast_state(source.device.type)

    def put(self, source: torch.Tensor, derived, weights) -> None:
        if torch.is_grad_enabled():
            self._entry = None
            return
        refs = tuple(weakref.ref(w) for w in weights)
        self._entry = (weakref.ref(source), refs, self._state(source, weights), derived)

    def get(self, source: torch.Tensor, weights):
        entry, self._entry = self._entry, None
        if entry is None or torch.is_grad_enabled():
            return None
        source_ref, weight_refs, state, derived = entry
        same_objects = source_ref() is source and len(weight_refs) == len(weights) and all(
            ref() is w for ref, w in zip(weight_refs, weights))
        if not same_objects or state != self._state(source, weights):
            return None
        self._entry = entry
        self.hits += 1
        return derived

    def clear(self) -> None:
        self._entry = self.pending = None


def enabled() -> bool:
    """Caches apply only without gradients and outside torch.compile tracing (where they would break the graph)."""
    return not torch.is_grad_enabled() and not torch.compiler.is_compiling()
