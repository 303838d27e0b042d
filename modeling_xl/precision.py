"""Precision of the steps that must not run in a 16-bit type (softmax, log-softmax, cross-entropy)."""

from __future__ import annotations

import torch


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """`x` in float32, or as it is when already float32 or float64 (a float64 model keeps its precision)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))
