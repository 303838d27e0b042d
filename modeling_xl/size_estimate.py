"""How big a model a config describes, computed from the config alone, and a refusal of what cannot fit.

A `config.json` with `n_layer: 10**9` (or a huge `d_model`, `vocab_size`, `d_inner`, `n_head`) would otherwise be built
until the machine runs out of memory. Every model of this package checks its config before building a parameter
(`TransformerXLPreTrainedModel.__init__`, so `from_pretrained`, the converter and `pretrain.py --config_name` all
do), and pretraining checks the training footprint (weights, gradients and Adam's two moments) before that.

The limit is the memory available now (Linux's MemAvailable; the physical memory elsewhere). On a machine where that is the wrong measure (weights loaded straight to
accelerators, offloading), set `MODELING_XL_MAX_MEMORY` to a size (`"512GB"`, `"2TB"`, a number of bytes) or to
`"unlimited"` to switch the check off.

Example: `estimate_parameters(TransformerXLConfig.from_preset("tiny"))` is 1,406,658 for a built model of 1,422,914
parameters (the presets are within 1.2%, `debug` within 4%); `n_layer=10**9` of the same config is about 2.7e14
parameters, ~1 PB of float32, refused before anything is built.
"""

from __future__ import annotations

import os
import re

import torch

MEMORY_VARIABLE = "MODELING_XL_MAX_MEMORY"
_UNITS = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30,
          "TIB": 2**40}
TRAINING_COPIES = 4  # weights + gradients + Adam's first and second moments


class ModelTooLargeError(ValueError):
    """The config describes a model that cannot fit in this machine's memory."""


def cluster_dims(config) -> list[tuple[int, int]]:
    """(number of tokens, embedding width) per adaptive cluster (one cluster without cutoffs)."""
    bounds = [0, *config.cutoffs, config.vocab_size]
    sizes = [hi - lo for lo, hi in zip(bounds[:-1], bounds[1:])]
    if config.div_val == 1:
        return [(size, config.d_embed) for size in sizes]
    return [(size, max(1, config.d_embed // config.div_val**i)) for i, size in enumerate(sizes)]


def estimate_parameters(config) -> int:
    """Parameters of a model of `config` (the causal LM's; the permutation LM and the classifier differ by a few
    vectors per layer and their heads), from the fields alone: Python integers, so no size overflows."""
    d, inner = int(config.d_model), int(config.n_head) * int(config.d_head)
    clusters = cluster_dims(config)
    projected = any(width != d for _, width in clusters) or config.div_val != 1
    embedding = sum(size * width for size, width in clusters)
    projections = sum(d * width for _, width in clusters) if projected else 0
    output_bias = int(config.vocab_size) + (len(clusters) - 1) * (1 + int(config.d_embed))  # biases + cluster head
    untied = not getattr(config, "tie_word_embeddings", True)
    per_layer = (5 * d * inner  # q, k, v, relative-position and output projections
                 + 2 * d * int(config.d_inner) + int(config.d_inner) + d  # position-wise feed-forward
                 + 4 * d  # two LayerNorms
                 + (2 * inner if config.untie_r else 0))  # u, v biases per layer
    if config.attn_type == "bi":  # segment biases and embeddings of the permutation LM
        per_layer += 3 * inner
    shared = 0 if config.untie_r else 2 * inner
    return (embedding * (2 if untied else 1) + projections * (2 if untied else 1) + output_bias
            + int(config.n_layer) * per_layer + shared + d)


def memory_limit() -> int | None:
    """Bytes the model may take: `MODELING_XL_MAX_MEMORY` if set (None for "unlimited"), else the memory available
    now (`available_memory`)."""
    text = os.environ.get(MEMORY_VARIABLE)
    if text is not None:
        if text.strip().lower() in ("unlimited", "none", "0"):
            return None
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
        if match is None or match.group(2).upper() not in _UNITS:
            raise ValueError(f"{MEMORY_VARIABLE}={text!r} is invalid; expected a size such as '512GB', '2TB', a "
                             "number of bytes, or 'unlimited'")
        return int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    return available_memory()


def available_memory() -> int | None:
    """Memory a new allocation can take now: Linux's MemAvailable (free memory plus what the kernel can reclaim),
    else the physical memory, else None (nothing to compare with)."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows)
        return None


def check_model_fits(config, dtype: torch.dtype | None = None, training: bool = False) -> int:
    """ModelTooLargeError (naming the fields, the estimate and the limit) when the model of `config` (its weights;
    with `training`, also gradients and Adam's moments) needs more than `memory_limit()`. Returns the estimate."""
    parameters = estimate_parameters(config)
    dtype = dtype or getattr(config, "dtype", None) or torch.get_default_dtype()
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, torch.float32)
    element = torch.empty((), dtype=dtype).element_size() if isinstance(dtype, torch.dtype) else 4
    needed = parameters * element * (TRAINING_COPIES if training else 1)
    limit = memory_limit()
    if limit is not None and needed > limit:
        what = "training it (weights, gradients, Adam's two moments)" if training else "its weights"
        raise ModelTooLargeError(
            f"the config (n_layer={config.n_layer}, d_model={config.d_model}, n_head={config.n_head}, d_head="
            f"{config.d_head}, d_inner={config.d_inner}, vocab_size={config.vocab_size}) describes a model of about "
            f"{parameters:,} parameters; {what} would take about {_size(needed)}, more than the {_size(limit)} "
            f"available on this machine; expected a config that fits, or {MEMORY_VARIABLE}=<size>|unlimited to allow it on a "
            "machine where it does")
    return parameters


def _size(n: int) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,} bytes"
