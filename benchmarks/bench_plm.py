"""Permutation-LM training: our TransformerXLForPermutationLM vs transformers 5 `XLNetLMHeadModel`, same work.

Same weights (an XLNetLMHeadModel is created with a seed and converted with `xlnet_conversion.from_xlnet`),
same batches (WikiText-2 word ids laid out as `reuse ++ A <sep> B <sep> <cls>`, targets and permutations from the
project's sampler `modeling_xl.data.plm_sampling.PLMCollator`: identical perm_mask / target_mapping / labels for both),
memory carried on both sides (`mem_len`, `reuse_len`; XLNet with `use_mems_train=True`), float32, 2 threads, one host
allocator for both (`--allocator`; both models live in one process).
Training step = forward + backward + Adam (torch's fused Adam on both sides). Both models live in this process and
alternate round by round. As in bench_causal_lm.py, the matrix-product FLOPs of one step of each side are counted
(FlopCounterMode) and divided by the float32 torch.mm rate measured in this run: `xlnet step / our floor` is the
largest ratio any float32 implementation doing our products could reach here. The products of one more step of each
side are also recorded and replayed alone, each at its own shapes and strides (`common.replayed_matmul_seconds`): the
time they take by themselves, at the rate of their own shapes.

    python benchmarks/bench_plm.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    add_allocator_option,
    counted_matmul_flops,
    matmul_flops,
    print_table,
    recorded_matmuls,
    replayed_matmul_seconds,
    set_threads,
    use_allocator,
    word_level_ids,
    write_json,
)

# XLNet-base shape cut to 2 cores: 6 layers of width 512, sequences of 128 (reuse 64), memory 96, 21 predictions.
XLNET = dict(vocab_size=16000, d_model=512, n_layer=6, n_head=8, d_inner=2048, ff_activation="gelu",
             untie_r=True, attn_type="bi", mem_len=96, reuse_len=64, dropout=0.1, bi_data=False, use_mems_train=True)
BATCH, SEQ_LEN, REUSE_LEN, NUM_PREDICT, PERM_SIZE = 4, 128, 64, 21, 64


def plm_batches(n_steps: int, vocab_size: int, batch: int = BATCH, seq_len: int = SEQ_LEN, reuse_len: int = REUSE_LEN,
                num_predict: int = NUM_PREDICT, perm_size: int = PERM_SIZE,
                ids: torch.Tensor | None = None) -> list[dict]:
    """Consecutive batches whose reuse halves continue each other row by row, collated by the project's sampler
    (by default at this benchmark's shape; bench_compile.py passes the `tiny` recipe's). `ids`: the word ids to lay
    out (below vocab_size - 2, at least batch * (n_steps + 1) * seq_len of them); WikiText-2's by default."""
    from modeling_xl.data.plm_sampling import PLMCollator, PLMSamplingConfig

    sep_id, cls_id = vocab_size - 2, vocab_size - 1
    per_row = (n_steps + 1) * seq_len
    if ids is None:
        ids = word_level_ids(vocab_size - 2, max_tokens=batch * per_row)
    ids = ids[: batch * per_row].view(batch, -1)
    collator = PLMCollator(PLMSamplingConfig(sep_id=sep_id, cls_id=cls_id, seq_len=seq_len, reuse_len=reuse_len,
                                             num_predict=num_predict, perm_size=perm_size))
    a_len = (seq_len - reuse_len - 3) // 2
    b_len = seq_len - reuse_len - 3 - a_len
    batches = []
    for step in range(n_steps):
        examples = []
        for row in range(batch):
            reuse = ids[row, step * reuse_len : (step + 1) * reuse_len]
            rest = ids[row, per_row // 2 + step * (a_len + b_len) :][: a_len + b_len]
            sample = torch.cat([reuse, rest[:a_len], torch.tensor([sep_id]), rest[a_len:],
                                torch.tensor([sep_id, cls_id])])
            types = torch.tensor([0] * (reuse_len + a_len + 1) + [1] * (b_len + 1) + [2])
            examples.append({"input_ids": sample.numpy(), "token_type_ids": types.numpy(),
                             "example_id": step * batch + row})
        batches.append(collator(examples))
    return batches


def step_ours(model, batch, state):
    out = model(input_ids=batch["input_ids"], perm_mask=batch["perm_mask"], target_mapping=batch["target_mapping"],
                token_type_ids=batch["token_type_ids"], mems=state.get("mems"), labels=batch["labels"],
                target_mask=batch["target_mask"], reuse_len=REUSE_LEN)
    state["mems"] = out.mems
    return out.loss


def step_xlnet(model, batch, state):
    """transformers' XLNet: mean cross-entropy over the predictions (every sample has NUM_PREDICT real targets, so
    this equals our target_mask-weighted mean)."""
    out = model(input_ids=batch["input_ids"], perm_mask=batch["perm_mask"], target_mapping=batch["target_mapping"],
                token_type_ids=batch["token_type_ids"], mems=state.get("mems"), labels=batch["labels"])
    state["mems"] = out.mems
    return out.loss


def timed_steps(model, step_fn, batches, state, n: int) -> list[float]:
    times = []
    for _ in range(n):
        batch = batches[state["i"] % len(batches)]
        state["i"] += 1
        begin = time.perf_counter()
        loss = step_fn(model, batch, state)
        loss.backward()
        state["opt"].step()
        state["opt"].zero_grad(set_to_none=True)
        times.append(time.perf_counter() - begin)
    return times


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="training steps timed per round and side")
    add_allocator_option(parser)
    parser.add_argument("--output", default="benchmarks/results/plm.json")
    args = parser.parse_args(argv)
    use_allocator(args.allocator)  # both models live in this process
    from transformers import XLNetConfig, XLNetLMHeadModel

    from modeling_xl.modeling_permutation_lm import TransformerXLForPermutationLM
    from modeling_xl.xlnet_conversion import from_xlnet

    set_threads()
    torch.manual_seed(1234)
    xlnet = XLNetLMHeadModel(XLNetConfig(**XLNET)).train()
    ours = from_xlnet(TransformerXLForPermutationLM, xlnet).train()
    batches = plm_batches(8, XLNET["vocab_size"])
    sides = {
        "ours": (ours, step_ours, {"i": 0, "opt": torch.optim.Adam(ours.parameters(), lr=1e-4, fused=True)}),
        "xlnet": (xlnet, step_xlnet, {"i": 0, "opt": torch.optim.Adam(xlnet.parameters(), lr=1e-4, fused=True)}),
    }
    # Same weights, same batch: the first losses must agree (dropout off for this check only).
    with torch.no_grad():
        ours.eval(), xlnet.eval()
        check = {name: float(fn(model, batches[0], {})) for name, (model, fn, _) in sides.items()}
        ours.train(), xlnet.train()
    times = {name: [] for name in sides}
    for name, (model, fn, state) in sides.items():
        timed_steps(model, fn, batches, state, 2)  # warm-up; fills the memory
    rates = []
    for _ in range(args.rounds):
        rates.append(matmul_flops(2048, repeats=3)["flops_per_s"])
        for name, (model, fn, state) in sides.items():
            times[name] += timed_steps(model, fn, batches, state, args.steps)
    flops = {name: counted_matmul_flops(lambda: timed_steps(model, fn, batches, state, 1))
             for name, (model, fn, state) in sides.items()}
    replayed = {name: replayed_matmul_seconds(recorded_matmuls(lambda: timed_steps(model, fn, batches, state, 1)))
                for name, (model, fn, state) in sides.items()}
    rate = statistics.median(rates)
    tokens = BATCH * SEQ_LEN
    steps = {name: statistics.median(t) for name, t in times.items()}
    tps = {name: tokens / steps[name] for name in sides}
    ratio = tps["ours"] / tps["xlnet"]
    ceiling = steps["xlnet"] / (flops["ours"] / rate)
    table = print_table(
        ["model", "training tokens/s", "step s (median)", "matmul GFLOP / step", "matmul floor s",
         "products replayed alone s", "eval loss, batch 0"],
        [[name, tps[name], steps[name], flops[name] / 1e9, flops[name] / rate, replayed[name]["seconds"], check[name]]
         for name in sides]
        + [["ours / xlnet", f"{ratio:.2f}x (target >= 2x)", "", "", "", "", ""],
           ["largest float32 ratio (xlnet step / our floor)", f"{ceiling:.2f}x", "", "", "", "", ""],
           ["xlnet step / our products replayed alone", f"{steps['xlnet'] / replayed['ours']['seconds']:.2f}x",
            "", "", "", "", ""]],
    )
    result = {"xlnet_config": XLNET, "allocator": args.allocator, "batch": BATCH, "seq_len": SEQ_LEN,
              "reuse_len": REUSE_LEN, "num_predict": NUM_PREDICT, "tokens_per_s": tps, "ratio": ratio,
              "step_times": times,
              "matmul_flops_per_step": flops, "matmul_flops_per_s": rate, "matmul_raw": rates,
              "largest_float32_ratio": ceiling, "replayed_matmuls": replayed, "loss_check": check, "table": table}
    write_json(args.output, result)
    return result


if __name__ == "__main__":
    main()
