"""Model FLOPs utilisation (MFU) of our causal-LM training, against the float32 matmul rate measured in the same run.

MFU = (model FLOPs per training token x training tokens/s) / (torch.mm FLOP/s on large square float32 matrices,
2 threads). The matmul rate and the training rate are measured alternately in this one process.

Model FLOPs per token (`flops_per_token`): matrix products only, 2 FLOPs per multiply-add. A product costs 3 x its
forward in training (backward: the gradients of its input and of its weight), except the two whose input needs no
gradient (the memory is detached, the position table is a constant sinusoid), which cost 2 x (marked * below). With
B = batch rows, T = tgt_len, M = memory length, K = M + T keys, R = K relative positions, H heads of width D, model
width d, feed-forward width d_ff:
    per layer, per token:
        2 d (3 H D)              q, k, v of the segment (fused projection)
      + 2 d (2 H D) M / T        k, v of the memory (recomputed every segment from the memory's hidden states) *
      + 2 d (H D) R / (B T)      W_R R, the position table projected once per segment for all B rows *
      + 2 H D K                  content scores (q + u) . k, every key (masked entries are computed too)
      + 2 H D R                  position scores (q + v) . W_R R before the shift
      + 2 H D K                  probabilities x values
      + 2 H D d                  output projection
      + 2 (2 d d_ff)             feed-forward
    adaptive input:  2 d_i d per token of cluster i when cluster i has a projection
    adaptive softmax: 2 d d_0 + 2 d_0 (c_0 + n_clusters) (head, with its projection if any) for every token, plus
                      f_i (2 d d_i + 2 d_i |cluster i|) for tail cluster i, f_i the measured fraction of targets in it.
Element-wise work (LayerNorm, softmax, dropout, Adam) is not counted, as usual for MFU, nor is work an
implementation adds (our training recomputes the attention scores in backward). The script prints `FlopCounterMode`'s
counts beside the formula: one training forward (which must agree with the formula's forward, to within the rounding
of the measured cluster fractions) and one whole training step (the formula's training FLOPs plus the recomputed
products).

    python benchmarks/bench_mfu.py
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_causal_lm import BENCH_PRESETS  # noqa: E402
from causal_lm_worker import one_step  # noqa: E402
from common import (  # noqa: E402
    add_allocator_option,
    counted_matmul_flops,
    matmul_flops,
    print_table,
    set_threads,
    stream_segments,
    use_allocator,
    word_level_ids,
    write_json,
)


def flops_per_token(cfg, batch: int, tgt_len: int, mem_len: int, targets: torch.Tensor) -> dict:
    """Training FLOPs per token of `cfg` (a TransformerXLConfig) for batches of `batch` rows and segments of
    `tgt_len` with `mem_len` memory; `targets` (token ids) give the cluster fractions of the adaptive softmax.
    Returns the parts and the total."""
    d, hd, d_ff = cfg.d_model, cfg.n_head * cfg.d_head, cfg.d_inner
    t, m = tgt_len, mem_len
    k = r = m + t
    weight_only = 2 * d * 2 * hd * m / t + 2 * d * hd * r / (batch * t)  # memory k, v and W_R R: no input gradient
    layer = 2 * d * 3 * hd + weight_only + 2 * hd * k + 2 * hd * r + 2 * hd * k + 2 * hd * d + 2 * 2 * d * d_ff
    bounds = [0, *cfg.cutoffs, cfg.vocab_size]
    dims = [cfg.d_embed // cfg.div_val**i if cfg.div_val > 1 else cfg.d_embed for i in range(len(bounds) - 1)]
    projected = cfg.div_val > 1 or cfg.d_embed != cfg.d_model
    fractions = [((targets >= lo) & (targets < hi)).float().mean().item() for lo, hi in zip(bounds[:-1], bounds[1:])]
    embed = sum(f * 2 * di * d for f, di in zip(fractions, dims)) if projected else 0.0
    n_clusters = len(bounds) - 2
    softmax = (2 * d * dims[0] if projected else 0) + 2 * dims[0] * (bounds[1] + n_clusters)
    for i in range(1, n_clusters + 1):
        softmax += fractions[i] * ((2 * d * dims[i] if projected else 0) + 2 * dims[i] * (bounds[i + 1] - bounds[i]))
    forward = cfg.n_layer * layer + embed + softmax
    return {"layers_fwd": cfg.n_layer * layer, "embedding_fwd": embed, "softmax_fwd": softmax,
            "forward": forward, "training": 3 * forward - cfg.n_layer * weight_only}


def training_step_times(model, segments, n_steps: int, state: dict) -> list[float]:
    """Forward + backward + Adam on consecutive segments, memory carried (state holds mems and the optimizer)."""
    times = []
    for _ in range(n_steps):
        segment = segments[state["step"] % len(segments)]
        state["step"] += 1
        x = segment[:, :-1]
        begin = time.perf_counter()
        out = model(input_ids=x, mems=state["mems"], labels=x)
        out.loss.backward()
        state["optimizer"].step()
        state["optimizer"].zero_grad(set_to_none=True)
        state["mems"] = out.mems
        times.append(time.perf_counter() - begin)
    return times


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="wide", choices=list(BENCH_PRESETS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="training steps timed per round")
    parser.add_argument("--matmul-n", type=int, default=2048)
    parser.add_argument("--compile", action="store_true", help="torch.compile every layer")
    add_allocator_option(parser)
    parser.add_argument("--output", default="benchmarks/results/mfu.json")
    args = parser.parse_args(argv)
    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM

    use_allocator(args.allocator)
    set_threads()
    spec = BENCH_PRESETS[args.preset]
    cfg = TransformerXLConfig(**spec["model"])
    torch.manual_seed(0)
    model = TransformerXLForCausalLM(cfg).train()
    if args.compile:
        for layer in model.transformer.layers:
            layer.compile(dynamic=False)
    batch, tgt_len = spec["batch"], spec["tgt_len"]
    n_seg = 8
    ids = word_level_ids(cfg.vocab_size, max_tokens=batch * (n_seg * tgt_len + 1))
    segments = stream_segments(ids, batch, tgt_len, n_seg)
    state = {"step": 0, "mems": None, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)}
    training_step_times(model, segments, 2, state)  # warm-up; the memory is full (mem_len = tgt_len) from now on
    flops = flops_per_token(cfg, batch, tgt_len, cfg.mem_len, torch.stack(segments)[:, :, 1:])
    inputs, tokens = segments[0][:, :-1], batch * tgt_len
    counted = {  # one training forward (loss included), then one whole training step
        "forward": counted_matmul_flops(lambda: model(input_ids=inputs, mems=state["mems"], labels=inputs)) / tokens,
        "training": counted_matmul_flops(lambda: one_step(model, inputs, state["mems"], state["optimizer"],
                                                          contextlib.nullcontext())) / tokens,
    }
    step_times, matmul_rates = [], []
    for _ in range(args.rounds):
        matmul_rates.append(matmul_flops(args.matmul_n, repeats=5)["flops_per_s"])
        step_times += training_step_times(model, segments, args.steps, state)
    peak = statistics.median(matmul_rates)
    tokens_per_s = batch * tgt_len / statistics.median(step_times)
    achieved = flops["training"] * tokens_per_s
    mfu = achieved / peak
    table = print_table(
        ["quantity", "value"],
        [["model GFLOP / training token", flops["training"] / 1e9],
         ["forward GFLOP / token: formula, FlopCounterMode", f"{flops['forward'] / 1e9:.4f}, "
          f"{counted['forward'] / 1e9:.4f}"],
         ["training step GFLOP / token, FlopCounterMode (recomputed scores included)",
          f"{counted['training'] / 1e9:.4f}"],
         ["training tokens/s", tokens_per_s],
         ["achieved GFLOP/s", achieved / 1e9], [f"torch.mm {args.matmul_n}^2 GFLOP/s", peak / 1e9],
         ["MFU", f"{mfu:.1%} (target >= 40%)"]],
    )
    result = {"preset": args.preset, "compile": args.compile, "allocator": args.allocator, "flops_per_token": flops,
              "counted_flops_per_token": counted, "tokens_per_s": tokens_per_s,
              "matmul_flops_per_s": peak, "matmul_raw": matmul_rates, "step_times": step_times,
              "achieved_flops_per_s": achieved, "mfu": mfu, "table": table}
    write_json(args.output, result)
    return result


if __name__ == "__main__":
    main()
