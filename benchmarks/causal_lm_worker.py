"""One causal-LM measurement in a fresh process; runs under our venv (`impl=ours`) or the transformers-4.35 venv
(`impl=legacy`). Started by bench_causal_lm.py / bench_activation_checkpointing.py / bench_mfu.py, never by hand.

Modes:
    create  (legacy only): build `TransfoXLLMHeadModel(TransfoXLConfig(**config))` after `torch.manual_seed(seed)`
            and `save_pretrained(model_dir)`; both sides then load these weights.
    train   forward + backward + Adam step per segment, memory carried from segment to segment.
    eval    no_grad forward with labels, memory carried.
Answer (one JSON line): per-step seconds of the timed steps, tokens per step, peak extra memory, the losses.
"""

from __future__ import annotations

import time

import torch

from common import PeakMemory, emit, set_threads, worker_args


def load_model(args):
    if args["impl"] == "legacy":
        from transformers import TransfoXLLMHeadModel

        return TransfoXLLMHeadModel.from_pretrained(args["model_dir"])
    from modeling_xl import TransformerXLForCausalLM

    model = TransformerXLForCausalLM.from_pretrained(args["model_dir"])
    if args.get("attn") == "eager":
        for layer in model.transformer.layers:
            layer.attn.use_sdpa = False
    if args.get("checkpointing"):
        model.gradient_checkpointing_enable()
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


def run(args) -> dict:
    set_threads(args.get("threads", 2))
    torch.manual_seed(0)
    model = load_model(args)
    segments = torch.load(args["data_path"], weights_only=True)  # [S, B, T + 1]
    training = args["mode"] == "train"
    model.train(training)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4) if training else None
    n_warmup, n_steps = args["warmup"], args["steps"]
    memory = PeakMemory()
    memory.start()
    mems, times, losses = None, [], []
    for step in range(n_warmup + n_steps):
        segment = segments[step % len(segments)]
        inputs = segment[:, :-1]
        start = time.perf_counter()
        with torch.set_grad_enabled(training):
            out = model(input_ids=inputs, mems=mems, labels=inputs)
            if training:
                out.loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        mems = out.mems
        elapsed = time.perf_counter() - start
        losses.append(float(out.loss))
        if step >= n_warmup:
            times.append(elapsed)
    peak = memory.stop()
    batch, qlen = segments.shape[1], segments.shape[2] - 1
    return {"times": times, "tokens_per_step": batch * qlen, "peak_bytes": peak, "peak_method": memory.method,
            "losses": losses, "mem_len_seen": int(mems[0].shape[0 if args["impl"] == "legacy" else 1])}


if __name__ == "__main__":
    arguments = worker_args()
    emit(create_legacy(arguments) if arguments["mode"] == "create" else run(arguments))
