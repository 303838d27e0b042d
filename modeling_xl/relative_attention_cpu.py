"""The CPU kernels of the relative attention: fused autograd nodes for training, checked against the reference.

`relative_attention.relative_attention` is the plain maths; this file computes the same thing with less memory and
fewer copies. Notation as there (batch-first): B batch, H heads, D d_head, T queries, M memory, K = M + T keys,
R rows of the position table, S position tables (1, or 2 with bi_data); u, v the content and position biases.

- `FusedRelativeAttention` (Transformer-XL in training): softmax(((q + u) k^T + rel_shift((q + v) (W_R R)^T))
  / sqrt(D), masked) @ value as one node that saves no float [B, H, T, K] tensor (with attention dropout, the boolean
  keep-mask): backward recomputes the probabilities, block by block (`score_blocks`).
- `FusedBiasedAttention` (XLNet's two streams in training, and an unmasked call): softmax((q k^T + bias) / sqrt(D),
  masked) @ value as one node, the score terms built outside; it saves the probabilities.
The position term's own nodes (every device) are `position_scores_fused`.
Why: autograd through the separate ops keeps several [B, H, T, K] tensors alive per layer, and on CPU SDPA falls back
to its unfused math path in training. Registered for the CPU only (`kernel_registry`): they loop over score blocks in
Python, written for the CPU's memory. Measurements: benchmarks/README.md, "Attention implementation notes".
"""

from __future__ import annotations

import math

import torch

from .dropout_cpu import apply_keep, keep_mask
from .position_scores_fused import ShiftedPositionScores, head_major, shifted_scores, unshift_buffer


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
    shaped like the mask, `x * visible + fill` and `x * visible`, because on CPU `masked_fill_` with a bool mask
    broadcast over the heads is much slower. The factors equal masked_fill for finite x; float16 scores can overflow
    to inf at a hidden key (inf * 0 is NaN), so float16 keeps masked_fill. The factors are built inside each call and
    freed at its end, so none stays alive between the two calls of a recomputing backward."""

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


def _relative_probs(q_u, q_v, key, r, hidden: Hidden | None, shift: int, scale: float) -> torch.Tensor:
    """softmax(((q + u) . k + rel_shift((q + v) . r)) * scale, masked), [B, H, T, K] in the keys' dtype. Deterministic
    in its inputs: the backward of `FusedRelativeAttention` recomputes the very same probabilities."""
    scores = torch.matmul(q_u, key.transpose(-1, -2))  # [B, H, T, K]
    scores += shifted_scores(q_v, r, key.size(2), shift, hidden_ok=hidden is not None)
    return _masked_softmax(scores, hidden, scale, key.dtype)


# The fused relative attention builds its [B, H, T, K]-sized tensors (scores, probabilities, their gradient) for blocks
# of (batch row, head) pairs of at most this many bytes at a time: long segments need a few blocks of scratch space
# instead of several whole-layer tensors, which bounds training memory under activation checkpointing. 4 MiB was the
# fastest block size measured (benchmarks/README.md, "Attention implementation notes").
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

    Same result as `relative_attention.relative_attention` (tested against it). Saved for backward: q + u, the keys,
    values, position vectors, the dropout keep-mask and the output, not the probabilities [B, H, T, K], the largest
    activation of a layer: backward recomputes them (two of the eleven attention products of a training step, and a
    softmax). Forward and backward work on blocks of (batch row, head) pairs (`score_blocks`), so the score-sized
    scratch space is bounded by `SCORE_BLOCK_BYTES` per tensor.
    Backward (the standard softmax-attention gradient) gives dS; the content part gives d(q + u) = dS k,
    dk = dS^T (q + u); the position part is dS shifted back into the table (the inverse of `rel_shift`: every visible
    entry has one source) giving d(q + v) and dr; dq is their sum, du and dv their sums over batch and positions.
    dS is built per block in dP's buffer: dP = dO V^T, minus rowsum(dP * P) (= rowsum(dO * O), from the output),
    times P; the probabilities are then freed, and dS, scaled, is written into the window of the inverse shift's
    [b, h, T, R + 1] buffer and read back unshifted. A block holds two score-sized tensors at a time.
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
                # dP, contiguous (a batched product written straight into the strided window is slower),
                # turned into dS / scale in place; the probabilities are freed before the shift buffer exists, so
                # a block holds two score-sized tensors at a time, not three
                grad_scores = torch.matmul(block_grad_out, value[rows, hs].transpose(-1, -2))
                if block_keep is not None:
                    apply_keep(grad_scores, block_keep, ctx.keep_scale, inplace=True)
                grad_scores.sub_(rowsum[rows, hs]).mul_(probs)
                del probs
                if block_hidden is not None:
                    block_hidden.zero_(grad_scores)
                padded, window = unshift_buffer(block_q_u.shape[:2], qlen, rlen, klen, ctx.shift, block_q_u)
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
    """softmax((query . key + score_bias) / sqrt(D), masked) @ value as one autograd node, for training.

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


def fused_relative_attention(q, key, value, r, u, v, mask, shift: int, dropout_p: float = 0.0):
    """`relative_attention.relative_attention` through the fused nodes (same arguments; returns (out, None): the
    probabilities are never kept). Without a mask, the position term's keys that no table row describes need
    rel_shift's zeros, which `ShiftedPositionScores` writes and `FusedRelativeAttention` does not."""
    if mask is None:
        bd = ShiftedPositionScores.apply(q, v, r, key.size(2), shift)
        return FusedBiasedAttention.apply(q + u[:, None], key, value, bd, None, dropout_p), None
    return FusedRelativeAttention.apply(q, u, v, key, value, r, mask, shift, dropout_p), None


def fused_biased_attention(query, key, value, score_bias, mask, dropout_p: float = 0.0) -> torch.Tensor:
    """`FusedBiasedAttention` as a function (arguments as `relative_attention_sdpa.sdpa_attention`; returns out)."""
    return FusedBiasedAttention.apply(query, key, value, score_bias, mask, dropout_p)


