#!/usr/bin/env python
"""LoRA adapter against full fine-tuning, per training step: time and the memory of what training keeps (gradients
and AdamW state), the same classifier on the same batches, in one process.

Both sides start from the same pretrained folder (`scripts/pretrain.py --preset tiny`): the sequence classifier on its
backbone, trained whole (AdamW over every weight), or through `modeling_xl.finetuning.adapters.lora_config` (LoRA on
peft's default targets for transformer-xl, the head trained whole). Rounds alternate the two sides, `--steps` steps
each, so that a machine whose load changes slows both alike; the table gives the median step. Training state: bytes
of every gradient and every AdamW state tensor after a step (exact, from the tensors; the weights themselves are the
same on both sides). Accuracy, end-to-end time and peak RSS come from the fine-tuning scripts (docs/ecosystem.md).

    python benchmarks/bench_adapters.py --model outputs/tiny
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from common import REPO, machine_description, print_table, set_threads, write_json


def training_state_bytes(model, optimizer) -> int:
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                if isinstance(t, torch.Tensor))
    return grads + state


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a pretrained causal-LM folder")
    parser.add_argument("--lora_r", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=48, help="tokens per text")
    parser.add_argument("--steps", type=int, default=5, help="steps per side and round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "adapters.json"))
    args = parser.parse_args(argv)
    set_threads(args.threads)
    from peft import get_peft_model

    from modeling_xl import TransformerXLForSequenceClassification
    from modeling_xl.finetuning.adapters import lora_config, trainable_parameters

    torch.manual_seed(0)
    sides = {}
    for name in ("full", f"LoRA r={args.lora_r}"):
        model = TransformerXLForSequenceClassification.from_pretrained(args.model, num_labels=8)
        if name != "full":
            model = get_peft_model(model, lora_config(model, r=args.lora_r))
        model.train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        sides[name] = {"model": model, "optimizer": optimizer, "times": []}
    vocab = sides["full"]["model"].config.vocab_size
    batches = [(torch.randint(1, vocab, (args.batch, args.length)), torch.randint(0, 8, (args.batch,)))
               for _ in range(args.steps)]
    for round_index in range(args.rounds + 1):  # round 0 warms both sides up
        for side in sides.values():
            for ids, labels in batches:
                start = time.perf_counter()
                loss = side["model"](input_ids=ids, labels=labels).loss
                loss.backward()
                side["optimizer"].step()
                side["optimizer"].zero_grad(set_to_none=False)
                if round_index:
                    side["times"].append(time.perf_counter() - start)
    rows, results = [], {}
    for name, side in sides.items():
        counts = trainable_parameters(side["model"])
        median = statistics.median(side["times"])
        state = training_state_bytes(side["model"], side["optimizer"])
        results[name] = {"trainable": counts["trainable"], "total": counts["total"], "step_seconds": median,
                         "training_state_bytes": state}
        rows.append([name, f"{counts['trainable']:,} / {counts['total']:,}", f"{median * 1000:.0f}",
                     f"{state / 2**20:.2f}"])
    print_table(["side", "trainable / all parameters", "median step ms", "gradients + AdamW state MiB"], rows)
    write_json(args.output, {"machine": machine_description(), "load": os.getloadavg(), "args": vars(args),
                             "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
