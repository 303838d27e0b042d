"""The kernel registry: the model files hold the maths and look up faster implementations of a few operations here,
by (operation, device type), in the manner of transformers' `ALL_ATTENTION_FUNCTIONS`.

`kernel(operation, device_type)` returns the registered function, or None where there is none (or inside
`reference_only()`): the caller then runs its reference. `attention_kernel(...)` is the one lookup of the attention,
with the policy below. Every kernel is tested against its reference, forward and backward (tests/test_kernels.py and
the files it names; on CUDA, benchmarks/gpu_check.py section (a)).

Kernel files are named `<operation>_<backend>.py`, next to `<operation>.py` (the module and its plain-torch reference):
`_cpu` holds autograd nodes registered for the CPU only, `_fused` plain-torch autograd nodes for every device, `_sdpa`
torch's scaled_dot_product_attention (every device), `_triton` Triton code (CUDA; the CPU under TRITON_INTERPRET=1).

| operation | reference (plain torch) | kernel, device types |
|---|---|---|
| layer_norm | `layer_norm.LayerNorm` (`nn.LayerNorm`) | `layer_norm_cpu.output_saving_layer_norm` (backward reads the output), cpu |
| dropout, relu_dropout | `dropout.dropout` (`F.dropout`, of `F.relu`) | `dropout_cpu.cpu_dropout`, `cpu_relu_dropout` (15-bit masks, bool saved), cpu |
| relative_attention.fused | `relative_attention.relative_attention` | `relative_attention_cpu.fused_relative_attention`, cpu |
| relative_attention.sdpa | same | `relative_attention_sdpa.sdpa_relative_attention`, every device |
| relative_attention.triton | same | `relative_attention_triton.triton_relative_attention` (flash-style), cuda; cpu under TRITON_INTERPRET=1 |
| biased_attention.fused / .sdpa | `relative_attention.masked_softmax_attention` | `relative_attention_cpu.fused_biased_attention`, cpu; `relative_attention_sdpa.sdpa_attention`, every device |
| two_stream_attention.triton | `two_stream_attention.two_stream_attention` | `two_stream_attention_triton.triton_two_stream_attention` (flash-style), cuda; cpu under TRITON_INTERPRET=1 |
| shifted_position_scores | `rel_shift((q + v) r^T)` | `position_scores_fused.shifted_position_scores` (one node, no padded copy), every device |
| position_product | `torch.matmul(q_v, r^T)` | `position_scores_fused.position_product` (per head, r never copied per row), every device |
| tied_table_gradient | - | `adaptive_softmax_fused.deferring_table_gradient`: a context for one LM forward in which the tied table's gradient is deferred to its lookup, every device |
| embedding, tied_output | the modules themselves | `adaptive_softmax_fused.embedding_lookup`, `tied_output_logits` (within that context), every device |
| adaptive_softmax_nll | `AdaptiveLogSoftmax.nll` | `adaptive_softmax_fused.shared_table_nll`, every device |
| adaptive_log_probs | `AdaptiveLogSoftmax.log_probs` | `adaptive_softmax_fused.full_log_probs` (one product, written once; greedy, top-k and beams: tails skipped), every device |
| greedy_decoding | - | `adaptive_softmax_fused.greedy_decoding`: a context in which `adaptive_log_probs` skips tails that cannot hold the argmax, every device |
| top_k_decoding | - | `adaptive_softmax_fused.top_k_decoding`: the same for a row's k best tokens (top-k sampling, beam search), cpu (on CUDA each skip decision is a host sync, and the whole product costs little; not measured there) |
| few_row_logits | `F.linear` | `adaptive_softmax_fused.few_row_logits`, cpu where torch's widest kernels are AVX2 (`few_rows_pay_off`) |

Attention policy (`attention_implementation`): the one place where the requested `attn_implementation` is not taken
literally.

| requested (`config._attn_implementation`) | where | runs |
|---|---|---|
| "eager", or `output_attentions` | everywhere | "eager": the reference, the only path that keeps the probabilities |
| "triton" | no attention dropout, triton installed, CUDA (CPU: TRITON_INTERPRET=1) | "triton" (XLNet's two streams: "sdpa" where query rows repeat a position) |
| "triton" elsewhere, "sdpa", or nothing | not the CPU | "sdpa" |
| the same | the CPU, with gradients or attention dropout, not under torch.compile | "fused" (OVERRIDES "sdpa") |
| the same | the CPU otherwise (no gradients and no dropout, or compiling) | "sdpa" |

Why the CPU override: SDPA's CPU backward is its unfused math path, which keeps several [B, H, T, K] tensors per layer;
the fused nodes keep none. With attention dropout and no gradients (reentrant activation checkpointing runs the forward
under no_grad, then again with gradients) both passes must draw the same masks, so they run the same kernel. Under
torch.compile the plain ops are traced and fused by the compiler instead.

Folders saved for `trust_remote_code` carry this file and every module it imports (transformers copies relative
imports), so they get the same kernels; the Triton one only where triton is installed.

Why a registry of our own rather than transformers' hub kernels (`use_kernel_forward_from_hub`,
`register_kernel_mapping`, `LocalLayerRepository`): those need the `kernels` package (not a dependency here), swap a
layer class's `forward` after `kernelize(model)`, and a local repository must be laid out as a built kernel package.
Ours are plain Python (autograd functions, Triton), several of them functions of many inputs with no layer to hang on
(the attention with its position term) or per-forward state (the deferred gradient of a tied table), and they must
work offline and in a remote-code folder.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Callable

import torch

from .adaptive_softmax_fused import (
    FEW_ROWS_PAY_OFF,
    deferring_table_gradient,
    embedding_lookup,
    few_row_logits,
    full_log_probs,
    greedy_decoding,
    shared_table_nll,
    tied_output_logits,
    top_k_decoding,
)
from .dropout_cpu import cpu_dropout, cpu_relu_dropout
from .layer_norm_cpu import output_saving_layer_norm
from .position_scores_fused import position_product, shifted_position_scores
from .relative_attention_cpu import fused_biased_attention, fused_relative_attention
from .relative_attention_sdpa import sdpa_attention, sdpa_relative_attention
from .relative_attention_triton import available as triton_available
from .relative_attention_triton import triton_relative_attention
from .two_stream_attention_triton import triton_two_stream_attention

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
    "two_stream_attention.triton": {"cuda": triton_two_stream_attention, "cpu": triton_two_stream_attention},
    "shifted_position_scores": {ANY: shifted_position_scores},
    "position_product": {ANY: position_product},
    "tied_table_gradient": {ANY: deferring_table_gradient},
    "embedding": {ANY: embedding_lookup},
    "tied_output": {ANY: tied_output_logits},
    "adaptive_softmax_nll": {ANY: shared_table_nll},
    "adaptive_log_probs": {ANY: full_log_probs},
    "greedy_decoding": {ANY: greedy_decoding},
    "top_k_decoding": {"cpu": top_k_decoding},
    "few_row_logits": {"cpu": few_row_logits} if FEW_ROWS_PAY_OFF else {},
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


# the names a user may request (`attn_implementation=...`): the plain maths, the default, and the Triton kernel
REQUESTABLE = ("eager", "sdpa", "triton")


def attention_implementation(requested: str | None, dropout_p: float, output_attentions: bool,
                             device_type: str = "cpu", streams: bool = False) -> str:
    """"eager", "fused", "sdpa" or "triton": the attention policy of the module docstring. `requested` is
    `config._attn_implementation`; `streams`: XLNet's two streams."""
    if requested == "eager" or output_attentions:
        return "eager"
    if requested == "triton" and dropout_p == 0 and triton_available(device_type):
        return "triton"
    if device_type != "cpu":
        return "sdpa"
    if (torch.is_grad_enabled() or dropout_p > 0) and not torch.compiler.is_compiling():
        return "fused"  # the CPU override (module docstring)
    return "sdpa"


def attention_kernel(requested: str | None, dropout_p: float, output_attentions: bool, device_type: str = "cpu",
                     streams: bool = False) -> tuple[str, Callable | None]:
    """The one lookup of the attention: (implementation, its kernel), the kernel None for "eager" (or where none is
    registered, or inside `reference_only()`): the caller then runs its reference. One stream's kernels are
    "relative_attention.*" (arguments of `relative_attention.relative_attention`), two streams' "biased_attention.*"
    (arguments of `relative_attention.masked_softmax_attention` with the score terms summed into one bias), or for
    "triton" "two_stream_attention.triton" (arguments of `two_stream_attention.two_stream_attention`)."""
    implementation = attention_implementation(requested, dropout_p, output_attentions, device_type, streams)
    if implementation == "eager":
        return implementation, None
    if streams:
        family = "two_stream_attention" if implementation == "triton" else "biased_attention"
    else:
        family = "relative_attention"
    return implementation, kernel(f"{family}.{implementation}", device_type)
