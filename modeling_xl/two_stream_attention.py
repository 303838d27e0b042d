"""Two-stream relative attention of XLNet (Yang et al. 2019, Sec. 2.3 and 2.5) on the Transformer-XL attention core.

Notation (batch-first everywhere):
    B batch, H heads, D d_head, d d_model, T segment length, M memory length, K = M + T key length,
    P predictions (query-stream rows), R rows of the position table, S position tables (1, or 2 with bi_data),
    u, v, s the content, position and segment biases (`r_w_bias`, `r_r_bias`, `r_s_bias`), [H, D] each.

Both streams read their keys and values from the content stream `[mem; h]`:
    content stream  h_i <- Attn(query h_i, keys/values [mem; h] that i may see, itself included)
    query stream    g_m <- Attn(query g_m, keys/values [mem; h] that target z_m may see)
`g_m` stands at its target's position z_m: it uses z_m's relative distances, segment and mask row, and starts from a
learned `mask_emb`, not z_m's content. That it never reads z_m's content through the keys is the permutation mask's
doing, not this module's: the query stream's mask is `perm_mask` as given (plus padding and causality), and XLNet's
sampler (`plm_sampling`) sets perm_mask[i, i] = 1 for every target i, as the authors' code and transformers do.
The content stream's mask always shows the diagonal. Score of a query at position i and key j:
    A_ij = (q_i + u) . k_j  +  (q_i + v) . W_R R_{i-j}  +  (q_i + s) . e[seg_i != seg_j]
           content "ac"        position "bd"               segment "ef"
The last term is XLNet's relative segment encoding (Sec. 2.5): only *whether* two tokens share a segment matters, and
memory counts as segment 0. `two_stream_attention` is the reference for one stream, one line per term;
`TwoStreamAttention.attend_stream` runs it or the fast path (`kernel_registry.attention_kernel` decides),
and `forward` calls it for both streams.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .kernel_registry import attention_kernel, kernel
from .relative_attention import RelativeMultiHeadAttention, masked_softmax_attention, project_rows
from .relative_positions import rel_shift


def relative_scores_at(scores: torch.Tensor, query_pos: torch.Tensor, klen: int, shift: int) -> torch.Tensor:
    """`rel_shift` for queries standing at arbitrary positions: `out[b, h, m, j] = scores[b, h, m, j + shift - p_m]`.

    `scores[b, h, m, c]` is query m against position-table row c; `query_pos[b, m] = p_m` is where query m stands in
    the segment. With `query_pos = arange(T)` this equals `rel_shift(scores, klen, shift)`; the query stream passes
    its targets' positions. Indices outside the table (only for masked keys of the causal table) are clamped.

    Worked example (T=2, M=1, K=3, bidirectional table of distances [3, 2, 1, 0, -1], shift = T = 2; one query
    standing at p=1, i.e. at absolute position M + p = 2): key j is at distance 2 - j, table row 3 - (2 - j) = 1 + j:
        scores = [[s3 s2 s1 s0 s-1]]  ->  out = [[s2 s1 s0]]   (distances 2, 1, 0 for keys 0, 1, 2)
    """
    rlen = scores.size(-1)
    index = (shift - query_pos)[:, :, None] + torch.arange(klen, device=scores.device)  # [B, P, K]
    index = index.clamp(0, rlen - 1)[:, None].expand(-1, scores.size(1), -1, -1)  # [B, H, P, K]
    return scores.gather(-1, index)


def segment_mismatch(token_type_ids: torch.Tensor, mlen: int) -> torch.Tensor:
    """Bool [B, T, M + T]: True where query i and key j lie in different segments; memory keys are segment 0.

    Example (M=1, token_type_ids [[0, 1]]): keys [0 (memory), 0, 1] -> [[F, F, T], [T, T, F]].
    """
    keys = F.pad(token_type_ids, (mlen, 0), value=0)  # [B, K]
    return token_type_ids[:, :, None] != keys[:, None, :]


def segment_scores(q: torch.Tensor, r_s_bias: torch.Tensor, seg_embed: torch.Tensor, mismatch: torch.Tensor):
    """(q + s) . e[mismatch] for every pair: q [B, H, T, D], seg_embed [2, H, D] (0: same, 1: different segment),
    mismatch bool [B, T, K] -> [B, H, T, K]. Two dot products per query, then a select: O(T * D + T * K). The select
    is `same * (1 - m) + different * m` with m the mismatch as 0/1 floats, exact like `torch.where` for finite
    values (on CPU, `torch.where` with a bool mask broadcast over the heads is slower, forward and backward)."""
    both = torch.matmul(q + r_s_bias[:, None], seg_embed.permute(1, 2, 0))  # [B, H, T, 2]
    m = mismatch[:, None].to(both.dtype)  # [B, 1, T, K]
    return (both[..., :1] * (1 - m)).addcmul_(both[..., 1:], m)


def table_products(q_v: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """(q + v) (W_R R)^T against every table row: q_v [B, H, T, D], r [S, H, R, D] -> [B, H, T, R]; batch rows
    [i B/S, (i+1) B/S) use table i (bi_data: the forward table, then the backward one)."""
    tables, (batch, heads, qlen, d_head) = r.size(0), q_v.shape
    by_table = q_v.view(tables, batch // tables, heads, qlen, d_head)  # [S, B/S, H, T, D]
    return torch.matmul(by_table, r[:, None].transpose(-1, -2)).flatten(0, 1)  # [B, H, T, R]


def shift_to_keys(scores: torch.Tensor, klen: int, shift: int, positions: torch.Tensor | None) -> torch.Tensor:
    """Scores against table rows [B, H, T, R] -> against keys [B, H, T, K]: `rel_shift` when row i is query i (the
    content stream, `positions` None), `relative_scores_at` for queries standing at `positions` (the query stream)."""
    return rel_shift(scores, klen, shift) if positions is None else relative_scores_at(scores, positions, klen, shift)


def two_stream_attention(q, key, value, r, biases, seg_embed, shift: int, stream: "Stream", dropout_p: float = 0.0):
    """XLNet attention of one stream, the reference: plain ops, one line per term of the score.

    q [B, H, Tq, D] the stream's queries (content: Tq = T; query stream: Tq = P); key, value [B, H, K, D] from
    [mem; h]; r = W_R R [S, H, R, D]; biases (u, v, s) [H, D] each; seg_embed [2, H, D]; shift: T (both XLNet tables
    start at distance K); `stream` its mask, segment mismatch and query positions. Returns (out [B, H, Tq, D], probs
    [B, H, Tq, K]).
    """
    u, v, s = biases
    ac = torch.matmul(q + u[:, None], key.transpose(-1, -2))  # content: (q + u) k^T
    bd = shift_to_keys(table_products(q + v[:, None], r), key.size(2), shift, stream.positions)  # position
    if stream.mismatch is None:  # no token_type_ids: no segment term
        return masked_softmax_attention(ac + bd, value, stream.mask, dropout_p)
    same_and_different = torch.matmul(q + s[:, None], seg_embed.permute(1, 2, 0))  # (q + s) e^T, [B, H, Tq, 2]
    ef = torch.where(stream.mismatch[:, None], same_and_different[..., 1:], same_and_different[..., :1])  # segment
    return masked_softmax_attention(ac + bd + ef, value, stream.mask, dropout_p)


def permutation_masks(perm_mask, attention_mask, mlen: int, causal: bool, batch: int, qlen: int, device):
    """(content mask, query mask), bool [B, T, M + T], True = hidden; (None, None) when nothing is hidden.

    Query i may not see key j when `perm_mask[b, i, j] = 1` (XLNet's convention), when j is padding
    (`attention_mask[b, j] = 0`) or, for `causal` (attn_type "uni"), when j lies after i. Memory is always visible.
    The content stream additionally always sees itself (the diagonal). The query stream's mask is exactly that: it
    hides a query's own content only where perm_mask[b, i, i] = 1, which XLNet's sampler sets for every target (with
    perm_mask None a query-stream row sees every key, its own included, as in transformers' XLNet).
    Example (T=2, M=0, perm_mask [[0, 1], [1, 0]]): query [[F, T], [T, F]]; content [[F, T], [T, F]]
    (perm_mask [[1, 0], [1, 1]]: query [[T, F], [T, T]]; content [[F, F], [T, F]]).
    """
    if perm_mask is None and attention_mask is None and not causal:
        return None, None
    hidden = torch.zeros(batch, qlen, qlen, dtype=torch.bool, device=device)
    if perm_mask is not None:
        hidden = hidden | (perm_mask > 0)
    if attention_mask is not None:
        hidden = hidden | (attention_mask == 0)[:, None, :]
    if causal:
        hidden = hidden | torch.ones(qlen, qlen, dtype=torch.bool, device=device).triu(1)
    query = F.pad(hidden, (mlen, 0), value=False)  # [B, T, K]
    itself = F.pad(torch.eye(qlen, dtype=torch.bool, device=device), (mlen, 0), value=False)
    return query & ~itself, query


@dataclass
class Stream:
    """What distinguishes the two streams inside one attention call (rows = the stream's queries).

    mask: bool [B, 1, Tq, K] or None (True = hidden); mismatch: bool [B, Tq, K] segment mismatch or None (no segment
    term); positions: long [B, Tq] where each query stands (None: row i stands at position i, the content stream);
    present: [B, Tq] 1 for real rows, 0 for padded prediction rows (they get no attention output, as in XLNet);
    distinct: whether the present rows stand at distinct positions, found by the Triton path on first use (None:
    not asked yet; see `two_stream_attention_triton`).
    """

    mask: torch.Tensor | None = None
    mismatch: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    present: torch.Tensor | None = None
    distinct: bool | None = None

    def rows(self, mask: torch.Tensor | None, positions: torch.Tensor, present: torch.Tensor) -> "Stream":
        """The query stream: rows `positions` [B, P] of `mask` [B, T, K] and of this stream's segment mismatch."""

        def take(x):
            return None if x is None else x.gather(1, positions[:, :, None].expand(-1, -1, x.size(-1)))

        return Stream(None if mask is None else take(mask)[:, None], take(self.mismatch), positions, present)


class TwoStreamAttention(RelativeMultiHeadAttention):
    """Relative attention (weights of `RelativeMultiHeadAttention`) plus XLNet's segment bias `r_s_bias` and
    `seg_embed`, shared by both streams."""

    def __init__(self, config):
        super().__init__(config)
        self.seg_embed = nn.Parameter(torch.zeros(2, config.n_head, config.d_head))
        if config.untie_r:
            self.r_s_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))

    def position_keys(self, pos_emb: torch.Tensor) -> torch.Tensor:
        """W_R R for each table: pos_emb [S, R, d] -> [S, H, R, D]."""
        r = self.r_net(pos_emb)  # [S, R, H*D]
        return r.view(r.size(0), r.size(1), self.n_head, self.d_head).transpose(1, 2)

    def attend_stream(self, q, k, v, r, biases, shift: int, stream: Stream, output_attentions: bool = False):
        """One stream's attention vectors: q [B, H, Tq, D] its queries, k/v [B, H, K, D] from [mem; h], r
        [S, H, R, D] (rows [B/2, B) use the second table when S = 2). Returns ([B, H, Tq, D], probs or None)."""
        dropout_p = self.dropatt if self.training else 0.0
        implementation, attention = attention_kernel(self.config._attn_implementation, dropout_p, output_attentions,
                                                     q.device.type, streams=True)
        result = None
        if implementation == "triton" and attention is not None:
            result = attention(q, k, v, r, biases, self.seg_embed, shift, stream, dropout_p)
            if result is None:  # query rows at repeated positions, which the kernel's layout cannot hold
                implementation, attention = attention_kernel("sdpa", dropout_p, output_attentions, q.device.type,
                                                             streams=True)
        if result is not None:
            attn_vec, probs = result
        elif implementation == "eager":
            attn_vec, probs = two_stream_attention(q, k, v, r, biases, self.seg_embed, shift, stream, dropout_p)
        else:
            attn_vec, probs = self.fast_attention(q, k, v, r, biases, shift, stream, dropout_p, attention), None
        if stream.present is not None:
            attn_vec = attn_vec * stream.present[:, None, :, None].to(attn_vec.dtype)
        return attn_vec, (probs if output_attentions else None)

    def fast_attention(self, q, k, v, r, biases, shift: int, stream: Stream, dropout_p: float, attention):
        """`two_stream_attention`'s output (tested against it), the score terms summed into one bias for the
        "biased_attention" kernel `attention` ("fused": one autograd node on the CPU; "sdpa"; None: plain ops). The content
        stream's position term is the "shifted_position_scores" kernel (one node, no padded copy, one gradient
        buffer); with one table, products are taken per head over all batch rows ("position_product")."""
        r_w_bias, r_r_bias, r_s_bias = biases
        klen, device = k.size(2), q.device.type
        shifted = kernel("shifted_position_scores", device) if not torch.compiler.is_compiling() else None
        if stream.positions is None and shifted is not None:
            bd = shifted(q, r_r_bias, r, klen, shift)  # [B, H, Tq, K]
        else:  # the query stream, or plain ops for torch.compile to trace
            q_v = q + r_r_bias[:, None]
            per_head = kernel("position_product", device)
            bd = per_head(q_v, r[0]) if r.size(0) == 1 and per_head is not None else table_products(q_v, r)
            bd = shift_to_keys(bd, klen, shift, stream.positions)  # [B, H, Tq, R] -> [B, H, Tq, K]
        if stream.mismatch is not None:
            bd = segment_scores(q, r_s_bias, self.seg_embed, stream.mismatch).add_(bd)  # a new tensor: add in place
        if attention is None:  # no kernel (reference_only): the plain softmax of the same score sum
            return masked_softmax_attention(torch.matmul(q + r_w_bias[:, None], k.transpose(-1, -2)) + bd, v,
                                            stream.mask, dropout_p)[0]
        return attention(q + r_w_bias[:, None], k, v, bd, stream.mask, dropout_p)

    def forward(self, h, g, pos_emb, content: Stream, query: Stream | None, mem=None, shared_biases=None,
                output_attentions: bool = False, content_output: bool = True):
        """h [B, T, d] content stream, g [B, P, d] query stream or None, pos_emb [S, R, d].
        Returns ([h'; g'] [B, T + P, d] (both streams' rows, merged by one output projection, residual and LayerNorm:
        one weight gradient instead of two summed), (content probs, query probs or None)). With a query stream and
        `content_output=False` (the last layer, whose content output nothing reads) only g' [B, P, d]: the content
        stream's own queries and attention are not computed, only the keys and values the query stream reads from it."""
        biases = shared_biases if shared_biases is not None else (self.r_w_bias, self.r_r_bias, self.r_s_bias)
        q_h, k, v = self.project(h, mem, queries=g is None or content_output)
        r = self.position_keys(pos_emb)
        # Both XLNet tables start at distance K, so query i (absolute M + i) meets key j on row T - i + j: shift T.
        shift = h.size(1)
        h_vec = h_probs = None
        if g is None or content_output:
            h_vec, h_probs = self.attend_stream(q_h, k, v, r, biases, shift, content, output_attentions)
        if g is None:
            return self.merge(h, h_vec), (h_probs, None)
        g_in = self.layer_norm(g) if self.pre_lnorm else g
        q_g = self.split_heads(project_rows(self.qkv_net, g_in, slice(self.n_head * self.d_head)))  # [B, H, P, D]
        g_vec, g_probs = self.attend_stream(q_g, k, v, r, biases, shift, query, output_attentions)
        if not content_output:
            return self.merge(g, g_vec), (None, g_probs)
        return self.merge(torch.cat([h, g], dim=1), torch.cat([h_vec, g_vec], dim=2)), (h_probs, g_probs)
