"""torch's CPU kernel sets (`ATEN_CPU_CAPABILITY`) as the suite uses them: which ones this processor runs, and one
Inductor cache per set (docs/testing.md, "CPU kernel sets")."""

import getpass
import os
import tempfile

import torch


def available_capabilities() -> list[str]:
    """The ATEN_CPU_CAPABILITY values this processor runs: `default` (scalar) always, and on x86 `avx2` and `avx512`
    where it has them (torch does not check the variable: a kernel set the processor lacks dies of SIGILL)."""
    capabilities = ["default"]
    if hasattr(torch.cpu, "_is_avx2_supported") and torch.cpu._is_avx2_supported():
        capabilities.append("avx2")
    if hasattr(torch.cpu, "_is_avx512_supported") and torch.cpu._is_avx512_supported():
        capabilities.append("avx512")
    return capabilities


def inductor_cache_dir(capability: str) -> str:
    """An Inductor cache folder for one kernel set. Inductor's compiled-graph cache does not key its entries on the
    kernel set (torch 2.13): a graph compiled under one ATEN_CPU_CAPABILITY is reused under another, its C++ then
    built with the other set's flags (AVX2 kernels under `default`: "'at::vec' has not been declared")."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (some containers)
        user = str(os.getuid())
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{user}_{capability.lower()}")
