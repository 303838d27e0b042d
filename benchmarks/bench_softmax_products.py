"""The adaptive softmax's products with few rows, as in generation (issue 22, item 3): which orientation is fastest.

A decoding step multiplies a handful of hidden states (batch rows, or the rows that still need a tail cluster) by
output tables of thousands of rows. Between two steps the rest of the model runs, so the table is no longer in the
CPU's caches: each call here first writes a 64 MB buffer (`--flush-mb`) to evict it, as a step does. Three forms,
same maths:

- `hidden @ table^T` (`F.linear(hidden, table, bias)`, what a plain `nn.Linear` does);
- `table @ hidden^T` (`torch.addmm(bias[:, None], table, hidden.t())`, the table as the left operand);
- ours (`adaptive_softmax_fused.few_row_logits`, what `AdaptiveLogSoftmax.cluster_logits` runs for few rows:
  `table @ hidden^T`, one row multiplied as two copies of itself, output made contiguous as with gradients).

Tables of the d_model 256 benchmark shape (33,278 words, cutoffs 2k/10k/20k: head 2,003 rows, tails 8,000 / 10,000
/ 13,278), float32, 2 threads; median ms over `--repeats` calls after 5 untimed ones.

    python benchmarks/bench_softmax_products.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, set_threads, write_json  # noqa: E402

from modeling_xl.adaptive_softmax_fused import few_row_logits  # noqa: E402


def cold_ms(fn, flush: torch.Tensor, repeats: int) -> float:
    times = []
    for i in range(repeats + 5):
        flush.add_(1.0)  # evicts the table from the caches, as the rest of a decoding step does
        start = time.perf_counter()
        fn()
        if i >= 5:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def ours(hidden: torch.Tensor, table: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    with torch.enable_grad():  # the copy made with gradients (a contiguous result), the dearer of the two cases
        return few_row_logits(hidden, [(table, bias)])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", nargs="+", type=int, default=[2003, 8000, 10000, 13278])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2, 3, 4, 8])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--flush-mb", type=int, default=64)
    parser.add_argument("--output", default="benchmarks/results/softmax_products.json")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    torch.manual_seed(0)
    flush = torch.zeros(args.flush_mb * 1024 * 1024 // 4)
    rows_out, results = [], []
    for size in args.tables:
        table, bias = torch.randn(size, args.width) * 0.05, torch.randn(size)
        for n in args.rows:
            hidden = torch.randn(n, args.width)
            want = F.linear(hidden, table, bias)
            torch.testing.assert_close(ours(hidden, table, bias), want, rtol=1e-5, atol=1e-5)
            linear = cold_ms(lambda: F.linear(hidden, table, bias), flush, args.repeats)
            left = cold_ms(lambda: torch.addmm(bias[:, None], table, hidden.t()), flush, args.repeats)
            mine = cold_ms(lambda: ours(hidden, table, bias), flush, args.repeats)
            results.append({"table_rows": size, "rows": n, "linear_ms": linear, "table_left_ms": left,
                            "ours_ms": mine})
            rows_out.append([size, n, f"{linear:.3f}", f"{left:.3f}", f"{mine:.3f}", f"{linear / mine:.2f}x"])
    print_table(["table rows", "hidden rows", "hidden @ table^T ms", "table @ hidden^T ms", "ours ms",
                 "ours vs hidden @ table^T"], rows_out)
    payload = {"threads": args.threads, "width": args.width, "flush_mb": args.flush_mb, "results": results}
    write_json(args.output, payload)
    return payload


if __name__ == "__main__":
    main()
