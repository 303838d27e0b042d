"""Checks of the backbones' inputs (`check_inputs`: shapes, dtypes, memory) and of input values (token ids in range,
0/1 masks) that work in eager mode and inside `torch.compile`.

Eager, on the CPU: the condition is read on the host and a failure raises `ValueError` naming the argument, the bad
value and what was expected. Compiled: reading a tensor on the host (`bool()`, `.item()`) breaks the graph, so the
check becomes `torch._assert_async` inside the graph instead: the compiled step raises `RuntimeError` with the same
text less the bad value (on CPU), or stops on a device-side assert (on CUDA), before the optimizer steps. On a GPU
(eager too) the check is `torch._assert_async` as well: reading the answer on the host would make every step wait
for the device; a bad id stops the run with a device-side assert instead of a `ValueError` (an id out of range would
stop it in the embedding lookup anyway).
"""

from __future__ import annotations

from typing import Callable

import torch


def require(condition: torch.Tensor, message: str, detailed: Callable[[], str] | None = None) -> None:
    """Raise unless every element of the boolean tensor `condition` is true. `message` names the argument and what
    was expected; in eager mode `detailed()`, when given, builds the error instead (it may read the offending value).
    """
    if torch.compiler.is_compiling() or condition.device.type not in ("cpu", "meta"):
        torch._assert_async(condition.all(), message)
        return
    if not bool(condition.all()):
        raise ValueError(message if detailed is None else detailed())


def ids_in_range(ids: torch.Tensor, vocab_size: int, ignore_index: int | None = None) -> torch.Tensor:
    """Boolean tensor: each id is in [0, vocab_size) (or equals `ignore_index`)."""
    inside = (ids >= 0) & (ids < vocab_size)
    return inside if ignore_index is None else inside | (ids == ignore_index)


def extreme_id(ids: torch.Tensor) -> int:
    """The id an out-of-range error shows: the lowest when it is negative, else the highest."""
    low = int(ids.min())
    return low if low < 0 else int(ids.max())


def check_inputs(config, input_ids: torch.Tensor | None, inputs_embeds, mems, dtype: torch.dtype | None = None,
                 attention_mask: torch.Tensor | None = None) -> tuple[int, int]:
    """Validate the backbone inputs; returns (B, T). Errors name the argument, the value and what was expected.

    `dtype`: the model's; `inputs_embeds` must have it (no silent rounding). Memory of another floating dtype is
    converted to the model's (`memory_like`: a float32 run's memory continues in bfloat16); integer memory, a `None`
    entry and more positions than `config.mem_len` are errors. `attention_mask` holds 0/1 (or booleans)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("expected exactly one of input_ids and inputs_embeds")
    x = input_ids if input_ids is not None else inputs_embeds
    if x.dim() != (2 if input_ids is not None else 3):
        name = "input_ids" if input_ids is not None else "inputs_embeds"
        expected = "[batch, seq_len]" if input_ids is not None else "[batch, seq_len, d_model]"
        raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {expected}")
    batch, length = x.shape[:2]
    if batch == 0 or length == 0:
        raise ValueError(f"input has shape {tuple(x.shape)}; expected a non-empty batch and sequence")
    if inputs_embeds is not None:
        if inputs_embeds.size(-1) != config.d_model:
            raise ValueError(f"inputs_embeds has shape {tuple(inputs_embeds.shape)}; expected [batch, seq_len, "
                             f"d_model={config.d_model}]")
        if dtype is not None and inputs_embeds.dtype != dtype:
            raise ValueError(f"inputs_embeds has dtype {inputs_embeds.dtype}; expected the model's dtype {dtype} "
                             "(convert with inputs_embeds.to(model.dtype))")
    if attention_mask is not None and attention_mask.numel():
        expected = "expected 1 for real tokens and 0 for padding"
        require((attention_mask == 0) | (attention_mask == 1), f"attention_mask holds other values; {expected}",
                lambda: f"attention_mask holds {sorted({float(v) for v in attention_mask.unique()[:6].tolist()})}; "
                        f"{expected}")
    if input_ids is not None:
        if input_ids.dtype not in (torch.long, torch.int):
            raise ValueError(f"input_ids has dtype {input_ids.dtype}; expected integer token ids (torch.long or "
                             "torch.int)")
        expected = f"expected token ids in [0, vocab_size={config.vocab_size})"
        require(ids_in_range(input_ids, config.vocab_size), f"input_ids has ids outside the vocabulary; {expected}",
                lambda: f"input_ids contains {extreme_id(input_ids)}; {expected}")
    if mems is not None:
        if len(mems) != config.n_layer:
            raise ValueError(f"mems has {len(mems)} tensors; expected one per layer (n_layer={config.n_layer})")
        for i, m in enumerate(mems):
            if not isinstance(m, torch.Tensor):
                raise ValueError(f"mems[{i}] is {type(m).__name__}; expected a tensor [batch, mem_len, d_model] per "
                                 "layer (the mems a forward returned), or mems=None for no memory")
            if not m.is_floating_point():
                raise ValueError(f"mems[{i}] has dtype {m.dtype}; expected floating-point hidden states (the mems a "
                                 "forward returned)")
            if m.dim() == 3 and m.size(1) > config.mem_len:
                raise ValueError(f"mems[{i}] holds {m.size(1)} positions; expected at most mem_len="
                                 f"{config.mem_len} (set model.config.mem_len to use a longer memory)")
        mlen = mems[0].size(1) if mems[0].dim() == 3 else -1
        for i, m in enumerate(mems):
            if m.dim() != 3 or m.size(0) != batch or m.size(1) != mlen or m.size(2) != config.d_model:
                raise ValueError(
                    f"mems[{i}] has shape {tuple(m.shape)}; expected [batch={batch}, mem_len={mlen} (same for every "
                    f"layer), d_model={config.d_model}]"
                )
    return batch, length
