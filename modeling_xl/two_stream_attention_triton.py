"""XLNet's two-stream attention (`two_stream_attention.two_stream_attention`, same arguments) on the flash-style
Triton kernel of `relative_attention_triton`: no [B, H, Tq, K] tensor in either stream.

Each stream is one kernel call per position table, with XLNet's segment term as the kernel's extra score term:
    content stream   rows = the T positions (query i stands at i), mask [B, 1, T, K], mismatch [B, T, K]
    query stream     P rows standing at `positions` [B, P]
The kernel reads the position term from a band of table rows, which needs query row i to stand at position i. So the
query stream's present rows are scattered to their positions in a layout of T rows (the rows no target stands at see
no key and are dropped), attended, and gathered back: the work of T rows instead of P, as transformers' XLNet does
with its `target_mapping`. This needs the present rows of each batch row to stand at distinct positions, which
XLNet's sampler gives; where they do not (a `target_mapping` naming one position twice), `triton_two_stream_attention`
returns None and the caller takes another path. Checking costs one read of the positions on the host per forward
(the answer is kept on the `Stream`, which every layer shares).
With two tables (bi_data), batch rows [i B/S, (i+1) B/S) use table i: one call per table.

Tested against the reference under triton's interpreter (tests/test_triton_attention.py).
"""

from __future__ import annotations

import torch

from .relative_attention_triton import TritonRelativeAttention, check_runnable


def rows_are_distinct(positions: torch.Tensor, present: torch.Tensor | None, length: int) -> bool:
    """Whether the present rows of every batch row stand at distinct positions (positions [B, P] in [0, length))."""
    weight = torch.ones_like(positions) if present is None else present.to(positions.dtype)
    counts = torch.zeros(positions.size(0), length, dtype=positions.dtype, device=positions.device)
    return bool((counts.scatter_add_(1, positions, weight) <= 1).all())


def to_positions(x: torch.Tensor, positions: torch.Tensor, present: torch.Tensor | None, length: int, dim: int):
    """Rows `dim` of x (one per query-stream row) moved to the rows of a `length`-row layout at `positions` [B, P],
    absent rows contributing nothing; the other rows are zero. x is [B, ..., P, ...] with P at `dim`."""
    shape = list(x.shape)
    shape[dim] = length
    index_shape = [1] * x.dim()
    index_shape[0], index_shape[dim] = positions.size(0), positions.size(1)
    index = positions.view(index_shape).expand_as(x)
    if present is not None:
        x = x * present.view(index_shape).to(x.dtype)
    return x.new_zeros(shape).scatter_add(dim, index, x)


def triton_two_stream_attention(q, key, value, r, biases, seg_embed, shift: int, stream, dropout_p: float = 0.0):
    """One stream of XLNet's attention by the Triton kernel: (out [B, H, Tq, D], None), or None where the query
    stream's rows repeat a position (module docstring). Arguments as `two_stream_attention.two_stream_attention`:
    q [B, H, Tq, D]; key, value [B, H, K, D]; r [S, H, R, D]; biases (u, v, s) [H, D] each; seg_embed [2, H, D];
    `stream` its mask, segment mismatch, query positions and present rows. No attention dropout."""
    check_runnable(q.device.type, dropout_p)
    u, v, s = biases
    seg = None if stream.mismatch is None else torch.matmul(q + s[:, None], seg_embed.permute(1, 2, 0))
    mask = None if stream.mask is None else stream.mask[:, 0]  # [B, Tq, K]
    mismatch, positions = stream.mismatch, stream.positions
    if positions is not None:
        length = shift  # T: the content stream's rows
        if stream.distinct is None:
            stream.distinct = rows_are_distinct(positions, stream.present, length)
        if not stream.distinct:
            return None
        q = to_positions(q, positions, stream.present, length, dim=2)
        seg = None if seg is None else to_positions(seg, positions, stream.present, length, dim=2)
        seen = (~mask).to(torch.uint8) if mask is not None else torch.ones(
            positions.shape + key.shape[2:3], dtype=torch.uint8, device=q.device)
        mask = to_positions(seen, positions, stream.present, length, dim=1) == 0  # rows with no target: all hidden
        if mismatch is not None:
            mismatch = to_positions(mismatch.to(torch.uint8), positions, stream.present, length, dim=1) > 0
    rows = q.size(0) // r.size(0)
    parts = []
    for t, table in enumerate(r):  # batch rows [t B/S, (t+1) B/S) read table t

        def part(x, t=t):
            return None if x is None else x[t * rows: (t + 1) * rows]

        mask_t = None if mask is None else part(mask)[:, None]
        parts.append(TritonRelativeAttention.apply(part(q), u, v, part(key), part(value), table, mask_t, shift,
                                                   part(seg), part(mismatch), torch.is_grad_enabled()))
    out = parts[0] if len(parts) == 1 else torch.cat(parts)
    if positions is not None:
        out = out.gather(2, positions[:, None, :, None].expand(-1, out.size(1), -1, out.size(-1)))
    return out, None
