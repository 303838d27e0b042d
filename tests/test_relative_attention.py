"""The attention maths against naive loops, and every fast path (`relative_attention_cpu`, SDPA) against the library's
reference `relative_attention`, forward and backward."""

import pytest
import torch

from modeling_xl import relative_attention_cpu
from modeling_xl.kernel_registry import REGISTRY, attention_implementation, attention_kernel
from modeling_xl.position_scores_fused import ShiftedPositionScores
from modeling_xl.relative_attention import masked_softmax_attention, relative_attention
from modeling_xl.relative_attention_cpu import FusedBiasedAttention, FusedRelativeAttention, fused_relative_attention
from modeling_xl.relative_attention_sdpa import sdpa_attention
from modeling_xl.relative_positions import causal_mask, rel_shift, relative_positions, sinusoid_table


def naive_shift(x, klen, shift):
    *lead, qlen, rlen = x.shape
    out = torch.full((*lead, qlen, klen), float("nan"))
    for i in range(qlen):
        for j in range(klen):
            c = j + shift - i
            if 0 <= c < rlen:
                out[..., i, j] = x[..., i, c]
    return out


@pytest.mark.parametrize("qlen,mlen", [(1, 0), (4, 0), (4, 3), (5, 7)])
def test_rel_shift_unidirectional_matches_gather(qlen, mlen):
    klen = qlen + mlen
    x = torch.randn(2, 3, qlen, klen)
    got = rel_shift(x, klen, shift=qlen - 1)
    want = naive_shift(x, klen, qlen - 1)
    visible = ~causal_mask(qlen, mlen)
    torch.testing.assert_close(got[..., visible], want[..., visible], rtol=0, atol=0)


@pytest.mark.parametrize("qlen,mlen", [(3, 0), (4, 5)])
def test_rel_shift_bidirectional_matches_gather(qlen, mlen):
    klen = qlen + mlen
    x = torch.randn(2, qlen, klen + qlen)  # distances klen .. -qlen+1
    got = rel_shift(x, klen, shift=qlen)
    torch.testing.assert_close(got, naive_shift(x, klen, qlen), rtol=0, atol=0)  # every entry is a real distance


def test_rel_shift_puts_each_distance_where_it_belongs():
    qlen, mlen = 3, 2
    klen = qlen + mlen
    dist = relative_positions(klen)  # [4, 3, 2, 1, 0]
    x = dist.expand(qlen, klen)
    shifted = rel_shift(x, klen, qlen - 1)
    for i in range(qlen):
        for j in range(mlen + i + 1):
            assert shifted[i, j] == mlen + i - j


def test_relative_positions_clamp_and_direction():
    assert relative_positions(5, clamp_len=3).tolist() == [3, 3, 2, 1, 0]
    assert relative_positions(3, qlen=2, bidirectional=True).tolist() == [3, 2, 1, 0, -1]
    assert relative_positions(4, qlen=3, clamp_len=2, bidirectional=True).tolist() == [2, 2, 2, 1, 0, -1, -2]


def test_sinusoid_table_formula():
    pos = torch.tensor([0.0, 1.0, 7.0])
    table = sinusoid_table(pos, 6)
    for r, p in enumerate(pos.tolist()):
        for k in range(3):
            freq = 1 / 10000 ** (2 * k / 6)
            assert table[r, k].item() == pytest.approx(torch.sin(torch.tensor(p * freq)).item(), abs=1e-6)
            assert table[r, 3 + k].item() == pytest.approx(torch.cos(torch.tensor(p * freq)).item(), abs=1e-6)


@pytest.mark.parametrize("same_length", [False, True])
@pytest.mark.parametrize("qlen,mlen,mem_len", [(3, 0, 4), (3, 2, 2), (4, 4, 4), (2, 5, 5), (3, 0, 0)])
def test_causal_mask_matches_definition(qlen, mlen, mem_len, same_length):
    mask = causal_mask(qlen, mlen, same_length, mem_len)
    klen = qlen + mlen
    for i in range(qlen):
        for j in range(klen):
            hidden = j > mlen + i
            if same_length and mem_len > 0:
                visible = klen - mem_len
                shift = qlen - visible if visible > 0 else qlen
                hidden = hidden or j - i <= -shift
            assert bool(mask[i, j]) == hidden, (i, j)
    assert not mask.all(-1).any(), "every query sees at least itself"


def test_sinusoid_table_in_the_models_dtype():
    """A float64 model's table is computed in float64 (float32 then cast is ~1e-7 off); 16-bit tables are the float32
    table rounded once."""
    pos = relative_positions(300)
    exact = sinusoid_table(pos, 64, torch.float64)
    assert exact.dtype == torch.float64
    inv_freq = 1 / 10000 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    angles = torch.outer(pos.double(), inv_freq)
    assert torch.equal(exact, torch.cat([angles.sin(), angles.cos()], -1))
    assert (sinusoid_table(pos, 64).double() - exact).abs().max() > 1e-9  # what float32 then .double() gave
    half = sinusoid_table(pos, 64, torch.bfloat16)
    assert half.dtype == torch.bfloat16 and torch.equal(half, sinusoid_table(pos, 64).to(torch.bfloat16))


def naive_relative_attention(q, u, v_bias, k, v, r, mask, mlen):
    """Transformer-XL attention pair by pair, from the definition: query i (absolute position M + i) against key j at
    distance M + i - j, whose position vector is the table row of that distance (rows hold K-1 ... 0)."""
    B, H, T, D = q.shape
    K = k.size(2)
    scores = torch.empty(B, H, T, K, dtype=q.dtype)
    for i in range(T):
        for j in range(K):
            distance = mlen + i - j
            row = r[:, K - 1 - distance] if 0 <= distance < K else torch.zeros_like(r[:, 0])  # [H, D]
            content = ((q[:, :, i] + u) * k[:, :, j]).sum(-1)
            position = ((q[:, :, i] + v_bias) * row).sum(-1)
            scores[:, :, i, j] = (content + position) / D**0.5
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize("mlen,same_length,padding", [(0, False, False), (4, False, False), (4, True, False),
                                                      (3, False, True)])
def test_reference_matches_naive_loop(mlen, same_length, padding):
    """The library's reference (`relative_attention`: rel_shift of one product) against a per-pair loop that never
    shifts: with and without memory, same_length, a padding mask per batch row."""
    torch.manual_seed(0)
    B, H, T, D = 2, 3, 5, 4
    K = T + mlen
    mask = causal_mask(T, mlen, same_length, mem_len=mlen)
    if padding:
        mask = mask[None, None].repeat(B, 1, 1, 1)
        mask[1, ..., :2] = True
    q, k, v = (torch.randn(B, H, n, D, dtype=torch.double) for n in (T, K, K))
    u, v_bias = torch.randn(H, D, dtype=torch.double), torch.randn(H, D, dtype=torch.double)
    r = torch.randn(H, K, D, dtype=torch.double)
    out, probs = relative_attention(q, k, v, r, u, v_bias, mask, shift=T - 1)
    torch.testing.assert_close(out, naive_relative_attention(q, u, v_bias, k, v, r, mask, mlen))
    assert torch.all(probs[mask.expand_as(probs)] == 0)


def test_masked_softmax_attention_equals_sdpa_and_masks():
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    bias = torch.randn(2, 3, 4, 6)
    mask = causal_mask(4, 2)
    eager, probs = masked_softmax_attention(q @ k.transpose(-1, -2) + bias, v, mask)
    torch.testing.assert_close(sdpa_attention(q, k, v, bias, mask), eager, rtol=1e-5, atol=1e-5)
    assert torch.all(probs[..., mask] == 0)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3, 4))


def test_fully_masked_row_is_uniform_not_nan():
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    mask = torch.tensor([[True, True, True], [False, True, True]])
    out, probs = masked_softmax_attention(q @ k.transpose(-1, -2), v, mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(probs[0, 0, 0], torch.full((3,), 1 / 3))
    torch.testing.assert_close(sdpa_attention(q, k, v, torch.zeros(1, 1, 2, 3), mask), out)


def test_attention_implementation_is_chosen_in_one_place():
    """"eager" always runs the reference, with gradients too; returned probabilities need it; by default training
    (or attention dropout, for recomputation under no_grad) takes the fused node, evaluation SDPA."""
    assert attention_implementation("eager", 0.0, False) == "eager"
    assert attention_implementation("sdpa", 0.0, True) == "eager"
    assert attention_implementation("sdpa", 0.0, False) == "fused"
    assert attention_implementation(None, 0.0, False) == "fused"
    with torch.no_grad():
        assert attention_implementation("eager", 0.1, False) == "eager"
        assert attention_implementation("sdpa", 0.0, False) == "sdpa"
        assert attention_implementation("sdpa", 0.1, False) == "fused"
    # on a GPU the default is SDPA with the position bias, with gradients too; "triton" is opt-in and needs no
    # attention dropout, no returned probabilities and a device it can run on (here: none without the interpreter)
    assert attention_implementation("sdpa", 0.1, False, "cuda") == "sdpa"
    assert attention_implementation(None, 0.0, False, "cuda") == "sdpa"
    assert attention_implementation("eager", 0.0, False, "cuda") == "eager"
    assert attention_implementation("triton", 0.0, True, "cuda") == "eager"
    assert attention_implementation("triton", 0.1, False, "cpu") == "fused"
    assert attention_implementation("triton", 0.0, False, "cuda", streams=True) == "sdpa"
    assert {op.split(".")[1] for op in REGISTRY if op.startswith("relative_attention.")} == {"fused", "sdpa", "triton"}
    assert attention_kernel("eager", 0.0, False) == ("eager", None)  # the caller runs its reference
    assert attention_kernel("sdpa", 0.0, False, "cuda")[1] is REGISTRY["relative_attention.sdpa"]["*"]
    assert attention_kernel(None, 0.0, False, "cuda", streams=True)[1] is REGISTRY["biased_attention.sdpa"]["*"]


def relative_args(B=2, H=3, T=5, M=4, D=8, rows=0, seed=0):
    """q, key, value, r, u, v (float64, requiring gradients) for relative attention, the table `rows` longer."""
    g = torch.Generator().manual_seed(seed)
    K = T + M
    shapes = [(B, H, T, D), (B, H, K, D), (B, H, K, D), (H, K + rows, D), (H, D), (H, D)]
    return [torch.randn(*shape, dtype=torch.double, generator=g).requires_grad_() for shape in shapes]


def mask_of(kind, B, T, M):
    K = T + M
    if kind == "causal":
        return causal_mask(T, M)
    if kind == "same_length":
        return causal_mask(T, M, True, max(M, 1))
    if kind == "padding":  # per batch row, as `with_key_padding` builds it
        mask = causal_mask(T, M)[None, None].repeat(B, 1, 1, 1)
        mask[1, ..., : M + 2] = True
        mask[1, 0, torch.arange(T), M + torch.arange(T)] = False  # a query keeps its own key
        return mask
    if kind == "fully_masked_row":
        return torch.ones(T, K, dtype=torch.bool).triu(M)
    return None  # no mask: keys that no table row describes get rel_shift's zeros


@pytest.mark.parametrize("implementation", ["fused", "sdpa"])
@pytest.mark.parametrize("mlen", [0, 4])
@pytest.mark.parametrize("mask_kind", ["causal", "same_length", "padding", "fully_masked_row", None])
def test_fast_paths_match_the_reference_forward_and_backward(implementation, mlen, mask_kind):
    """Each entry of the dispatch table against `relative_attention` (dropout off): output and the gradient of every
    input, with and without memory, each kind of mask."""
    B, T = 2, 5
    args = relative_args(B=B, T=T, M=mlen)
    mask = mask_of(mask_kind, B, T, mlen)
    kernel = REGISTRY[f"relative_attention.{implementation}"]
    out, _ = kernel.get("cpu", kernel.get("*"))(*args, mask, T - 1)
    want, _ = relative_attention(*args, mask, T - 1)
    torch.testing.assert_close(out, want)
    if implementation == "sdpa" and mask_kind == "fully_masked_row":
        return  # SDPA (gradients only under torch.compile) passes a hidden row's gradient to its bias; no model row is
        # fully hidden (a query always keeps its own key)
    grad = torch.randn_like(out)
    for got, expected in zip(torch.autograd.grad(out, args, grad), torch.autograd.grad(want, args, grad)):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("mask_kind,extra_rows", [("causal", 0), ("same_length", 0), ("fully_masked_row", 0),
                                                  ("causal", 3)])
def test_fused_relative_attention_matches_unfused_with_gradients(mask_kind, extra_rows):
    """Output against the reference and every input's gradient (gradcheck); `extra_rows`: a position table longer
    than the keys (rel_shift keeps the first K columns)."""
    B, H, T, M, D = 2, 3, 5, 4, 8
    K = T + M
    mask = {"causal": causal_mask(T, M), "same_length": causal_mask(T, M, True, 4),
            "fully_masked_row": torch.ones(T, K, dtype=torch.bool).triu(0)}[mask_kind]
    args = [torch.randn(B, H, T, D, dtype=torch.double, requires_grad=True)]
    args += [torch.randn(H, D, dtype=torch.double, requires_grad=True) for _ in range(2)]
    args += [torch.randn(B, H, K, D, dtype=torch.double, requires_grad=True) for _ in range(2)]
    args += [torch.randn(H, K + extra_rows, D, dtype=torch.double, requires_grad=True)]
    fused = FusedRelativeAttention.apply(*args, mask, T - 1, 0.0)
    q, u, v_bias, k, v, r = args
    torch.testing.assert_close(fused, relative_attention(q, k, v, r, u, v_bias, mask, T - 1)[0])
    assert torch.autograd.gradcheck(lambda *a: FusedRelativeAttention.apply(*a, mask, T - 1, 0.0), args)


def test_fused_relative_attention_dropout_draws_the_references_mask():
    """With attention dropout, the fused node and the reference draw the same keep-mask from the same seed (so a
    model gives the same training run on either path); forward and backward agree."""
    from modeling_xl.dropout_cpu import keep_mask

    B, H, T, M, D, p = 2, 2, 4, 3, 8, 0.3
    K = T + M
    mask = causal_mask(T, M)
    args = relative_args(B=B, H=H, T=T, M=M, D=D)
    torch.manual_seed(5)
    out, _ = fused_relative_attention(*args, mask, T - 1, p)
    torch.manual_seed(5)
    want, _ = relative_attention(*args, mask, T - 1, p)
    torch.manual_seed(5)
    keep, keep_scale = keep_mask((B, H, T, K), p)
    assert 0 < keep.sum() < keep.numel() and keep_scale == pytest.approx(1 / (1 - p), rel=1e-4)
    torch.testing.assert_close(out, want)
    grad = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, args, grad), torch.autograd.grad(want, args, grad)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("bias_shape,with_mask", [((2, 3, 5, 9), True), ((1, 3, 5, 9), True), ((2, 1, 5, 9), False)])
def test_fused_biased_attention_matches_attend_with_gradients(bias_shape, with_mask):
    """FusedBiasedAttention against the reference's tail (`masked_softmax_attention`), including a bias broadcast over
    batch or heads (its gradient is summed back) and no mask; forward, backward, gradcheck."""
    B, H, T, K, D = 2, 3, 5, 9, 8
    mask = causal_mask(T, K - T)[None, None] if with_mask else None
    args = [torch.randn(B, H, T, D, dtype=torch.double, requires_grad=True)]
    args += [torch.randn(B, H, K, D, dtype=torch.double, requires_grad=True) for _ in range(2)]
    args += [torch.randn(*bias_shape, dtype=torch.double, requires_grad=True)]

    def reference(q, k, v, bias):
        return masked_softmax_attention(q @ k.transpose(-1, -2) + bias, v, mask)[0]

    out = FusedBiasedAttention.apply(*args, mask, 0.0)
    want = reference(*args)
    torch.testing.assert_close(out, want)
    grad = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, args, grad), torch.autograd.grad(want, args, grad)):
        torch.testing.assert_close(a, b)
    assert torch.autograd.gradcheck(lambda *a: FusedBiasedAttention.apply(*a, mask, 0.0), args)


def test_fused_biased_attention_dropout_uses_the_package_mask():
    from modeling_xl.dropout_cpu import keep_mask

    B, H, T, K, D, p = 1, 2, 4, 6, 8, 0.25
    q, k, v = (torch.randn(B, H, n, D, dtype=torch.double, requires_grad=True) for n in (T, K, K))
    bias = torch.randn(B, H, T, K, dtype=torch.double, requires_grad=True)
    torch.manual_seed(9)
    out = FusedBiasedAttention.apply(q, k, v, bias, None, p)
    torch.manual_seed(9)
    keep, keep_scale = keep_mask((B, H, T, K), p)
    want = torch.softmax((q @ k.transpose(-1, -2) + bias) / D**0.5, -1) * keep * keep_scale @ v
    torch.testing.assert_close(out, want)
    grad = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v, bias), grad), torch.autograd.grad(want, (q, k, v, bias), grad)):
        torch.testing.assert_close(a, b)


def test_training_attention_saves_no_score_sized_tensor():
    """Training memory: the relative attention recomputes its probabilities in backward instead of keeping any
    [B, H, T, K] tensor (the largest activation of a layer), and its output, merged over heads, is the very storage
    that the output projection saves (no second copy of the attention vectors)."""
    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM

    cfg = TransformerXLConfig.from_preset("debug", mem_len=6, dropatt=0.0)
    model = TransformerXLForCausalLM(cfg).train()
    x = torch.randint(0, cfg.vocab_size, (2, 5))
    mems = model(x).mems
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        model(x, mems=mems, labels=x).loss.backward()
    heads, klen = cfg.n_head, 6 + 5
    assert not [t.shape for t in saved if t.is_floating_point() and t.dim() == 4 and t.shape[-1] == klen
                and t.shape[1] == heads]
    vectors = [t for t in saved if t.dim() == 4 and t.shape == (2, heads, 5, cfg.d_head)]  # q + u and outputs
    storages = {t.untyped_storage().data_ptr() for t in vectors}
    width = heads * cfg.d_head
    merged = [t for t in saved if t.dim() and t.shape[-1] == width and t.numel() == 2 * 5 * width
              and t.untyped_storage().data_ptr() in storages]
    assert len(merged) == cfg.n_layer, "each layer's output projection saves the attention node's own output"


@pytest.mark.parametrize("tables,rlen,shift", [(0, 9, 4), (1, 13, 5), (2, 13, 5), (1, 14, 5), (2, 14, 5)])
def test_shifted_position_scores_matches_rel_shift_with_gradients(tables, rlen, shift):
    """The one-node position scores (written into rel_shift's buffer; the gradient into the inverse shift's) against
    rel_shift of the plain product, with one table given as [H, R, D] (tables=0) or S tables [S, H, R, D], and a table
    longer than the keys; R = 14 describes every (query, key) pair (XLNet's bidirectional table: the strided-view
    path), the others leave entries that only rel_shift's padding defines (the padded-buffer path)."""
    B, H, T, K, D = 4, 2, 5, 9, 3
    q = torch.randn(B, H, T, D, dtype=torch.double, requires_grad=True)
    v = torch.randn(H, D, dtype=torch.double, requires_grad=True)
    r = torch.randn(*([tables] if tables else []), H, rlen, D, dtype=torch.double, requires_grad=True)
    r_rows = r if tables else r[None]
    s = max(tables, 1)
    q_v = (q + v[:, None]).view(s, B // s, H, T, D)
    want = rel_shift(torch.matmul(q_v, r_rows[:, None].transpose(-1, -2)).flatten(0, 1), K, shift)
    torch.testing.assert_close(ShiftedPositionScores.apply(q, v, r, K, shift), want)
    assert torch.autograd.gradcheck(lambda *a: ShiftedPositionScores.apply(*a, K, shift), (q, v, r))


def test_score_blocks_cover_every_pair_once_in_contiguous_blocks():
    from modeling_xl.relative_attention_cpu import SCORE_BLOCK_BYTES, score_blocks

    per_pair = SCORE_BLOCK_BYTES // 4  # bytes of one (row, head) pair's scores: 4 pairs fit a block
    for batch, heads in [(3, 2), (2, 8), (1, 3), (5, 1)]:
        blocks = score_blocks(batch, heads, 1, per_pair, 1)
        seen = torch.zeros(batch, heads, dtype=torch.long)
        x = torch.zeros(batch, heads, 7)
        for rows, hs in blocks:
            seen[rows, hs] += 1
            assert x[rows, hs].is_contiguous()
            assert seen[rows, hs].numel() <= 4
        assert (seen == 1).all()
    assert score_blocks(2, 8, 1, 1, 1) == [(slice(None), slice(None))]


@pytest.mark.parametrize("block_pairs", [2, 3, 4])
def test_fused_relative_attention_in_blocks_matches_unfused(monkeypatch, block_pairs):
    """Forced into blocks of whole batch rows (4 pairs per block, 4 heads) or of head ranges within a row (2 or 3
    pairs): output and gradients equal the unfused ops, with dropout (each block's keep-mask taken from one full mask
    in block order) and a per-row padding mask."""
    from modeling_xl.relative_attention_cpu import score_blocks

    B, H, T, M, D, p = 3, 4, 4, 3, 8, 0.3
    K = T + M
    monkeypatch.setattr(relative_attention_cpu, "SCORE_BLOCK_BYTES", block_pairs * T * K * 8)
    blocks = score_blocks(B, H, T, K, 8)
    assert len(blocks) > 1
    mask = causal_mask(T, M)[None, None].expand(B, 1, T, K).clone()
    mask[1, ..., :2] = True  # padding keys of row 1
    torch.manual_seed(3)
    full_keep = torch.rand(B, H, T, K) > p
    order = iter(blocks)
    monkeypatch.setattr(relative_attention_cpu, "keep_mask",
                        lambda shape, rate, device=None: (full_keep[next(order)], 1 / (1 - p)))
    args = [torch.randn(B, H, T, D, dtype=torch.double, requires_grad=True)]
    args += [torch.randn(H, D, dtype=torch.double, requires_grad=True) for _ in range(2)]
    args += [torch.randn(B, H, K, D, dtype=torch.double, requires_grad=True) for _ in range(2)]
    args += [torch.randn(H, K, D, dtype=torch.double, requires_grad=True)]
    out = FusedRelativeAttention.apply(*args, mask, T - 1, p)
    q, u, v_bias, k, v, r = args
    scores = (q + u[:, None]) @ k.transpose(-1, -2) + rel_shift((q + v_bias[:, None]) @ r.transpose(-1, -2), K, T - 1)
    probs = torch.softmax((scores / D**0.5).masked_fill(mask, torch.finfo(scores.dtype).min), -1)
    want = probs * full_keep * (1 / (1 - p)) @ v
    torch.testing.assert_close(out, want)
    grad = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, args, grad), torch.autograd.grad(want, args, grad)):
        torch.testing.assert_close(a, b)
    assert torch.autograd.gradcheck(lambda *a: FusedRelativeAttention.apply(*a, mask, T - 1, 0.0), args, fast_mode=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_hidden_equals_masked_fill(dtype):
    """`Hidden.hide_` is masked_fill(mask, finfo.min) and `zero_` masked_fill(mask, 0), in the scores' own dtype (no
    overflow to -inf, even for the most negative finite scores), the mask broadcast over heads; in float16 an
    overflowed (inf) score at a hidden key is hidden too, not turned into NaN."""
    from modeling_xl.relative_attention_cpu import Hidden

    torch.manual_seed(0)
    x = (torch.randn(2, 3, 5, 7) * 100).to(dtype)
    x[0, 0, 0, 0] = torch.finfo(dtype).min  # extremes stay finite
    x[0, 0, 0, 1] = torch.finfo(dtype).max
    mask = torch.rand(2, 1, 5, 7) > 0.5
    mask[0, 0, 0, :2] = True
    if dtype == torch.float16:
        x[1, 2, 3, 4], mask[1, 0, 3, 4] = float("inf"), True
    hidden = Hidden.of(mask, dtype)
    assert torch.equal(hidden.hide_(x.clone()), x.masked_fill(mask, torch.finfo(dtype).min))
    assert torch.equal(hidden.zero_(x.clone()), x.masked_fill(mask, 0))
    assert torch.equal(Hidden.of(mask, dtype).zero_(x.clone()), x.masked_fill(mask, 0))  # zero_ alone (backward)
    assert Hidden.of(None, dtype) is None


@pytest.mark.parametrize("layout", ["head_major", "batch_major", "block"])
def test_position_product_equals_broadcast_matmul(layout):
    from modeling_xl.position_scores_fused import head_major, position_product

    torch.manual_seed(0)
    B, H, T, D, R = 3, 4, 5, 6, 9
    x = torch.randn(B, H, T, D, dtype=torch.double)
    r = torch.randn(H, R, D, dtype=torch.double)
    if layout == "head_major":
        q_v = head_major(x.shape, x).copy_(x)
        assert q_v.transpose(0, 1).is_contiguous()
    elif layout == "batch_major":
        q_v = x
    else:  # rows 1-2 of a head-major tensor, heads 1-3: what one block of the fused attention reads
        q_v = head_major(x.shape, x).copy_(x)[1:3, 1:4]
        r = r[1:4]
    torch.testing.assert_close(position_product(q_v, r), torch.matmul(q_v, r.transpose(-1, -2)))


@pytest.mark.parametrize("qlen,mem_len", [(3, 2), (5, 4), (4, 8), (8, 3)])
def test_same_length_shows_every_query_the_newest_mem_len_keys_once_the_memory_is_full(qlen, mem_len):
    mask = causal_mask(qlen, mem_len, same_length=True, mem_len=mem_len)
    for i in range(qlen):  # query i sits at key mem_len + i and sees keys i + 1 .. mem_len + i
        assert (~mask[i]).nonzero().flatten().tolist() == list(range(i + 1, mem_len + i + 1))
    if (qlen, mem_len) == (3, 2):  # the docstring's example
        x, o = True, False
        assert mask.tolist() == [[x, o, o, x, x], [x, x, o, o, x], [x, x, x, o, o]]
    for filled in range(mem_len):  # before the memory is full a query sees at most mem_len keys
        assert (~causal_mask(qlen, filled, True, mem_len)).sum(-1).max() <= mem_len


def test_reported_attended_context_is_the_most_keys_a_query_sees():
    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM
    from modeling_xl.evaluation.long_context import evaluate_stream

    model = TransformerXLForCausalLM(TransformerXLConfig(vocab_size=11, d_model=8, n_layer=1, n_head=2, d_head=4,
                                                         d_inner=16, adaptive=False)).eval()
    tokens = torch.randint(0, 11, (40,))
    for mem_len, same_length in [(6, True), (6, False), (0, True)]:
        result = evaluate_stream(model, tokens, tgt_len=5, mem_len=mem_len, same_length=same_length)
        mask = causal_mask(5, mem_len, result["same_length"], mem_len)
        assert result["attended_context"] == int((~mask).sum(-1).max())
