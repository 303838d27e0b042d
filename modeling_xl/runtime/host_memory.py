"""Host memory: freed CPU memory kept in the process for the next allocation, as a caching allocator keeps GPU memory.

glibc's malloc serves a request above its mmap threshold (128 KiB at first, raised as large blocks are freed, to at
most 32 MiB) with fresh pages from the kernel and unmaps them when the block is freed; free space at the top of its
heap beyond the trim threshold goes back to the kernel too. A tensor of that size made at every training step, such
as the tied [V, d] table's gradient (34 MB for a 33,278-word vocabulary at width 256), is then page-faulted in, one
page at a time, at every step (figures: benchmarks/README.md, "Host memory"). With both thresholds at 1 GiB malloc
keeps what is freed and hands it out again; the resident size stays at its high-water mark. A block of exactly a
freed block's size may still come from the top of the heap: torch allocates with posix_memalign, which asks for the
block plus its alignment, more than the freed chunk holds; in training the page faults per step still fell from
about 13,000 to about 1,000 (docs/pretraining.md, "Host memory on the CPU").

Process-wide: importing the package changes nothing. The training loops of pretraining and fine-tuning apply it on
the CPU right before their first step (`runs.keep_freed_host_memory`), after the data, the model and a resumed
checkpoint exist, whose one-off peaks thus stay out of the kept memory; the build workers of `data.text_file_build`
and the benchmark workers (both sides of a comparison) apply it too. The user's own settings of these thresholds
(`MALLOC_*_` variables or `glibc.malloc` tunables in the environment, read by glibc at startup) are left as they are.
"""

from __future__ import annotations

import ctypes
import os
import platform

THRESHOLD_BYTES = 1 << 30
# mallopt(3) parameters set here, with the environment variables and tunables that set the same from outside
OPTIONS = {"M_MMAP_THRESHOLD": -3, "M_TRIM_THRESHOLD": -1}
USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
USER_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold", "glibc.malloc.top_pad",
                 "glibc.malloc.mmap_max")


def user_malloc_settings() -> list[str]:
    """Where the environment holds the user's own setting of what `keep_freed_memory` changes: variable names, and
    `GLIBC_TUNABLES` with the tunables it sets."""
    found = [name for name in USER_VARIABLES if name in os.environ]
    tunables = [item.split("=")[0] for item in os.environ.get("GLIBC_TUNABLES", "").split(":")]
    own = [name for name in USER_TUNABLES if name in tunables]
    return found + ([f"GLIBC_TUNABLES ({', '.join(own)})"] if own else [])


def keep_freed_memory() -> str | None:
    """Raise glibc's mmap and trim thresholds to 1 GiB in this process (see the module docstring). Returns None once
    done, else why not (one line, for a log): not glibc, the user's own settings, or a threshold glibc refused (older
    releases cap the mmap threshold at 32 MiB)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return f"the C library is not glibc ({platform.system()}, {platform.libc_ver()[0] or 'unknown'})"
    own = user_malloc_settings()
    if own:
        return f"the environment sets it already: {', '.join(own)}"
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError as error:
        return f"libc.so.6 could not be loaded ({error})"
    for name, option in OPTIONS.items():
        if libc.mallopt(option, THRESHOLD_BYTES) != 1:
            return f"mallopt({name}, 1 GiB) was refused (older glibc releases cap the mmap threshold at 32 MiB)"
    return None
