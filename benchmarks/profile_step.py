"""Where a training step spends its time: every operator timed where it runs, over a few steps of a
bench_causal_lm.py preset or of bench_plm.py's permutation-LM setup (`--preset plm`).

Causal LM: runs under either interpreter, `--impl ours` (this project) or `--impl legacy` (transformers 4.35.0
`TransfoXLLMHeadModel`, run it with that venv's python). Same preset, batches and fused Adam as bench_causal_lm.py.
Permutation LM: `--impl ours` or `--impl xlnet` (transformers 5 `XLNetLMHeadModel`); as in bench_plm.py both models
live in the process (ours converted from the seeded XLNet) and both take the warm-up steps, the chosen one is timed.

After two warm-up steps, `--steps` plain steps (their median is the step's wall time) alternate with as many under
`OperatorTimer`, which times each aten operator where it runs (`time.perf_counter` around the call; torch.profiler is
no guide on this CPU: it inflated the self time of parallel kernels up to 5x). Operators are grouped (matrix
products, optimizer, random draws, softmax, copies and fills, views and allocation, the rest); what the wall time
holds beyond the operators' own time is the time outside them (Python, autograd, dispatch), `wall - sum of operator
times`: a difference of two measurements, within their noise of either sign. The timer's own per-call cost (a few
microseconds of Python around each call) is counted inside the operators' time: it overstates groups of many small
calls (views and allocation most) and understates the time outside by as much.
`--replay-matmuls` adds the step's matrix products replayed alone at their own shapes (common.replayed_matmul_seconds):
the products' own cost, against which the time they take inside the step and the non-product rest are read (issue 22:
step <= 1.25x the replay). `--floor` (causal presets) adds the framework floor: the same model (layers, heads,
clusters, memory) shrunk until it does almost no arithmetic (d_head 2, d_inner 8, 16 tokens per cluster, 1 x 8 tokens,
memory 8), so its step is the cost of running the operators at all.

    python benchmarks/profile_step.py --impl ours --preset d256 --replay-matmuls --floor
    /work/venv435/bin/python benchmarks/profile_step.py --impl legacy --preset wide
    python benchmarks/profile_step.py --impl xlnet --preset plm
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_causal_lm import BENCH_PRESETS, legacy_config  # noqa: E402
from causal_lm_worker import one_step  # noqa: E402
from common import (  # noqa: E402
    MATMUL_OPS,
    add_allocator_option,
    print_table,
    recorded_matmuls,
    replayed_matmul_seconds,
    set_threads,
    stream_segments,
    use_allocator,
    word_level_ids,
    write_json,
)

# operator groups (aten overload packet names); everything not named is "the rest" (elementwise, LayerNorm, GELU,
# reductions, indexing)
GROUPS = {
    "matrix products": set(MATMUL_OPS),
    "optimizer": {"_fused_adam_", "_foreach_add_", "_foreach_mul_", "_foreach_addcmul_", "_foreach_addcdiv_",
                  "_foreach_sqrt", "_foreach_div_", "_foreach_lerp_"},
    "random draws (dropout)": {"random_", "bernoulli_", "uniform_", "bernoulli", "rand", "native_dropout"},
    "softmax": {"_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data"},
    "copies and fills": {"clone", "cat", "copy_", "_to_copy", "fill_", "zero_", "zeros_like", "ones_like", "new_zeros",
                         "zeros", "slice_backward", "select_backward", "index_put", "index_put_", "index_add",
                         "index_add_", "index_copy", "index_select", "embedding", "embedding_dense_backward",
                         "constant_pad_nd", "masked_fill_", "masked_fill", "scatter_add", "scatter_add_"},
    "views and allocation": {"view", "_unsafe_view", "slice", "expand", "transpose", "t", "detach", "alias",
                             "as_strided", "unsqueeze", "squeeze", "split", "split_with_sizes", "permute", "select",
                             "unbind", "empty", "empty_like", "new_empty", "empty_strided", "_reshape_alias",
                             "unfold", "diagonal", "view_as_real", "lift_fresh"},
}
REST = "the rest (elementwise, norms, reductions)"


def group_of(name: str) -> str:
    return next((group for group, names in GROUPS.items() if name in names), REST)


class OperatorTimer(TorchDispatchMode):
    """Wall time and calls of every aten operator run under it, timed around the call where it runs."""

    def __init__(self):
        super().__init__()
        self.seconds, self.calls = Counter(), Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.seconds[name] += time.perf_counter() - start
        self.calls[name] += 1
        return out


def build(impl: str, spec: dict):
    torch.manual_seed(1234)
    if impl == "legacy":
        from transformers import TransfoXLConfig, TransfoXLLMHeadModel

        return TransfoXLLMHeadModel(TransfoXLConfig(**legacy_config(spec["model"])))
    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM

    return TransformerXLForCausalLM(TransformerXLConfig(**spec["model"]))


def causal_steps(impl: str, spec: dict, segments: list[torch.Tensor], warmup: int = 2):
    """run(n): n training steps (forward, backward, fused Adam, memory carried) over `segments` in turn, returning
    each step's seconds; the first `warmup` steps are taken before it is returned."""
    model = build(impl, spec).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
    precision = torch.autocast("cpu", enabled=False)
    state = {"i": 0, "mems": None}

    def run(n: int) -> list[float]:
        times = []
        for _ in range(n):
            segment = segments[state["i"] % len(segments)]
            state["i"] += 1
            begin = time.perf_counter()
            state["mems"] = one_step(model, segment[:, :-1], state["mems"], optimizer, precision).mems
            times.append(time.perf_counter() - begin)
        return times

    run(warmup)
    return run


def shrunk_model(model: dict) -> dict:
    """`model` (a preset's config) with the same layers, heads, clusters and div_val but almost no arithmetic."""
    clusters = len(model["cutoffs"])
    d_model = 2 * model["n_head"]
    return dict(model, d_head=2, d_model=d_model, d_embed=max(d_model, model["div_val"] ** clusters), d_inner=8,
                cutoffs=[16 * (i + 1) for i in range(clusters)], vocab_size=16 * (clusters + 1), mem_len=8)


def framework_floor(impl: str, model: dict, steps: int) -> dict:
    """Median step and operator count of `shrunk_model(model)` at 1 x 8 tokens."""
    shrunk = shrunk_model(model)
    generator = torch.Generator().manual_seed(0)
    segments = list(torch.randint(0, shrunk["vocab_size"], (8, 1, 9), generator=generator))
    run = causal_steps(impl, {"model": shrunk}, segments, warmup=5)
    seconds = statistics.median(run(max(steps, 20)))
    timer = OperatorTimer()
    with timer:
        run(1)
    return {"step_s": seconds, "operators": sum(timer.calls.values()),
            "config": {k: shrunk[k] for k in ("d_model", "d_head", "d_inner", "vocab_size", "cutoffs", "mem_len")}}


def plm_steps(impl: str, n_steps: int):
    """bench_plm.py's setup: run(n) doing n training steps of `impl` and returning each step's seconds, after two
    warm-up steps of both models."""
    from bench_plm import XLNET, plm_batches, step_ours, step_xlnet, timed_steps
    from transformers import XLNetConfig, XLNetLMHeadModel

    from modeling_xl.modeling_permutation_lm import TransformerXLForPermutationLM
    from modeling_xl.xlnet_conversion import from_xlnet

    torch.manual_seed(1234)
    xlnet = XLNetLMHeadModel(XLNetConfig(**XLNET)).train()
    ours = from_xlnet(TransformerXLForPermutationLM, xlnet).train()
    sides = {"ours": (ours, step_ours), "xlnet": (xlnet, step_xlnet)}
    batches = plm_batches(n_steps + 2, XLNET["vocab_size"])
    states = {name: {"i": 0, "opt": torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)}
              for name, (model, _) in sides.items()}
    for name, (model, step) in sides.items():
        timed_steps(model, step, batches, states[name], 2)
    model, step = sides[impl]
    return lambda n: timed_steps(model, step, batches, states[impl], n)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--impl", choices=["ours", "legacy", "xlnet"], default="ours")
    parser.add_argument("--preset", choices=[*BENCH_PRESETS, "plm"], default="wide")
    parser.add_argument("--steps", type=int, default=6,
                        help="steps timed plainly, and as many under the operator timer, alternately")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--replay-matmuls", action="store_true",
                        help="also record one more step's matrix products and time each alone at its shapes (the "
                             "time they take by themselves: every other operation free)")
    parser.add_argument("--floor", action="store_true",
                        help="also time the same model shrunk to almost no arithmetic (causal presets): the cost of "
                             "running the step's operators at all")
    add_allocator_option(parser)
    parser.add_argument("--output", default=None, help="default benchmarks/results/profile_<impl>_<preset>.json")
    args = parser.parse_args(argv)
    if args.impl not in (("ours", "xlnet") if args.preset == "plm" else ("ours", "legacy")):
        parser.error(f"--impl {args.impl} does not go with --preset {args.preset}; expected ours/legacy for the causal "
                     "presets, ours/xlnet for plm")
    if args.floor and args.preset == "plm":
        parser.error("--floor goes with the causal presets only (tiny, d256, wide), not --preset plm")
    if args.steps < 1:
        parser.error(f"--steps {args.steps}; expected at least 1")
    use_allocator(args.allocator)
    set_threads()
    if args.preset == "plm":
        run = plm_steps(args.impl, 2 * args.steps + 1)
    else:
        spec = BENCH_PRESETS[args.preset]
        n_seg = 2 * args.steps + 4
        ids = word_level_ids(spec["model"]["vocab_size"], max_tokens=spec["batch"] * (n_seg * spec["tgt_len"] + 1))
        run = causal_steps(args.impl, spec, stream_segments(ids, spec["batch"], spec["tgt_len"], n_seg))
    # plain and timed steps alternate, so that a drift of the machine's speed reaches both
    timer, plain = OperatorTimer(), []
    for _ in range(args.steps):
        plain += run(1)
        with timer:
            run(1)
    wall = statistics.median(plain)
    per_step = {name: seconds / args.steps for name, seconds in timer.seconds.items()}
    in_operators = sum(per_step.values())
    groups = Counter()
    for name, seconds in per_step.items():
        groups[group_of(name)] += seconds
    ms = lambda seconds: 1e3 * seconds  # noqa: E731
    rows = [[name, timer.calls[name] // args.steps, ms(seconds), f"{100 * seconds / wall:.1f}%"]
            for name, seconds in sorted(per_step.items(), key=lambda item: item[1], reverse=True)[:args.top]]
    rows += [[f"= {group}", "", ms(seconds), f"{100 * seconds / wall:.1f}%"] for group, seconds in groups.most_common()]
    rows.append(["= outside the operators (Python, autograd, dispatch)", "", ms(wall - in_operators),
                 f"{100 * (wall - in_operators) / wall:.1f}%"])
    rows.append(["= the step (wall, plain)", sum(timer.calls.values()) // args.steps, ms(wall), "100%"])
    table = print_table(["operator", "calls / step", "ms / step", "of the step"], rows)
    payload = {"impl": args.impl, "preset": args.preset, "steps": args.steps, "allocator": args.allocator,
               "table": table, "step_s": wall, "operators_per_step": sum(timer.calls.values()) / args.steps,
               "group_s": dict(groups), "outside_operators_s": wall - in_operators,
               "operator_s": per_step,
               "operator_calls": {name: calls / args.steps for name, calls in timer.calls.items()}}
    if args.replay_matmuls:
        replay = replayed_matmul_seconds(recorded_matmuls(lambda: run(1)))
        products = groups["matrix products"]
        payload["replayed_matmuls"] = replay
        lines = [f"matrix products of one step replayed alone: {ms(replay['seconds']):.1f} ms ({replay['calls']} "
                 f"calls, {replay['signatures']} distinct signatures); inside the step: {ms(products):.1f} ms",
                 f"step / replayed products: {wall / replay['seconds']:.2f}; everything but the products: "
                 f"{ms(wall - products):.1f} ms, the products' extra time inside the step: "
                 f"{ms(products - replay['seconds']):.1f} ms; a step of 1.25x the replay leaves "
                 f"{ms(0.25 * replay['seconds']):.1f} ms for both"]
        print("\n".join(lines), flush=True)
    if args.floor:
        payload["floor"] = floor = framework_floor(args.impl, BENCH_PRESETS[args.preset]["model"], args.steps)
        print(f"framework floor (the model shrunk: {floor['config']}, 1 x 8 tokens): {ms(floor['step_s']):.1f} ms a "
              f"step, {floor['operators']} operators", flush=True)
    write_json(args.output or f"benchmarks/results/profile_{args.impl}_{args.preset}.json", payload)
    return payload


if __name__ == "__main__":
    main()
