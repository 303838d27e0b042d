"""Where a training step spends its time: torch.profiler over a few steps of a bench_causal_lm.py preset, or of
bench_plm.py's permutation-LM setup (`--preset plm`).

Causal LM: runs under either interpreter, `--impl ours` (this project) or `--impl legacy` (transformers 4.35.0
`TransfoXLLMHeadModel`, run it with that venv's python). Same preset, batches and fused Adam as bench_causal_lm.py.
Permutation LM: `--impl ours` or `--impl xlnet` (transformers 5 `XLNetLMHeadModel`); as in bench_plm.py both models
live in the process (ours converted from the seeded XLNet) and both take the warm-up steps, the chosen one is profiled.
Two warm-up steps, then `--steps` profiled steps. Prints the operators with the most self CPU time and the share of
matrix products (aten::mm / bmm / addmm / baddbmm), the optimizer and everything else, and writes JSON.

    python benchmarks/profile_step.py --impl ours --preset wide
    /work/venv435/bin/python benchmarks/profile_step.py --impl legacy --preset wide
    python benchmarks/profile_step.py --impl xlnet --preset plm
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_causal_lm import BENCH_PRESETS, legacy_config  # noqa: E402
from causal_lm_worker import one_step  # noqa: E402
from common import MATMUL_OPS as COMMON_MATMUL_OPS  # noqa: E402
from common import (add_allocator_option, print_table, recorded_matmuls, replayed_matmul_seconds,  # noqa: E402
                    set_threads, stream_segments, use_allocator, word_level_ids, write_json)

MATMUL_OPS = {f"aten::{name}" for name in COMMON_MATMUL_OPS}
OPTIMIZER_OPS = {"aten::_fused_adam_", "aten::_foreach_add_", "aten::_foreach_mul_", "aten::_foreach_addcmul_",
                 "aten::_foreach_addcdiv_", "aten::_foreach_sqrt", "aten::_foreach_div_", "aten::_foreach_lerp_"}


def build(impl: str, spec: dict):
    torch.manual_seed(1234)
    if impl == "legacy":
        from transformers import TransfoXLConfig, TransfoXLLMHeadModel

        return TransfoXLLMHeadModel(TransfoXLConfig(**legacy_config(spec["model"])))
    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM

    return TransformerXLForCausalLM(TransformerXLConfig(**spec["model"]))


def plm_steps(impl: str, n_steps: int):
    """bench_plm.py's setup: (run(n) doing n training steps of `impl`, after two warm-up steps of both models)."""
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
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--replay-matmuls", action="store_true",
                        help="also record one more step's matrix products and time each alone at its shapes (the "
                             "time they take by themselves: every other operation free)")
    add_allocator_option(parser)
    parser.add_argument("--output", default=None, help="default benchmarks/results/profile_<impl>_<preset>.json")
    args = parser.parse_args(argv)
    if args.impl not in (("ours", "xlnet") if args.preset == "plm" else ("ours", "legacy")):
        parser.error(f"--impl {args.impl} does not go with --preset {args.preset}; expected ours/legacy for the causal "
                     "presets, ours/xlnet for plm")
    use_allocator(args.allocator)
    set_threads()
    if args.preset == "plm":
        run = plm_steps(args.impl, args.steps + 1)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run(args.steps)
        one_more = lambda: run(1)  # noqa: E731
    else:
        spec = BENCH_PRESETS[args.preset]
        n_seg = args.steps + 3
        ids = word_level_ids(spec["model"]["vocab_size"], max_tokens=spec["batch"] * (n_seg * spec["tgt_len"] + 1))
        segments = stream_segments(ids, spec["batch"], spec["tgt_len"], n_seg)
        model = build(args.impl, spec).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
        precision = torch.autocast("cpu", enabled=False)
        mems = None
        for segment in segments[:2]:
            mems = one_step(model, segment[:, :-1], mems, optimizer, precision).mems
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for segment in segments[2:-1]:
                mems = one_step(model, segment[:, :-1], mems, optimizer, precision).mems
        one_more = lambda: one_step(model, segments[-1][:, :-1], mems, optimizer, precision)  # noqa: E731
    averages = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in averages)
    ops = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)
    share = {"matrix products": 0.0, "optimizer": 0.0, "everything else": 0.0}
    for event in ops:
        group = ("matrix products" if event.key in MATMUL_OPS else
                 "optimizer" if event.key in OPTIMIZER_OPS else "everything else")
        share[group] += event.self_cpu_time_total / total
    rows = [[e.key, e.count // args.steps, e.self_cpu_time_total / 1e3 / args.steps,
             f"{100 * e.self_cpu_time_total / total:.1f}%"] for e in ops[:args.top]]
    rows += [[f"= {name}", "", "", f"{100 * value:.1f}%"] for name, value in share.items()]
    table = print_table(["operator", "calls / step", "self ms / step", "share"], rows)
    output = args.output or f"benchmarks/results/profile_{args.impl}_{args.preset}.json"
    # the sum of operator self times per step: profiler overhead included, Python time between operators left out
    # (not the wall time of a step; bench_causal_lm.py / bench_plm.py time steps)
    payload = {"impl": args.impl, "preset": args.preset, "steps": args.steps, "table": table, "share": share,
               "operator_self_ms_per_step": total / 1e3 / args.steps}
    if args.replay_matmuls:
        payload["replayed_matmuls"] = replay = replayed_matmul_seconds(recorded_matmuls(one_more))
        print(f"matrix products of one step replayed alone: {1e3 * replay['seconds']:.1f} ms "
              f"({replay['calls']} calls, {replay['signatures']} distinct signatures)")
    write_json(output, payload)
    return share


if __name__ == "__main__":
    main()
