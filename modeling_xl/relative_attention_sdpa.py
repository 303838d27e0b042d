"""The relative attention through torch's `scaled_dot_product_attention`: the content term is SDPA's own product,
the position (and XLNet's segment) terms enter as its additive float bias. A kernel of `kernel_registry` (the default on
every device without gradients, and with gradients on GPUs, whose fused SDPA kernels take a bias with a gradient).
Notation as in `relative_attention`; tested against its reference in tests/test_relative_attention.py and, on CUDA,
by benchmarks/gpu_check.py.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .position_scores_fused import position_product
from .relative_positions import rel_shift


def sdpa_attention(query, key, value, score_bias, mask, dropout_p: float = 0.0) -> torch.Tensor:
    """softmax((query . key + score_bias) / sqrt(D), masked) @ value by torch's `scaled_dot_product_attention`.

    query [B, H, T, D] (content bias included), key/value [B, H, K, D], score_bias broadcastable to [B, H, T, K]
    (position and segment terms, unscaled), mask bool or None. The mask is folded into the float bias: SDPA's own
    causal flag aligns top-left, which is wrong when the keys (memory included) outnumber the queries. Everything runs
    in the keys' dtype (under autocast the biases added to the queries are float32 parameters). On CUDA a head width
    that is not a multiple of 8 (wt103-base's 41) is zero-padded to one, so that the fused (memory-efficient) kernel
    takes it instead of the unfused math fallback: zero columns add nothing to query . key, and the output's padded
    columns are cut off.
    """
    d_head = query.size(-1)
    scale = 1.0 / math.sqrt(d_head)
    query = query.to(key.dtype)
    bias = (score_bias * scale).to(key.dtype)
    if mask is not None:
        bias = bias.masked_fill(mask, torch.finfo(bias.dtype).min)
    pad = -d_head % 8 if query.is_cuda else 0
    if pad:
        query, key, value = (F.pad(x, (0, pad)) for x in (query, key, value))
    out = F.scaled_dot_product_attention(query, key, value.to(key.dtype), attn_mask=bias, dropout_p=dropout_p,
                                         scale=scale)
    return out[..., :d_head] if pad else out


def sdpa_relative_attention(q, key, value, r, u, v, mask, shift: int, dropout_p: float = 0.0):
    """`relative_attention` with the softmax and value product by SDPA (arguments as there; returns (out, None)).
    The position product is `position_product`'s, one product per head: the reference's broadcast `matmul` copies
    r once per batch row ([B, H, D, R], the largest copy of a generation step)."""
    bd = rel_shift(position_product(q + v[:, None], r), key.size(2), shift)
    return sdpa_attention(q + u[:, None], key, value, bd, mask, dropout_p), None
