"""`attn_implementation="eager"` runs the reference attention (`relative_attention.relative_attention`, the two
streams' `two_stream_attention`) with gradients too, and gives the training run of the default fused/SDPA paths; the
two-stream fast path against its reference, forward and backward."""

import copy

import pytest
import torch

from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM, TransformerXLForPermutationLM, relative_attention
from modeling_xl.kernel_registry import REGISTRY
from modeling_xl.two_stream_attention import (
    Stream,
    TwoStreamAttention,
    permutation_masks,
    segment_mismatch,
    two_stream_attention,
)

V, B, T = 60, 4, 6


def causal_lm(dropout):
    config = TransformerXLConfig(vocab_size=V, d_model=16, d_embed=16, n_layer=2, n_head=2, d_head=8, d_inner=32,
                                 cutoffs=[30], div_val=1, mem_len=5, dropout=dropout, dropatt=dropout)
    return TransformerXLForCausalLM(config)


def permutation_lm(dropout):
    config = TransformerXLConfig(vocab_size=V, d_model=16, n_layer=2, n_head=2, d_head=8, d_inner=32, adaptive=False,
                                 attn_type="bi", bi_data=True, ff_activation="gelu", mem_len=5, reuse_len=3,
                                 dropout=dropout, dropatt=dropout)
    return TransformerXLForPermutationLM(config)


def batches(head, steps=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        ids = torch.randint(0, V, (B, T), generator=g)
        if head == "causal":
            out.append(dict(input_ids=ids, labels=ids))
            continue
        order = torch.stack([torch.randperm(T, generator=g) for _ in range(B)])
        targets = torch.stack([(row >= T - 2).nonzero().flatten() for row in order])  # the last two in the order
        out.append(dict(input_ids=ids, perm_mask=(order[:, None, :] >= order[:, :, None]).float(),
                        target_mapping=torch.nn.functional.one_hot(targets, T).float(),
                        token_type_ids=(torch.arange(T) >= 3).long().expand(B, T),
                        labels=torch.randint(0, V, (B, 2), generator=g)))
    return out


def train(model, head, implementation, steps=3):
    """Losses and per-step gradients of a few Adam steps with the memory carried, seeded identically."""
    model.set_attn_implementation(implementation)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    mems, losses, grads = None, [], []
    torch.manual_seed(7)
    for batch in batches(head, steps):
        out = model(**batch, mems=mems)
        out.loss.backward()
        losses.append(out.loss.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        optimizer.step()
        optimizer.zero_grad()
        mems = out.mems
    return losses, grads


@pytest.mark.parametrize("head", ["causal", "plm"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_eager_training_matches_the_fused_path(head, dropout, monkeypatch):
    """The same model trained 3 steps (memory carried) on the reference attention and on the default paths: losses
    and every parameter's gradient agree to float32 rounding, with dropout too (both draw the same masks)."""
    torch.manual_seed(0)
    fast = causal_lm(dropout) if head == "causal" else permutation_lm(dropout)
    eager = copy.deepcopy(fast)
    calls = []
    reference = relative_attention.relative_attention
    monkeypatch.setattr(relative_attention, "relative_attention", lambda *a, **k: calls.append(1) or reference(*a, **k))
    fast_losses, fast_grads = train(fast, head, "sdpa")
    assert not calls
    eager_losses, eager_grads = train(eager, head, "eager")
    assert bool(calls) == (head == "causal")  # the dispatch table is Transformer-XL's; the two streams branch on it
    for step, (a, b) in enumerate(zip(fast_losses, eager_losses)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"loss of step {step}")
    for step, (a, b) in enumerate(zip(fast_grads, eager_grads)):
        assert a.keys() == b.keys()
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6, msg=f"{name} at step {step}")


def test_from_pretrained_attn_implementation_eager_runs_the_reference(tmp_path, monkeypatch):
    model = causal_lm(0.0)
    model.save_pretrained(tmp_path)
    loaded = TransformerXLForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    assert loaded.config._attn_implementation == "eager"
    calls = []
    reference = relative_attention.relative_attention
    monkeypatch.setattr(relative_attention, "relative_attention",
                        lambda *a, **k: calls.append(torch.is_grad_enabled()) or reference(*a, **k))
    x = torch.randint(0, V, (2, 5))
    loaded.train()(x, labels=x).loss.backward()
    with torch.no_grad():
        loaded.eval()(x)
    assert calls == [True] * 2 + [False] * 2  # both layers, with and without gradients


def two_stream_inputs(mlen, tables, segments, seed=0):
    """A two-stream layer, its keys/values, position vectors and both streams' `Stream`s (float64)."""
    g = torch.Generator().manual_seed(seed)
    H, D, P = 2, 4, 3
    K = mlen + T
    config = TransformerXLConfig(vocab_size=V, d_model=8, n_layer=1, n_head=H, d_head=D, d_inner=16, adaptive=False,
                                 attn_type="bi", dropout=0.0, dropatt=0.0)
    layer = TwoStreamAttention(config).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.5, generator=g)
    rand = lambda *shape: torch.randn(*shape, dtype=torch.double, generator=g).requires_grad_()  # noqa: E731
    perm_mask = (torch.rand(B, T, T, generator=g) > 0.5).float()
    attention_mask = torch.ones(B, T)
    attention_mask[1, :2] = 0  # padding keys of row 1
    content_mask, query_mask = permutation_masks(perm_mask, attention_mask, mlen, False, B, T, "cpu")
    mismatch = segment_mismatch((torch.arange(T) >= 2).long().expand(B, T), mlen) if segments else None
    content = Stream(content_mask[:, None], mismatch)
    positions = torch.stack([torch.randperm(T, generator=g)[:P] for _ in range(B)])
    present = torch.ones(B, P)
    present[0, -1] = 0  # a padded prediction
    query = content.rows(query_mask, positions, present)
    tensors = dict(h=rand(B, H, T, D), g=rand(B, H, P, D), k=rand(B, H, K, D), v=rand(B, H, K, D),
                   r=rand(tables, H, K + T, D))
    return layer, tensors, content, query


@pytest.mark.parametrize("implementation", ["fused", "sdpa"])
@pytest.mark.parametrize("mlen,tables,segments", [(0, 1, False), (3, 1, True), (3, 2, True)])
def test_two_stream_fast_path_matches_the_reference(implementation, mlen, tables, segments):
    """Both streams (content: rel_shift; query: targets' positions), with and without memory, one table or two
    (bi_data), with and without the segment term, permutation and padding masks, dropout off: output and the
    gradients of every input and of the layer's biases and segment embeddings."""
    layer, x, content, query = two_stream_inputs(mlen, tables, segments)
    biases = (layer.r_w_bias, layer.r_r_bias, layer.r_s_bias)
    inputs = [x["k"], x["v"], x["r"], *biases, layer.seg_embed]
    for q, stream in ((x["h"], content), (x["g"], query)):
        want, _ = two_stream_attention(q, x["k"], x["v"], x["r"], biases, layer.seg_embed, T, stream)
        kernel = REGISTRY[f"biased_attention.{implementation}"]
        got = layer.fast_attention(q, x["k"], x["v"], x["r"], biases, T, stream, 0.0,
                                   kernel.get("cpu", kernel.get("*")))
        torch.testing.assert_close(got, want)
        grad = torch.randn_like(got)
        wrt = [q, *inputs]  # without segments, r_s_bias and seg_embed get no gradient (zeros here)
        for a, b in zip(torch.autograd.grad(got, wrt, grad, allow_unused=True, materialize_grads=True),
                        torch.autograd.grad(want, wrt, grad, allow_unused=True, materialize_grads=True)):
            torch.testing.assert_close(a, b)


def test_two_stream_reference_segment_term_against_a_loop():
    """The reference's score, read back from its probabilities' logits, against a per-pair sum of its three terms."""
    layer, x, content, _ = two_stream_inputs(2, 1, True)
    u, v, s = layer.r_w_bias, layer.r_r_bias, layer.r_s_bias
    q, k, r = x["h"], x["k"], x["r"]
    nomask = Stream(None, content.mismatch)
    _, probs = two_stream_attention(q, k, x["v"], r, (u, v, s), layer.seg_embed, T, nomask)
    K = k.size(2)
    scores = torch.empty(B, 2, T, K, dtype=torch.double)
    for i in range(T):
        for j in range(K):
            row = K - (2 + i - j)  # the table holds distances K ... -T+1: the row of distance M + i - j (M = 2)
            segment = layer.seg_embed[int(content.mismatch[0, i, j])]
            scores[:, :, i, j] = (((q[:, :, i] + u) * k[:, :, j]).sum(-1) + ((q[:, :, i] + v) * r[0, :, row]).sum(-1)
                                  + ((q[:, :, i] + s) * segment).sum(-1))
    torch.testing.assert_close(probs, torch.softmax(scores / 4**0.5, -1))
