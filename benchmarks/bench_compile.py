"""torch.compile (inductor) of the whole training step vs eager, both objectives, `tiny` preset: warm-up and steps/s.

What `accelerate launch --dynamo_backend inductor scripts/pretrain.py --preset tiny` compiles: `torch.compile(model)`,
the model's forward with its loss (AOT autograd compiles the backward with it); Adam and the loop stay eager. Two
copies of one model (same initial weights, dropout 0 so that both draw nothing random) train on the same batches,
with the memory carried and torch's fused Adam, in this one process:
- warm-up: the wall time of the compiled model's first steps (step 1 compiles the graph without memory, step 2 the
  graph with memory; a permutation LM whose memory is still filling (mem_len > reuse_len) compiles once more, with a
  dynamic memory length) against the eager model's first steps;
- steps/s: median step time after warm-up, the two sides alternating step by step; the speed-up is the median of
  the ratios of consecutive eager and compiled steps (a shared machine's load shifts hit both of a pair alike);
- losses: every step's loss of both sides (they take the same updates, so they stay equal up to float32 rounding,
  which the updates carry forward);
- the compiled formulation's matrix products: under compilation the adaptive input and softmax run every cluster
  over every token (masked) instead of selecting each cluster's rows, so that shapes do not depend on the data;
  FlopCounterMode counts one training step of each formulation, run eagerly.

Inductor keeps compiled graphs in an on-disk cache (`TORCHINDUCTOR_CACHE_DIR`, by default under /tmp) and a later
process compiling the same graphs loads them instead: the warm-up is measured with an empty cache of its own unless
`--warm_cache` (then the default cache, as a second run of the same command would find it).

    python benchmarks/bench_compile.py                  # both objectives
    python benchmarks/bench_compile.py --objectives clm --rounds 20
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_plm import plm_batches  # noqa: E402
from common import counted_matmul_flops, print_table, set_threads, stream_segments, word_level_ids, write_json  # noqa: E402

BATCH, TGT_LEN = 16, 64  # the `tiny` recipe (modeling_xl/training/recipes.py)
N_BATCHES = 64  # consecutive segments, enough for the default warm-up and rounds without reusing one


def build(objective: str):
    """(model, batches, step function) of the `tiny` preset for `objective`, dropout 0."""
    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM, TransformerXLForPermutationLM

    torch.manual_seed(0)
    if objective == "clm":
        config = TransformerXLConfig.from_preset("tiny", dropout=0.0, dropatt=0.0)
        ids = word_level_ids(config.vocab_size)
        segments = stream_segments(ids, BATCH, TGT_LEN, N_BATCHES)
        batches = [dict(input_ids=s[:, :-1], next_token_labels=s[:, 1:]) for s in segments]
        return TransformerXLForCausalLM(config).train(), batches, clm_step
    reuse_len = TGT_LEN // 2  # the script's defaults (modeling_xl/training/plm.py, plm_settings)
    config = TransformerXLConfig.from_preset("tiny", dropout=0.0, dropatt=0.0, adaptive=False, cutoffs=[],
                                             tie_projs=[False], attn_type="bi", reuse_len=reuse_len)
    batches = plm_batches(N_BATCHES, config.vocab_size, batch=BATCH, seq_len=TGT_LEN, reuse_len=reuse_len,
                          num_predict=max(2, round(TGT_LEN / 6)), perm_size=reuse_len)
    return TransformerXLForPermutationLM(config).train(), batches, plm_step


def clm_step(model, batch, mems):
    out = model(input_ids=batch["input_ids"], mems=mems, next_token_labels=batch["next_token_labels"])
    return out.loss, out.mems


def plm_step(model, batch, mems):
    out = model(input_ids=batch["input_ids"], perm_mask=batch["perm_mask"], target_mapping=batch["target_mapping"],
                token_type_ids=batch["token_type_ids"], mems=mems, labels=batch["labels"],
                target_mask=batch["target_mask"])
    return out.loss, out.mems


class Side:
    """One model with its optimizer, memory and position in the batches; `steps(n)` trains n steps."""

    def __init__(self, model, step_fn, batches):
        self.model, self.step_fn, self.batches = model, step_fn, batches
        self.optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
        self.mems, self.i, self.losses = None, 0, []

    def steps(self, n: int) -> list[float]:
        times = []
        for _ in range(n):
            begin = time.perf_counter()
            loss, self.mems = self.step_fn(self.model, self.batches[self.i % len(self.batches)], self.mems)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - begin)
            self.losses.append(float(loss.detach()))
            self.i += 1
        return times


def compiled_formulation_flops(model, step_fn, batch) -> dict:
    """Matrix-product FLOPs of one forward + backward (memory empty) as eager runs it and as the compiled graph
    computes it (the branches taken under `torch.compiler.is_compiling()`, run eagerly)."""
    def once():
        loss, _ = step_fn(model, batch, None)
        loss.backward()
        model.zero_grad(set_to_none=True)

    eager = counted_matmul_flops(once)
    with mock.patch.object(torch.compiler, "is_compiling", lambda: True):
        compiled = counted_matmul_flops(once)
    return {"eager": eager, "compiled": compiled}


def measure(objective: str, backend: str, warmup_steps: int, rounds: int, steps: int) -> dict:
    model, batches, step_fn = build(objective)
    flops = compiled_formulation_flops(model, step_fn, batches[0])
    eager = Side(copy.deepcopy(model), step_fn, batches)
    compiled = Side(torch.compile(copy.deepcopy(model), backend=backend), step_fn, batches)
    warm = {"eager": eager.steps(warmup_steps), "compiled": compiled.steps(warmup_steps)}
    times = {"eager": [], "compiled": []}
    for _ in range(rounds):
        times["eager"] += eager.steps(steps)
        times["compiled"] += compiled.steps(steps)
    step_s = {name: statistics.median(t) for name, t in times.items()}
    # the two sides alternate step by step (by default), so a load change hits both steps of a pair alike
    paired = statistics.median(e / c for e, c in zip(times["eager"], times["compiled"]))
    diffs = [abs(a - b) / abs(b) for a, b in zip(compiled.losses, eager.losses)]
    return {"objective": objective, "warmup_step_s": warm, "step_times": times, "step_s": step_s,
            "steps_per_s": {name: 1 / s for name, s in step_s.items()}, "speedup": paired,
            "losses": {"eager": eager.losses, "compiled": compiled.losses}, "max_rel_loss_diff": max(diffs),
            "max_rel_loss_diff_first_steps": max(diffs[:warmup_steps]), "matmul_flops_per_step": flops,
            "tokens_per_step": BATCH * TGT_LEN}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--objectives", nargs="+", default=["clm", "plm"], choices=["clm", "plm"])
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--warmup_steps", type=int, default=3, help="first steps timed one by one (compilation)")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--steps", type=int, default=1, help="steps timed per round and side")
    parser.add_argument("--warm_cache", action="store_true", help="keep inductor's default on-disk cache")
    parser.add_argument("--output", default="benchmarks/results/compile.json")
    args = parser.parse_args(argv)
    set_threads()
    with tempfile.TemporaryDirectory(prefix="bench_compile_inductor_") as cache:
        if not args.warm_cache:  # read when inductor first compiles, so set before any compilation
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        results = [measure(o, args.backend, args.warmup_steps, args.rounds, args.steps) for o in args.objectives]
    rows = []
    for r in results:
        for name in ("eager", "compiled"):
            rows.append([r["objective"], name, " / ".join(f"{t:.2f}" for t in r["warmup_step_s"][name]),
                         r["steps_per_s"][name], r["step_s"][name], r["matmul_flops_per_step"][name] / 1e9])
        rows.append([r["objective"], "compiled / eager (median of paired steps)", "", f"{r['speedup']:.2f}x", "",
                     f"{r['matmul_flops_per_step']['compiled'] / r['matmul_flops_per_step']['eager']:.2f}x"])
    table = print_table(["objective", "side", f"first {args.warmup_steps} steps, s each", "steps/s after warm-up",
                         "step s (median)", "matmul GFLOP / fwd+bwd"], rows)
    for r in results:
        print(f"{r['objective']}: largest relative loss difference compiled vs eager {r['max_rel_loss_diff']:.2e} "
              f"over {len(r['losses']['eager'])} steps ({r['max_rel_loss_diff_first_steps']:.2e} over the first "
              f"{args.warmup_steps})")
    result = {"backend": args.backend, "warm_cache": args.warm_cache, "batch": BATCH, "tgt_len": TGT_LEN,
              "results": results, "table": table}
    write_json(args.output, result)
    return result


if __name__ == "__main__":
    main()
