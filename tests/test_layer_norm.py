"""The LayerNorm that keeps its output for backward (modeling_xl/layer_norm_cpu.py) against torch's."""

import pytest
import torch
import torch.nn.functional as F

from modeling_xl.layer_norm import LayerNorm
from modeling_xl.layer_norm_cpu import OutputSavingLayerNorm


def _norm(d=48, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    norm = LayerNorm(d, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.3, 2.0).mul_(torch.randn(d).sign())  # negative gammas too
        norm.bias.normal_(0.0, 0.5)
    return norm


def _grads(fn, norm, x, grad):
    x = x.clone().requires_grad_()
    y = fn(x)
    return (y, *torch.autograd.grad(y, (x, norm.weight, norm.bias), grad))


def _reference(norm):
    return lambda x: F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_values_and_gradients_match_torch(dtype, tol):
    norm = _norm(dtype=dtype)
    x = torch.randn(3, 5, 48, dtype=dtype) * 3 + 1
    grad = torch.randn(3, 5, 48, dtype=dtype)
    for ours, ref in zip(_grads(norm, norm, x, grad), _grads(_reference(norm), norm, x, grad)):
        torch.testing.assert_close(ours, ref, rtol=tol, atol=tol)


def _saved_storages(fn, x):
    saved = []

    def pack(t):
        saved.append(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fn(x)
    return y, set(saved)


def test_keeps_its_output_not_its_input():
    norm = _norm(dtype=torch.float32)
    x = torch.randn(4, 48, requires_grad=True)
    h = x * 2  # the residual sum: an intermediate nothing else keeps
    y, saved = _saved_storages(norm, h)
    assert y.grad_fn.name().startswith("OutputSavingLayerNorm")
    assert y.untyped_storage().data_ptr() in saved and h.untyped_storage().data_ptr() not in saved
    _, saved_by_torch = _saved_storages(_reference(norm), h)
    assert h.untyped_storage().data_ptr() in saved_by_torch  # what the plain op does


@pytest.mark.parametrize("change", ["zero_gamma", "large_beta"])
def test_falls_back_where_the_output_does_not_determine_the_input(change):
    """gamma = 0 loses the input; |beta| > 16 |gamma| loses digits: the plain op (same gradients, exactly)."""
    norm = _norm()
    with torch.no_grad():
        if change == "zero_gamma":
            norm.weight[7] = 0.0
        else:
            norm.bias[3] = 17.0 * norm.weight[3].abs()
    x = torch.randn(6, 48, dtype=torch.float64)
    grad = torch.randn(6, 48, dtype=torch.float64)
    ours = _grads(norm, norm, x, grad)
    assert not ours[0].grad_fn.name().startswith("OutputSavingLayerNorm")
    for a, b in zip(ours, _grads(_reference(norm), norm, x, grad)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_plain_op_under_autocast_and_without_gradients():
    norm = _norm(dtype=torch.float32)
    x = torch.randn(4, 48, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(x.to(torch.bfloat16))
        ref = _reference(norm)(x.to(torch.bfloat16))
    assert y.dtype == ref.dtype and not y.grad_fn.name().startswith("OutputSavingLayerNorm")
    torch.testing.assert_close(y, ref, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(norm(x), _reference(norm)(x), rtol=0, atol=0)


def test_same_parameters_and_state_dict_as_torch():
    ours, plain = LayerNorm(8, eps=1e-6), torch.nn.LayerNorm(8, eps=1e-6)
    assert isinstance(ours, torch.nn.LayerNorm)
    assert ours.state_dict().keys() == plain.state_dict().keys()
    ours.load_state_dict(plain.state_dict())


def test_without_bias_and_partial_gradients():
    torch.manual_seed(1)
    norm = LayerNorm(16, bias=False).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(5, 16, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(5, 16, dtype=torch.float64)
    y = norm(x)
    assert y.grad_fn.name().startswith("OutputSavingLayerNorm")
    gx, gw = torch.autograd.grad(y, (x, norm.weight), grad)
    ref_x = x.detach().clone().requires_grad_()
    rx, rw = torch.autograd.grad(F.layer_norm(ref_x, (16,), norm.weight, None, norm.eps), (ref_x, norm.weight), grad)
    torch.testing.assert_close(gx, rx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gw, rw, rtol=1e-12, atol=1e-12)
    # only the weight needs a gradient (a frozen input): no input gradient is computed
    (only_w,) = torch.autograd.grad(OutputSavingLayerNorm.apply(x.detach(), norm.weight, None, norm.eps),
                                    (norm.weight,), grad)
    torch.testing.assert_close(only_w, rw, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_without_autocast_uses_the_plain_op(dtype):
    """Rounding of a 16-bit output would be amplified up to 16x by the division: the input is kept instead."""
    norm = LayerNorm(32).to(dtype)
    x = torch.randn(4, 32, dtype=dtype, requires_grad=True)
    y = norm(x)
    assert not y.grad_fn.name().startswith("OutputSavingLayerNorm")
    torch.testing.assert_close(y, F.layer_norm(x, (32,), norm.weight, norm.bias, norm.eps), rtol=0, atol=0)


def test_subnormal_gamma_and_a_gamma_changed_in_place():
    """A subnormal gamma (1 / gamma overflows) falls back; the check's answer is kept only while gamma and beta are
    unchanged: an in-place edit (an optimizer step) is seen at the next call."""
    norm = LayerNorm(16)
    x = torch.randn(3, 16, requires_grad=True)
    assert norm(x).grad_fn.name().startswith("OutputSavingLayerNorm")
    with torch.no_grad():
        norm.weight[5] = 1e-39
    y = norm(x)
    assert not y.grad_fn.name().startswith("OutputSavingLayerNorm")
    grad = torch.randn(3, 16)
    (gx,) = torch.autograd.grad(y, x, grad)
    assert torch.isfinite(gx).all()
    with torch.no_grad():
        norm.weight.fill_(1.0)
    assert norm(x).grad_fn.name().startswith("OutputSavingLayerNorm")


def test_second_order_gradients_are_refused():
    """1/std is saved as a constant, so a second derivative through it would be wrong: it raises instead."""
    norm = _norm()
    x = torch.randn(4, 48, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(norm(x).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|differentiate"):
        torch.autograd.grad(gx.sum(), x)
