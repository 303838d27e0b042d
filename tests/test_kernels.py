"""The kernel table (`modeling_xl/kernel_registry.py`): lookups, `reference_only`, whole models with and without kernels, and
the generation kernels of the adaptive softmax against `AdaptiveLogSoftmax.log_probs`. The other kernels have their
own files (see docs/kernels.md)."""

import inspect

import pytest
import torch

from modeling_xl import (
    TransformerXLConfig,
    TransformerXLForCausalLM,
    TransformerXLForPermutationLM,
    TransformerXLModel,
    TransformerXLPermutationModel,
)
from modeling_xl import kernel_registry as kernels
from modeling_xl.adaptive_softmax import AdaptiveLogSoftmax
from modeling_xl.adaptive_softmax_fused import full_log_probs, greedy_decoding
from modeling_xl.layer_norm import LayerNorm


def test_lookup_by_device_and_for_every_device():
    assert kernels.kernel("layer_norm", "cpu") is not None
    assert kernels.kernel("layer_norm", "cuda") is None  # torch's own kernel there
    assert kernels.kernel("relative_attention.sdpa", "cuda") is kernels.kernel("relative_attention.sdpa", "mps")
    with kernels.reference_only():
        assert all(kernels.kernel(op, "cpu") is None for op in kernels.REGISTRY)
    assert kernels.kernel("dropout", "cpu") is not None
    with pytest.raises(KeyError, match=r"operation='layer_nrom' is not a kernel operation; expected one of"):
        kernels.kernel("layer_nrom", "cpu")


def test_register_and_remove_a_kernel():
    calls = []
    original = kernels.kernel("layer_norm", "cpu")
    kernels.register_kernel("layer_norm", "cpu", lambda module, x: calls.append(x.shape) or original(module, x))
    try:
        norm = LayerNorm(4)
        out = norm(torch.randn(2, 4))
        assert calls == [torch.Size([2, 4])]
        kernels.register_kernel("layer_norm", "cpu", None)  # removed: the reference runs
        torch.testing.assert_close(norm(torch.ones(2, 4)), torch.nn.functional.layer_norm(torch.ones(2, 4), (4,)))
        assert len(calls) == 1 and out.shape == (2, 4)
    finally:
        kernels.register_kernel("layer_norm", "cpu", original)
    with pytest.raises(KeyError, match="'flash' is not a kernel operation"):
        kernels.register_kernel("flash", "cuda", print)


@pytest.mark.parametrize("head", ["causal", "causal-div2", "plm"])
def test_training_step_with_kernels_equals_the_references(head):
    """Two segments, memory carried: the loss and every gradient with the kernels equal those of `reference_only()`
    (no dropout: the CPU dropout kernel draws its masks from other random numbers than `F.dropout`; that the
    attention's kernels and reference draw the same ones is tests/test_attention_implementations.py's check)."""
    torch.manual_seed(0)
    if head == "plm":
        config = TransformerXLConfig.from_preset("debug", attn_type="bi", cutoffs=[], adaptive=False, n_token_type=3,
                                                 reuse_len=6, dropout=0.0, dropatt=0.0)
        model = TransformerXLForPermutationLM(config).train()
        x = torch.randint(0, 97, (2, 12))
        perm = (torch.rand(2, 12, 12) > 0.5).float()
        mapping = torch.eye(12)[None, -4:].expand(2, -1, -1)
        kwargs = dict(input_ids=x, perm_mask=perm, target_mapping=mapping, labels=x[:, -4:],
                      token_type_ids=(torch.arange(12) >= 6).long().expand(2, -1))
    else:
        config = TransformerXLConfig.from_preset("debug", div_val=2 if head == "causal-div2" else 1, d_embed=16)
        model = TransformerXLForCausalLM(config).train()
        x = torch.randint(0, 97, (2, 12))
        kwargs = dict(input_ids=x, labels=x)

    def run():
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        first = model(**kwargs)
        second = model(**kwargs, mems=first.mems)
        (first.loss + second.loss).backward()
        return second.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    fast_loss, fast_grads = run()
    with kernels.reference_only():
        ref_loss, ref_grads = run()
    torch.testing.assert_close(fast_loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert fast_grads.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(fast_grads[name], ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_forward_signatures_hold_no_kernel_state():
    """The deferred table gradient and greedy decoding are context variables, not arguments."""
    for cls in (TransformerXLModel, TransformerXLForCausalLM, TransformerXLPermutationModel,
                TransformerXLForPermutationLM):
        names = set(inspect.signature(cls.forward).parameters)
        assert not names & {"table_gradient", "argmax_only"}, (cls.__name__, names)


@pytest.mark.parametrize("few_row_form", [True, False], ids=["few-row-form", "linear"])
@pytest.mark.parametrize("rows", [1, 3, 40])
@pytest.mark.parametrize("cutoffs", [[20, 50], []])
def test_full_log_probs_written_once_equal_the_reference(rows, cutoffs, few_row_form, monkeypatch):
    """One shared table (div_val 1): one product for every token (fewer rows than the width, 1 and 3 of 16: in
    `few_row_logits`' form where the CPU gains by it, else as `F.linear`; both forms run here), each cluster
    normalised in place; equal to `log_probs` (per-cluster log-softmax) to float32 rounding, a distribution per row,
    one contiguous buffer."""
    from modeling_xl import adaptive_softmax_fused

    monkeypatch.setattr(adaptive_softmax_fused, "FEW_ROWS_PAY_OFF", few_row_form)
    config = TransformerXLConfig.from_preset("debug", div_val=1, cutoffs=cutoffs, adaptive=bool(cutoffs))
    torch.manual_seed(0)
    softmax = AdaptiveLogSoftmax(config)
    for p in softmax.parameters():
        torch.nn.init.normal_(p, std=0.5)
    hidden = torch.randn(rows, config.d_model)
    with torch.no_grad():
        fast, want = full_log_probs(softmax, hidden), softmax.log_probs(hidden)
        assert torch.equal(softmax(hidden), fast)  # what forward runs
    torch.testing.assert_close(fast, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.logsumexp(-1), torch.zeros(rows), atol=1e-5, rtol=0)
    assert fast.is_contiguous()


def test_full_log_probs_falls_back_where_it_does_not_apply():
    """div_val > 1 (clusters of different widths), gradients on: the reference runs (None from the kernel)."""
    torch.manual_seed(0)
    softmax = AdaptiveLogSoftmax(TransformerXLConfig.from_preset("debug", div_val=2))
    hidden = torch.randn(3, 16)
    with torch.no_grad():
        assert full_log_probs(softmax, hidden) is None
    shared = AdaptiveLogSoftmax(TransformerXLConfig.from_preset("debug", div_val=1, d_embed=16))
    assert full_log_probs(shared, hidden) is None  # gradients on (the parameters'): the reference, differentiable
    logp = shared(hidden)
    assert logp.requires_grad and torch.isfinite(logp).all()


def test_greedy_decoding_context_is_scoped_to_its_softmax():
    """Inside `greedy_decoding(softmax)` that softmax's full distribution skips tails (some entries -inf), another
    softmax's does not, and outside the block nothing does."""
    torch.manual_seed(0)
    config = TransformerXLConfig.from_preset("debug", div_val=1, d_embed=16)
    one, other = AdaptiveLogSoftmax(config), AdaptiveLogSoftmax(config)
    with torch.no_grad():
        one.cluster_bias.fill_(-8.0)  # tails far less likely than the shortlist: skipped
        other.load_state_dict(one.state_dict())
        hidden = torch.randn(4, 16)
        with greedy_decoding(one):
            skipped, untouched = one(hidden), other(hidden)
        after = one(hidden)
    assert torch.isinf(skipped[:, one.shortlist:]).all() and torch.isfinite(untouched).all()
    assert torch.isfinite(after).all()
    assert torch.equal(skipped.argmax(-1), after.argmax(-1))


@pytest.mark.parametrize("rows", [1, 3])
def test_few_row_logits_equal_the_linear_product(rows):
    """The few-row form (table @ hidden^T, one row as two copies of itself, tables stacked) gives `F.linear`'s
    logits over the stacked tables to float32 rounding, as a view without gradients and a contiguous tensor with."""
    import torch.nn.functional as F

    from modeling_xl.adaptive_softmax_fused import few_row_logits, few_row_logits_contiguous

    torch.manual_seed(0)
    tables = [(torch.randn(50, 16), torch.randn(50)), (torch.randn(3, 16), torch.randn(3))]
    hidden = torch.randn(rows, 16)
    want = F.linear(hidden, torch.cat([w for w, _ in tables]), torch.cat([b for _, b in tables]))
    with torch.no_grad():
        torch.testing.assert_close(few_row_logits(hidden, tables), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(few_row_logits_contiguous(hidden, *tables[0]), want[:, :50], rtol=1e-5, atol=1e-5)
    with_grad = few_row_logits(hidden.requires_grad_(), tables)
    assert with_grad.is_contiguous()
    torch.testing.assert_close(with_grad.detach(), want, rtol=1e-5, atol=1e-5)
