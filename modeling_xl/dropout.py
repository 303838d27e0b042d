"""Dropout as the model files use it: `F.dropout`, or the "dropout" / "relu_dropout" kernel of `kernel_registry`
where one is registered for the tensor's device (on the CPU: `dropout_cpu`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .kernel_registry import kernel


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
