"""The CPU kernel of LayerNorm (`layer_norm.LayerNorm` routes CPU tensors here): a LayerNorm whose backward reads its
output instead of its input.

`nn.LayerNorm` keeps its input for backward. In a post-norm layer (Transformer-XL's default) the input is the residual
sum, which nothing else keeps, while the output is kept anyway by whatever reads it next (the feed-forward's first
product, the next layer's projections, the softmax). Recovering the normalized input from the output, x_hat = (y - beta)
/ gamma, makes the input unnecessary: one [B, T, d] tensor less per LayerNorm, two per layer. The division is exact up
to rounding only where gamma is not small against beta, so the output is used only in float32 / float64 and only when
every |gamma| >= |beta| / 16 and is a normal number (initialised gamma = 1, beta = 0), and only on the CPU; elsewhere
(on a GPU, under autocast, while compiling) this is `nn.LayerNorm`. The same trick is Apex's and Megatron-LM's
`memory_efficient` LayerNorm.

The check reads gamma and beta on the host, so its answer is kept until either changes in place (an optimizer step):
one check per LayerNorm and step. On a GPU that read would synchronise with the host at every step, which is why
GPU tensors take `nn.LayerNorm`'s own fused kernel instead. Since the output is saved, modifying it in place
before backward raises autograd's in-place error; this includes the last layer's output that the backbone returns
(`last_hidden_state`), which `nn.LayerNorm` would let a caller edit in place when nothing else saved it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# |beta| / |gamma| above which the output is not used: x_hat then carries an absolute rounding error of about
# eps * (|x_hat| + |beta| / |gamma|), at most that of a float rounded at magnitude 16.
MAX_BIAS_RATIO = 16.0


class OutputSavingLayerNorm(torch.autograd.Function):
    """layer_norm(x) over the last dimension, saving (output, 1/std) for backward. Backward rebuilds x_hat from the
    output and hands it to the native LayerNorm backward as an input of mean 0 and scale 1, then scales the input's
    gradient by 1/std: the same formula, dx = rstd * (g*gamma - mean(g*gamma) - x_hat * mean(g*gamma*x_hat))."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps: float):
        y, _, rstd = torch.native_layer_norm(x, (x.size(-1),), weight, bias, eps)
        ctx.save_for_backward(y, weight, bias, rstd)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable  # rstd is saved as a constant: no second-order gradient
    def backward(ctx, grad):
        y, weight, bias, rstd = ctx.saved_tensors
        inverse = weight.reciprocal()
        offset = torch.zeros_like(weight) if bias is None else -bias * inverse
        x_hat = torch.addcmul(offset, y, inverse)
        grad_x, grad_weight, grad_bias = torch.ops.aten.native_layer_norm_backward(
            grad.contiguous(), x_hat, (y.size(-1),), torch.zeros_like(rstd), torch.ones_like(rstd), weight, bias,
            [ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2]])
        if grad_x is not None:
            grad_x.mul_(rstd)
        return grad_x, grad_weight, grad_bias, None


def output_recoverable(weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether x_hat can be rebuilt from the output to rounding: float32 / float64, and every |gamma| a normal
    number (so 1 / gamma is finite) no smaller than |beta| / 16."""
    if weight.dtype not in (torch.float32, torch.float64):
        return False
    with torch.no_grad():
        magnitude = weight.abs()
        ok = magnitude >= torch.finfo(weight.dtype).tiny
        if bias is not None:
            ok &= magnitude * MAX_BIAS_RATIO >= bias.abs()
        return bool(ok.all())


def output_saving_layer_norm(module: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """`module(x)` (an `nn.LayerNorm` over the last dimension), keeping its output, not its input, for backward where
    that is exact to rounding (see the module docstring); elsewhere `F.layer_norm`. The answer of the gamma/beta check
    is kept on the module until either changes in place (an optimizer step)."""
    weight, bias = module.weight, module.bias
    if (len(module.normalized_shape) == 1 and weight is not None and torch.is_grad_enabled()
            and not torch.compiler.is_compiling() and not torch.is_autocast_enabled(x.device.type)
            and x.dtype == weight.dtype and _output_recoverable(module)):
        return OutputSavingLayerNorm.apply(x, weight, bias, module.eps)
    return F.layer_norm(x, module.normalized_shape, weight, bias, module.eps)


def _output_recoverable(module: nn.LayerNorm) -> bool:
    key = tuple((t.data_ptr(), t._version) for t in (module.weight, module.bias) if t is not None)
    kept = getattr(module, "_recoverable", None)  # ((weight/bias identity and versions), output_recoverable)
    if kept is None or kept[0] != key:
        kept = (key, output_recoverable(module.weight, module.bias))
        module._recoverable = kept
    return kept[1]
