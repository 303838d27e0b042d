"""Peak training memory of our causal LM with and without activation checkpointing (`enable_checkpointing`).

Long segments (tgt_len = mem_len = 512) and 8 layers of 8 narrow heads: the regime where checkpointing matters,
with large attention score tensors ([B, H, T, M+T] per layer; the fused attention keeps none of them for backward
and builds them in blocks of at most 4 MiB, `relative_attention_cpu.SCORE_BLOCK_BYTES`). Each measurement is a fresh
process; the two variants alternate `--repeats` times and the medians are compared. The cut is measured on the tensor
peak (everything alive at the step's peak, weights and Adam state included: `causal_lm_worker.tensor_peak`); the
growth of resident memory over the steps (weights excluded, allocator slack included: common.py) is printed beside
it. MiB = 2^20 bytes.

    python benchmarks/bench_activation_checkpointing.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUR_PYTHON, print_table, run_worker, stream_segments, word_level_ids, write_json  # noqa: E402

WORKER = Path(__file__).resolve().parent / "causal_lm_worker.py"
# Many narrow heads and 8 layers: attention maps are large, weights (and so gradients and Adam state) small.
MODEL = dict(vocab_size=8000, d_model=128, d_embed=128, n_layer=8, n_head=8, d_head=16, d_inner=512,
             cutoffs=[2000, 4000], div_val=2, mem_len=512, clamp_len=-1, dropout=0.1, dropatt=0.0)
BATCH, TGT_LEN, STEPS = 2, 512, 2


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default="benchmarks/results/activation_checkpointing.json")
    args = parser.parse_args(argv)
    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM

    runs = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        TransformerXLForCausalLM(TransformerXLConfig(**MODEL)).save_pretrained(f"{tmp}/model")
        n_seg = STEPS + 2
        ids = word_level_ids(MODEL["vocab_size"], max_tokens=BATCH * (n_seg * TGT_LEN + 1))
        torch.save(torch.stack(stream_segments(ids, BATCH, TGT_LEN, n_seg)), f"{tmp}/segments.pt")
        for _ in range(args.repeats):
            for checkpointing in (False, True):
                runs[checkpointing].append(run_worker(OUR_PYTHON, WORKER, dict(
                    impl="ours", mode="train", model_dir=f"{tmp}/model", data_path=f"{tmp}/segments.pt",
                    warmup=2, steps=STEPS, checkpointing=checkpointing)))
    peak = {c: statistics.median(r["peak_bytes"] for r in rs) / 2**20 for c, rs in runs.items()}
    tensors = {c: statistics.median(r["tensor_peak_bytes"] for r in rs) / 2**20 for c, rs in runs.items()}
    step = {c: statistics.median(statistics.median(r["times"]) for r in rs) for c, rs in runs.items()}
    cut = 1 - peak[True] / peak[False]
    tensor_cut = 1 - tensors[True] / tensors[False]
    table = print_table(
        ["variant", "tensor peak MiB", "RSS growth MiB", "step s", "tokens/s"],
        [[f"checkpointing={c}", tensors[c], peak[c], step[c], BATCH * TGT_LEN / step[c]] for c in (False, True)]
        + [["memory cut", f"{tensor_cut:.1%}", f"{cut:.1%}", f"x{step[True] / step[False]:.2f} time", ""]],
    )
    result = {"model": MODEL, "batch": BATCH, "tgt_len": TGT_LEN, "rss_growth_mib": {str(c): peak[c] for c in peak},
              "tensor_peak_mib": {str(c): tensors[c] for c in tensors}, "tensor_memory_cut": tensor_cut,
              "step_s": {str(c): step[c] for c in step}, "rss_growth_cut": cut, "target_cut": 0.40,
              "peak_method": runs[False][0]["peak_method"], "table": table,
              "raw_rss_growth_mib": {str(c): [r["peak_bytes"] / 2**20 for r in rs] for c, rs in runs.items()},
              "raw_tensor_peak_mib": {str(c): [r["tensor_peak_bytes"] / 2**20 for r in rs] for c, rs in runs.items()},
              "resident_mib": {str(c): [r["resident_bytes"] / 2**20 for r in rs] for c, rs in runs.items()}}
    write_json(args.output, result)
    return result


if __name__ == "__main__":
    main()
