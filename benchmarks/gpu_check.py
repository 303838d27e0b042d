"""The GPU check: every kernel against its reference, mixed-precision training, throughput, long-memory evaluation and
generation on one CUDA device (no network, no `datasets`/`evaluate`).

    python benchmarks/gpu_check.py --output $OUT/gpu_check.json     # on a GPU machine
    python benchmarks/gpu_check.py --dry-run                          # the same code paths on the CPU at toy sizes

One command ends within a device command's 9 minutes: no section, and within (c) and (e) no side, starts after
`--budget-s` (420 s); the table names what it skipped. All of it takes longer than that on one H200 (section (a)
alone spends about 150 s compiling Triton kernels), so run the rest in a second command, e.g. `--sections ac` then
`--sections edb`. Within (c) and (e) the items run in the order of their worth: references and defaults first.

Sections (each runs on its own: a failure is recorded in the table and the JSON, and the next section runs):
  (a) kernels: the relative attention's implementations ("sdpa", "triton") against the reference
      (`relative_attention.relative_attention`, computed in float64 from the same inputs) in fp32 / bf16 / fp16,
      output and every input's gradient, relative to the reference's largest entry; the adaptive softmax's training
      NLL (custom autograd nodes; under autocast for bf16 / fp16) against the plain log-softmax; whole models
      (causal LM, permutation LM) against their eager runs, loss and gradients.
  (b) `tiny` trained for 300 steps in fp32, bf16 (autocast) and fp16 (autocast + GradScaler; tiny has div_val 2) on
      the same token stream (the Python standard library's `pydoc_data` help text, word level): the mean loss of the
      last 50 steps of each must lie within 3% of fp32's, and every 20-step mean within 5%.
  (c) training tokens/s, peak memory and MFU at `wt103-base` sizes (batch 32, tgt 192, mem 192, bf16 autocast,
      Adam, clip 0.25): ours for each attention path ("eager", "sdpa", "triton"; "sdpa" also in fp32 with TF32),
      our permutation LM (SDPA; and the Triton two-stream kernel, which has no attention dropout, with dropatt 0)
      and transformers' XLNet at equal size (vocabulary 32,000, seq 192, reuse 96, 32 predictions), GPT-2 at equal
      size (full softmax over the same 267,735 words, 192 positions). Token ids are Zipf-distributed (s = 1) over the
      vocabulary. MFU = counted matrix-product FLOPs of one step
      (FlopCounterMode; ours on its "sdpa" path, which the Triton path equals in maths) x tokens/s / the bf16 rate of
      an 8192^3 torch.mm measured in this run. NVIDIA's A100 anchor: 59,961 tokens/s (AMP), 41,527 (TF32).
  (d) evaluation at tgt 128 / mem 1600 / clamp 1000, same_length (the paper's wt103-large setting, on the
      wt103-base model), batch 8, bf16: tokens/s and peak memory above the model and memory, for "sdpa" and "triton",
      and the same at mem 400 and 800 (peak memory against mem_len: its slope).
  (e) generation tokens/s, batch 1 and 8, 200 new tokens after 16: greedy and top-k 40 sampling, ours (the shape of
      benchmarks/bench_generate.py) against GPT-2 of the same depth, width and vocabulary, fp32.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import numpy as np

if "--dry-run" in sys.argv:  # before triton is imported anywhere: its kernels run under the interpreter on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Sizes of the real check and of the dry run (same code, toy shapes).
SIZES = {
    "real": dict(train_steps=300, train_batch=16, train_tgt=64, tail=50, window=20,
                 wt_batch=32, wt_tgt=192, wt_mem=192, warm=3, timed=10,
                 plm_vocab=32000, plm_seq=192, plm_reuse=96, plm_predict=32,
                 eval_batch=8, eval_tgt=128, eval_mems=(400, 800, 1600), eval_clamp=1000, eval_segments=4,
                 gen_batches=(1, 8), gen_new=(200, 1000), gen_prompt=16, gen_calls=2, matmul_n=8192),
    "dry": dict(train_steps=6, train_batch=4, train_tgt=16, tail=2, window=2,
                wt_batch=2, wt_tgt=16, wt_mem=16, warm=1, timed=1,
                plm_vocab=120, plm_seq=32, plm_reuse=16, plm_predict=5,
                eval_batch=2, eval_tgt=8, eval_mems=(8, 16), eval_clamp=12, eval_segments=1,
                gen_batches=(1, 2), gen_new=(3, 6), gen_prompt=4, gen_calls=1, matmul_n=256),
}
# model shapes of the dry run: wt103-base's structure (three tail clusters, div_val 1) at toy width
DRY_WT103 = dict(vocab_size=300, d_model=32, d_embed=32, n_layer=2, n_head=2, d_head=16, d_inner=64,
                 cutoffs=[20, 40, 200], div_val=1)
TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 4e-2, torch.float16: 8e-3}  # relative to the reference's max
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


class Check:
    """Collects the table rows and the JSON of the run; `section` runs one part and records a failure instead of
    stopping."""

    def __init__(self, device: torch.device, dry: bool, deadline: float | None = None):
        self.device, self.dry, self.rows, self.results = device, dry, [], {}
        self.deadline = deadline  # perf_counter time after which no section or timed item starts (--budget-s)

    def row(self, section, item, metric, value, note=""):
        self.rows.append([section, item, metric, value, note])
        print(" | ".join(map(str, self.rows[-1])), flush=True)  # kept in the log if the command is cut short

    def spent(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def budgeted(self, section: str, item: str, fn):
        """`fn()`, or None and a SKIPPED row when --budget-s is spent: the items of a section run in the order of
        their worth, so that a slow machine loses the last ones, not the whole section."""
        if self.spent():
            self.row(section, f"SKIPPED {item}", "--budget-s spent", "")
            return None
        return fn()

    def section(self, name: str, fn) -> None:
        if self.spent():
            self.results[name] = {"skipped": "--budget-s spent before this section"}
            self.row(name, "SKIPPED", "--budget-s spent", "")
            return
        begin = time.perf_counter()
        try:
            self.results[name] = fn(self)
        except Exception as error:  # recorded; the other sections still run
            self.results[name] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
            self.row(name, "FAILED", type(error).__name__, str(error)[:200])
            print(traceback.format_exc(), flush=True)
        finally:
            self.cleanup()
        self.results.setdefault("seconds", {})[name] = time.perf_counter() - begin
        print(f"[{name}] {time.perf_counter() - begin:.1f} s", flush=True)

    def cleanup(self):
        import gc

        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_reset(device) -> int:
    """Reset the peak counter; returns the bytes allocated now (0 on the CPU, where torch keeps no statistics)."""
    if device.type != "cuda":
        return 0
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def peak_since(device, baseline: int) -> float | None:
    """Peak bytes allocated above `baseline` since the last `peak_reset`, in MiB (None on the CPU)."""
    if device.type != "cuda":
        return None
    sync(device)
    return (torch.cuda.max_memory_allocated(device) - baseline) / 2**20


def autocast(device, dtype):
    return torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()


def zipf_ids(vocab_size: int, n: int, seed: int = 0) -> torch.Tensor:
    """`n` token ids with P(id) proportional to 1 / (id + 1) (Zipf, s = 1): a word-frequency-sorted vocabulary's
    shape, so the adaptive softmax's clusters see realistic shares."""
    weights = 1.0 / np.arange(1, vocab_size + 1)
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.choice(vocab_size, size=n, p=weights / weights.sum())).long()


def pydoc_word_ids(vocab_size: int) -> torch.Tensor:
    """The `pydoc_data` help topics of this Python as word ids (whitespace split, `<eos>` = 1 after each line, ids by
    frequency, `<unk>` = 0 past the vocabulary): real English text that every Python has."""
    import pydoc_data.topics

    words = []
    for topic in sorted(pydoc_data.topics.topics):
        for line in pydoc_data.topics.topics[topic].splitlines():
            if line.split():
                words += line.split() + ["<eos>"]
    counts = Counter(words)
    counts.pop("<eos>")
    vocab = {w: i + 2 for i, (w, _) in enumerate(counts.most_common(vocab_size - 2))}
    vocab["<eos>"] = 1
    return torch.tensor([vocab.get(w, 0) for w in words], dtype=torch.long)


# ---------------------------------------------------------------------------------------------------------- (a)
def attention_inputs(device, dtype, batch=2, heads=3, qlen=40, mlen=24, d_head=41, seed=0):
    gen = torch.Generator().manual_seed(seed)
    klen = qlen + mlen
    shapes = [(batch, heads, qlen, d_head), (batch, heads, klen, d_head), (batch, heads, klen, d_head),
              (heads, klen, d_head), (heads, d_head), (heads, d_head)]
    return [torch.randn(*s, generator=gen).to(device=device, dtype=dtype).requires_grad_() for s in shapes]


def attention_mask(kind, device, batch, qlen, mlen):
    from modeling_xl.relative_positions import causal_mask, with_key_padding

    if kind == "causal":
        return causal_mask(qlen, mlen, device=device)
    if kind == "same_length":
        return causal_mask(qlen, mlen, same_length=True, mem_len=mlen - 5, device=device)
    padding = torch.ones(batch, qlen, dtype=torch.long, device=device)
    padding[0, : qlen // 3] = 0
    return with_key_padding(causal_mask(qlen, mlen, device=device), padding, mlen)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).abs().max() / want.double().abs().max().clamp(min=1e-30))


def check_attention(check: Check, dtypes) -> dict:
    from modeling_xl.kernel_registry import kernel
    from modeling_xl.relative_attention import relative_attention
    from modeling_xl.relative_attention_triton import available

    device, out = check.device, {}
    impls = ["sdpa"] + (["triton"] if available(device.type) else [])
    for dtype in dtypes:
        for kind in ("causal", "same_length", "padding"):
            # the dry run's Triton kernels run under the interpreter (numpy, one program at a time): the smallest
            # shape that still crosses a 16-tile boundary in queries and keys (tests/test_triton_attention.py checks
            # the kernel itself at more shapes)
            inputs = attention_inputs(device, dtype, **(dict(batch=1, heads=2, qlen=20, mlen=12) if check.dry else {}))
            batch, _, qlen, _ = inputs[0].shape
            mlen = inputs[1].size(2) - qlen
            mask = attention_mask(kind, device, batch, qlen, mlen)
            reference = [x.detach().double().requires_grad_() for x in inputs]
            want, _ = relative_attention(*reference, mask, qlen - 1)
            grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(1)).to(device, torch.float64)
            want_grads = torch.autograd.grad(want, reference, grad)
            for impl in impls:
                if impl == "triton" and check.dry and dtype != torch.float32:
                    continue  # the interpreter computes in numpy: float32 is what it can check
                attention = kernel(f"relative_attention.{impl}", device.type) or relative_attention
                got, _ = attention(*inputs, mask, qlen - 1)
                got_grads = torch.autograd.grad(got, inputs, grad.to(got.dtype))
                forward = relative_error(got, want)
                backward = max(relative_error(g, w) for g, w in zip(got_grads, want_grads))
                ok = forward <= TOLERANCE[dtype] and backward <= 2 * TOLERANCE[dtype]
                name = f"relative_attention[{impl}]"
                out[f"{name} {DTYPE_NAMES[dtype]} {kind}"] = {"forward": forward, "backward": backward, "ok": ok}
                check.row("a", f"{name} {kind}", f"{DTYPE_NAMES[dtype]} fwd / bwd rel. err",
                          f"{forward:.1e} / {backward:.1e}", "ok" if ok else f"FAIL (tol {TOLERANCE[dtype]:.0e})")
    return out


def check_adaptive_softmax(check: Check, dtypes) -> dict:
    from modeling_xl import TransformerXLConfig
    from modeling_xl.adaptive_softmax import AdaptiveLogSoftmax

    device, out = check.device, {}
    for div_val in (1, 2):
        config = TransformerXLConfig.from_preset("debug", div_val=div_val, d_embed=32 if div_val == 2 else 16)
        torch.manual_seed(0)
        softmax = AdaptiveLogSoftmax(config).to(device)
        for p in softmax.parameters():
            torch.nn.init.normal_(p, std=0.3)
        targets = torch.randint(0, config.vocab_size, (64,), device=device)
        targets[::9] = -100
        hidden = torch.randn(64, config.d_model, device=device)
        reference = {n: p.detach().double().requires_grad_() for n, p in softmax.named_parameters()}
        hidden64 = hidden.double().requires_grad_()
        plain = torch.func.functional_call(softmax.double(), reference, (hidden64,))  # every log-probability
        softmax.float()
        want = torch.where(targets >= 0, -plain.gather(1, targets.clamp(min=0)[:, None]).squeeze(1), 0.0)
        want_grads = torch.autograd.grad(want.sum(), [hidden64, *reference.values()])
        for dtype in dtypes:
            x = hidden.clone().requires_grad_()
            with autocast(device, dtype):
                got = softmax(x, targets)
            got_grads = torch.autograd.grad(got.sum(), [x, *softmax.parameters()])
            forward = relative_error(got, want)
            backward = max(relative_error(g, w) for g, w in zip(got_grads, want_grads))
            tol = TOLERANCE[dtype] * (1 if dtype == torch.float32 else 2)
            ok = forward <= tol and backward <= 2 * tol
            out[f"div_val={div_val} {DTYPE_NAMES[dtype]}"] = {"forward": forward, "backward": backward, "ok": ok}
            check.row("a", f"adaptive softmax NLL div_val={div_val}", f"{DTYPE_NAMES[dtype]} fwd / bwd rel. err",
                      f"{forward:.1e} / {backward:.1e}", "ok" if ok else f"FAIL (tol {tol:.0e})")
    return out


def check_models(check: Check) -> dict:
    """Whole models in fp32: each fast path's loss and gradients against the eager run of the same weights."""
    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM, TransformerXLForPermutationLM
    from modeling_xl.relative_attention_triton import available

    device, out = check.device, {}
    rows = 1 if check.dry else 2  # the dry run's Triton kernels run under the (slow) interpreter
    x = torch.randint(2, 97, (rows, 24), device=device)
    cases = {"causal LM": (TransformerXLForCausalLM, dict(same_length=True), ["sdpa"]
                           + (["triton"] if available(device.type) else [])),
             "permutation LM": (TransformerXLForPermutationLM, dict(attn_type="bi", n_token_type=3, reuse_len=12,
                                                                    cutoffs=[], adaptive=False, d_embed=16), ["sdpa"])}
    for name, (cls, extra, impls) in cases.items():
        torch.manual_seed(0)
        model = cls(TransformerXLConfig.from_preset("debug", **extra)).to(device)
        if cls is TransformerXLForPermutationLM:
            perm = (torch.rand(rows, 24, 24, device=device) > 0.5).float()
            mapping = torch.eye(24, device=device)[None, -6:].expand(rows, -1, -1)
            kwargs = dict(input_ids=x, perm_mask=perm, target_mapping=mapping, labels=x[:, -6:],
                          token_type_ids=(torch.arange(24, device=device) >= 12).long().expand(rows, -1))
        else:
            kwargs = dict(input_ids=x, labels=x)

        def loss_and_grads(impl):
            model.set_attn_implementation(impl)
            model.zero_grad()
            first = model(**kwargs)
            second = model(**kwargs, mems=first.mems)
            (first.loss + second.loss).backward()
            return float(second.loss), [p.grad.clone() for p in model.parameters() if p.grad is not None]

        want_loss, want_grads = loss_and_grads("eager")
        for impl in impls:
            loss, grads = loss_and_grads(impl)
            error = max(relative_error(g, w) for g, w in zip(grads, want_grads))
            ok = abs(loss - want_loss) <= 1e-4 * abs(want_loss) and error <= 1e-3
            out[f"{name} {impl}"] = {"loss": loss, "eager_loss": want_loss, "grad_error": error, "ok": ok}
            check.row("a", f"{name} [{impl}] vs eager (fp32)", "loss / grads rel. err",
                      f"{abs(loss - want_loss) / abs(want_loss):.1e} / {error:.1e}", "ok" if ok else "FAIL")
    return out


@contextlib.contextmanager
def one_triton_tile(device: torch.device):
    """Within the block the Triton kernel runs at the first candidate tile on CUDA instead of autotuning, which would
    compile every candidate again (section (c)'s attention rows time them all); elsewhere nothing changes."""
    from modeling_xl import relative_attention_triton as tra

    setting = tra.TILES.get(device.type)
    if device.type == "cuda":
        tra.TILES["cuda"] = tra.CANDIDATES["cuda"][0]
    try:
        yield
    finally:
        tra.TILES[device.type] = setting


def section_kernels(check: Check) -> dict:
    dtypes = [torch.float32, torch.bfloat16, torch.float16]
    out, seconds = {}, {}
    with one_triton_tile(check.device):  # exactness needs one tile
        for name, fn in (("attention", lambda: check_attention(check, dtypes)),
                         ("adaptive_softmax", lambda: check_adaptive_softmax(check, dtypes)),
                         ("models", lambda: check_models(check))):
            begin = time.perf_counter()
            out[name] = fn()
            seconds[name] = time.perf_counter() - begin
            print(f"[a] {name}: {seconds[name]:.1f} s", flush=True)
    out["seconds"] = seconds
    return out


# ---------------------------------------------------------------------------------------------------------- (b)
def train_tiny(device, precision: str, sizes: dict, ids: torch.Tensor) -> list[float]:
    """Losses of `sizes["train_steps"]` steps of `tiny` (its recipe: batch 16, tgt 64, mem 64, Adam 3e-3, 50 warmup
    steps then cosine, no clipping; the dry run's batch and length are smaller) in fp32, bf16 or fp16 (autocast +
    GradScaler)."""
    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM

    steps, batch, tgt = sizes["train_steps"], sizes["train_batch"], sizes["train_tgt"]
    torch.manual_seed(0)
    model = TransformerXLForCausalLM(TransformerXLConfig.from_preset("tiny")).to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, fused=device.type == "cuda")
    warmup = min(50, steps // 5)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (s + 1) / warmup if s < warmup else
                                                 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, steps - warmup))))
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    rows = ids[: ids.numel() // batch * batch].view(batch, -1).to(device)
    mems, losses = None, []
    for step in range(steps):
        start = (step * tgt) % (rows.size(1) - tgt - 1)
        if start < tgt:
            mems = None  # wrapped around: the memory would not continue the text
        with autocast(device, dtype):
            out = model(input_ids=rows[:, start : start + tgt], next_token_labels=rows[:, start + 1 : start + tgt + 1],
                        mems=mems)
        scaler.scale(out.loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        mems = out.mems
        losses.append(float(out.loss))
    return losses


def section_training(check: Check) -> dict:
    sizes = SIZES["dry" if check.dry else "real"]
    ids = pydoc_word_ids(8000)
    curves = {p: train_tiny(check.device, p, sizes, ids) for p in ("fp32", "bf16", "fp16")}
    tail, window = sizes["tail"], sizes["window"]
    reference_tail = float(np.mean(curves["fp32"][-tail:]))
    means = {p: [float(np.mean(c[i : i + window])) for i in range(0, len(c), window)] for p, c in curves.items()}
    out = {"curves": curves, "window_means": means, "tolerance": {"tail_relative": 0.03, "window_relative": 0.05}}
    for p in ("fp32", "bf16", "fp16"):
        tail_mean = float(np.mean(curves[p][-tail:]))
        worst = max(abs(a - b) / b for a, b in zip(means[p], means["fp32"]))
        ok = abs(tail_mean - reference_tail) <= 0.03 * reference_tail and worst <= 0.05
        out[p] = {"first": curves[p][0], "tail_mean": tail_mean, "worst_window": worst, "ok": ok}
        check.row("b", f"tiny {sizes['train_steps']} steps, {p}", f"loss first -> last-{tail} mean (worst window)",
                  f"{curves[p][0]:.2f} -> {tail_mean:.3f} ({worst:.1%})", "ok" if ok else "FAIL (3% / 5%)")
    return out


# ---------------------------------------------------------------------------------------------------------- (c)
def matmul_rate(device, n: int) -> float:
    """bf16 (CUDA) or fp32 (CPU) FLOP/s of an n^3 torch.mm, median of 5 after 2 warm-ups."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    times = []
    for i in range(7):
        sync(device)
        begin = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        if i >= 2:
            times.append(time.perf_counter() - begin)
    return 2 * n**3 / float(np.median(times))


def counted_flops(fn) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def timed_training(device, step, sizes, tokens_per_step: int) -> dict:
    """tokens/s and peak MiB (above the weights, optimizer state and data present before) of `step()` calls."""
    for _ in range(sizes["warm"]):
        step()
    baseline = peak_reset(device)
    begin = time.perf_counter()
    for _ in range(sizes["timed"]):
        step()
    sync(device)
    seconds = (time.perf_counter() - begin) / sizes["timed"]
    return {"tokens_per_s": tokens_per_step / seconds, "step_s": seconds, "peak_mib": peak_since(device, baseline)}


def device_busy(device, step) -> dict:
    """One `step()` under torch.profiler: the seconds the device spends in kernels and copies, and how many ran.
    Against the step's wall time this says whether the host (Python, launches) or the device bounds the step."""
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU
    sync(device)
    with profile(activities=[activity]) as prof:
        step()
        sync(device)
    events = [e for e in prof.key_averages() if device.type != "cuda" or getattr(e, "device_type", None) is not None]
    field = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    busy = [e for e in events if getattr(e, field, 0) > 0] if device.type == "cuda" else events
    return {"busy_s": sum(getattr(e, field, 0) for e in busy) / 1e6, "kernels": sum(e.count for e in busy)}


# how a side of (c) compiles: not at all, each layer on its own, or the whole forward + loss (its backward through
# AOT autograd) with the adaptive softmax's tail capacity (static shapes), without or with CUDA graphs; inductor's
# default mode (its max-autotune GEMM search alone ran past a 9-minute device command on the H200, 2026-11-29)
COMPILE_MODES = {"layers": None, "whole": "default", "graphs": "reduce-overhead"}


def compile_model(model, how: str | None, dry: bool, batches: list[dict]):
    """`model` compiled as `how` says (see COMPILE_MODES); the dry run traces with `aot_eager` (the same graphs, no
    code generation: minutes less on a CPU)."""
    if how is None:
        return model
    if how == "layers":
        for layer in model.transformer.layers:
            layer.compile(dynamic=False, **({"backend": "aot_eager"} if dry else {}))
        return model
    from modeling_xl.training.tail_capacity import batch_tail_counts, tail_capacity

    model.lm_head.tail_capacity = tail_capacity(batch_tail_counts(batches, model.lm_head.bounds))
    options = {"backend": "aot_eager"} if dry else {"mode": COMPILE_MODES[how]}
    return torch.compile(model, fullgraph=True, **options)


def causal_lm_side(check, impl: str, precision: str, sizes: dict, compiled: str | None = None) -> dict:
    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM
    from modeling_xl.memory import carry_memory

    device = check.device
    shape = DRY_WT103 if check.dry else {}
    config = TransformerXLConfig.from_preset("wt103-base", mem_len=sizes["wt_mem"], **shape)
    torch.manual_seed(0)
    model = TransformerXLForCausalLM(config).to(device).train()
    model.set_attn_implementation(impl)
    batch, tgt = sizes["wt_batch"], sizes["wt_tgt"]
    rows = zipf_ids(config.vocab_size, batch * (8 * tgt + 1)).view(batch, -1).to(device)
    batches = [{"input_ids": rows[:, s * tgt: (s + 1) * tgt],
                "next_token_labels": rows[:, s * tgt + 1: (s + 1) * tgt + 1]} for s in range(8)]
    run = compile_model(model, compiled, check.dry, batches)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2.5e-4, fused=device.type == "cuda")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    state = {"mems": None, "i": 0}

    def step():
        inputs = batches[state["i"] % 8]
        state["i"] += 1
        with autocast(device, dtype):
            out = run(**inputs, mems=state["mems"])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state["mems"] = carry_memory(state["mems"], out.mems)  # one buffer per layer: what a captured step reads

    result = timed_training(device, step, sizes, batch * tgt)
    if impl == "sdpa" and compiled is None:
        result["flops_per_token"] = counted_flops(step) / (batch * tgt)
    try:
        result["device"] = device_busy(device, step)
    except Exception as error:  # the profiler's field names move between torch releases: recorded, not fatal
        result["device"] = {"error": f"{type(error).__name__}: {error}"}
    return result


def plm_sides(check, sizes: dict) -> dict:
    """Our permutation LM and transformers' XLNetLMHeadModel at equal size, same batches (project's sampler)."""
    from bench_plm import plm_batches
    from transformers import XLNetConfig, XLNetLMHeadModel

    from modeling_xl.modeling_permutation_lm import TransformerXLForPermutationLM
    from modeling_xl.relative_attention_triton import available as triton_available
    from modeling_xl.xlnet_conversion import from_xlnet

    device = check.device
    base = dict(d_model=32, n_layer=2, n_head=2, d_inner=64) if check.dry else dict(d_model=410, n_layer=16,
                                                                                    n_head=10, d_inner=2100)
    seq, reuse, batch = sizes["plm_seq"], sizes["plm_reuse"], sizes["wt_batch"]
    torch.manual_seed(0)
    xlnet = XLNetLMHeadModel(XLNetConfig(vocab_size=sizes["plm_vocab"], ff_activation="gelu", untie_r=True,
                                         attn_type="bi", mem_len=sizes["wt_mem"], reuse_len=reuse, dropout=0.1,
                                         use_mems_train=True, **base))
    ours = from_xlnet(TransformerXLForPermutationLM, xlnet)
    sides = [("ours (permutation LM)", ours), ("transformers XLNet", xlnet)]
    if triton_available(device.type):  # the Triton kernel has no attention dropout: this side runs without it
        ours_triton = from_xlnet(TransformerXLForPermutationLM, xlnet, dropatt=0.0)
        ours_triton.set_attn_implementation("triton")
        sides.append(("ours (permutation LM) [triton, dropatt 0]", ours_triton))
    ids = zipf_ids(sizes["plm_vocab"] - 2, batch * 9 * seq)
    batches = [{k: v.to(device) for k, v in b.items()} for b in plm_batches(
        8, sizes["plm_vocab"], batch=batch, seq_len=seq, reuse_len=reuse, num_predict=sizes["plm_predict"],
        perm_size=reuse, ids=ids)]
    out = {}
    with one_triton_tile(device):
        for name, model in sides:
            model.to(device).train()
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=device.type == "cuda")
            state = {"mems": None, "i": 0}

            def step(model=model, optimizer=optimizer, state=state, ours_side=model is not xlnet):
                b = batches[state["i"] % len(batches)]
                state["i"] += 1
                extra = dict(target_mask=b["target_mask"], reuse_len=reuse) if ours_side else {}
                with autocast(device, torch.bfloat16 if device.type == "cuda" else torch.float32):
                    result = model(input_ids=b["input_ids"], perm_mask=b["perm_mask"],
                                   target_mapping=b["target_mapping"], token_type_ids=b["token_type_ids"],
                                   mems=state["mems"], labels=b["labels"], **extra)
                result.loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                state["mems"] = result.mems

            out[name] = timed_training(device, step, sizes, batch * seq)
            out[name]["flops_per_token"] = counted_flops(step) / (batch * seq)
            model.cpu()
            del optimizer, state
            check.cleanup()
    return out


def gpt2_side(check, sizes: dict) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    device = check.device
    shape = DRY_WT103 if check.dry else dict(vocab_size=267735, d_model=410, n_layer=16, n_head=10, d_inner=2100)
    batch, tgt = sizes["wt_batch"], sizes["wt_tgt"]
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=shape["vocab_size"], n_positions=tgt, n_embd=shape["d_model"],
                                       n_layer=shape["n_layer"], n_head=shape["n_head"], n_inner=shape["d_inner"]))
    model.to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=2.5e-4, fused=device.type == "cuda")
    rows = zipf_ids(shape["vocab_size"], batch * (8 * tgt + 1)).view(batch, -1).to(device)
    state = {"i": 0}

    def step():
        start = (state["i"] % 8) * tgt
        state["i"] += 1
        with autocast(device, torch.bfloat16 if device.type == "cuda" else torch.float32):
            loss = model(input_ids=rows[:, start : start + tgt], labels=rows[:, start : start + tgt]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    result = timed_training(device, step, sizes, batch * tgt)
    result["flops_per_token"] = counted_flops(step) / (batch * tgt)
    return result


def attention_timing(check: Check, sizes: dict) -> dict:
    """Milliseconds of one attention call, forward + backward, at the training shape of (c) (wt103-base: 10 heads
    of 41, tgt = mem = 192, batch 32, causal, bf16 on CUDA): SDPA with the position bias, and the Triton kernel at
    each tile size (`relative_attention_triton.CANDIDATES`, and the one autotuning picks, timed afresh) with each way
    of adding up the table's gradient (`TABLE_GRADIENT`: per-tile bands summed after, or fp32 atomics)."""
    from modeling_xl import relative_attention_triton as tra
    from modeling_xl.kernel_registry import kernel
    from modeling_xl.relative_attention import causal_mask, relative_attention

    device = check.device
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    heads, d_head = (2, 16) if check.dry else (10, 41)
    batch, qlen, mlen = sizes["wt_batch"], sizes["wt_tgt"], sizes["wt_mem"]
    inputs = attention_inputs(device, dtype, batch, heads, qlen, mlen, d_head)
    mask = causal_mask(qlen, mlen, device=device)
    grad = torch.randn(batch, heads, qlen, d_head, device=device, dtype=dtype)
    tiles = ["autotune", *tra.CANDIDATES["cuda"]] if device.type == "cuda" else ["autotune", tra.TILES["cpu"]]
    configs = [("sdpa", None, None)] + ([("triton", t, g) for t in tiles for g in ("bands", "atomic")]
                                        if tra.available(device.type) else [])
    default, default_gradient, out = tra.TILES.get(device.type), tra.TABLE_GRADIENT, {}
    for impl, tile, table_gradient in configs:
        if tile is not None:
            tra.TILES[device.type], tra.TABLE_GRADIENT = tile, table_gradient
        chosen_before, tra.CHOSEN = tra.CHOSEN, {}

        attention = kernel(f"relative_attention.{impl}", device.type) or relative_attention

        tile_name = tile if tile in (None, "autotune") else f"{tile[0]} warps {tile[1]}"
        name = impl if tile is None else f"{impl} tile {tile_name} table gradient {table_gradient}"

        def call():
            result, _ = attention(*inputs, mask, qlen - 1)
            torch.autograd.grad(result, inputs, grad)

        try:
            call()
            sync(device)
            begin = time.perf_counter()
            for _ in range(5):
                call()
            sync(device)
            out[name] = (time.perf_counter() - begin) / 5 * 1e3
        except Exception as error:  # a tile size the compiler refuses (registers, shared memory): recorded
            out[name] = f"{type(error).__name__}: {str(error)[:120]}"
        finally:
            tra.TILES[device.type], tra.TABLE_GRADIENT = default, default_gradient
            chosen, tra.CHOSEN = list(tra.CHOSEN.values()), {**chosen_before, **tra.CHOSEN}
        value = out[name]
        if tile == "autotune" and chosen:
            name = f"{name}: chose {chosen[0]}"
        check.row("c", f"attention alone [{name}]", "ms fwd + bwd (one layer)",
                  value if isinstance(value, str) else f"{value:.2f}")
    return out


def section_throughput(check: Check) -> dict:
    """The sides in the order of their worth (each skipped once --budget-s is spent): the references (GPT-2, XLNet)
    and ours on the default path first, then the other paths and compile modes, then one layer's attention alone."""
    from modeling_xl.relative_attention_triton import available

    sizes = SIZES["dry" if check.dry else "real"]
    device = check.device
    rate = matmul_rate(device, sizes["matmul_n"])
    out = {"matmul_flops_per_s": rate}
    check.row("c", f"torch.mm {sizes['matmul_n']}^3", "TFLOP/s (bf16 on CUDA)", rate / 1e12)
    gpt2 = check.budgeted("c", "GPT-2", lambda: gpt2_side(check, sizes))
    if gpt2 is not None:
        out["GPT-2"] = gpt2
    out.update(check.budgeted("c", "permutation LM sides", lambda: plm_sides(check, sizes)) or {})
    sides = [("sdpa", "bf16"), ("eager", "bf16")] + ([("triton", "bf16")] if available(device.type) else [])
    sides += [("sdpa", "tf32")] + [(f"sdpa+{how}", "bf16") for how in COMPILE_MODES if not check.dry or how == "whole"]
    for impl, precision in sides:
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        key = f"ours [{impl}] {precision}"
        try:
            result = check.budgeted("c", key, lambda: causal_lm_side(
                check, impl.split("+")[0], precision, sizes, compiled=impl.split("+")[1] if "+" in impl else None))
            if result is not None:
                out[key] = result
        except Exception as error:  # one side failing (a compiler error, say) leaves the others standing
            out[key] = {"error": f"{type(error).__name__}: {error}"}
            check.row("c", f"train {key}", "FAILED", f"{type(error).__name__}: {str(error)[:150]}")
            print(traceback.format_exc(), flush=True)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
        check.cleanup()
    attention = check.budgeted("c", "attention alone", lambda: attention_timing(check, sizes))
    if attention is not None:
        out["attention_ms"] = attention
    throughput_rows(check, out, rate)
    return out


def throughput_rows(check: Check, out: dict, rate: float) -> None:
    """(c)'s table rows: tokens/s, MFU and peak memory per side, with its ratio to its reference, and the device's
    busy time in one step."""
    flops = out.get("ours [sdpa] bf16", {}).get("flops_per_token")  # the maths of every causal path
    for key in [k for k in out if k.startswith("ours [") and "error" not in out[k]]:
        out[key].setdefault("flops_per_token", flops)
    reference = {name: out[key]["tokens_per_s"] for name, key in (("xlnet", "transformers XLNet"), ("gpt2", "GPT-2"))
                 if key in out}
    for name, result in list(out.items()):
        if not isinstance(result, dict) or "tokens_per_s" not in result:
            continue
        tokens_per_s = result["tokens_per_s"]
        result["mfu"] = None if result["flops_per_token"] is None else result["flops_per_token"] * tokens_per_s / rate
        note = ""
        if name.startswith("ours ["):
            note = f"{tokens_per_s / 59961:.2f}x NVIDIA A100 AMP" + (
                f"; {tokens_per_s / reference['gpt2']:.2f}x GPT-2" if "gpt2" in reference else "")
        elif name.startswith("ours (permutation") and "xlnet" in reference:
            note = f"{tokens_per_s / reference['xlnet']:.2f}x XLNet (target >= 3x)"
        peak = "" if result["peak_mib"] is None else f", peak {result['peak_mib']:,.0f} MiB"
        mfu = "MFU not counted" if result["mfu"] is None else f"{result['mfu']:.1%}"
        check.row("c", f"train {name}", "tokens/s (MFU, peak memory)", f"{tokens_per_s:,.0f} ({mfu}{peak})", note)
        busy = result.get("device", {})
        if "busy_s" in busy:
            check.row("c", f"  {name}: device busy in one step", "ms busy / ms step (kernels)",
                      f"{busy['busy_s'] * 1e3:.1f} / {result['step_s'] * 1e3:.1f} ({busy['kernels']:,})",
                      f"host-bound: {1 - busy['busy_s'] / result['step_s']:.0%} idle"
                      if busy["busy_s"] < 0.8 * result["step_s"] else "device-bound")


# ---------------------------------------------------------------------------------------------------------- (d)
def section_evaluation(check: Check) -> dict:
    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM
    from modeling_xl.relative_attention_triton import available

    sizes = SIZES["dry" if check.dry else "real"]
    device, batch, tgt = check.device, sizes["eval_batch"], sizes["eval_tgt"]
    shape = DRY_WT103 if check.dry else {}
    out = {}
    impls = ["sdpa"] + (["triton"] if available(device.type) else [])
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    for mem in sizes["eval_mems"]:
        config = TransformerXLConfig.from_preset("wt103-base", mem_len=mem, clamp_len=sizes["eval_clamp"],
                                                 same_length=True, **shape)
        torch.manual_seed(0)
        model = TransformerXLForCausalLM(config).to(device=device, dtype=dtype).eval()
        rows = zipf_ids(config.vocab_size, batch * (sizes["eval_segments"] + 1) * tgt).view(batch, -1).to(device)
        for impl in impls:
            model.set_attn_implementation(impl)
            mems = tuple(torch.randn(batch, mem, config.d_model, device=device, dtype=dtype)
                         for _ in range(config.n_layer))
            with torch.no_grad():
                model(input_ids=rows[:, :tgt], mems=mems, labels=rows[:, :tgt])  # warm-up (and compile)
                baseline = peak_reset(device)
                begin = time.perf_counter()
                nll = 0.0
                for s in range(1, sizes["eval_segments"] + 1):
                    result = model(input_ids=rows[:, s * tgt : (s + 1) * tgt], mems=mems,
                                   labels=rows[:, s * tgt : (s + 1) * tgt])
                    mems = result.mems
                    nll += float(result.loss)
                sync(device)
                seconds = time.perf_counter() - begin
            out[f"{impl} mem={mem}"] = {"tokens_per_s": batch * tgt * sizes["eval_segments"] / seconds,
                                        "peak_mib": peak_since(device, baseline),
                                        "mean_loss": nll / sizes["eval_segments"]}
        model.cpu()
        del model
        check.cleanup()
    for impl in impls:
        peaks = [out[f"{impl} mem={m}"]["peak_mib"] for m in sizes["eval_mems"]]
        slope = None if peaks[0] is None else (peaks[-1] - peaks[0]) / (sizes["eval_mems"][-1] - sizes["eval_mems"][0])
        out[f"{impl} slope_mib_per_mem"] = slope
        for mem in sizes["eval_mems"]:
            result = out[f"{impl} mem={mem}"]
            peak = "" if result["peak_mib"] is None else f", peak +{result['peak_mib']:,.0f} MiB"
            check.row("d", f"eval [{impl}] tgt {tgt} mem {mem} clamp {sizes['eval_clamp']}", "tokens/s (peak)",
                      f"{result['tokens_per_s']:,.0f}{peak}",
                      "" if slope is None or mem != sizes["eval_mems"][-1]
                      else f"{slope * 1024:.0f} KiB per memory position")
    return out


# ---------------------------------------------------------------------------------------------------------- (e)
def section_generation(check: Check) -> dict:
    """New tokens per second of `generate` at batch 1 and 8, 200 and 1,000 new tokens, greedy and top-k 40: ours
    (the memory as ring buffers; `static_decoding` "eager" and "compiled", on CUDA a CUDA graph captured once) against
    GPT-2 of the same depth and width in both of transformers' modes (its dynamic cache, and its static cache, which
    transformers compiles on CUDA): each ratio is against GPT-2's better one. Ours should take the same time per
    token at 1,000 new tokens as at 200 (the memory's size never changes). `generate` with a model that costs
    nothing (`loop_alone_class`) gives the bound of those ratios."""
    from bench_generate import SHAPE
    from transformers import GPT2Config, GPT2LMHeadModel

    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM

    GenerateLoopAlone = loop_alone_class()
    sizes = SIZES["dry" if check.dry else "real"]
    device = check.device
    shape = dict(SHAPE, vocab_size=300, cutoffs=[20, 40, 200], d_model=32, d_embed=32, d_inner=64, n_head=2,
                 d_head=16, mem_len=8) if check.dry else SHAPE
    torch.manual_seed(0)
    ours = TransformerXLForCausalLM(TransformerXLConfig(**shape))
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=shape["vocab_size"], n_positions=1024 + 64, n_embd=shape["d_model"],
                                      n_layer=shape["n_layer"], n_head=shape["n_head"], n_inner=shape["d_inner"],
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    loop = GenerateLoopAlone(GPT2Config(vocab_size=shape["vocab_size"]))
    for model in (ours, gpt2, loop):
        model.to(device).eval()
        for config in (model.config, model.generation_config):
            config.eos_token_id = None
            config.pad_token_id = 0
    if check.dry:  # the same graph, traced without code generation (minutes less on a CPU)
        ours.static_decoding_options = {"backend": "aot_eager"}
    sides = {"ours [eager]": (ours, {}, "eager"), "ours [compiled]": (ours, {}, "compiled"),
             "GPT-2 [dynamic cache]": (gpt2, {}, None),
             "GPT-2 [static cache, compiled]": (gpt2, {"cache_implementation": "static"}, None),
             LOOP_ALONE: (loop, {}, None)}
    modes = {"greedy": dict(do_sample=False), "top-k 40": dict(do_sample=True, top_k=40)}
    out = {}

    def compare(batch: int, new: int, mode: str) -> None:
        prompts = zipf_ids(shape["vocab_size"], batch * sizes["gen_prompt"], seed=1).view(batch, -1).to(device)
        rates = {}
        for name, (model, extra, static) in sides.items():
            if model is ours:
                ours.static_decoding = static
            try:
                rates[name] = generation_rate(model, prompts, new, {**modes[mode], **extra}, sizes, device)
            except Exception as error:  # a mode this release does not offer, say: recorded, not fatal
                rates[name] = None
                out[f"{name} batch={batch} new={new} {mode} error"] = f"{type(error).__name__}: {error}"
            out[f"{name} batch={batch} new={new} {mode}"] = rates[name]
        generation_rows(check, rates, batch, new, mode)

    for batch in sizes["gen_batches"]:  # batch 1 first: the targets are there
        for new in sizes["gen_new"]:
            for mode in modes:
                check.budgeted("e", f"generate batch {batch}, {new} new, {mode}", lambda: compare(batch, new, mode))
    ours.static_decoding = "eager"
    return out


LOOP_ALONE = "generate() alone"


def loop_alone_class():
    """A model that costs nothing: its forward returns the same logits (zeros over the vocabulary) for the last
    position, so that `generate` with it times transformers' own loop per token (inputs, logits processors, token
    choice, stopping criteria): the least that any model pays through `generate`, and so the bound of every ratio to
    GPT-2 there."""
    from transformers import GenerationMixin, GPT2Config, PreTrainedModel
    from transformers.modeling_outputs import CausalLMOutput

    class GenerateLoopAlone(PreTrainedModel, GenerationMixin):
        config_class = GPT2Config

        def __init__(self, config):
            super().__init__(config)
            self.logits = torch.nn.Parameter(torch.zeros(1, 1, config.vocab_size))
            self.post_init()

        def forward(self, input_ids=None, **kwargs):
            return CausalLMOutput(logits=self.logits.expand(input_ids.size(0), 1, -1))

    return GenerateLoopAlone


def generation_rate(model, prompts, new: int, kwargs: dict, sizes: dict, device) -> float:
    """New tokens per second of `model.generate` (median of `gen_calls` calls after a warm-up call)."""
    call = dict(max_new_tokens=new, min_new_tokens=new, num_beams=1, eos_token_id=None, pad_token_id=0, **kwargs)
    times = []
    with torch.no_grad():
        model.generate(prompts, **call)  # warm-up (compilations, captures)
        for _ in range(sizes["gen_calls"]):
            sync(device)
            begin = time.perf_counter()
            generated = model.generate(prompts, **call)
            sync(device)
            times.append(time.perf_counter() - begin)
    if generated.shape[1] != prompts.size(1) + new:
        raise RuntimeError(f"generated {generated.shape[1] - prompts.size(1)} tokens; expected {new}")
    return prompts.size(0) * new / float(np.median(times))


def generation_rows(check: Check, rates: dict, batch: int, new: int, mode: str) -> None:
    gpt2 = max((r for name, r in rates.items() if name.startswith("GPT-2") and r), default=None)
    best = max((name for name in rates if name.startswith("GPT-2") and rates[name]), key=rates.get, default=None)
    for name, rate in rates.items():
        if not name.startswith("ours"):
            continue
        value = "FAILED" if rate is None else f"{rate:,.0f}"
        note = "" if rate is None or gpt2 is None else f"{rate / gpt2:.2f}x {best}"
        check.row("e", f"generate {name} batch {batch}, {new} new, {mode}", "new tokens/s", value, note)
    if gpt2 is not None:
        check.row("e", f"generate GPT-2 batch {batch}, {new} new, {mode}", "new tokens/s (its best mode)",
                  f"{gpt2:,.0f}", best)
    loop = rates.get(LOOP_ALONE)
    if loop:  # the most any model reaches through `generate`
        note = "" if gpt2 is None else f"{loop / gpt2:.2f}x {best}: the bound of every ratio above"
        check.row("e", f"{LOOP_ALONE}, a model that costs nothing, batch {batch}, {new} new, {mode}",
                  "new tokens/s", f"{loop:,.0f}", note)


def environment(device) -> dict:
    import transformers

    env = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
           "device": str(device)}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpu_memory_gib"] = torch.cuda.get_device_properties(device).total_memory / 2**30
    with contextlib.suppress(ImportError):
        import triton

        env["triton"] = triton.__version__
    return env


DEFAULT_BUDGET_S = 420.0  # with the slowest item's few minutes after it, within one 9-minute device command
SECTIONS = {"a": section_kernels, "b": section_training, "c": section_throughput, "d": section_evaluation,
            "e": section_generation}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="the CPU at toy sizes (what the test suite runs)")
    parser.add_argument("--sections", default="abcde", help="which of a-e to run (default all)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help=f"no section or timed item starts after this many seconds (default "
                             f"{DEFAULT_BUDGET_S:.0f}; none in the dry run); the table names the skipped ones")
    parser.add_argument("--output", default="benchmarks/results/gpu_check.json")
    args = parser.parse_args(argv)
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"--sections {args.sections!r}: unknown {sorted(unknown)}; expected letters of 'abcde'")
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU machine, or pass --dry-run for the CPU at toy sizes")
    device = torch.device("cpu" if args.dry_run else "cuda")
    # the dry run checks every section and item unless a budget is given
    budget = args.budget_s if args.budget_s is not None or args.dry_run else DEFAULT_BUDGET_S
    check = Check(device, args.dry_run, None if budget is None else time.perf_counter() + budget)
    check.results["environment"] = environment(device)
    print(json.dumps(check.results["environment"]), flush=True)
    path = Path(args.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    for letter in args.sections:
        check.section(letter, SECTIONS[letter])
        path.write_text(json.dumps(check.results, indent=1, default=str) + "\n")  # kept if a later section hangs
    from common import print_table

    table = print_table(["section", "item", "metric", "value", "check / ratio"], check.rows)
    check.results["table"] = table
    check.results["failed"] = [r for r in check.rows if r[1] in ("FAILED", "SKIPPED") or str(r[4]).startswith("FAIL")]
    path.write_text(json.dumps(check.results, indent=1, default=str) + "\n")
    print(f"wrote {path}", flush=True)
    return check.results


if __name__ == "__main__":
    main()
