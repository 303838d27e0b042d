"""The CPU kernels of dropout (`kernel_registry` routes CPU tensors here; elsewhere `F.dropout` runs): a fast keep-mask,
a boolean mask saved for backward, and ReLU + dropout as one autograd node that saves nothing but its output.

Why not `nn.Dropout`: on CPU it draws one Mersenne-Twister float per element (`bernoulli_`, a noticeable share of a CPU
training step: benchmarks/README.md) and saves a float mask (4 bytes per element) for backward.

The keep-mask here is drawn as 64-bit random integers (`random_()`: 63 uniform bits), each giving four 15-bit uniform
integers (bits 0-14, 16-30, 32-46, 48-62), compared against `round(p * 2**15)`: one generator call per four elements
(faster than `bernoulli_`: benchmarks/README.md), same seed handling as any
torch random op (`torch.manual_seed`, per-device generators). The drop probability is `p` rounded to a multiple of
2**-15 (within 1.6e-5; 0.1 becomes 0.100006) and kept elements are scaled by `1 / (1 - p_rounded)`, so the layer
stays unbiased in expectation. The comparison is integer arithmetic and the mask is applied through its bytes
(`apply_keep`): on CPU, ops that produce or read bool tensors are several times slower than the same on uint8.
Under `torch.compile`, which cannot trace `random_`, the masks are `torch.rand(shape) >= p` and dropout is plain ops.
All of this is for the CPU: on other devices (CUDA) `dropout.dropout` and `dropout.relu_dropout` are torch's own
fused kernels (`F.dropout`), and `keep_mask` (the attention's dropout on probabilities) draws `torch.rand(shape) >= p`.
"""

from __future__ import annotations

import torch

_BITS = 15
_LOW_BITS = (1 << _BITS) - 1
_PER_WORD = 4  # 15-bit integers per 64-bit word, 16 bits apart


def keep_mask(shape, p: float, device=None) -> tuple[torch.Tensor, float]:
    """Boolean mask of `shape`, True with probability `1 - p`, and the scale `1 / (1 - p)` to apply to kept values."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability p={p!r}; expected 0 <= p <= 1")
    numel = 1
    for size in shape:
        numel *= size
    threshold = round(p * (1 << _BITS))
    if threshold == 1 << _BITS:  # p rounds to 1: nothing is kept
        return torch.zeros(shape, dtype=torch.bool, device=device), 0.0
    device = torch.device(device) if device is not None else torch.get_default_device()
    # the 15-bit trick pays on the CPU only; under torch.compile (which cannot trace `random_`) the compiler's own
    # generator draws the uniform floats
    if device.type != "cpu" or torch.compiler.is_compiling():
        return torch.rand(shape, device=device) >= p, 1.0 / (1.0 - p)
    words = torch.empty(-(-numel // _PER_WORD), dtype=torch.int64, device=device).random_()  # 63 uniform bits each
    quarters = words.view(torch.int16)[:numel].bitwise_and_(_LOW_BITS)  # 15 uniform bits per element
    # keep = quarters >= threshold, as integer arithmetic (2-3x faster on CPU than a comparison producing bool):
    # quarters - threshold lies in [-2**15, 2**15), its sign bit shifted down is -1 (drop) or 0 (keep)
    keep = quarters.sub_(threshold).bitwise_right_shift_(_BITS).add_(1).to(torch.uint8)
    return keep.view(torch.bool).view(shape), 1.0 / (1.0 - threshold / (1 << _BITS))


def apply_keep(x: torch.Tensor, keep: torch.Tensor, scale: float, inplace: bool = False) -> torch.Tensor:
    """x * keep * scale for a boolean `keep` (broadcastable to x), new or in place. Multiplies by the mask's bytes:
    on CPU, arithmetic with a bool tensor is 3-4x slower than with the same bytes as uint8."""
    keep = keep.view(torch.uint8)
    out = x.mul_(keep) if inplace else x.mul(keep)
    return out.mul_(scale) if scale != 1.0 else out


class _Dropout(torch.autograd.Function):
    """x * keep / (1 - p); saves the boolean mask only."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float):
        keep, scale = keep_mask(x.shape, p, x.device)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return apply_keep(x, keep, scale)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return apply_keep(grad, keep, ctx.scale), None


class _ReLUDropout(torch.autograd.Function):
    """dropout(relu(x)); saves only the output y: the gradient is grad * scale where y > 0 (kept and positive), and the
    next linear layer saves y anyway, so the node costs no memory of its own."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float):
        y = torch.relu(x)
        scale = 1.0
        if p > 0:
            keep, scale = keep_mask(x.shape, p, x.device)
            apply_keep(y, keep, scale, inplace=True)
        ctx.save_for_backward(y)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        # ReLU's own backward kernel (20x faster on CPU than `where(y > 0, ...)`, which broadcasts a scalar)
        grad_x = torch.ops.aten.threshold_backward(grad, y.to(grad.dtype), 0)
        return (grad_x.mul_(ctx.scale) if ctx.scale != 1.0 else grad_x), None


def cpu_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """dropout(x, p) in training (same contract as `F.dropout`, not in place; p > 0)."""
    if torch.compiler.is_compiling():  # plain ops, for the compiler to fuse
        keep, scale = keep_mask(x.shape, p, x.device)
        return x * keep * scale
    if not torch.is_grad_enabled() or not x.requires_grad:
        keep, scale = keep_mask(x.shape, p, x.device)
        return apply_keep(x, keep, scale)
    return _Dropout.apply(x, p)


def cpu_relu_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """dropout(relu(x), p) with the memory of one tensor (the output); p may be 0 (evaluation: relu alone)."""
    if torch.compiler.is_compiling():
        y = torch.relu(x)
        return cpu_dropout(y, p) if p > 0 else y
    if not torch.is_grad_enabled() or not x.requires_grad:
        y = torch.relu(x)
        if p > 0:
            keep, scale = keep_mask(x.shape, p, x.device)
            y = apply_keep(y, keep, scale, inplace=True)
        return y
    return _ReLUDropout.apply(x, p)
