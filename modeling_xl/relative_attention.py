"""Relative multi-head attention of Transformer-XL (Dai et al. 2019, Sec. 3.3), shared by every head of this package.

Notation (batch-first everywhere):
    B batch, H heads, D d_head, T query length (current segment), M memory length, K = M + T key length,
    R number of relative positions in the position table, d d_model.

Score of query i and key j (Eq. in Sec. 3.3, with u = r_w_bias, v = r_r_bias):
    A_ij = (q_i + u) . k_j  +  (q_i + v) . W_R R_{i-j}
The second term is computed for all R relative positions at once, (q + v) @ (W_R R)^T, then `rel_shift` moves every
row to its own distance: O(T * R) work instead of O(T * K * D) for gathering per pair.
"""

from __future__ import annotations

import math
import torch
import torch.nn.functional as F
from torch import nn

from .dropout import Dropout, apply_keep, dropout, keep_mask
from .inference_cache import ProjectionCache
from .layer_norm import LayerNorm
from .precision import at_least_float32


def relative_positions(klen: int, qlen: int = 0, clamp_len: int = -1, bidirectional: bool = False) -> torch.Tensor:
    """Relative distances, largest first, covered by the position table.

    Unidirectional (Transformer-XL): `klen-1, ..., 1, 0` (a query never looks forward).
    Bidirectional (XLNet): `klen, ..., 1, 0, -1, ..., -qlen+1`.
    Distances beyond `clamp_len` (when > 0) share the vector of `clamp_len`. Example, klen=5, clamp_len=3:
    `[4, 3, 2, 1, 0] -> [3, 3, 2, 1, 0]`.
    """
    if bidirectional:
        pos = torch.arange(klen, -qlen, -1.0)
    else:
        pos = torch.arange(klen - 1, -1, -1.0)
    if clamp_len > 0:
        pos = pos.clamp(-clamp_len, clamp_len)
    return pos


def sinusoid_table(pos: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoid embedding `[sin(p * w_k), cos(p * w_k)]`, w_k = 1 / 10000^(2k / dim) (Vaswani et al. 2017). [R, dim]."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2.0, device=pos.device) / dim))
    angles = torch.outer(pos.to(inv_freq.dtype), inv_freq)  # [R, dim/2]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def rel_shift(x: torch.Tensor, klen: int, shift: int) -> torch.Tensor:
    """Move row i of `x` left by `shift - i` and keep `klen` columns: `out[..., i, j] = x[..., i, j + shift - i]`.

    `x[..., i, c]` holds the score of query i against relative-position row c; with the table starting at distance
    `start` (row c = distance `start - c`) and M memory slots, query i (absolute M + i) meets key j at distance
    M + i - j, i.e. row `j + (start - M) - i`, so `shift = start - M` (`T - 1` for Transformer-XL, `T` for XLNet).

    Worked example (T=3, klen=R=3, shift=2; letters are the distance-ordered scores of each row, '?' garbage that the
    causal mask hides):
        x = [[a2 a1 a0]      out = [[a0  ?  ?]
             [b2 b1 b0]   ->        [b1 b0  ?]
             [c2 c1 c0]]            [c2 c1 c0]]
    Implementation: pad one zero column on the right (rows of R + 1), flatten, and read T rows of length R starting
    `shift` elements in: row i then starts at i * (R + 1) + shift - i. One copy (the pad), no gather.
    """
    *lead, qlen, rlen = x.shape
    _check_shift(qlen, rlen, klen, shift)
    return _shift_window(F.pad(x, (0, 1)), shift)[..., :klen]  # pad: [..., T, R+1]


def _shift_window(padded: torch.Tensor, shift: int) -> torch.Tensor:
    """The [..., T, R] that rel_shift reads from a padded [..., T, R + 1]: T*R elements from `shift` on (a view)."""
    *lead, qlen, width = padded.shape
    rlen = width - 1
    return padded.flatten(-2)[..., shift : shift + qlen * rlen].view(*lead, qlen, rlen)


def _check_shift(qlen: int, rlen: int, klen: int, shift: int) -> None:
    if klen > rlen or not 0 <= shift <= qlen:
        raise ValueError(f"rel_shift: klen={klen}, shift={shift} do not fit {qlen} queries x {rlen} positions")


def causal_mask(qlen: int, mlen: int, same_length: bool = False, mem_len: int = 0, device=None) -> torch.Tensor:
    """Boolean [T, K] mask, True where query i may NOT attend key j.

    Query i sits at absolute position M + i: it sees keys j <= M + i (memory plus the causal part of the segment).
    With `same_length`, every query sees the same number of keys: keys farther back than the window that the last
    query sees are hidden too (the paper's evaluation setting). Example T=3, M=2, mem_len=2, same_length
    (x = hidden):
        [. . . x x]      [. . . x x]
        [. . . . x]  ->  [x . . . x]
        [. . . . .]      [x x . . .]
    """
    klen = mlen + qlen
    ones = torch.ones(qlen, klen, dtype=torch.bool, device=device)
    mask = torch.triu(ones, diagonal=1 + mlen)
    if same_length and mem_len > 0:  # with no memory window the legacy formula would hide every key: ignore it
        visible = klen - mem_len
        shift = qlen - visible if visible > 0 else qlen
        mask = mask | torch.tril(ones, diagonal=-shift)
    return mask


def takes_fused_path(dropout_p: float, output_attentions: bool) -> bool:
    """Whether attention runs through a fused autograd node (`FusedRelativeAttention` / `FusedBiasedAttention`) rather
    than plain ops or SDPA: with gradients, and also without them when there is attention dropout (reentrant
    activation checkpointing runs the forward under no_grad and recomputes it with gradients: both must draw the same
    dropout masks). Not when the probabilities are returned, nor under torch.compile, which traces the plain ops (no
    graph break) and fuses them itself."""
    return ((torch.is_grad_enabled() or dropout_p > 0) and not output_attentions
            and not torch.compiler.is_compiling())


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    score_bias: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float = 0.0,
    use_sdpa: bool = True,
    output_attentions: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax((query . key + score_bias) / sqrt(D) masked) @ value.

    query [B, H, T, D] (already includes the content bias u), key/value [B, H, K, D], score_bias [B|1, H, T, K]
    (the position and segment terms, unscaled), mask bool broadcastable to [B, H, T, K] (True = hidden).
    A fully hidden row gets uniform weights instead of NaN (as XLNet's `-1e30` does). Where `takes_fused_path`, the
    fused node computes it.
    """
    if takes_fused_path(dropout_p, output_attentions):
        return FusedBiasedAttention.apply(query, key, value, score_bias, mask, dropout_p), None
    scale = 1.0 / math.sqrt(query.size(-1))
    bias = score_bias * scale
    if mask is not None:
        bias = bias.masked_fill(mask, torch.finfo(bias.dtype).min)
    if use_sdpa and not output_attentions:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=bias.to(query.dtype), dropout_p=dropout_p,
                                             scale=scale)
        return out, None
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale + bias  # [B, H, T, K]
    probs = torch.softmax(at_least_float32(scores), dim=-1).to(value.dtype)
    probs_dropped = dropout(probs, dropout_p)
    return torch.matmul(probs_dropped, value), (probs if output_attentions else None)


# Mixed precision in the fused attentions: inputs may mix the autocast dtype (projections) and float32 (q + bias,
# position tables). They compute in the keys' dtype with autocast off, softmax in float32, and hand gradients back in
# each input's own dtype.
def _common_dtype(ctx, tensors, like: torch.Tensor) -> list[torch.Tensor]:
    ctx.input_dtypes = [t.dtype for t in tensors]
    return [t.to(like.dtype) for t in tensors]


def _input_dtypes(ctx, grads) -> list[torch.Tensor]:
    return [g.to(dtype) for g, dtype in zip(grads, ctx.input_dtypes)]


class Hidden:
    """A boolean attention mask (True = hidden) applied to scores [..., T, K] of one dtype: `hide_` is
    `masked_fill_(mask, finfo.min)`, `zero_` is `masked_fill_(mask, 0)`. Except in float16 they run as float factors
    shaped like the mask, `x * visible + fill` and `x * visible`: on CPU, `masked_fill_` with a bool mask broadcast
    over the heads is about 20x slower. The factors equal masked_fill for finite x; float16 scores can overflow to
    inf at a hidden key (inf * 0 is NaN), so float16 keeps masked_fill. The factors (4-8x the bool mask's size) are
    built inside each call and freed at its end, so none of them stays alive across the allocations between the two
    calls of a recomputing backward (hide_ on the recomputed scores, zero_ on their gradient): at the activation
    checkpointing benchmark's shapes a [T, K] factor is 2 MiB, and it used to sit in the step's peak."""

    def __init__(self, mask: torch.Tensor, dtype: torch.dtype):
        self.mask, self.dtype, self.exact = mask, dtype, dtype == torch.float16

    @classmethod
    def of(cls, mask: torch.Tensor | None, dtype: torch.dtype) -> "Hidden | None":
        return None if mask is None else cls(mask, dtype)

    def visible(self) -> torch.Tensor:
        """1 where a key is visible, 0 where hidden, in the scores' dtype."""
        return self.mask.logical_not().to(self.dtype)

    def hide_(self, scores: torch.Tensor) -> torch.Tensor:
        if self.exact:
            return scores.masked_fill_(self.mask, torch.finfo(scores.dtype).min)
        scores.mul_(self.visible())  # one factor alive at a time
        return scores.add_(self.mask.to(self.dtype).mul_(torch.finfo(self.dtype).min))

    def zero_(self, grad: torch.Tensor) -> torch.Tensor:
        return grad.masked_fill_(self.mask, 0.0) if self.exact else grad.mul_(self.visible())


def _masked_softmax(scores, hidden: Hidden | None, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """softmax(scores * scale, masked) in float32 or wider, cast to `dtype`; `scores` is scaled and masked in place."""
    scores *= scale
    if hidden is not None:
        hidden.hide_(scores)
    low_precision = scores.dtype in (torch.float16, torch.bfloat16)
    return torch.softmax(scores.float() if low_precision else scores, dim=-1).to(dtype)


def _dropout_value(probs, value, dropout_p: float):
    """(dropout(probs) @ value, keep-mask or None, keep scale)."""
    if dropout_p == 0:
        return torch.matmul(probs, value), None, 1.0
    keep, keep_scale = keep_mask(probs.shape, dropout_p, probs.device)
    return torch.matmul(apply_keep(probs, keep, keep_scale), value), keep, keep_scale


def _softmax_dropout_value(scores, value, hidden: Hidden | None, dropout_p: float, scale: float):
    """Forward core of the fused attentions: softmax(scores * scale, masked), dropout, @ value. `scores` [B, H, T, K]
    (the raw sum of score terms) is scaled and masked in place. Returns (out, probs, keep-mask or None, keep scale)."""
    probs = _masked_softmax(scores, hidden, scale, value.dtype)
    del scores
    out, keep, keep_scale = _dropout_value(probs, value, dropout_p)
    return out, probs, keep, keep_scale


def _softmax_dropout_value_backward(grad_out, value, hidden: Hidden | None, probs, keep, keep_scale: float,
                                    scale: float):
    """(grad of value, grad of the raw score sum): dV = P'^T dO with P' the dropped probabilities, dP = dO V^T
    (masked like P'), dS = P * (dP - rowsum(dP * P)) * scale, zero where masked."""
    grad_out = grad_out.to(value.dtype).contiguous()
    grad_value = _grad_value(grad_out, probs, keep, keep_scale)
    grad_probs = torch.matmul(grad_out, value.transpose(-1, -2))  # [B, H, T, K]
    if keep is not None:
        apply_keep(grad_probs, keep, keep_scale, inplace=True)
    grad_scores = torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype)
    del grad_probs
    grad_scores.mul_(scale)
    if hidden is not None:
        hidden.zero_(grad_scores)
    return grad_value, grad_scores


def _grad_value(grad_out, probs, keep, keep_scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """dV = P'^T dO, P' the probabilities after dropout (written into `out` when given)."""
    dropped = probs if keep is None else apply_keep(probs, keep, keep_scale)
    return torch.matmul(dropped.transpose(-1, -2), grad_out, out=out)


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


def _shifted_position_scores(q_v: torch.Tensor, r: torch.Tensor, klen: int, shift: int,
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
    its own matrix (`_shifted_position_scores` checks that): row i starts i * (R - 1) + shift elements in."""
    return x.as_strided((*x.shape[:-1], klen), (*x.stride()[:-2], x.size(-1) - 1, 1), x.storage_offset() + shift)


class ShiftedPositionScores(torch.autograd.Function):
    """`rel_shift((q + v) @ r^T, klen, shift)` as one autograd node (`_shifted_position_scores`, no padded copy in
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
            return _shifted_position_scores(q_v, r, klen, shift)
        q_v = torch.add(q, v[:, None])  # [B, H, T, D]
        ctx.save_for_backward(q_v, r, v)
        by_table = q_v.view(ctx.tables, batch // ctx.tables, heads, qlen, d_head)
        return _shifted_position_scores(by_table, r[:, None], klen, shift).flatten(0, 1)

    @staticmethod
    def backward(ctx, grad):
        q_v, r, v = ctx.saved_tensors  # q_v [B, H, T, D]: head-major storage with one table, else batch-major
        batch, heads, qlen, d_head = q_v.shape
        rlen = r.size(-2)
        grad_q = grad_v = grad_r = None
        if ctx.tables == 1:  # r [H, R, D]; products per head over all batch rows
            padded, window = _unshift_buffer((heads, batch), qlen, rlen, ctx.klen, ctx.shift, q_v)
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
        padded, window = _unshift_buffer(by_table.shape[:3], qlen, rlen, ctx.klen, ctx.shift, q_v)
        window.copy_(grad.unflatten(0, (tables, batch // tables)))
        grad_bd = padded[..., :rlen]  # [S, B/S, H, T, R]
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            grad_q = torch.matmul(grad_bd, r[:, None]).flatten(0, 1)
            grad_v = grad_q.sum((0, 2), dtype=torch.promote_types(grad_q.dtype, torch.float32)).to(v.dtype)
        if ctx.needs_input_grad[2]:
            grad_r = torch.matmul(grad_bd.transpose(-1, -2), by_table).sum(1)
        return grad_q, grad_v, grad_r, None, None


def _relative_probs(q_u, q_v, key, r, hidden: Hidden | None, shift: int, scale: float) -> torch.Tensor:
    """softmax(((q + u) . k + rel_shift((q + v) . r)) * scale, masked), [B, H, T, K] in the keys' dtype. Deterministic
    in its inputs: the backward of `FusedRelativeAttention` recomputes the very same probabilities."""
    scores = torch.matmul(q_u, key.transpose(-1, -2))  # [B, H, T, K]
    scores += _shifted_position_scores(q_v, r, key.size(2), shift, hidden_ok=hidden is not None)
    return _masked_softmax(scores, hidden, scale, key.dtype)


def _unshift_buffer(lead, qlen: int, rlen: int, klen: int, shift: int, like: torch.Tensor):
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


# The fused relative attention builds its [B, H, T, K]-sized tensors (scores, probabilities, their gradient) for blocks
# of (batch row, head) pairs of at most this many bytes at a time. Long segments then need a few blocks of scratch
# space instead of several whole-layer tensors, which is what bounds training memory under activation checkpointing.
# Measured with benchmarks/bench_activation_checkpointing.py's model (2 x 8 heads x 512 x 1024 scores, 32 MB a
# layer): 1.23 s per plain training step with one block, 0.86 s with 8 MiB blocks, 0.61 s with 4 MiB, 0.63 s with
# 2 MiB, 0.80 s with 1 MiB (smaller buffers stay in cache and are not fresh pages); tensor peak 149 -> 100 MB.
SCORE_BLOCK_BYTES = 4 * 2**20


def score_blocks(batch: int, heads: int, qlen: int, klen: int, itemsize: int) -> list[tuple[slice, slice]]:
    """(batch slice, head slice) blocks covering [B, H] whose [*, *, T, K] scores fit `SCORE_BLOCK_BYTES` (at least one
    pair each): whole batch rows when one row fits, else head ranges within one row, so that every block of a
    contiguous [B, H, ...] tensor is contiguous. Example: B=2, H=8, 4 pairs per block -> (row 0, heads 0-3),
    (row 0, heads 4-7), (row 1, heads 0-3), (row 1, heads 4-7)."""
    pairs = max(1, SCORE_BLOCK_BYTES // (qlen * klen * itemsize))
    if pairs >= batch * heads:
        return [(slice(None), slice(None))]
    if pairs >= heads:
        rows = pairs // heads
        return [(slice(b, min(b + rows, batch)), slice(None)) for b in range(0, batch, rows)]
    return [(slice(b, b + 1), slice(h, min(h + pairs, heads))) for b in range(batch) for h in range(0, heads, pairs)]


def _mask_block(mask: torch.Tensor | None, rows: slice, heads: slice) -> torch.Tensor | None:
    """The part of a mask broadcastable to [B, H, T, K] that applies to one block."""
    if mask is None or mask.dim() < 3:
        return mask
    mask = mask.view(*([1] * (4 - mask.dim())), *mask.shape)
    return mask[rows if mask.size(0) > 1 else slice(None), heads if mask.size(1) > 1 else slice(None)]


class FusedRelativeAttention(torch.autograd.Function):
    """softmax(((q + u) . k + rel_shift((q + v) . r)) / sqrt(D), masked) @ value as one autograd node, for training.

    Same result as `position_scores` + `attend`. Saved for backward: q + u, the keys, values, position vectors, the
    dropout keep-mask and the output, not the probabilities [B, H, T, K]: backward recomputes them (two of the eleven
    attention products of a training step, and a softmax). They were the largest activation of a layer (8 MB per
    layer at the `wide` benchmark preset, where leaving them out took the training tensor peak from 0.83x to 0.68x
    the legacy implementation's, with the changes around it; benchmarks/README.md). Autograd through the separate ops
    would keep several [B, H, T, K] tensors alive, and on CPU SDPA falls back to its unfused math path in training.
    Forward and backward work on blocks of (batch row, head) pairs (`score_blocks`), so the score-sized scratch space
    is bounded by `SCORE_BLOCK_BYTES` per tensor (a layer of the `tiny` preset is one block, of `wide` two).
    Backward (the standard softmax-attention gradient) gives dS; the content part gives d(q + u) = dS k,
    dk = dS^T (q + u); the position part is dS shifted back into the table (the inverse of `rel_shift`: every visible
    entry has one source) giving d(q + v) and dr; dq is their sum, du and dv their sums over batch and positions.
    dS is built per block in dP's buffer: dP = dO V^T, minus rowsum(dP * P) (= rowsum(dO * O), from the output),
    times P; the probabilities are then freed, and dS, scaled, is written into the window of the inverse shift's
    [b, h, T, R + 1] buffer and read back unshifted. A block holds two score-sized tensors at a time (it held three,
    which set the activation-checkpointed training peak).
    The output is a [B, H, T, D] view of a [B, T, H, D] tensor, so that merging the heads is a view and the output
    projection saves the same storage as this node.
    Inputs: q [B, H, T, D]; u, v [H, D] (the content and position biases); key, value [B, H, K, D]; r [H, R, D];
    mask bool broadcastable to [B, H, T, K], hiding every key that no table row describes (as the causal mask does);
    shift (see `rel_shift`); dropout_p.
    """

    @staticmethod
    def forward(ctx, q, u, v, key, value, r, mask, shift: int, dropout_p: float):
        with torch.autocast(key.device.type, enabled=False):
            q, u, v, key, value, r = _common_dtype(ctx, (q, u, v, key, value, r), key)
            key, value, r = key.contiguous(), value.contiguous(), r.contiguous()
            (batch, heads, qlen, d_head), klen = q.shape, key.size(2)
            scale = 1.0 / math.sqrt(d_head)
            q_u = torch.add(q, u[:, None], out=torch.empty(q.shape, dtype=q.dtype, device=q.device))
            q_v = torch.add(q_u, (v - u)[:, None], out=head_major(q_u.shape, q_u))
            out = q.new_empty(batch, qlen, heads, d_head).transpose(1, 2)  # [B, H, T, D] over [B, T, H, D]
            keep = None if dropout_p == 0 else torch.empty(batch, heads, qlen, klen, dtype=torch.bool,
                                                           device=q.device)
            ctx.keep_scale = 1.0
            for rows, hs in score_blocks(batch, heads, qlen, klen, q.element_size()):
                probs = _relative_probs(q_u[rows, hs], q_v[rows, hs], key[rows, hs], r[hs],
                                        Hidden.of(_mask_block(mask, rows, hs), key.dtype), shift, scale)
                if keep is not None:
                    keep[rows, hs], ctx.keep_scale = keep_mask(probs.shape, dropout_p, probs.device)
                    apply_keep(probs, keep[rows, hs], ctx.keep_scale, inplace=True)
                out[rows, hs] = torch.matmul(probs, value[rows, hs])
                del probs
        ctx.save_for_backward(q_u, u, v, key, value, r, mask, keep, out)
        ctx.shift, ctx.scale = shift, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q_u, u, v, key, value, r, mask, keep, out = ctx.saved_tensors
        with torch.autocast(grad_out.device.type, enabled=False):
            grad_out = grad_out.to(value.dtype).contiguous()
            q_v = torch.add(q_u, (v - u)[:, None], out=head_major(q_u.shape, q_u))
            acc = torch.promote_types(out.dtype, torch.float32)  # bf16 / fp16 accumulate in float32
            rowsum = (grad_out.to(acc) * out.to(acc)).sum(-1, keepdim=True).to(q_u.dtype)  # rowsum(dP * P)
            (batch, heads, qlen, _), klen, rlen = q_u.shape, key.size(2), r.size(1)
            grad_value = torch.empty_like(value)
            grad_q = grad_key = None  # allocated once the first block's probabilities are freed
            grad_r, grad_u, grad_v = torch.zeros_like(r), torch.zeros_like(u), torch.zeros_like(v)
            for rows, hs in score_blocks(batch, heads, qlen, klen, q_u.element_size()):
                block_q_u, block_q_v, block_key, block_r = q_u[rows, hs], q_v[rows, hs], key[rows, hs], r[hs]
                block_grad_out = grad_out[rows, hs]
                block_hidden = Hidden.of(_mask_block(mask, rows, hs), key.dtype)
                block_keep = None if keep is None else keep[rows, hs]
                probs = _relative_probs(block_q_u, block_q_v, block_key, block_r, block_hidden, ctx.shift, ctx.scale)
                _grad_value(block_grad_out, probs, block_keep, ctx.keep_scale, out=grad_value[rows, hs])
                # dP, contiguous (a batched product written straight into the strided window is 1.2-1.7x slower),
                # turned into dS / scale in place; the probabilities are freed before the shift buffer exists, so
                # a block holds two score-sized tensors at a time, not three
                grad_scores = torch.matmul(block_grad_out, value[rows, hs].transpose(-1, -2))
                if block_keep is not None:
                    apply_keep(grad_scores, block_keep, ctx.keep_scale, inplace=True)
                grad_scores.sub_(rowsum[rows, hs]).mul_(probs)
                del probs
                if block_hidden is not None:
                    block_hidden.zero_(grad_scores)
                padded, window = _unshift_buffer(block_q_u.shape[:2], qlen, rlen, klen, ctx.shift, block_q_u)
                grad_scores = torch.mul(grad_scores, ctx.scale, out=window)  # dS, the old buffer freed
                del window
                if grad_q is None:
                    grad_q, grad_key = torch.empty_like(q_u), torch.empty_like(key)
                block_grad_q = grad_q[rows, hs]
                torch.matmul(grad_scores, block_key, out=block_grad_q)  # d(q + u); d(q + v) is added below
                torch.matmul(grad_scores.transpose(-1, -2), block_q_u, out=grad_key[rows, hs])
                del grad_scores
                grad_u[hs] += block_grad_q.sum((0, 2))
                grad_bd = padded[..., :rlen]  # [b, h, T, R]
                grad_q_v = torch.matmul(grad_bd, block_r)
                grad_v[hs] += grad_q_v.sum((0, 2))
                block_grad_q += grad_q_v
                grad_r[hs] += torch.matmul(grad_bd.transpose(-1, -2), block_q_v).sum(0)  # [h, R, D]
                # freed before the next block's buffers exist (else two [b, h, T, R + 1] buffers are alive at once)
                del padded, grad_bd, grad_q_v
        grads = _input_dtypes(ctx, (grad_q, grad_u, grad_v, grad_key, grad_value, grad_r))
        return (*grads, None, None, None)


class FusedBiasedAttention(torch.autograd.Function):
    """softmax((query . key + score_bias) / sqrt(D), masked) @ value as one autograd node: `attend` in training.

    For score terms built outside (XLNet's two streams: positions gathered per target, segment terms, two tables).
    Saves query, key, value, mask, the probabilities and the keep-mask, not the bias; the bias gets the gradient of
    the score sum (summed over its broadcast dimensions). Inputs: query [B, H, T, D], key/value [B, H, K, D],
    score_bias broadcastable to [B, H, T, K], mask bool broadcastable or None, dropout_p.
    """

    @staticmethod
    def forward(ctx, query, key, value, score_bias, mask, dropout_p: float):
        with torch.autocast(key.device.type, enabled=False):
            query, key, value, score_bias = _common_dtype(ctx, (query, key, value, score_bias), key)
            scale = 1.0 / math.sqrt(query.size(-1))
            scores = torch.matmul(query, key.transpose(-1, -2))  # [B, H, T, K]
            scores += score_bias
            out, probs, keep, ctx.keep_scale = _softmax_dropout_value(scores, value, Hidden.of(mask, key.dtype),
                                                                      dropout_p, scale)
        ctx.save_for_backward(query, key, value, mask, probs, keep)
        ctx.bias_shape, ctx.scale = score_bias.shape, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, mask, probs, keep = ctx.saved_tensors
        with torch.autocast(grad_out.device.type, enabled=False):
            hidden = Hidden.of(mask, value.dtype)
            grad_value, grad_scores = _softmax_dropout_value_backward(grad_out, value, hidden, probs, keep,
                                                                      ctx.keep_scale, ctx.scale)
            grad_query = torch.matmul(grad_scores, key)
            grad_key = torch.matmul(grad_scores.transpose(-1, -2), query)
            grad_bias = grad_scores.sum_to_size(ctx.bias_shape)
        return (*_input_dtypes(ctx, (grad_query, grad_key, grad_value, grad_bias)), None, None)


class RelativeMultiHeadAttention(nn.Module):
    """Transformer-XL attention sublayer with its residual connection and LayerNorm (pre- or post-norm).

    Weights: `qkv` fused [3*H*D, d] (queries from the segment, keys/values from [memory; segment]), `r_net` the
    position projection W_R [H*D, d], `o_net` [d, H*D], and the content/position biases u, v (`r_w_bias`, `r_r_bias`)
    per layer or shared (then passed in).
    """

    def __init__(self, config, r_w_bias: nn.Parameter | None = None, r_r_bias: nn.Parameter | None = None):
        super().__init__()
        self.n_head, self.d_head = config.n_head, config.d_head
        inner = config.n_head * config.d_head
        self.qkv_net = nn.Linear(config.d_model, 3 * inner, bias=False)
        self.r_net = nn.Linear(config.d_model, inner, bias=False)
        self.o_net = nn.Linear(inner, config.d_model, bias=False)
        self.layer_norm = LayerNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.drop = Dropout(config.dropout)
        self.dropatt = config.dropatt
        self.pre_lnorm = config.pre_lnorm
        if config.untie_r:
            self.r_w_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
            self.r_r_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
        self.config = config  # `use_sdpa` follows its `_attn_implementation` (`model.set_attn_implementation`)
        self._use_sdpa = None
        # without gradients: keys/values of the memory and the projected position table, reused (inference_cache)
        self.memory_cache = ProjectionCache()
        self.position_cache = ProjectionCache()

    @property
    def use_sdpa(self) -> bool:
        """Attention without gradients runs on SDPA unless the config's `_attn_implementation` is "eager" (read at
        every call, so `model.set_attn_implementation("eager")` reaches the layers) or this was set to False."""
        return self.config._attn_implementation != "eager" if self._use_sdpa is None else self._use_sdpa

    @use_sdpa.setter
    def use_sdpa(self, value: bool) -> None:
        self._use_sdpa = bool(value)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, L, H*D] -> [B, H, L, D]."""
        return x.view(x.size(0), x.size(1), self.n_head, self.d_head).transpose(1, 2)

    def project(self, h: torch.Tensor, mem: torch.Tensor | None, use_cache: bool = False,
                queries: bool = True) -> tuple[torch.Tensor | None, ...]:
        """Queries from `h` [B, T, d]; keys and values from `[mem; h]` [B, M+T, d]. Each [B, H, *, D]; keys and values
        contiguous in that layout (the attention products would otherwise copy them, each time). With `use_cache`
        (set by the backbone only where `inference_cache.enabled()`) the memory's keys and values may come from the
        cache, and those of `[mem; h]` stay pending until `keep_memory_projection`. `queries=False`: keys and values
        only (the queries come back as None and are not computed)."""
        inner = self.n_head * self.d_head
        x = self.layer_norm(h) if self.pre_lnorm else h
        if queries:
            q, k, v = F.linear(x, self.qkv_net.weight).split(inner, dim=-1)
        else:
            q, (k, v) = None, F.linear(x, self.qkv_net.weight[inner:]).split(inner, dim=-1)
        k, v = self.split_heads(k), self.split_heads(v)
        if mem is not None and mem.size(1) > 0:
            cached = self.memory_cache.get(mem, self._memory_weights()) if use_cache else None
            if cached is None:
                mem = self.layer_norm(mem) if self.pre_lnorm else mem
                cached = [self.split_heads(x) for x in F.linear(mem, self.qkv_net.weight[inner:]).split(inner, -1)]
            k, v = torch.cat([cached[0], k], dim=2), torch.cat([cached[1], v], dim=2)
        else:
            k, v = k.contiguous(), v.contiguous()
        if use_cache:
            self.memory_cache.pending = (k, v)
        return (None if q is None else self.split_heads(q)), k, v

    def _memory_weights(self) -> tuple[torch.Tensor, ...]:
        return (self.qkv_net.weight, self.layer_norm.weight, self.layer_norm.bias) if self.pre_lnorm else (
            self.qkv_net.weight,)

    def keep_memory_projection(self, new_mem: torch.Tensor | None) -> None:
        """Called by the backbone with this layer's next memory (None without memory), the last `new_mem.size(1)`
        states of the `[mem; h]` just projected: their keys and values are the tail of that projection, kept for the
        next call."""
        pending, self.memory_cache.pending = self.memory_cache.pending, None
        if pending is None or new_mem is None:
            return
        m = new_mem.size(1)
        self.memory_cache.put(new_mem, (pending[0][:, :, -m:], pending[1][:, :, -m:]), self._memory_weights())

    def project_positions(self, pos_emb: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        """W_R R: [K, d] -> [H, K, D]; with `use_cache`, reused while the backbone hands over the same table."""
        r = self.position_cache.get(pos_emb, (self.r_net.weight,)) if use_cache else None
        if r is None:
            r = self.r_net(pos_emb).view(-1, self.n_head, self.d_head).transpose(0, 1)
            if use_cache:
                self.position_cache.put(pos_emb, r, (self.r_net.weight,))
        return r

    def position_scores(self, q: torch.Tensor, pos_emb: torch.Tensor, r_r_bias: torch.Tensor, klen: int,
                        shift: int, use_cache: bool = False) -> torch.Tensor:
        """(q + v) . W_R R for every (query, key) pair: [B, H, T, K], via one matmul over the table then rel_shift."""
        r = self.project_positions(pos_emb, use_cache)  # [H, R, D]
        scores = torch.matmul(q + r_r_bias[:, None], r.transpose(-1, -2))  # [B, H, T, R]
        return rel_shift(scores, klen, shift)

    def merge(self, h: torch.Tensor, attn_vec: torch.Tensor) -> torch.Tensor:
        """Output projection, dropout, residual and (post-)LayerNorm. attn_vec [B, H, T, D] -> [B, T, d]."""
        attn_vec = attn_vec.transpose(1, 2).reshape(h.size(0), h.size(1), -1)  # [B, T, H*D]
        out = h + self.drop(self.o_net(attn_vec))
        return out if self.pre_lnorm else self.layer_norm(out)

    def forward(
        self,
        h: torch.Tensor,
        pos_emb: torch.Tensor,
        attn_mask: torch.Tensor | None,
        mem: torch.Tensor | None = None,
        r_w_bias: torch.Tensor | None = None,
        r_r_bias: torch.Tensor | None = None,
        output_attentions: bool = False,
        use_cache: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """h [B, T, d], pos_emb [K, d] (distances K-1..0), attn_mask bool [T, K] or [B, 1, T, K]. `use_cache`: reuse
        and keep projections (inference_cache); the backbone sets it only where the cache is enabled and then calls
        `keep_memory_projection` after every forward."""
        r_w_bias = self.r_w_bias if r_w_bias is None else r_w_bias
        r_r_bias = self.r_r_bias if r_r_bias is None else r_r_bias
        q, k, v = self.project(h, mem, use_cache)
        klen = k.size(2)
        dropout_p = self.dropatt if self.training else 0.0
        if takes_fused_path(dropout_p, output_attentions) and attn_mask is not None:
            r = self.r_net(pos_emb).view(-1, self.n_head, self.d_head).transpose(0, 1)  # [H, R, D]
            attn_vec = FusedRelativeAttention.apply(q, r_w_bias, r_r_bias, k, v, r,
                                                    attn_mask, h.size(1) - 1, dropout_p)
            return self.merge(h, attn_vec), None
        bd = self.position_scores(q, pos_emb, r_r_bias, klen, shift=h.size(1) - 1, use_cache=use_cache)
        attn_vec, probs = attend(q + r_w_bias[:, None], k, v, bd, attn_mask, dropout_p, self.use_sdpa,
                                 output_attentions)
        return self.merge(h, attn_vec), probs
