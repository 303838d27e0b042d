"""The Triton kernels of the flash-style relative attention (see `relative_attention_triton`, which launches them
and holds the maths they implement). Imported only when the kernel is first used, so that TRITON_INTERPRET=1 set by a
test before that point takes effect, and `import modeling_xl` never pays for importing triton.

Tile of BLOCK_M queries (from i0) and BLOCK_N keys (from j0): query a meets key b on table row
band0 + (b - a + BLOCK_M - 1), band0 = j0 - i0 - (BLOCK_M - 1) + shift; the tile reads the band of rows
band0 .. band0 + BLOCK_M + BLOCK_N - 1. Scores are kept in the log2 domain (scale_log2 = log2(e) / sqrt(D)).
A hidden key scores HIDDEN (finite, as the reference's finfo.min): a query that sees no key at all then weighs every
key alike, as the reference does; keys past the end score -inf. With HAS_SEG, XLNet's segment term is added: SEG
holds (q + s) . e_same and (q + s) . e_different per query (fp32 [B * H, T, 2]), MIS whether query i and key j lie in
different segments (bytes [B, T, K]).
"""

from __future__ import annotations

try:  # optional dependency: a module that cannot import it never reaches this file (`relative_attention_triton`)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the caller checks `available()` first
    triton = None
    tl = None

HIDDEN = tl.constexpr(-1e30)  # the score of a hidden key, log2 domain (jit code reads only constexpr globals)


@triton.jit
def tile_mismatch(mis_base, offs_m, offs_n, qlen, klen):
    """Whether query i and key j of the tile lie in different segments (bool [BLOCK_M, BLOCK_N])."""
    inside = (offs_m < qlen)[:, None] & (offs_n < klen)[None, :]
    return tl.load(mis_base + offs_m[:, None] * klen + offs_n[None, :], mask=inside, other=0) != 0


@triton.jit
def tile_scores(q_u, q_v, k_ptrs, r_base, offs_m, offs_n, offs_d, band0, mask_base, stride_mq, stride_mk,
                stride_rr, stride_rd, qlen, klen, rlen, d_head, seg_base, mis_base, scale_log2,
                HAS_MASK: tl.constexpr, HAS_SEG: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    """Scores of one tile in the log2 domain: ((q + u) . k + band diagonals of (q + v) . r [+ the segment term])
    x scale_log2, HIDDEN where the key is hidden, -inf outside the tensors. Returns (scores [BLOCK_M, BLOCK_N] fp32,
    visible bool, the key tile [BLOCK_N, BLOCK_D], the band [BLOCK_M + BLOCK_N, BLOCK_D])."""
    d_ok = offs_d < d_head
    key = tl.load(k_ptrs, mask=(offs_n < klen)[:, None] & d_ok[None, :], other=0.0)
    scores = tl.dot(q_u, tl.trans(key), input_precision=PRECISION)
    offs_w = band0 + tl.arange(0, BLOCK_M + BLOCK_N)
    band = tl.load(r_base + offs_w[:, None] * stride_rr + offs_d[None, :] * stride_rd,
                   mask=((offs_w >= 0) & (offs_w < rlen))[:, None] & d_ok[None, :], other=0.0)
    band_scores = tl.dot(q_v, tl.trans(band), input_precision=PRECISION)  # [BLOCK_M, BLOCK_M + BLOCK_N]
    diagonal = tl.arange(0, BLOCK_N)[None, :] - tl.arange(0, BLOCK_M)[:, None] + (BLOCK_M - 1)
    scores += tl.gather(band_scores, diagonal, 1)
    inside = (offs_m < qlen)[:, None] & (offs_n < klen)[None, :]
    if HAS_SEG:
        same = tl.load(seg_base + offs_m * 2, mask=offs_m < qlen, other=0.0)
        different = tl.load(seg_base + offs_m * 2 + 1, mask=offs_m < qlen, other=0.0)
        scores += tl.where(tile_mismatch(mis_base, offs_m, offs_n, qlen, klen), different[:, None], same[:, None])
    visible = inside
    if HAS_MASK:
        hidden = tl.load(mask_base + offs_m[:, None] * stride_mq + offs_n[None, :] * stride_mk, mask=inside,
                         other=1)
        visible = inside & (hidden == 0)
    scores = tl.where(visible, scores * scale_log2, HIDDEN)
    return tl.where(inside, scores, float("-inf")), visible, key, band


@triton.jit
def probabilities(scores, lse, klen):
    """A tile's softmax weights from the scores (`tile_scores`) and each query's log-sum-exp: 0 outside the tensors,
    and 1 / K for every key of a query that sees none (its log-sum-exp, HIDDEN + log2 K, rounds to HIDDEN)."""
    p = tl.exp2(scores - lse[:, None])
    return tl.where((lse < HIDDEN / 2)[:, None], p / klen, p)


@triton.jit
def biased_queries(Q, U, VB, b, h, offs_m, offs_d, stride_qb, stride_qh, stride_qt, stride_qd, stride_uh, stride_ud,
                   qlen, d_head):
    """(q + u, q + v) of one block of queries, [BLOCK_M, BLOCK_D] each in q's dtype (the sum taken in fp32; zeros
    outside the tensors)."""
    d_ok = offs_d < d_head
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd,
                mask=(offs_m < qlen)[:, None] & d_ok[None, :], other=0.0)
    u = tl.load(U + h * stride_uh + offs_d * stride_ud, mask=d_ok, other=0.0).to(tl.float32)
    v = tl.load(VB + h * stride_uh + offs_d * stride_ud, mask=d_ok, other=0.0).to(tl.float32)
    return (q.to(tl.float32) + u[None, :]).to(q.dtype), (q.to(tl.float32) + v[None, :]).to(q.dtype)


@triton.jit
def forward_kernel(Q, K, V, R, U, VB, MASK, RANGES, OUT, LSE, SEG, MIS,
                   stride_qb, stride_qh, stride_qt, stride_qd,
                   stride_kb, stride_kh, stride_kt, stride_kd,
                   stride_vb, stride_vh, stride_vt, stride_vd,
                   stride_rh, stride_rr, stride_rd, stride_uh, stride_ud,
                   stride_mb, stride_mq, stride_mk, stride_gb, stride_gm,
                   stride_ob, stride_oh, stride_ot, stride_od,
                   heads, qlen, klen, rlen, d_head, shift, scale_log2,
                   HAS_MASK: tl.constexpr, HAS_SEG: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    block, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // heads, bh % heads
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < d_head
    q_u, q_v = biased_queries(Q, U, VB, b, h, offs_m, offs_d, stride_qb, stride_qh, stride_qt, stride_qd, stride_uh,
                              stride_ud, qlen, d_head)
    ranges = RANGES + b * stride_gb + block * stride_gm
    lo = (tl.load(ranges) // BLOCK_N) * BLOCK_N
    hi = tl.load(ranges + 1)
    mask_base = MASK + b * stride_mb
    r_base = R + h * stride_rh
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        band0 = start - block * BLOCK_M - (BLOCK_M - 1) + shift
        scores, _, _, _ = tile_scores(
            q_u, q_v, k_base + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd, r_base, offs_m,
            offs_n, offs_d, band0, mask_base, stride_mq, stride_mk, stride_rr, stride_rd, qlen, klen, rlen,
            d_head, SEG + bh * qlen * 2, MIS + b * qlen * klen, scale_log2, HAS_MASK, HAS_SEG, BLOCK_M, BLOCK_N,
            BLOCK_D, PRECISION)
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(scores - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        value = tl.load(v_base + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd,
                        mask=(offs_n < klen)[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(value.dtype), value, input_precision=PRECISION)
        m_i = m_new
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    tl.store(OUT + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :] * stride_od,
             out.to(OUT.dtype.element_ty), mask=(offs_m < qlen)[:, None] & d_ok[None, :])
    lse = tl.where(l_i == 0.0, float("inf"), m_i + tl.log2(l_safe))  # log2 domain; inf: no visible key
    tl.store(LSE + bh * qlen + offs_m, lse, mask=offs_m < qlen)


@triton.jit
def backward_keys_kernel(Q, K, V, R, U, VB, MASK, RANGES, DO, LSE, DELTA, DK, DV, SEG, MIS,
                         stride_qb, stride_qh, stride_qt, stride_qd,
                         stride_kb, stride_kh, stride_kt, stride_kd,
                         stride_vb, stride_vh, stride_vt, stride_vd,
                         stride_rh, stride_rr, stride_rd, stride_uh, stride_ud,
                         stride_mb, stride_mq, stride_mk, stride_gb, stride_gm,
                         stride_ob, stride_oh, stride_ot, stride_od,
                         heads, qlen, klen, rlen, d_head, shift, scale_log2, n_query_blocks,
                         HAS_MASK: tl.constexpr, HAS_SEG: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    """dv = P^T dO and dk = dS^T (q + u) for one key block, over the query blocks that see it. DK and DV are
    fp32 [B, H, K, D] (contiguous); dS here is P * (dP - delta), unscaled."""
    kblock, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // heads, bh % heads
    offs_n = kblock * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < d_head
    k_ptrs = K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd
    value = tl.load(V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd,
                    mask=(offs_n < klen)[:, None] & d_ok[None, :], other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for block in range(0, n_query_blocks):
        ranges = RANGES + b * stride_gb + block * stride_gm
        if (tl.load(ranges) < kblock * BLOCK_N + BLOCK_N) & (tl.load(ranges + 1) > kblock * BLOCK_N):
            offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
            m_ok = offs_m < qlen
            q_u, q_v = biased_queries(Q, U, VB, b, h, offs_m, offs_d, stride_qb, stride_qh, stride_qt, stride_qd,
                                      stride_uh, stride_ud, qlen, d_head)
            band0 = kblock * BLOCK_N - block * BLOCK_M - (BLOCK_M - 1) + shift
            scores, visible, _, _ = tile_scores(
                q_u, q_v, k_ptrs, R + h * stride_rh, offs_m, offs_n, offs_d, band0, MASK + b * stride_mb,
                stride_mq, stride_mk, stride_rr, stride_rd, qlen, klen, rlen, d_head, SEG + bh * qlen * 2,
                MIS + b * qlen * klen, scale_log2, HAS_MASK, HAS_SEG, BLOCK_M, BLOCK_N, BLOCK_D, PRECISION)
            lse = tl.load(LSE + bh * qlen + offs_m, mask=m_ok, other=float("inf"))
            p = probabilities(scores, lse, klen)
            grad_out = tl.load(DO + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot
                               + offs_d[None, :] * stride_od, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
            dv += tl.dot(tl.trans(p.to(grad_out.dtype)), grad_out, input_precision=PRECISION)
            delta = tl.load(DELTA + bh * qlen + offs_m, mask=m_ok, other=0.0)
            dp = tl.dot(grad_out, tl.trans(value), input_precision=PRECISION)
            ds = tl.where(visible, p * (dp - delta[:, None]), 0.0)  # a hidden key's score has no gradient
            dk += tl.dot(tl.trans(ds.to(q_u.dtype)), q_u, input_precision=PRECISION)
    offs = (bh * klen + offs_n[:, None]) * d_head + offs_d[None, :]
    ok = (offs_n < klen)[:, None] & d_ok[None, :]
    tl.store(DK + offs, dk, mask=ok)
    tl.store(DV + offs, dv, mask=ok)


@triton.jit
def band_keys(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Where each entry (a, c) of a tile's band comes from: key c - (BLOCK_M - 1) + a of the tile, and whether that
    key lies on the tile ([BLOCK_M, BLOCK_M + BLOCK_N] each; keys off the tile read as key 0)."""
    band_key = tl.arange(0, BLOCK_M + BLOCK_N)[None, :] - (BLOCK_M - 1) + tl.arange(0, BLOCK_M)[:, None]
    on_tile = (band_key >= 0) & (band_key < BLOCK_N)
    return tl.where(on_tile, band_key, 0), on_tile


@triton.jit
def store_table_gradient(DR, dr, tile, band0, h, rlen, d_head, offs_d, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BANDS: tl.constexpr):
    """One tile's gradient of its band of table rows, dr [BLOCK_M + BLOCK_N, BLOCK_D]. BANDS: stored whole, with
    plain stores, as tile `tile` of DR = fp32 [B * H, query blocks, key blocks, BLOCK_M + BLOCK_N, D] (the caller
    sums the bands: `relative_attention_triton.sum_bands`); otherwise its rows inside the table are added
    atomically into DR = fp32 [H, R, D]."""
    offs_c = tl.arange(0, BLOCK_M + BLOCK_N)
    d_ok = offs_d < d_head
    if BANDS:
        tl.store(DR + (tile * (BLOCK_M + BLOCK_N) + offs_c[:, None]) * d_head + offs_d[None, :], dr,
                 mask=d_ok[None, :])
    else:
        offs_w = band0 + offs_c
        tl.atomic_add(DR + (h * rlen + offs_w[:, None]) * d_head + offs_d[None, :], dr,
                      mask=((offs_w >= 0) & (offs_w < rlen))[:, None] & d_ok[None, :])


@triton.jit
def segment_gradient(ds, mis_base, offs_m, offs_n, qlen, klen):
    """dS summed over the tile's keys in the query's own segment, and in another: ([BLOCK_M], [BLOCK_M])."""
    different = tile_mismatch(mis_base, offs_m, offs_n, qlen, klen)
    return tl.sum(tl.where(different, 0.0, ds), 1), tl.sum(tl.where(different, ds, 0.0), 1)


@triton.jit
def backward_queries_kernel(Q, K, V, R, U, VB, MASK, RANGES, DO, LSE, DELTA, DQU, DQV, DR, SEG, MIS, DSEG,
                            stride_qb, stride_qh, stride_qt, stride_qd,
                            stride_kb, stride_kh, stride_kt, stride_kd,
                            stride_vb, stride_vh, stride_vt, stride_vd,
                            stride_rh, stride_rr, stride_rd, stride_uh, stride_ud,
                            stride_mb, stride_mq, stride_mk, stride_gb, stride_gm,
                            stride_ob, stride_oh, stride_ot, stride_od,
                            heads, qlen, klen, rlen, d_head, shift, scale_log2, n_query_blocks, n_key_blocks,
                            HAS_MASK: tl.constexpr, HAS_SEG: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                            BANDS: tl.constexpr):
    """For one query block: d(q + u) = dS k and d(q + v) = dS_band r_band (fp32 [B, H, T, D] each), each tile's
    gradient of its band of table rows, dS_band^T (q + v) (`store_table_gradient`), and with HAS_SEG the segment
    term's gradient DSEG = fp32 [B * H, T, 2]. dS_band is the tile's dS moved back onto the band (the inverse of the
    diagonal read: entry (a, c) is dS[a, c - (BLOCK_M - 1) + a] where that key exists, else 0)."""
    block, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // heads, bh % heads
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < d_head
    m_ok = offs_m < qlen
    q_u, q_v = biased_queries(Q, U, VB, b, h, offs_m, offs_d, stride_qb, stride_qh, stride_qt, stride_qd, stride_uh,
                              stride_ud, qlen, d_head)
    grad_out = tl.load(DO + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot
                       + offs_d[None, :] * stride_od, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    lse = tl.load(LSE + bh * qlen + offs_m, mask=m_ok, other=float("inf"))
    delta = tl.load(DELTA + bh * qlen + offs_m, mask=m_ok, other=0.0)
    ranges = RANGES + b * stride_gb + block * stride_gm
    k_base, v_base = K + b * stride_kb + h * stride_kh, V + b * stride_vb + h * stride_vh
    dq_u, dq_v = tl.zeros([BLOCK_M, BLOCK_D], tl.float32), tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    dseg_same, dseg_different = tl.zeros([BLOCK_M], tl.float32), tl.zeros([BLOCK_M], tl.float32)
    band_key, on_tile = band_keys(BLOCK_M, BLOCK_N)
    for start in range((tl.load(ranges) // BLOCK_N) * BLOCK_N, tl.load(ranges + 1), BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        band0 = start - block * BLOCK_M - (BLOCK_M - 1) + shift
        scores, visible, key, band = tile_scores(
            q_u, q_v, k_base + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd, R + h * stride_rh,
            offs_m, offs_n, offs_d, band0, MASK + b * stride_mb, stride_mq, stride_mk, stride_rr, stride_rd,
            qlen, klen, rlen, d_head, SEG + bh * qlen * 2, MIS + b * qlen * klen, scale_log2, HAS_MASK, HAS_SEG,
            BLOCK_M, BLOCK_N, BLOCK_D, PRECISION)
        value = tl.load(v_base + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd,
                        mask=(offs_n < klen)[:, None] & d_ok[None, :], other=0.0)
        dp = tl.dot(grad_out, tl.trans(value), input_precision=PRECISION)
        ds = tl.where(visible, probabilities(scores, lse, klen) * (dp - delta[:, None]), 0.0)  # 0 where hidden
        if HAS_SEG:
            same, different = segment_gradient(ds, MIS + b * qlen * klen, offs_m, offs_n, qlen, klen)
            dseg_same, dseg_different = dseg_same + same, dseg_different + different
        dq_u += tl.dot(ds.to(key.dtype), key, input_precision=PRECISION)
        ds_band = tl.where(on_tile, tl.gather(ds, band_key, 1), 0.0)  # [BLOCK_M, BLOCK_M + BLOCK_N]
        dq_v += tl.dot(ds_band.to(band.dtype), band, input_precision=PRECISION)
        dr = tl.dot(tl.trans(ds_band.to(q_v.dtype)), q_v, input_precision=PRECISION)  # [band, BLOCK_D]
        store_table_gradient(DR, dr, (bh * n_query_blocks + block) * n_key_blocks + start // BLOCK_N, band0, h,
                             rlen, d_head, offs_d, BLOCK_M, BLOCK_N, BANDS)
    offs = (bh * qlen + offs_m[:, None]) * d_head + offs_d[None, :]
    tl.store(DQU + offs, dq_u, mask=m_ok[:, None] & d_ok[None, :])
    tl.store(DQV + offs, dq_v, mask=m_ok[:, None] & d_ok[None, :])
    if HAS_SEG:
        tl.store(DSEG + (bh * qlen + offs_m) * 2, dseg_same, mask=m_ok)
        tl.store(DSEG + (bh * qlen + offs_m) * 2 + 1, dseg_different, mask=m_ok)
