"""Shared helpers of the benchmarks: timing, peak memory, WikiText-2 batches, matmul rate, tables and JSON.

This file must import under both interpreters the benchmarks use (our /work/venv and the legacy transformers-4.35
venv), so it depends on torch and the standard library only.

Peak memory. Each measurement runs in a fresh subprocess (`run_worker`). After the model and the batches exist, the
worker resets the kernel's resident-set high-water mark (`echo 5 > /proc/self/clear_refs`, Linux >= 4.0) and records
the current RSS as the baseline; after the measured steps the peak is `VmHWM - baseline` from /proc/self/status: the
extra memory of training (activations, gradients, optimizer state, allocator slack), with the weights and data
excluded. Where clear_refs cannot be written, `resource.getrusage(RUSAGE_SELF).ru_maxrss` minus the baseline is used
(its mark cannot be reset, so a transient peak while loading would hide a smaller training peak; the JSON says which
method ran). RSS counts what the process really touches, which is what the legacy model and ours both pay, whatever
allocator sits below; torch has no CPU allocator statistics in this version.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
WIKITEXT2_TRAIN = DATA / "wikitext-2" / "train.txt"
OUR_PYTHON = sys.executable
DEFAULT_THREADS = 2


# ----------------------------------------------------------------------------------------------------------------- time
def set_threads(n: int = DEFAULT_THREADS) -> None:
    torch.set_num_threads(n)


ALLOCATORS = ("keep", "default")


def add_allocator_option(parser) -> None:
    """`--allocator` of a benchmark script (default "keep"), to hand to `use_allocator`."""
    parser.add_argument("--allocator", default="keep", choices=ALLOCATORS,
                        help="host memory allocator of every measured process, the same for both sides: 'keep' "
                             "(glibc keeps freed memory, modeling_xl/runtime/host_memory.py, as pretraining and "
                             "fine-tuning on the CPU set it) or 'default' (glibc's own thresholds)")


def use_allocator(name: str) -> None:
    """Apply `name` (one of ALLOCATORS) to this process before anything is built. "keep" runs the project's own
    `modeling_xl/runtime/host_memory.py`, loaded by its path, so that the legacy interpreter (which does not have the
    project installed) applies the very same setting."""
    if name not in ALLOCATORS:
        raise ValueError(f"allocator={name!r}; expected one of {ALLOCATORS}")
    if name == "keep":
        path = REPO / "modeling_xl" / "runtime" / "host_memory.py"
        spec = importlib.util.spec_from_file_location("host_memory", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        why_not = module.keep_freed_memory()
        if why_not is not None:
            raise RuntimeError(f"allocator='keep' could not be applied here: {why_not}; run with --allocator default")


def timed(fn, repeats: int, warmup: int = 1) -> list[float]:
    """Wall seconds of `repeats` calls of `fn` after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def summary(times: list[float]) -> dict:
    """Median and spread of repeated timings (the spread shows the noise of a shared machine)."""
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "n": len(times),
        "rel_spread": (max(times) - min(times)) / statistics.median(times),
    }


# --------------------------------------------------------------------------------------------------------------- memory
def _status_kib(field: str) -> int | None:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


class PeakMemory:
    """Peak extra resident memory (bytes) between `start()` and `stop()`; see the module docstring."""

    def __init__(self):
        self.method = "VmHWM after clear_refs"
        self.baseline = 0

    def start(self) -> None:
        import gc

        gc.collect()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            self.method = "ru_maxrss (high-water mark not resettable)"
        self.baseline = _status_kib("VmRSS") * 1024

    def stop(self) -> int:
        if self.method.startswith("VmHWM"):
            peak = _status_kib("VmHWM") * 1024
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(peak - self.baseline, 0)


# ---------------------------------------------------------------------------------------------------------------- data
def word_level_ids(vocab_size: int, max_tokens: int | None = None, path: Path = WIKITEXT2_TRAIN) -> torch.Tensor:
    """The first `max_tokens` words of WikiText-2 train (all of it by default) as word ids: whitespace split plus
    `<eos>` at each line end (the paper's corpus reader), ids sorted by frequency over the whole file (a real
    vocabulary, what the adaptive softmax cutoffs expect), words past `vocab_size - 1` mapped to `<unk>`.

    The vocabulary comes from the whole file whatever `max_tokens` is: with cutoffs 2k/10k/20k, 22% of the tokens of
    a benchmark batch fall in the tail clusters, as in training. (Until 2026-11-25 it was counted over the returned
    words only, so a short benchmark stream used ids below about 2,500 and the tail clusters almost never ran: 0.3%
    of the `d256` preset's tokens; figures measured before then say so.)
    Written with torch alone (not `tokenization.word_level`) because this module also runs in the legacy interpreter,
    which does not have the project installed."""
    words = _wikitext_words(str(path))
    counts = Counter(words)
    counts.pop("<unk>", None)
    vocab = ["<unk>"] + [w for w, _ in counts.most_common(vocab_size - 1)]
    index = {w: i for i, w in enumerate(vocab)}
    return torch.tensor([index.get(w, 0) for w in words[:max_tokens]], dtype=torch.long)


@functools.lru_cache(maxsize=2)
def _wikitext_words(path: str) -> tuple[str, ...]:
    words = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            tokens = line.split()
            if tokens:
                words.extend(tokens)
                words.append("<eos>")
    return tuple(words)


def stream_segments(ids: torch.Tensor, batch: int, tgt_len: int, n_segments: int) -> list[torch.Tensor]:
    """Cut the stream into `batch` contiguous rows and return `n_segments` consecutive [batch, tgt_len + 1] windows
    (the +1 overlaps the next window: inputs and shifted labels of one segment; row b of segment s+1 continues row b
    of segment s, so the memory stays meaningful)."""
    need = batch * (n_segments * tgt_len + 1)
    if ids.numel() < need:
        raise ValueError(f"ids has {ids.numel()} tokens; expected at least {need} for {n_segments} segments")
    rows = ids[:need].view(batch, -1)
    return [rows[:, s * tgt_len : (s + 1) * tgt_len + 1].clone() for s in range(n_segments)]


# ------------------------------------------------------------------------------------------------------------- matmul
def matmul_flops(n: int = 2048, repeats: int = 5) -> dict:
    """Float32 FLOP/s of torch.mm on two n x n matrices (2 n^3 per product), median of `repeats`."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    times = timed(lambda: torch.mm(a, b), repeats, warmup=2)
    stats = summary(times)
    stats["flops_per_s"] = 2 * n**3 / stats["median_s"]
    stats["n"] = n
    return stats


def counted_matmul_flops(fn) -> int:
    """Matrix-product FLOPs of calling `fn()` (torch.utils.flop_counter.FlopCounterMode): what the code really
    multiplies, wasted work included."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


MATMUL_OPS = ("mm", "bmm", "addmm", "baddbmm")


def recorded_matmuls(fn) -> Counter:
    """The matrix products of calling `fn()`, forward and backward: Counter of (op name, ((shape, stride, dtype) of
    each tensor argument, the out= tensor included), the other arguments) -> calls."""
    from torch.utils._python_dispatch import TorchDispatchMode

    def describe(x):
        if isinstance(x, torch.Tensor):
            return ("tensor", tuple(x.shape), tuple(x.stride()), str(x.dtype).removeprefix("torch."))
        return x

    calls = Counter()

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__
            if name in MATMUL_OPS:
                calls[(name, tuple(describe(a) for a in args), tuple(sorted((k, describe(v))
                                                                         for k, v in kwargs.items())))] += 1
            return func(*args, **kwargs)

    with Recorder():
        fn()
    return calls


def replayed_matmul_seconds(calls: Counter, repeats: int = 5, min_seconds: float = 0.02) -> dict:
    """Each recorded product alone, at its own shapes, strides and dtype, on random inputs: the time the step's matrix
    products take by themselves (every other operation free, every product at the rate of its own shape). Per
    signature the median of `repeats` timings of a loop of at least `min_seconds`; returns total seconds (calls
    counted), the number of calls and of distinct signatures, and the five costliest."""

    def make(desc):
        if not (isinstance(desc, tuple) and desc[:1] == ("tensor",)):
            return desc
        _, shape, stride, dtype = desc
        extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride) if n > 0)
        return torch.randn(extent, dtype=getattr(torch, dtype)).as_strided(shape, stride)

    costs = []
    for (name, args, kwargs), count in calls.items():
        op = getattr(torch.ops.aten, name)
        real_args, real_kwargs = [make(a) for a in args], {k: make(v) for k, v in kwargs}
        call = lambda: op(*real_args, **real_kwargs)  # noqa: E731
        estimate = min(timed(call, 3, warmup=1))
        loops = max(1, math.ceil(min_seconds / max(estimate, 1e-7)))
        per_call = statistics.median(timed(lambda: [call() for _ in range(loops)], repeats, warmup=0)) / loops
        shapes = [a[1] for a in args if isinstance(a, tuple) and a[:1] == ("tensor",)]
        costs.append((per_call * count, count, name, shapes))
    costs.sort(key=lambda c: c[0], reverse=True)
    return {"seconds": sum(c[0] for c in costs), "calls": sum(calls.values()), "signatures": len(calls),
            "costliest": [{"seconds": c[0], "calls": c[1], "op": c[2], "shapes": c[3]} for c in costs[:5]]}


# ------------------------------------------------------------------------------------------------------- subprocesses
def run_worker(python: str, script: str | Path, args: dict, timeout: int = 1800) -> dict:
    """Run `python script --args JSON` in a fresh process and return the JSON of its last stdout line (OpenMP / MKL
    start at DEFAULT_THREADS threads; a worker given `threads` sets its own count with `set_threads`)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(DEFAULT_THREADS), MKL_NUM_THREADS=str(DEFAULT_THREADS),
               TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(script).resolve().parent), env.get("PYTHONPATH", "")])
    proc = subprocess.run([python, str(script), "--args", json.dumps(args)], capture_output=True, text=True,
                          env=env, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{python} {script} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_script(command: list, what: str) -> float:
    """Run one of the project's scripts (`command`, output captured) and return its wall-clock seconds; RuntimeError
    naming `what`, with the end of its stderr, if it fails."""
    start = time.perf_counter()
    proc = subprocess.run([str(part) for part in command], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def worker_args() -> dict:
    """The JSON dict a worker was started with (`--args`)."""
    return json.loads(sys.argv[sys.argv.index("--args") + 1])


def emit(result: dict) -> None:
    """A worker's answer: one JSON line on stdout."""
    print(json.dumps(result), flush=True)


# ---------------------------------------------------------------------------------------------------------- reporting
def print_table(headers: list[str], rows: list[list]) -> str:
    """Markdown table of `rows`; numbers formatted compactly. Returns the text (also printed)."""

    def fmt(x):
        if isinstance(x, float):
            return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"
        return str(x)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def write_marker(path: str | Path, payload) -> None:
    """`payload` as JSON in `path`, whole or not at all (a temporary file beside it, then renamed): a result file whose
    existence says that a piece of work is done must never be left half-written by a killed process."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(payload, indent=1))
    os.replace(temporary, path)


def write_json(path: str | Path, payload: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = dict(payload, machine=machine_description())
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path}", flush=True)


def machine_description() -> dict:
    model = "unknown"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                     model)
    except OSError:
        pass
    return {"cpu": model, "cpu_count": os.cpu_count(), "threads": DEFAULT_THREADS, "torch": torch.__version__,
            "load_avg_at_end": os.getloadavg()}


def median_of(results: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in results)
