"""Dropout (`dropout.dropout`, and its CPU kernel modeling_xl/dropout_cpu.py): mask statistics, seeding, and gradients
against the plain ops."""

import pytest
import torch
import torch.nn.functional as F

from modeling_xl.dropout import Dropout, dropout, relu_dropout
from modeling_xl.dropout_cpu import keep_mask


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_mask_rate_and_scale(p):
    torch.manual_seed(0)
    keep, scale = keep_mask((1000, 1001), p)  # 1,001,000 = 4 x 250,250: also try a partly used last word below
    assert keep.shape == (1000, 1001) and keep.dtype == torch.bool
    # 1e6 Bernoulli draws: standard error of the rate is below 5e-4
    assert keep.float().mean().item() == pytest.approx(1 - p, abs=3e-3)
    assert scale == 1 / (1 - round(p * 2**15) / 2**15)  # p rounded to a multiple of 2**-15
    assert scale == pytest.approx(1 / (1 - p), rel=1e-4)


def test_keep_mask_columns_are_independent_of_word_quarters():
    """Column j of a [N, 4] mask comes from quarter j of every 64-bit word (bits 16j..16j+14); each quarter must be
    uniform, the one holding the word's top bit included, and the quarters independent of each other."""
    torch.manual_seed(1)
    keep, _ = keep_mask((200_000, 4), 0.5)
    columns = keep.float() - 0.5
    for j in range(4):
        assert columns[:, j].mean().item() == pytest.approx(0.0, abs=5e-3)
        for k in range(j + 1, 4):
            assert (columns[:, j] * columns[:, k]).mean().item() == pytest.approx(0.0, abs=5e-3)
    quarter = keep_mask((200_000, 4), 0.75)[0][:, 3].float().mean().item()  # a biased top quarter would keep < 0.25
    assert quarter == pytest.approx(0.25, abs=5e-3)
    assert keep_mask((7,), 0.5)[0].shape == (7,)  # last word partly used


def test_keep_mask_edges_and_seeding():
    assert keep_mask((3, 4), 0.0)[0].all()
    keep, scale = keep_mask((3, 4), 1.0)
    assert not keep.any() and scale == 0.0
    torch.manual_seed(7)
    a = keep_mask((50,), 0.3)[0]
    torch.manual_seed(7)
    assert torch.equal(a, keep_mask((50,), 0.3)[0])
    with pytest.raises(ValueError, match="p=1.5"):
        keep_mask((2,), 1.5)
    with pytest.raises(ValueError, match="p=-0.1"):
        Dropout(-0.1)


def test_dropout_matches_mask_and_gradient():
    x = torch.randn(6, 7, dtype=torch.double, requires_grad=True)
    torch.manual_seed(3)
    y = dropout(x, 0.4)
    torch.manual_seed(3)
    keep, scale = keep_mask((6, 7), 0.4)
    torch.testing.assert_close(y, x * keep * scale)
    (grad,) = torch.autograd.grad(y, x, torch.ones_like(y))
    torch.testing.assert_close(grad, (keep * scale).double())
    assert dropout(x, 0.4, training=False) is x


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_relu_dropout_equals_relu_then_dropout(p):
    x = torch.randn(5, 9, dtype=torch.double)
    x[0, :3] = 0.0  # relu'(0) = 0, as torch's threshold_backward
    x.requires_grad_(True)
    torch.manual_seed(11)
    y = relu_dropout(x, p)
    torch.manual_seed(11)
    want = F.relu(x)
    if p > 0:
        keep, scale = keep_mask(x.shape, p)
        want = want * keep * scale
    torch.testing.assert_close(y, want)
    grad_out = torch.randn_like(y)
    torch.testing.assert_close(torch.autograd.grad(y, x, grad_out)[0], torch.autograd.grad(want, x, grad_out)[0])


def test_relu_dropout_without_grad_and_in_eval():
    x = torch.randn(4, 4)
    torch.testing.assert_close(relu_dropout(x, 0.5, training=False), F.relu(x))
    with torch.no_grad():
        torch.manual_seed(2)
        y = relu_dropout(x, 0.5)
    torch.manual_seed(2)
    keep, scale = keep_mask(x.shape, 0.5)
    torch.testing.assert_close(y, F.relu(x) * keep * scale)


def test_dropout_module_is_a_drop_in():
    module = Dropout(0.25)
    assert module.p == 0.25 and "p=0.25" in repr(module)
    x = torch.randn(3, 3)
    assert module.eval()(x) is x


def test_keep_mask_on_other_devices_uses_uniform_floats():
    """Devices other than CPU/CUDA (MPS, XLA, meta) take a plain uniform draw: their int64 `random_` may not give
    63 random bits."""
    keep, scale = keep_mask((3, 5), 0.25, device="meta")
    assert keep.device.type == "meta" and keep.dtype == torch.bool and keep.shape == (3, 5)
    assert scale == pytest.approx(1 / 0.75)


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_apply_keep_equals_bool_arithmetic(inplace, dtype):
    """apply_keep multiplies by the mask's bytes; the result is x * keep * scale, broadcasting included, and the
    mask's bytes are exactly 0 or 1 (it is a bool view of integer arithmetic)."""
    from modeling_xl.dropout_cpu import apply_keep

    torch.manual_seed(0)
    keep, scale = keep_mask((4, 1, 6), 0.3)
    assert set(keep.view(torch.uint8).unique().tolist()) <= {0, 1}
    x = torch.randn(4, 5, 6).to(dtype)
    expected = x * keep * scale
    out = apply_keep(x.clone() if inplace else x, keep, scale, inplace=inplace)
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected)
