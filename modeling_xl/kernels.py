"""The kernel boundary: the model files hold the maths, and look up faster implementations of a few operations here,
by (operation, device type), in the manner of transformers' `ALL_ATTENTION_FUNCTIONS`.

`kernel(operation, device_type)` returns the registered function, or None where there is none (or inside
`reference_only()`): the caller then runs its reference. Every kernel is tested against its reference, forward and
backward (tests/test_kernels.py and the files it names; on CUDA, benchmarks/gpu_check.py section (a)).

| operation | reference (plain torch) | kernel, device types |
|---|---|---|
| layer_norm | `nn.LayerNorm` | `layer_norm.output_saving_layer_norm` (backward reads the output), cpu |
| dropout, relu_dropout | `F.dropout` (of `F.relu`) | `dropout.cpu_dropout`, `cpu_relu_dropout` (15-bit masks, bool saved), cpu |
| relative_attention.fused | `relative_attention.relative_attention` | `fused_attention.fused_relative_attention`, cpu |
| relative_attention.sdpa | same | `sdpa_attention.sdpa_relative_attention`, every device |
| relative_attention.triton | same | `triton_relative_attention` (flash-style, Triton), cuda; cpu under TRITON_INTERPRET=1 |
| biased_attention.fused / .sdpa | `relative_attention.masked_softmax_attention` | `fused_attention.fused_biased_attention`, cpu; `sdpa_attention.sdpa_attention`, every device |
| shifted_position_scores | `rel_shift((q + v) r^T)` | `fused_attention.shifted_position_scores` (one node, no padded copy), every device |
| position_product | `torch.matmul(q_v, r^T)` | `fused_attention.position_product` (per head, r never copied per row), every device |
| tied_table_gradient | - | `softmax_kernels.deferring_table_gradient`: a context for one LM forward in which the tied table's gradient is deferred to its lookup, every device |
| embedding, tied_output | the modules themselves | `softmax_kernels.embedding_lookup`, `tied_output_logits` (within that context), every device |
| adaptive_softmax_nll | `AdaptiveLogSoftmax.nll` | `softmax_kernels.shared_table_nll`, every device |
| adaptive_log_probs | `AdaptiveLogSoftmax.log_probs` | `softmax_kernels.full_log_probs` (one product, written once; greedy: tails skipped), every device |
| greedy_decoding | - | `softmax_kernels.greedy_decoding`: a context in which `adaptive_log_probs` skips tails that cannot hold the argmax, every device |
| few_row_logits | `F.linear` | `softmax_kernels.few_row_logits`, cpu |

Which attention variant runs is decided in one place, `relative_attention.attention_implementation` (device, gradients,
dropout, `attn_implementation`). Folders saved for `trust_remote_code` carry this file and every module it imports
(transformers copies relative imports), so they get the same kernels; the Triton one only where triton is installed.

Why a table of our own rather than transformers' hub kernels (`use_kernel_forward_from_hub`, `register_kernel_mapping`,
`LocalLayerRepository`): those need the `kernels` package (not a dependency here, and not on the GPU machine this
project is checked on), swap a layer class's `forward` after `kernelize(model)`, and a local repository must be laid
out as a built kernel package. Ours are plain Python (autograd functions, Triton), several of them functions of many
inputs with no layer to hang on (the attention with its position term) or per-forward state (the deferred gradient of
a tied table), and they must work offline and in a remote-code folder.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .dropout import cpu_dropout, cpu_relu_dropout
from .fused_attention import fused_biased_attention, fused_relative_attention, position_product, shifted_position_scores
from .layer_norm import output_saving_layer_norm
from .sdpa_attention import sdpa_attention, sdpa_relative_attention
from .softmax_kernels import (
    deferring_table_gradient,
    embedding_lookup,
    few_row_logits,
    full_log_probs,
    greedy_decoding,
    shared_table_nll,
    tied_output_logits,
)
from .triton_relative_attention import triton_relative_attention

ANY = "*"  # a kernel for every device type

REGISTRY: dict[str, dict[str, Callable]] = {
    "layer_norm": {"cpu": output_saving_layer_norm},
    "dropout": {"cpu": cpu_dropout},
    "relu_dropout": {"cpu": cpu_relu_dropout},
    "relative_attention.fused": {"cpu": fused_relative_attention},
    "relative_attention.sdpa": {ANY: sdpa_relative_attention},
    "relative_attention.triton": {"cuda": triton_relative_attention, "cpu": triton_relative_attention},
    "biased_attention.fused": {"cpu": fused_biased_attention},
    "biased_attention.sdpa": {ANY: sdpa_attention},
    "shifted_position_scores": {ANY: shifted_position_scores},
    "position_product": {ANY: position_product},
    "tied_table_gradient": {ANY: deferring_table_gradient},
    "embedding": {ANY: embedding_lookup},
    "tied_output": {ANY: tied_output_logits},
    "adaptive_softmax_nll": {ANY: shared_table_nll},
    "adaptive_log_probs": {ANY: full_log_probs},
    "greedy_decoding": {ANY: greedy_decoding},
    "few_row_logits": {"cpu": few_row_logits},
}

_REFERENCE_ONLY: ContextVar[bool] = ContextVar("reference_only", default=False)


def kernel(operation: str, device_type: str) -> Callable | None:
    """The kernel of `operation` for tensors on `device_type` (its own entry, else the one for every device), or None
    (no kernel, or inside `reference_only()`, which torch.compile does not see: it traces the kernels)."""
    if not torch.compiler.is_compiling() and _REFERENCE_ONLY.get():
        return None
    by_device = REGISTRY.get(operation)
    if by_device is None:
        raise KeyError(f"operation={operation!r} is not a kernel operation; expected one of {sorted(REGISTRY)}")
    return by_device.get(device_type, by_device.get(ANY))


def register_kernel(operation: str, device_type: str, function: Callable | None) -> None:
    """Set (or, with None, remove) the kernel of `operation` on `device_type` (`ANY` for every device): a kernel of
    your own for a device, taking the reference's arguments."""
    if operation not in REGISTRY:
        raise KeyError(f"operation={operation!r} is not a kernel operation; expected one of {sorted(REGISTRY)}")
    if function is None:
        REGISTRY[operation].pop(device_type, None)
    else:
        REGISTRY[operation][device_type] = function


@contextlib.contextmanager
def reference_only():
    """Within the block no kernel is found: every operation runs its plain reference (tests, debugging a kernel)."""
    token = _REFERENCE_ONLY.set(True)
    try:
        yield
    finally:
        _REFERENCE_ONLY.reset(token)


# ----------------------------------------------------------------------------------- layers that look a kernel up
def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """`F.dropout(x, p, training)`, by the "dropout" kernel where there is one."""
    if not training or p == 0.0:
        return x
    fast = kernel("dropout", x.device.type)
    return fast(x, p) if fast is not None else F.dropout(x, p, training=True)


def relu_dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """dropout(relu(x), p), by the "relu_dropout" kernel where there is one."""
    fast = kernel("relu_dropout", x.device.type)
    if fast is not None:
        return fast(x, p if training else 0.0)
    return dropout(F.relu(x), p, training)


class Dropout(nn.Module):
    """`nn.Dropout` (no parameters, same `p` attribute) whose forward is `dropout` above."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout p={p!r}; expected 0 <= p <= 1")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class LayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` (same parameters and state dict) whose forward is the "layer_norm" kernel where there is one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fast = kernel("layer_norm", x.device.type)
        return fast(self, x) if fast is not None else super().forward(x)
