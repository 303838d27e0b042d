"""LayerNorm as the model files use it: `nn.LayerNorm`, or the "layer_norm" kernel of `kernel_registry` where one is
registered for the tensor's device (on the CPU: `layer_norm_cpu`, whose backward reads the output)."""

from __future__ import annotations

import torch
from torch import nn

from .kernel_registry import kernel


class LayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` (same parameters and state dict) whose forward is the "layer_norm" kernel where there is one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fast = kernel("layer_norm", x.device.type)
        return fast(self, x) if fast is not None else super().forward(x)
