"""One causal-LM measurement in a fresh process; runs under our venv (`impl=ours`) or the transformers-4.35 venv
(`impl=legacy`). Started by bench_causal_lm.py / bench_activation_checkpointing.py / bench_mfu.py, never by hand.

Modes:
    create  (legacy only): build `TransfoXLLMHeadModel(TransfoXLConfig(**config))` after `torch.manual_seed(seed)`
            and `save_pretrained(model_dir)`; both sides then load these weights.
    train   forward + backward + Adam step per segment, memory carried from segment to segment.
    eval    no_grad forward with labels, memory carried.
Options: `allocator` "keep" or "default" (common.use_allocator, applied first; default "default"); `threads` (2);
`optimizer` "adam-fused" (default: `fused=True`, one kernel per step) or "adam" (torch's default); `autocast` "bf16"
runs the forward under `torch.autocast("cpu", torch.bfloat16)` (weights and Adam stay float32).
Answer (one JSON line): per-step seconds and minor page faults of the timed steps, tokens per step, the growth of
resident memory (RSS) over the timed steps, the losses, the matrix-product FLOPs of one more step counted by
`torch.utils.flop_counter.FlopCounterMode` (what this implementation really multiplies, wasted work included), the
tensor peak of one more step (`tensor_peak`: everything alive, weights included) and the float32 torch.mm rate
measured in this process right after its steps (for the step's matmul floor).
"""

from __future__ import annotations

import resource
import time

import torch
from common import (
    PeakMemory,
    counted_matmul_flops,
    emit,
    matmul_flops,
    recorded_matmuls,
    replayed_matmul_seconds,
    set_threads,
    use_allocator,
    worker_args,
)


def load_model(args):
    if args["impl"] == "legacy":
        from transformers import TransfoXLLMHeadModel

        return TransfoXLLMHeadModel.from_pretrained(args["model_dir"])
    from modeling_xl import TransformerXLForCausalLM

    model = TransformerXLForCausalLM.from_pretrained(args["model_dir"])
    if args.get("attn") == "eager":  # the reference attention (relative_attention.attention_implementation)
        model.set_attn_implementation("eager")
    if args.get("checkpointing"):
        from modeling_xl.training.models import enable_checkpointing

        enable_checkpointing(model)
    if args.get("compile"):
        for layer in model.transformer.layers:
            layer.compile(dynamic=False)
    return model


def create_legacy(args) -> dict:
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel

    torch.manual_seed(args["seed"])
    model = TransfoXLLMHeadModel(TransfoXLConfig(**args["config"]))
    model.save_pretrained(args["model_dir"])
    return {"n_params": sum(p.numel() for p in model.parameters())}


def one_step(model, inputs, mems, optimizer, precision):
    """Training step (forward, backward, Adam) when `optimizer` is given, else a no_grad forward; returns the output."""
    with torch.set_grad_enabled(optimizer is not None):
        with precision:
            out = model(input_ids=inputs, mems=mems, labels=inputs)
        if optimizer is not None:
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return out


def live_tensor_bytes() -> int:
    """Bytes of every CPU tensor storage reachable from Python now (found through `gc`), each storage counted once:
    weights, gradients, optimizer state, the memory carried between segments, caches, data."""
    import gc

    storages = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and obj.layout == torch.strided:
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = max(storage.nbytes(), storages.get(storage.data_ptr(), 0))
    return sum(storages.values())


def tensor_peak(step) -> dict:
    """Allocator-independent peak of one call of `step`: the bytes of every tensor alive when it starts (weights,
    optimizer state, carried memory, caches: `live_tensor_bytes`) plus the largest sum of the bytes it allocates and
    frees (torch profiler memory events, in order). Unlike RSS it holds no allocator slack, thread buffers or library
    scratch space: what the implementation itself keeps and asks for."""
    from torch.profiler import ProfilerActivity, profile

    resident = live_tensor_bytes()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return {"tensor_peak_bytes": resident + peak, "resident_bytes": resident, "step_peak_bytes": peak}


def run(args) -> dict:
    use_allocator(args.get("allocator", "default"))
    set_threads(args.get("threads", 2))
    torch.manual_seed(0)
    model = load_model(args)
    segments = torch.load(args["data_path"], weights_only=True)  # [S, B, T + 1]
    training = args["mode"] == "train"
    model.train(training)
    fused = args.get("optimizer", "adam-fused") == "adam-fused"
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=fused) if training else None
    precision = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.get("autocast") == "bf16")
    n_warmup, n_steps = args["warmup"], args["steps"]
    memory = PeakMemory()
    memory.start()
    mems, times, losses, faults = None, [], [], []
    for step in range(n_warmup + n_steps):
        segment = segments[step % len(segments)]
        inputs = segment[:, :-1]
        faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        out = one_step(model, inputs, mems, optimizer, precision)
        mems = out.mems
        elapsed = time.perf_counter() - start
        losses.append(float(out.loss))
        if step >= n_warmup:
            times.append(elapsed)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before)
    peak = memory.stop()
    flops = counted_matmul_flops(
        lambda: one_step(model, segments[(n_warmup + n_steps) % len(segments)][:, :-1], mems, optimizer, precision))
    tensors = tensor_peak(lambda: one_step(model, segments[0][:, :-1], mems, optimizer, precision))
    rate = matmul_flops(2048, repeats=5)["flops_per_s"]  # after the steps: its 16 MB matrices would move RSS
    replayed = {}
    if args.get("replay_matmuls"):
        replayed = replayed_matmul_seconds(recorded_matmuls(
            lambda: one_step(model, segments[1][:, :-1], mems, optimizer, precision)))
    batch, qlen = segments.shape[1], segments.shape[2] - 1
    return {"times": times, "page_faults": faults, "tokens_per_step": batch * qlen, "peak_bytes": peak,
            "peak_method": memory.method, "matmul_flops_per_step": flops, **tensors, "matmul_flops_per_s": rate,
            "replayed_matmuls": replayed, "losses": losses,
            "mem_len_seen": int(mems[0].shape[0 if args["impl"] == "legacy" else 1])}


if __name__ == "__main__":
    arguments = worker_args()
    emit(create_legacy(arguments) if arguments["mode"] == "create" else run(arguments))
