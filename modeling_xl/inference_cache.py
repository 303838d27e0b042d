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

from .relative_positions import relative_positions, sinusoid_table


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


class AppendRoom:
    """Tensors that grow along one dimension, kept in buffers with free room after them, so that appending usually
    writes only the new entries instead of copying everything (`torch.cat`).

    Generation appends one token per step to every layer's keys and values of the memory: a concatenation copies the
    whole memory each time (M + 1 entries for 1 new, per layer, twice), an append into room writes 1 and copies the
    memory only when the room runs out (buffers 1.5 x as long as what they hold: every (M + 1) / 2 steps). The memory
    cache (`RelativeMultiHeadAttention.project`) holds the rooms; nothing else sees their buffers.

        room = AppendRoom.of((k_mem, v_mem), dim=2)     # copies once, into buffers with room
        room = AppendRoom.joined([[k_mem, k], [v_mem, v]], dim=2)   # or: [k_mem; k] and [v_mem; v], as torch.cat
        longer = room.append((k_new, v_new))             # writes k_new, v_new after the end (or copies, see below)
        k, v = longer.views()                            # [.., M + T, ..] views of the buffers
        kept = longer.tail(m)                            # the last m entries, a room that `append` can extend

    A room writes in place only at the end that was written last (its buffers' `frontier`): a room whose end is
    behind it (an older room, appended to again) copies into new buffers instead, so that no view handed out before
    ever changes. Used only without gradients (the buffers are written in place).
    """

    def __init__(self, buffers: tuple[torch.Tensor, ...], start: int, end: int, dim: int, frontier: list[int]):
        self.buffers, self.start, self.end, self.dim = buffers, start, end, dim
        self.frontier = frontier  # shared by every room on these buffers: [the end written last]

    @classmethod
    def of(cls, tensors, dim: int) -> AppendRoom:
        """A room holding copies of `tensors`, with space for half as many entries again."""
        return cls.joined([[x] for x in tensors], dim)

    @classmethod
    def joined(cls, pieces: list[list[torch.Tensor]], dim: int) -> AppendRoom:
        """A room holding each list of `pieces` joined along `dim` (as `torch.cat` would, dtype included), in buffers
        1.5 x that long."""
        length = sum(x.size(dim) for x in pieces[0])
        buffers = []
        for parts in pieces:
            shape = list(parts[0].shape)
            shape[dim] = length + max(length // 2, 1)
            buffer = parts[0].new_empty(shape, dtype=torch.result_type(*parts) if len(parts) > 1 else parts[0].dtype)
            torch.cat(parts, dim=dim, out=buffer.narrow(dim, 0, length))
            buffers.append(buffer)
        return cls(tuple(buffers), 0, length, dim, [length])

    def views(self) -> tuple[torch.Tensor, ...]:
        return tuple(b.narrow(self.dim, self.start, self.end - self.start) for b in self.buffers)

    def tail(self, length: int) -> AppendRoom:
        return AppendRoom(self.buffers, self.end - length, self.end, self.dim, self.frontier)

    def append(self, tensors) -> AppendRoom:
        """The room extended by `tensors` (shaped as the buffers except along `dim`): written in place when this room
        ends at the frontier, the buffers have space and the dtypes match; else copied into new buffers with room."""
        n = tensors[0].size(self.dim)
        fits = self.frontier[0] == self.end and self.end + n <= self.buffers[0].size(self.dim)
        if fits and all(x.dtype == b.dtype for x, b in zip(tensors, self.buffers)):
            for buffer, x in zip(self.buffers, tensors):
                buffer.narrow(self.dim, self.end, n).copy_(x)
            self.frontier[0] = self.end + n
            return AppendRoom(self.buffers, self.start, self.end + n, self.dim, self.frontier)
        return AppendRoom.joined([[old, x] for old, x in zip(self.views(), tensors)], self.dim)


class PositionTable:
    """The sinusoid vectors of distances K-1..0 (clamped at `clamp_len`) a backbone's layers read, [K, d_model], and,
    without gradients, one table kept for reuse with every layer's projection of it.

    Kept (`use_cache`): one table of at least `mem_len + 1` rows (the length a one-token step reaches once the memory
    is full); a call for K rows returns its last K rows, the same tensor object for the same K, so that the layers'
    `ProjectionCache`s recognise it. Generation, whose key length grows by one per step until the memory is full,
    reads every table from that one place, and `offer_projections` hands each layer the matching rows of its
    projection of the whole table (computed once per layer and weights) instead of a new K x d_model x d_model product
    per layer and step. Rows of a product equal the product of the rows up to float rounding."""

    def __init__(self, config, n_layer: int):
        self.config = config
        self.kept = None  # (key, table, (klen, rows of it)) when a table is kept
        self.projections = [ProjectionCache() for _ in range(n_layer)]  # one per layer: W_R of the whole kept table

    def __deepcopy__(self, memo):  # a copy of a model starts with nothing kept
        return PositionTable(self.config, len(self.projections))

    def clear(self) -> None:
        self.kept = None
        for cache in self.projections:
            cache.clear()

    def __call__(self, klen: int, dtype: torch.dtype, device, use_cache: bool = False) -> torch.Tensor:
        cfg = self.config
        key = (dtype, torch.device(device), cfg.clamp_len, cfg.d_model)
        kept = self.kept if use_cache else None
        if kept is None or kept[0] != key or kept[1].size(0) < klen:
            length = max(klen, cfg.mem_len + 1) if use_cache else klen
            pos = relative_positions(length, clamp_len=cfg.clamp_len).to(device)
            kept = (key, sinusoid_table(pos, cfg.d_model, dtype), None)  # float64 model: float64 table
            if not use_cache:
                return kept[1]
        full = kept[1]
        if klen == full.size(0):
            table = full
        elif kept[2] is not None and kept[2][0] == klen:
            table = kept[2][1]
        else:  # distances klen-1..0 are the table's last rows (clamping is per distance)
            table = full[-klen:]
        self.kept = (key, full, (klen, table))
        return table

    def offer_projections(self, pos_emb: torch.Tensor, layers) -> None:
        """When `pos_emb` is a part of the kept table: give each attention layer (`offer_position_projection`) the
        rows of its projection W_R of the whole table (`project_positions`, weights `position_weights()`)."""
        full = self.kept[1] if self.kept is not None else None
        if full is None or pos_emb is full or pos_emb.data_ptr() + pos_emb.nbytes != full.data_ptr() + full.nbytes:
            return
        if any(type(layer.position_weights()[0].data) is not torch.Tensor for layer in layers):
            return  # sharded weights (FSDP2 DTensors) are whole only inside each layer's own forward
        if not all(layer.positions_cacheable() for layer in layers):
            return  # an adapter on the projection: its output is not the weight's product (nothing is cached)
        for layer, cache in zip(layers, self.projections):  # `relative_attention.RelativeMultiHeadAttention`s
            weights = layer.position_weights()
            projected = cache.get(full, weights)
            if projected is None:
                projected = layer.project_positions(full)  # [H, R, D]
                cache.put(full, projected, weights)
            layer.offer_position_projection(pos_emb, projected[:, -pos_emb.size(0):])
