"""Decoding one token at a time with the memory as a ring buffer of fixed size: every step has the same shapes.

Transformer-XL's memory has a fixed length (`mem_len`), so a decoding step reads M memory positions and one new token
whatever the step: unlike a key/value cache that grows with every token, the step's shapes never change. This file
keeps, per layer, the memory's keys and values (and the hidden states they were projected from) in buffers of M slots
written in place, oldest slot first (a ring), and runs a step as plain torch ops on them, so that the step can be
compiled or captured as a CUDA graph once and replayed for as long as the user generates.

Notation: B batch, H heads, D d_head, d d_model, M = mem_len slots, R = M + 1 distances (0..M).
Slot s holds the token written `dist(s)` steps ago: with `pointer` the next slot to write (the oldest),
    dist(s) = ((pointer - 1 - s) mod M) + 1,          e.g. M = 4, pointer = 1: dist = [1, 4, 3, 2].
The score of the new token (distance 0 from itself) against slot s is, as in `relative_attention.relative_attention`,
    (q + u) . k_s + (q + v) . r_{dist(s)}             r = W_R R, the projected sinusoid of each distance,
computed against every distance at once, (q + v) r^T [B, H, 1, R], then gathered at `dist` instead of `rel_shift`ed.
Slots not yet written, or holding padding, are hidden (`real`). A step equals the backbone's forward of that token
with the memory as mems (the same ops in another order: equal up to float rounding; tests/test_static_decoding.py).
"""

from __future__ import annotations

import math

import torch

from .precision import at_least_float32
from .relative_attention import project_rows
from .relative_positions import relative_positions, sinusoid_table


def ring_distances(pointer: torch.Tensor, slots: int) -> torch.Tensor:
    """Distance of each slot's token from the token being decoded, [M] (see the module docstring)."""
    return torch.remainder(pointer - 1 - torch.arange(slots, device=pointer.device), slots) + 1


class DecodeState:
    """The memory of a causal Transformer-XL during generation, as ring buffers of `mem_len` slots per layer.

    Built from the `mems` a forward returned (`from_mems`), advanced one token at a time (`step`), reordered in place
    for beam search (`reorder_`), and, with `keep_hiddens`, read back as ordinary `mems` (`to_mems`): the layers'
    inputs are then kept beside their keys and values (generation needs only the keys and values). Without
    gradients only."""

    def __init__(self, backbone, batch: int, device, dtype, keep_hiddens: bool = False):
        cfg = backbone.config
        self.backbone, self.slots, self.clamp_len = backbone, cfg.mem_len, cfg.clamp_len
        heads, d_head, layers = cfg.n_head, cfg.d_head, cfg.n_layer
        self.keys = [torch.zeros(batch, heads, self.slots, d_head, device=device, dtype=dtype) for _ in range(layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.hiddens = [torch.zeros(batch, self.slots, cfg.d_model, device=device, dtype=dtype)
                        for _ in range(layers)] if keep_hiddens else None
        self.real = torch.zeros(batch, self.slots, dtype=torch.bool, device=device)  # written, and not padding
        self.pointer = torch.zeros((), dtype=torch.long, device=device)  # the next slot to write (the oldest)
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)  # the step's input
        self.filled = 0  # slots written so far (at most M)
        distances = relative_positions(self.slots + 1, clamp_len=cfg.clamp_len).flip(0).to(device)  # 0..M, clamped
        self.table = sinusoid_table(distances, cfg.d_model, dtype)  # [R, d]
        self.positions = [layer.attn.project_positions(self.table) for layer in backbone.layers]  # [H, R, D] each
        self.compiled_step = None
        if torch.device(device).type == "cuda":  # written in place (`step`, `load_`): a CUDA graph reads them there
            for buffer in (*self.rows(), *self.positions, self.pointer, self.token):
                torch._dynamo.mark_static_address(buffer, guard=False)

    def rows(self) -> tuple[torch.Tensor, ...]:
        """Every buffer with a row per sequence (dim 0): keys, values, hidden states if kept, and the written mask."""
        return (*self.keys, *self.values, *(self.hiddens or ()), self.real)

    @classmethod
    @torch.no_grad()
    def from_mems(cls, backbone, mems: tuple[torch.Tensor, ...], real: torch.Tensor | None = None,
                  keep_hiddens: bool = False) -> "DecodeState":
        """The state whose memory is `mems` (n_layer tensors [B, M', d], M' <= mem_len, oldest first); `real` [B, M']
        marks the positions that are not padding (default: all)."""
        state = cls(backbone, mems[0].size(0), mems[0].device, mems[0].dtype, keep_hiddens)
        return state.load_(mems, real, positions=False)

    def fits(self, backbone, mems: tuple[torch.Tensor, ...], keep_hiddens: bool = False) -> bool:
        """Whether `load_(mems)` can reuse this state's buffers: the same backbone, memory length, clamp length, rows,
        device and dtype."""
        cfg = backbone.config
        return (backbone is self.backbone and (cfg.mem_len, cfg.clamp_len) == (self.slots, self.clamp_len)
                and (self.hiddens is not None) == keep_hiddens
                and mems[0].shape[0] == self.real.size(0) and mems[0].device == self.real.device
                and mems[0].dtype == self.keys[0].dtype)

    @torch.no_grad()
    def load_(self, mems: tuple[torch.Tensor, ...], real: torch.Tensor | None = None,
              positions: bool = True) -> "DecodeState":
        """The memory becomes `mems` (as in `from_mems`), written into the buffers this state already has, so that a
        step captured as a CUDA graph keeps reading them at their addresses; with `positions`, the projected distance
        table is computed again too (the weights may have changed since)."""
        length = mems[0].size(1)
        if length > self.slots:
            raise ValueError(f"mems hold {length} positions; expected at most mem_len = {self.slots}")
        for buffer in self.rows():
            buffer.zero_()
        if positions:
            for projected, layer in zip(self.positions, self.backbone.layers):
                projected.copy_(layer.attn.project_positions(self.table))
        if length:
            for i, (layer, keys, values, mem) in enumerate(zip(self.backbone.layers, self.keys, self.values, mems)):
                mem_keys, mem_values = layer.attn.memory_keys_values(mem)  # [B, H, M', D] each
                if self.hiddens is not None:
                    self.hiddens[i][:, :length] = mem
                keys[:, :, :length] = mem_keys
                values[:, :, :length] = mem_values
            self.real[:, :length] = True if real is None else real.to(torch.bool)
        self.pointer.fill_(length % self.slots)
        self.filled = length
        return self

    def to_mems(self) -> tuple[torch.Tensor, ...]:
        """The memory as a forward returns it: n_layer tensors [B, M', d], oldest first (M' the slots written)."""
        if self.hiddens is None:
            raise ValueError("this DecodeState keeps no hidden states (keep_hiddens=False); expected one built with "
                             "keep_hiddens=True to read its memory back")
        order = torch.argsort(ring_distances(self.pointer, self.slots), descending=True)  # oldest first
        order = order[self.slots - self.filled:]  # the slots written
        return tuple(hidden.index_select(1, order) for hidden in self.hiddens)

    def reorder_(self, index: torch.Tensor) -> "DecodeState":
        """Beam search: every buffer's rows follow `index` (row r takes row index[r]). On CUDA in place, so that a
        captured CUDA graph keeps reading them at their addresses. Elsewhere only the rows whose source is another
        row move (a third of them a step in a 4-beam search), each copied straight from its source (`_move_rows`);
        with more than half the rows moving, each buffer is replaced by its reordered copy (one pass over the memory
        instead of two). A compiled step reads either without recompiling."""
        index = index.to(self.real.device)
        if self.real.device.type == "cuda":
            for buffer in self.rows():
                buffer.copy_(buffer.index_select(0, index))
            return self
        moved = (index != torch.arange(index.numel(), device=index.device)).nonzero().squeeze(1)
        if 2 * moved.numel() <= index.numel():
            self._move_rows(moved.tolist(), index[moved].tolist())
            return self
        self.keys = [k.index_select(0, index) for k in self.keys]
        self.values = [v.index_select(0, index) for v in self.values]
        if self.hiddens is not None:
            self.hiddens = [h.index_select(0, index) for h in self.hiddens]
        self.real = self.real.index_select(0, index)
        return self

    def _move_rows(self, rows: list[int], sources: list[int]) -> None:
        """Row rows[j] of every buffer takes row sources[j], in place: each row copy reads its source and writes its
        destination (a gather of the sources, then a scatter, moves every row twice). Sources that another move
        overwrites are read out first, and copied from there."""
        overwritten = set(rows)
        early = sorted({source for source in sources if source in overwritten})
        slot = {source: i for i, source in enumerate(early)}
        for buffer in self.rows():
            saved = buffer[early] if early else None  # a copy, taken before any row is written
            for row, source in zip(rows, sources):
                buffer[row].copy_(saved[slot[source]] if source in slot else buffer[source])

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The last hidden state [B, 1, d] of the backbone for one new token per row, input_ids [B, 1]; the token's
        layer inputs, keys and values are written into the oldest slot."""
        step = self.compiled_step if self.compiled_step is not None else self._step
        self.token.copy_(input_ids)  # one layout whatever the caller sliced it from: a compiled step never recompiles
        hidden = step(self.token)
        self.filled = min(self.filled + 1, self.slots)
        return hidden

    def _step(self, input_ids: torch.Tensor) -> torch.Tensor:
        backbone = self.backbone
        cfg = backbone.config
        h = backbone.word_emb(input_ids)  # [B, 1, d]
        dist = ring_distances(self.pointer, self.slots)  # [M]
        hidden_mask = torch.cat([~self.real, self.real.new_zeros(self.real.size(0), 1)], dim=1)[:, None, None]
        for i, layer in enumerate(backbone.layers):
            attn = layer.attn
            u = attn.r_w_bias if cfg.untie_r else backbone.r_w_bias
            v = attn.r_r_bias if cfg.untie_r else backbone.r_r_bias
            x = attn.layer_norm(h) if attn.pre_lnorm else h
            q, k, val = (attn.split_heads(t) for t in project_rows(attn.qkv_net, x, slice(None)).split(
                attn.n_head * attn.d_head, dim=-1))  # [B, H, 1, D] each
            attn_vec = self._attend(q, k, val, u, v, self.keys[i], self.values[i], self.positions[i], dist,
                                    hidden_mask)
            out = layer.ff(attn.merge(h, attn_vec))
            if self.hiddens is not None:
                self.hiddens[i].index_copy_(1, self.pointer.view(1), h)
            self.keys[i].index_copy_(2, self.pointer.view(1), k)
            self.values[i].index_copy_(2, self.pointer.view(1), val)
            h = out
        self.real.index_fill_(1, self.pointer.view(1), True)
        self.pointer.copy_(torch.remainder(self.pointer + 1, self.slots))
        return h

    @staticmethod
    def _attend(q, k, v_new, u, v, keys, values, positions, dist, hidden_mask):
        """softmax(((q + u) . [K; k] + (q + v) . r_dist) / sqrt(D), hidden slots masked) @ [V; v]: [B, H, 1, D]."""
        q_u, q_v = q + u[:, None], q + v[:, None]
        content = torch.cat([torch.matmul(q_u, keys.transpose(-1, -2)), (q_u * k).sum(-1, keepdim=True)], dim=-1)
        by_distance = torch.matmul(q_v, positions.transpose(-1, -2))  # [B, H, 1, R]
        position = torch.cat([by_distance.index_select(-1, dist), by_distance[..., :1]], dim=-1)  # [B, H, 1, M+1]
        scores = (content + position) * (1.0 / math.sqrt(q.size(-1)))
        scores = scores.masked_fill(hidden_mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(at_least_float32(scores), dim=-1).to(v_new.dtype)  # never in 16 bits
        return torch.matmul(probs[..., :-1], values) + probs[..., -1:] * v_new
