"""Relative multi-head attention of Transformer-XL (Dai et al. 2019, Sec. 3.3): the maths, and the module.

Notation (one layout, batch-first: [B, H, T, D] for queries, [B, H, K, D] for keys and values):
    B batch, H heads (n_head), D d_head, d d_model
    T query length (the current segment), M memory length, K = M + T key length ([memory; segment])
    R rows of the position table (distances K-1 ... 0, largest first)
    u, v   content and position biases (`r_w_bias`, `r_r_bias`), [H, D]
    W_R R  the sinusoid table projected by `r_net`, [H, R, D]

Score of query i and key j (Sec. 3.3, the four terms (a) + (c) and (b) + (d) regrouped):
    A_ij = (q_i + u) . k_j  +  (q_i + v) . W_R R_{i-j}
           content "ac"        position "bd"
Why `rel_shift`: the position term is computed against all R distances at once, (q + v) (W_R R)^T [T, R], and each
row is then moved to its own distances: O(T R D) work instead of gathering a [T, K, D] tensor of position vectors.

`relative_attention` below is the reference, one line per term; the pure functions it uses (`rel_shift`, the
sinusoid table, the causal mask) are in `relative_positions`. Which implementation runs, the reference ("eager") or
one of its kernels (`relative_attention_cpu`, `_sdpa`, `_triton`), is `kernel_registry.attention_kernel`'s one
lookup; tests check every kernel against the reference.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .dropout import Dropout, dropout
from .inference_cache import AppendRoom, ProjectionCache
from .kernel_registry import attention_kernel
from .layer_norm import LayerNorm
from .precision import at_least_float32
from .relative_positions import causal_mask, rel_shift, relative_positions, sinusoid_table  # noqa: F401 (re-exported)


def masked_softmax_attention(scores: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                             dropout_p: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scores / sqrt(D), masked) with dropout, @ value: the part every attention here shares.

    scores [B, H, T, K] (the sum of the score terms, unscaled), value [B, H, K, D], mask bool broadcastable to the
    scores (True = hidden) or None. Returns (out [B, H, T, D], probs [B, H, T, K] before dropout). A fully hidden row
    gets uniform weights instead of NaN (every score finfo.min), as XLNet's `-1e30` does.
    """
    scores = scores * (1.0 / math.sqrt(value.size(-1)))
    if mask is not None:
        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(at_least_float32(scores), dim=-1).to(value.dtype)  # softmax never in 16 bits
    return torch.matmul(dropout(probs, dropout_p), value), probs


def relative_attention(q, key, value, r, u, v, mask, shift: int, dropout_p: float = 0.0):
    """Transformer-XL attention, the reference: plain ops, one line per term of the score.

    q [B, H, T, D]; key, value [B, H, K, D] from [memory; segment]; r = W_R R [H, R, D]; u, v [H, D]; mask bool
    [T, K] or [B, 1, T, K] (True = hidden); shift: where row i of the position table starts (see `rel_shift`, T - 1
    here). Returns (out [B, H, T, D], probs [B, H, T, K]).
    """
    ac = torch.matmul(q + u[:, None], key.transpose(-1, -2))  # content: (q + u) k^T, [B, H, T, K]
    bd = rel_shift(torch.matmul(q + v[:, None], r.transpose(-1, -2)), key.size(2), shift)  # position, [B, H, T, K]
    return masked_softmax_attention(ac + bd, value, mask, dropout_p)


def is_plain_linear(layer: nn.Module) -> bool:
    """`layer` is a bare `nn.Linear`: its output is the product with its `weight` alone, so rows of the weight give
    those columns of the output, and what the inference caches derive from it is keyed by that weight. An adapter
    wrapping the layer (peft's LoRA adds `B A x` to `W x`) leaves `weight` as it was: such a layer runs as a module,
    whole, and nothing computed from it is cached (turning the adapter off changes no tensor a cache could see)."""
    return type(layer) is nn.Linear


def project_rows(layer: nn.Module, x: torch.Tensor, rows: slice) -> torch.Tensor:
    """`layer(x)[..., rows]` of a bias-free linear layer: only those rows of a plain layer's weight are multiplied
    (the memory's keys and values need no queries); an adapted layer's whole output is sliced."""
    if is_plain_linear(layer):
        return F.linear(x, layer.weight[rows])
    return layer(x)[..., rows]


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
        self.config = config  # its `_attn_implementation` is read at every call (`kernel_registry.attention_kernel`)
        # without gradients: keys/values of the memory and the projected position table, reused (inference_cache)
        self.memory_cache = ProjectionCache()
        self.position_cache = ProjectionCache()

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, L, H*D] -> [B, H, L, D]."""
        return x.view(x.size(0), x.size(1), self.n_head, self.d_head).transpose(1, 2)

    def project(self, h: torch.Tensor, mem: torch.Tensor | None, use_cache: bool = False,
                queries: bool = True) -> tuple[torch.Tensor | None, ...]:
        """Queries from `h` [B, T, d]; keys and values from `[mem; h]` [B, M+T, d]. Each [B, H, *, D]; for keys and
        values the (B, H) dimensions merge into one (contiguous, or views of an `AppendRoom`'s buffers), so that the
        attention products read them without copying. With `use_cache` (set by the backbone only where
        `inference_cache.enabled()`) the memory's keys and values may come from the cache, the new ones are appended
        to them in place where possible, and the whole stays pending until `keep_memory_projection`.
        `queries=False`: keys and values only (the queries come back as None and are not computed)."""
        inner = self.n_head * self.d_head
        x = self.layer_norm(h) if self.pre_lnorm else h
        if queries:
            q, k, v = project_rows(self.qkv_net, x, slice(None)).split(inner, dim=-1)
        else:
            q, (k, v) = None, project_rows(self.qkv_net, x, slice(inner, None)).split(inner, dim=-1)
        use_cache = use_cache and is_plain_linear(self.qkv_net)
        k, v = self.split_heads(k), self.split_heads(v)
        has_mem = mem is not None and mem.size(1) > 0
        if use_cache:
            room = self.memory_cache.get(mem, self._memory_weights()) if has_mem else None
            if room is not None:
                room = room.append((k, v))
            else:
                pieces = zip(self.memory_keys_values(mem), (k, v)) if has_mem else ([k], [v])
                room = AppendRoom.joined([list(p) for p in pieces], dim=2)
            self.memory_cache.pending = room
            k, v = room.views()
        elif has_mem:
            mem_k, mem_v = self.memory_keys_values(mem)
            k, v = torch.cat([mem_k, k], dim=2), torch.cat([mem_v, v], dim=2)
        else:
            k, v = k.contiguous(), v.contiguous()
        return (None if q is None else self.split_heads(q)), k, v

    def memory_keys_values(self, mem: torch.Tensor) -> list[torch.Tensor]:
        """Keys and values [B, H, M, D] of the memory [B, M, d] (views of one product)."""
        inner = self.n_head * self.d_head
        mem = self.layer_norm(mem) if self.pre_lnorm else mem
        return [self.split_heads(x) for x in project_rows(self.qkv_net, mem, slice(inner, None)).split(inner, -1)]

    def _memory_weights(self) -> tuple[torch.Tensor, ...]:
        return (self.qkv_net.weight, self.layer_norm.weight, self.layer_norm.bias) if self.pre_lnorm else (
            self.qkv_net.weight,)

    def clear_cache(self) -> None:
        """Drop the keys, values and position projections kept for evaluation without gradients."""
        self.memory_cache.clear()
        self.position_cache.clear()

    def position_weights(self) -> tuple[torch.Tensor, ...]:
        """The weights the projection of the position table depends on (`inference_cache` keys)."""
        return (self.r_net.weight,)

    def positions_cacheable(self) -> bool:
        """Whether W_R R may be kept: not while an adapter wraps `r_net` (`is_plain_linear`)."""
        return is_plain_linear(self.r_net)

    def offer_position_projection(self, pos_emb: torch.Tensor, projected: torch.Tensor) -> None:
        """Keep `projected` [H, K, D] as W_R `pos_emb`, computed elsewhere (`inference_cache.PositionTable`)."""
        self.position_cache.put(pos_emb, projected, self.position_weights())

    def keep_memory_projection(self, new_mem: torch.Tensor | None) -> None:
        """Called by the backbone with this layer's next memory (None without memory), the last `new_mem.size(1)`
        states of the `[mem; h]` just projected: their keys and values are the tail of that projection, kept for the
        next call."""
        pending, self.memory_cache.pending = self.memory_cache.pending, None
        if pending is None or new_mem is None:
            return
        self.memory_cache.put(new_mem, pending.tail(new_mem.size(1)), self._memory_weights())

    def reorder_memory_projection(self, old_mem: torch.Tensor, new_mem: torch.Tensor, index: torch.Tensor) -> None:
        """Beam search reordered the memory's rows (`new_mem = old_mem.index_select(0, index)`): the keys and values
        kept for `old_mem` follow them, so that the next step reuses them instead of projecting the whole memory
        again (transformers reorders a key/value cache the same way)."""
        weights = self._memory_weights()
        room = self.memory_cache.get(old_mem, weights)
        if room is not None:
            k, v = room.views()
            self.memory_cache.put(new_mem, AppendRoom.of((k.index_select(0, index), v.index_select(0, index)), dim=2),
                                  weights)

    def project_positions(self, pos_emb: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        """W_R R: [K, d] -> [H, K, D]; with `use_cache`, reused while the backbone hands over the same table."""
        use_cache = use_cache and self.positions_cacheable()
        r = self.position_cache.get(pos_emb, self.position_weights()) if use_cache else None
        if r is None:
            r = self.r_net(pos_emb).view(-1, self.n_head, self.d_head).transpose(0, 1)
            if use_cache:
                self.position_cache.put(pos_emb, r, self.position_weights())
        return r

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
        u = self.r_w_bias if r_w_bias is None else r_w_bias
        v = self.r_r_bias if r_r_bias is None else r_r_bias
        q, key, value = self.project(h, mem, use_cache)  # [B, H, T, D], [B, H, K, D], [B, H, K, D]
        r = self.project_positions(pos_emb, use_cache)  # W_R R, [H, R, D]
        dropout_p = self.dropatt if self.training else 0.0
        _, attention = attention_kernel(self.config._attn_implementation, dropout_p, output_attentions, h.device.type)
        attention = attention or relative_attention  # no kernel: the reference
        attn_vec, probs = attention(q, key, value, r, u, v, attn_mask, h.size(1) - 1, dropout_p)  # shift T - 1
        return self.merge(h, attn_vec), (probs if output_attentions else None)
