"""Evaluation with state reuse vs the vanilla sliding window, at a context of 640 tokens (Dai et al. 2019, Sec. 4.3).

State reuse: our causal LM reads the stream in segments of `--tgt-len` tokens with `mem_len = 640` and
`same_length=True`, so every prediction attends to exactly 640 keys; the memory is carried from segment to segment.
Vanilla (Al-Rfou et al. 2019): the same model without memory slides a 640-token window one token at a time and predicts
only the window's last token (`logits_to_keep=1`): one full forward per predicted token.

Time per predicted token: state reuse = median segment time / tgt_len; vanilla = median time of one window forward.
Every vanilla forward has the same shapes whatever the position, so it is timed on `--vanilla-positions` consecutive
positions and that median per-token time stands for every position of the stream (the extrapolation). Both sides
run in this process, interleaved round by round, on the same WikiText-2 tokens, batch 1, float32, 2 threads.

Table 9 (`--table9`, issue 22): the same two measurements with a model of the paper's `wt103-base` shape (16
layers, d_model 410, 10 heads x 41, d_inner 2,100, 267,735-word adaptive softmax with cutoffs 20k/40k/200k, div_val
1, evaluation clamp_len 400) at attention lengths 800, 1,800, 2,800 and 3,800 (`mem_len` = the attention length),
printed beside the paper's GPU column (363x, 773x, 1,409x, 1,874x; Dai et al. 2019, Table 9). Vanilla is timed on a
sample of `--vanilla-positions` targets per round (one forward each, its cost is the same at every position);
state reuse on a whole stream: every segment of `--segments` consecutive segments after the memory is full, timed
together. Random weights (speed does not depend on them); WikiText-2 word ids (`common.word_level_ids`, all below
33,278: of the wt103-base tails only the first, 20k-40k, holds targets; the others' logits are not computed by
either side, as in any evaluation).

    python benchmarks/bench_eval_reuse.py
    python benchmarks/bench_eval_reuse.py --table9 --rounds 1 --segments 4 --vanilla-positions 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, set_threads, word_level_ids, write_json  # noqa: E402

CONTEXT = 640
# The `wide` model of bench_causal_lm (WT103-like width, 6 layers, 30k adaptive vocabulary), evaluation settings.
MODEL = dict(vocab_size=30000, d_model=512, d_embed=512, n_layer=6, n_head=8, d_head=64, d_inner=2048,
             cutoffs=[5000, 15000], div_val=1, mem_len=CONTEXT, clamp_len=-1, same_length=True, dropout=0.0,
             dropatt=0.0)
# Table 9: the paper's WT103 base model with its evaluation clamp_len, and the paper's speed-ups (GPU).
TABLE9_MODEL = dict(vocab_size=267735, d_model=410, d_embed=410, n_layer=16, n_head=10, d_head=41, d_inner=2100,
                    cutoffs=[20000, 40000, 200000], div_val=1, clamp_len=400, same_length=True, dropout=0.0,
                    dropatt=0.0)
TABLE9_PAPER = {800: 363, 1800: 773, 2800: 1409, 3800: 1874}


def reuse_segment_times(model, ids: torch.Tensor, tgt_len: int, n_segments: int, context: int = CONTEXT
                        ) -> list[float]:
    """Fill the memory with `context` tokens, then time `n_segments` segments (inputs and next-token targets)."""
    mems = None
    with torch.no_grad():
        for start in range(0, context, tgt_len):
            mems = model(input_ids=ids[None, start : start + tgt_len], mems=mems).mems
        times = []
        for s in range(n_segments):
            start = context + s * tgt_len
            x = ids[None, start : start + tgt_len]
            y = ids[None, start + 1 : start + tgt_len + 1]
            begin = time.perf_counter()
            mems = model(input_ids=x, mems=mems, next_token_labels=y).mems
            times.append(time.perf_counter() - begin)
    return times


def reuse_stream_time(model, ids: torch.Tensor, tgt_len: int, n_segments: int, context: int) -> float:
    """Seconds per predicted token of a whole stream of `n_segments` consecutive segments (timed together, from the
    first to the last), after the memory has been filled with `context` tokens."""
    mems = None
    with torch.no_grad():
        for start in range(0, context, tgt_len):
            mems = model(input_ids=ids[None, start : start + tgt_len], mems=mems).mems
        begin = time.perf_counter()
        for s in range(n_segments):
            start = context + s * tgt_len
            x = ids[None, start : start + tgt_len]
            y = ids[None, start + 1 : start + tgt_len + 1]
            mems = model(input_ids=x, mems=mems, next_token_labels=y).mems
        return (time.perf_counter() - begin) / (n_segments * tgt_len)


def vanilla_token_times(model, ids: torch.Tensor, n_positions: int, offset: int, context: int = CONTEXT
                        ) -> list[float]:
    """One forward over the `context` tokens before each position, no memory, log-probs of the last token only."""
    times = []
    with torch.no_grad():
        for p in range(offset, offset + n_positions):
            window = ids[None, p - context : p]
            begin = time.perf_counter()
            logp = model(input_ids=window, mems=None, logits_to_keep=1).logits[0, -1]
            float(-logp[ids[p]])  # the prediction's NLL, as an evaluation would accumulate it
            times.append(time.perf_counter() - begin)
    return times


def table9(args) -> dict:
    """State reuse vs vanilla at the paper's attention lengths with the `wt103-base` shape (see the docstring)."""
    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM

    torch.manual_seed(0)
    lengths = args.lengths
    model = TransformerXLForCausalLM(TransformerXLConfig(**TABLE9_MODEL, mem_len=max(lengths))).eval()
    ids = word_level_ids(33278, max_tokens=max(lengths) * 2 + args.tgt_len * args.segments + 1)
    rows, result = [], {"model": TABLE9_MODEL, "tgt_len": args.tgt_len, "lengths": {}}
    for length in lengths:
        model.config.mem_len = length  # every prediction attends to exactly `length` keys (same_length)
        model.transformer.clear_inference_cache()
        vanilla_token_times(model, ids, 1, length, length)  # warm-up
        reuse, vanilla = [], []
        for r in range(args.rounds):
            reuse.append(reuse_stream_time(model, ids, args.tgt_len, args.segments, length))
            vanilla += vanilla_token_times(model, ids, args.vanilla_positions, length + r * args.vanilla_positions,
                                           length)
        reuse_tok, vanilla_tok = statistics.median(reuse), statistics.median(vanilla)
        result["lengths"][length] = {"reuse_s_per_token": reuse_tok, "vanilla_s_per_token": vanilla_tok,
                                     "speedup": vanilla_tok / reuse_tok, "reuse_raw": reuse, "vanilla_raw": vanilla,
                                     "paper_speedup_gpu": TABLE9_PAPER.get(length)}
        rows.append([length, vanilla_tok * 1e3, reuse_tok * 1e3, f"{vanilla_tok / reuse_tok:.0f}x",
                     f"{TABLE9_PAPER[length]}x" if length in TABLE9_PAPER else ""])
        print(f"attention length {length}: {vanilla_tok / reuse_tok:.0f}x", flush=True)
    result["table"] = print_table(
        ["attention length", "vanilla ms / token", "state reuse ms / token", "speed-up (this CPU)",
         "paper (GPU)"], rows)
    write_json(args.output, result)
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tgt-len", type=int, default=64, help="segment length of the state-reuse evaluation")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved measurement rounds")
    parser.add_argument("--segments", type=int, default=4, help="segments timed per round (state reuse)")
    parser.add_argument("--vanilla-positions", type=int, default=4, help="positions timed per round (vanilla)")
    parser.add_argument("--table9", action="store_true",
                        help="the paper's Table 9: wt103-base shape at attention lengths --lengths")
    parser.add_argument("--lengths", nargs="+", type=int, default=list(TABLE9_PAPER))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=None,
                        help="JSON path (default benchmarks/results/eval_reuse.json, or table9.json)")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    if args.table9:
        args.output = args.output or "benchmarks/results/table9.json"
        return table9(args)
    args.output = args.output or "benchmarks/results/eval_reuse.json"
    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM

    torch.manual_seed(0)
    model = TransformerXLForCausalLM(TransformerXLConfig(**MODEL)).eval()
    ids = word_level_ids(MODEL["vocab_size"], max_tokens=CONTEXT * 4 + args.tgt_len * args.segments + 1)
    reuse, vanilla = [], []
    vanilla_token_times(model, ids, 1, CONTEXT)  # warm-up of both paths
    reuse_segment_times(model, ids, args.tgt_len, 1)
    for r in range(args.rounds):
        reuse += [t / args.tgt_len for t in reuse_segment_times(model, ids, args.tgt_len, args.segments)]
        vanilla += vanilla_token_times(model, ids, args.vanilla_positions, CONTEXT + r * args.vanilla_positions)
    reuse_tok, vanilla_tok = statistics.median(reuse), statistics.median(vanilla)
    ratio = vanilla_tok / reuse_tok
    table = print_table(
        ["method", "ms / predicted token", "measured predictions"],
        [[f"state reuse (tgt_len {args.tgt_len}, mem_len {CONTEXT})", reuse_tok * 1e3,
          len(reuse) * args.tgt_len],
         [f"vanilla sliding window ({CONTEXT})", vanilla_tok * 1e3, len(vanilla)],
         ["speed-up", f"{ratio:.0f}x (target >= 300x; paper 363x at 800)", ""]],
    )
    result = {"model": MODEL, "context": CONTEXT, "tgt_len": args.tgt_len, "reuse_s_per_token": reuse_tok,
              "vanilla_s_per_token": vanilla_tok, "speedup": ratio, "reuse_raw": reuse, "vanilla_raw": vanilla,
              "table": table}
    write_json(args.output, result)
    return result


if __name__ == "__main__":
    main()
