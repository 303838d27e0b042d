"""Span question-answering training: our TransformerXLForQuestionAnswering vs transformers 5
`XLNetForQuestionAnswering` (XLNet's SQuAD head: start, end conditioned on the start, answer class), same work.

Same weights (a seeded XLNetForQuestionAnswering, converted with `xlnet_conversion.from_xlnet`), same batches
(WikiText-2 word ids laid out as XLNet's `P <sep> Q <sep> <cls>`, a p_mask over the question and special tokens,
start/end positions in the passage, `is_impossible` and `cls_index`: the full SQuAD 2.0 loss), float32, 2 threads.
Training step = forward + backward + fused Adam. Each side runs in its own fresh process per round (sides alternate,
rounds repeat), so each peak resident memory is its own: the peak above the process's memory after building the
model and optimizer state, over the timed steps. The first evaluation-mode loss of both sides is printed: the same
weights must give the same loss.

    python benchmarks/bench_qa.py
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
    PeakMemory,
    emit,
    print_table,
    run_worker,
    set_threads,
    word_level_ids,
    worker_args,
    write_json,
)

# XLNet-base's shape cut to 2 cores: 6 layers of width 512, windows of 256 tokens (question 32), batch 4, no memory
# (SQuAD windows are independent, as in XLNet's run_squad.py).
XLNET = dict(vocab_size=16000, d_model=512, n_layer=6, n_head=8, d_inner=2048, ff_activation="gelu", untie_r=True,
             attn_type="bi", mem_len=None, dropout=0.1, start_n_top=5, end_n_top=5)
BATCH, SEQ_LEN, QUESTION_LEN = 4, 256, 32


def qa_batches(n: int, vocab_size: int) -> list[dict]:
    """`n` batches of `P <sep> Q <sep> <cls>` windows with labels; P and Q are consecutive WikiText-2 words."""
    sep_id, cls_id = vocab_size - 2, vocab_size - 1
    passage = SEQ_LEN - QUESTION_LEN - 3
    ids = word_level_ids(vocab_size - 2, max_tokens=n * BATCH * (SEQ_LEN - 3)).view(n, BATCH, -1)
    generator = torch.Generator().manual_seed(0)
    batches = []
    for step in range(n):
        rows = ids[step]
        sep, cls = torch.full((BATCH, 1), sep_id), torch.full((BATCH, 1), cls_id)
        x = torch.cat([rows[:, :passage], sep, rows[:, passage:passage + QUESTION_LEN], sep, cls], dim=1)
        types = torch.tensor([0] * (passage + 1) + [1] * (QUESTION_LEN + 1) + [2]).expand(BATCH, -1)
        p_mask = torch.ones(BATCH, SEQ_LEN)
        p_mask[:, :passage] = 0.0
        start = torch.randint(0, passage - 8, (BATCH,), generator=generator)
        end = start + torch.randint(0, 8, (BATCH,), generator=generator)
        batches.append({"input_ids": x, "token_type_ids": types, "p_mask": p_mask, "start_positions": start,
                        "end_positions": end, "is_impossible": (torch.arange(BATCH) % 2).float(),
                        "cls_index": torch.full((BATCH,), SEQ_LEN - 1)})
    return batches


def worker() -> None:
    args = worker_args()
    set_threads()
    from transformers import XLNetConfig, XLNetForQuestionAnswering

    torch.manual_seed(1234)
    xlnet = XLNetForQuestionAnswering(XLNetConfig(**XLNET))
    if args["side"] == "ours":
        from modeling_xl import TransformerXLForQuestionAnswering
        from modeling_xl.xlnet_conversion import from_xlnet

        model = from_xlnet(TransformerXLForQuestionAnswering, xlnet)
        del xlnet
    else:
        model = xlnet
    batches = qa_batches(4, XLNET["vocab_size"])
    with torch.no_grad():
        check = float(model.eval()(**batches[0]).loss)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5, fused=True)

    def step(batch):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(batches[0])  # warm-up: allocates gradients and optimizer state
    peak = PeakMemory()
    peak.start()
    times = []
    for i in range(args["steps"]):
        begin = time.perf_counter()
        step(batches[(i + 1) % len(batches)])
        times.append(time.perf_counter() - begin)
    emit({"times": times, "peak_bytes": peak.stop(), "peak_method": peak.method, "eval_loss_batch0": check})


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="training steps timed per round and side")
    parser.add_argument("--output", default="benchmarks/results/qa.json")
    parser.add_argument("--args", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.args is not None:
        return worker()
    runs = {"ours": [], "xlnet": []}
    for _ in range(args.rounds):
        for side in runs:
            runs[side].append(run_worker(sys.executable, __file__, {"side": side, "steps": args.steps}))
    tokens = BATCH * SEQ_LEN
    step_s = {side: statistics.median(t for r in results for t in r["times"]) for side, results in runs.items()}
    peak = {side: statistics.median(r["peak_bytes"] for r in results) / 2**20 for side, results in runs.items()}
    check = {side: results[0]["eval_loss_batch0"] for side, results in runs.items()}
    tps = {side: tokens / s for side, s in step_s.items()}
    table = print_table(
        ["model", "training tokens/s", "step s (median)", "peak MiB above model + Adam state (median)",
         "eval loss, batch 0"],
        [[side, tps[side], step_s[side], peak[side], check[side]] for side in runs]
        + [["ours / xlnet", f"{tps['ours'] / tps['xlnet']:.2f}x", "", f"{peak['ours'] / peak['xlnet']:.2f}x", ""]])
    result = {"xlnet_config": XLNET, "batch": BATCH, "seq_len": SEQ_LEN, "question_len": QUESTION_LEN,
              "tokens_per_s": tps, "step_s": step_s, "peak_mib": peak, "loss_check": check, "runs": runs,
              "table": table}
    write_json(args.output, result)
    return result


if __name__ == "__main__":
    main()
