"""Host memory: freed CPU memory kept in the process for the next allocation, as a caching allocator keeps GPU memory.

glibc's malloc serves a request above its mmap threshold (128 KiB, raised as large blocks are freed, to at most
32 MiB) with fresh pages from the kernel and hands them back when the block is freed; freed heap memory above its trim
threshold goes back to the kernel too. A tensor of that size made at every training step, such as the gradient of the
tied [V, d] table (34 MB at the d256 benchmark shape, 61 MB at `wide`), is then page-faulted in, one 4 KiB page at a
time, at every step: 8,300 and 16,000 page faults per step measured, 4% and 11% of the step
(benchmarks/README.md, "Host memory"). With both thresholds at 1 GiB, malloc keeps what was freed and hands it out
again. The resident size stays at its high-water mark, which a training process reaches at every step anyway.

The setting is process-wide, so only the programs that own their process apply it: pretraining and fine-tuning on the
CPU, the build workers of `data.text_file_build`, and the benchmark workers (for both sides of a comparison).
Importing the package changes nothing. A user's own glibc malloc settings (`MALLOC_*_` variables or `glibc.malloc`
tunables in the environment, read by glibc at startup) are left as they are.
"""

from __future__ import annotations

import ctypes
import os
import platform

# mallopt(3) parameters and the value given to both
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
THRESHOLD_BYTES = 1 << 30


def user_malloc_settings() -> list[str]:
    """The environment variables that hold the user's own glibc malloc settings."""
    names = [name for name in os.environ if name.startswith("MALLOC_") and name.endswith("_")]
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        names.append("GLIBC_TUNABLES")
    return names


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds to 1 GiB in this process (see the module docstring). Returns whether it
    did: False where the C library is not glibc or the environment already holds the user's own malloc settings."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if user_malloc_settings():
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return all(libc.mallopt(option, THRESHOLD_BYTES) == 1 for option in (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD))
