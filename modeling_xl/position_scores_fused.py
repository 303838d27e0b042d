"""The position term of the relative attention as autograd nodes that run on every device (`kernel_registry`
routes "shifted_position_scores" and "position_product" here): rel_shift((q + v) (W_R R)^T) without rel_shift's
padded copy, and the per-head product that never copies the table per batch row.

Notation as in `relative_attention` (batch-first): B batch, H heads, D d_head, T queries, K = M + T keys, R rows of
the position table, S position tables (1, or 2 with bi_data); v the position bias. `relative_positions.rel_shift` is
the reference these are tested against (tests/test_relative_attention.py).
"""

from __future__ import annotations

import torch


def _shift_window(padded: torch.Tensor, shift: int) -> torch.Tensor:
    """The [..., T, R] that rel_shift reads from a padded [..., T, R + 1]: T*R elements from `shift` on (a view)."""
    *lead, qlen, width = padded.shape
    rlen = width - 1
    return padded.flatten(-2)[..., shift : shift + qlen * rlen].view(*lead, qlen, rlen)


def _check_shift(qlen: int, rlen: int, klen: int, shift: int) -> None:
    """The conditions of `rel_shift` (named error otherwise)."""
    if klen > rlen or not 0 <= shift <= qlen:
        raise ValueError(f"rel_shift: klen={klen}, shift={shift} do not fit {qlen} queries x {rlen} positions")


def head_major(shape, like: torch.Tensor) -> torch.Tensor:
    """An empty [B, H, ...] tensor stored as [H, B, ...], for position products (`position_product`)."""
    return torch.empty((shape[1], shape[0], *shape[2:]), dtype=like.dtype, device=like.device).transpose(0, 1)


def position_product(q_v: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """q_v [B, H, T, D] times r [H, R, D] transposed: [B, H, T, R] (a view of an [H, B, T, R] product).

    One product per head over all batch rows: `torch.matmul(q_v, r^T)` broadcasts r by copying it for every batch row
    ([B, H, D, R]). With q_v stored head-major (`head_major`) nothing is copied; otherwise q_v (never larger: T <= R)
    is."""
    batch, heads, qlen, d_head = q_v.shape
    by_head = q_v.transpose(0, 1).reshape(heads, batch * qlen, d_head)
    return torch.matmul(by_head, r.transpose(-1, -2)).view(heads, batch, qlen, -1).transpose(0, 1)


def shifted_scores(q_v: torch.Tensor, r: torch.Tensor, klen: int, shift: int,
                             hidden_ok: bool = False) -> torch.Tensor:
    """`rel_shift(q_v @ r^T, klen, shift)` without rel_shift's padded copy. q_v [B, H, T, D], r [H, R, D] ->
    [B, H, T, klen] (a view).

    Entry (i, j) is row j + shift - i of query i's products. In the contiguous [T, R] product of one (batch, head)
    that is element i * R + j + shift - i = i * (R - 1) + j + shift: a strided view with row stride R - 1. Where
    j + shift - i falls outside [0, R) (keys that no table row describes, which Transformer-XL's causal mask hides)
    that view reads a neighbouring row instead of rel_shift's zero pad; `hidden_ok` says the caller masks them. Where
    such entries exist and the caller does not say so, the product is written into rel_shift's padded buffer
    instead (also without a copy, but a strided product is slower).
    With r [H, R, D] the product is `position_product`'s (head-major); with r broadcastable to q_v's leading
    dimensions (several tables, [S, 1, H, R, D] against q_v [S, B/S, H, T, D]) it is a broadcast matmul."""
    *lead, qlen, d_head = q_v.shape
    rlen = r.size(-2)
    if _shift_view_ok(qlen, rlen, klen, shift, hidden_ok):
        product = position_product(q_v, r) if r.dim() == 3 else torch.matmul(q_v, r.transpose(-1, -2))
        return _shift_view(product, klen, shift)
    if r.dim() == 3:  # [B, H, T, R + 1] stored head-major, each head's product written into it in one piece
        batch, heads = lead
        padded = head_major((batch, heads, qlen, rlen + 1), q_v)
        by_head = q_v.transpose(0, 1).reshape(heads, batch * qlen, d_head)
        torch.matmul(by_head, r.transpose(-1, -2), out=padded.transpose(0, 1)[..., :rlen].flatten(1, 2))
    else:
        padded = q_v.new_empty(*lead, qlen, rlen + 1)
        torch.matmul(q_v, r.transpose(-1, -2), out=padded[..., :rlen])
    padded[..., rlen].zero_()
    return _shift_window(padded, shift)[..., :klen]


def _shift_view_ok(qlen: int, rlen: int, klen: int, shift: int, hidden_ok: bool) -> bool:
    """Whether `_shift_view` may stand for rel_shift: every entry it reads lies in its own [T, R] matrix, and either
    every (query, key) pair has a table row or the caller hides those that do not (`hidden_ok`)."""
    _check_shift(qlen, rlen, klen, shift)
    all_described = shift >= qlen - 1 and klen - 1 + shift < rlen
    return (hidden_ok or all_described) and (qlen - 1) * (rlen - 1) + klen - 1 + shift < qlen * rlen


def _shift_view(x: torch.Tensor, klen: int, shift: int) -> torch.Tensor:
    """rel_shift of x [..., T, R] (each [T, R] matrix contiguous) as a strided view, where every entry it reads lies in
    its own matrix (`shifted_scores` checks that): row i starts i * (R - 1) + shift elements in."""
    return x.as_strided((*x.shape[:-1], klen), (*x.stride()[:-2], x.size(-1) - 1, 1), x.storage_offset() + shift)


class ShiftedPositionScores(torch.autograd.Function):
    """`rel_shift((q + v) @ r^T, klen, shift)` as one autograd node (`shifted_scores`, no padded copy in
    forward), whose backward writes the gradient into the inverse shift's buffer once, where autograd through
    pad / flatten / slice zero-fills and copies [B, H, T, R]-sized tensors four times.
    q [B, H, T, D]; v [H, D] (the position bias); r [H, R, D] or [S, H, R, D] with S position tables (batch rows
    [i*B/S, (i+1)*B/S) use table i). Returns [B, H, T, klen].
    With one table, q + v and the gradient buffer are stored head-major ([H, B, T, *]): every product is one matrix
    product per head over all batch rows, and r is never copied per batch row. With several tables (bi_data) they
    stay batch-major: a head-major layout would make the output [B, H, T, K] a copy, larger than the copies of r."""

    @staticmethod
    def forward(ctx, q, v, r, klen: int, shift: int):
        batch, heads, qlen, d_head = q.shape
        ctx.tables = r.size(0) if r.dim() == 4 else 1
        ctx.klen, ctx.shift, ctx.r_shape = klen, shift, r.shape
        if ctx.tables == 1:
            r = r.reshape(r.shape[-3:])  # [H, R, D]
            q_v = torch.add(q, v[:, None], out=head_major(q.shape, q))
            ctx.save_for_backward(q_v, r, v)
            return shifted_scores(q_v, r, klen, shift)
        q_v = torch.add(q, v[:, None])  # [B, H, T, D]
        ctx.save_for_backward(q_v, r, v)
        by_table = q_v.view(ctx.tables, batch // ctx.tables, heads, qlen, d_head)
        return shifted_scores(by_table, r[:, None], klen, shift).flatten(0, 1)

    @staticmethod
    def backward(ctx, grad):
        q_v, r, v = ctx.saved_tensors  # q_v [B, H, T, D]: head-major storage with one table, else batch-major
        batch, heads, qlen, d_head = q_v.shape
        rlen = r.size(-2)
        grad_q = grad_v = grad_r = None
        if ctx.tables == 1:  # r [H, R, D]; products per head over all batch rows
            padded, window = unshift_buffer((heads, batch), qlen, rlen, ctx.klen, ctx.shift, q_v)
            window.transpose(0, 1).copy_(grad)
            grad_bd = padded[..., :rlen].flatten(1, 2)  # [H, B * T, R]
            if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
                by_head = torch.matmul(grad_bd, r)  # [H, B * T, D]
                grad_v = by_head.sum(1, dtype=torch.promote_types(by_head.dtype, torch.float32)).to(v.dtype)
                grad_q = by_head.view(heads, batch, qlen, d_head).transpose(0, 1)
            if ctx.needs_input_grad[2]:
                by_head_q_v = q_v.transpose(0, 1).flatten(1, 2)  # [H, B * T, D], a view
                grad_r = torch.matmul(grad_bd.transpose(-1, -2), by_head_q_v).view(ctx.r_shape)
            return grad_q, grad_v, grad_r, None, None
        tables = ctx.tables  # several tables, batch-major
        by_table = q_v.view(tables, batch // tables, heads, qlen, d_head)
        padded, window = unshift_buffer(by_table.shape[:3], qlen, rlen, ctx.klen, ctx.shift, q_v)
        window.copy_(grad.unflatten(0, (tables, batch // tables)))
        grad_bd = padded[..., :rlen]  # [S, B/S, H, T, R]
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            grad_q = torch.matmul(grad_bd, r[:, None]).flatten(0, 1)
            grad_v = grad_q.sum((0, 2), dtype=torch.promote_types(grad_q.dtype, torch.float32)).to(v.dtype)
        if ctx.needs_input_grad[2]:
            grad_r = torch.matmul(grad_bd.transpose(-1, -2), by_table).sum(1)
        return grad_q, grad_v, grad_r, None, None


def unshift_buffer(lead, qlen: int, rlen: int, klen: int, shift: int, like: torch.Tensor):
    """The buffer of the inverse of `rel_shift`: (padded [*lead, T, R + 1], window [*lead, T, klen]), `window` being
    where rel_shift reads its output from (each visible score has exactly one source there), everything else zero.
    The scores' gradient written into `window` makes `padded[..., :R]` the gradient of the unshifted scores, no
    copy. Allocated like `like` (dtype, device)."""
    padded = like.new_empty(*lead, qlen, rlen + 1)
    flat = padded.flatten(-2)
    flat[..., :shift].zero_()
    flat[..., shift + qlen * rlen :].zero_()
    window = _shift_window(padded, shift)
    window[..., klen:].zero_()
    return padded, window[..., :klen]


def shifted_position_scores(q, v, r, klen: int, shift: int) -> torch.Tensor:
    """`ShiftedPositionScores` as a function: rel_shift((q + v) r^T, klen, shift), [B, H, T, klen]."""
    return ShiftedPositionScores.apply(q, v, r, klen, shift)
