"""Causal-LM training and evaluation: our TransformerXLForCausalLM vs transformers 4.35.0 `TransfoXLLMHeadModel`.

Same config, same weights (the legacy model is created in its own venv with a seed and saved; ours loads that folder
through `from_pretrained`, which converts it), same WikiText-2 batches (word level, contiguous streams, memory carried),
float32, 2 threads (`--threads`), the same optimizer and host allocator on both sides (`--optimizer`, default torch's
fused Adam; `--allocator`, default glibc keeping freed memory, as our training scripts set it on the CPU). Every
measurement runs in a fresh process; ours and legacy alternate `--repeats` times and the medians are compared, so both
sides of a ratio come from the same run of this script.

The matmul floor: each worker counts the matrix-product FLOPs of one training step (FlopCounterMode) and measures the
float32 torch.mm rate (2048^2, at the run's thread count) right after its timed steps; FLOPs / rate is the time a step
would take if every product ran at that rate and nothing else cost anything (the median over the workers of a side is
reported, with the range of the rates). `legacy step / our floor` is therefore about the largest ratio a float32
implementation doing our products could reach on this machine (the 2048^2 rate is a reference, not a hard bound: a
product of another shape may run a little faster). The train workers also record the products of one more step and
replay each alone at its own shapes and strides (`common.replayed_matmul_seconds`): the time the step's products take
by themselves at the rate of their shapes, a floor nearer to what small products really cost. `--bf16` adds a
training row under `torch.autocast("cpu", torch.bfloat16)` for both sides (a precision change, reported apart from
the float32 targets). Each worker also counts the minor page faults of its timed steps (see `--allocator`).

Memory, two measures (MiB = 2^20 bytes): the tensor peak (everything alive at the step's peak: weights, gradients,
Adam state, carried memory, activations; `causal_lm_worker.tensor_peak`), which the memory ratios use, and the growth
of resident memory (RSS) over the timed steps, weights excluded, allocator slack included (common.py).

    python benchmarks/bench_causal_lm.py --legacy-python /work/venv435/bin/python [--bf16]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    OUR_PYTHON,
    add_allocator_option,
    print_table,
    run_worker,
    set_threads,
    stream_segments,
    word_level_ids,
    write_json,
)

WORKER = Path(__file__).resolve().parent / "causal_lm_worker.py"
DEFAULT_VENV = Path.home() / ".cache" / "modeling_xl_bench" / "venv435"

# Model and batch shapes per benchmark preset. `tiny` is the project's preset with its training recipe; `wide` is a
# WT103-like model cut to what 2 cores can time in a minute (d_model 512, 6 layers, 30k adaptive vocabulary); `d256`
# is the shape of issue 22.
BENCH_PRESETS = {
    "tiny": dict(
        model=dict(vocab_size=8000, d_model=128, d_embed=128, n_layer=4, n_head=4, d_head=32, d_inner=512,
                   cutoffs=[2000, 4000], div_val=2, mem_len=64, clamp_len=-1, dropout=0.1, dropatt=0.0),
        batch=16, tgt_len=64, train_steps=12, eval_steps=12,
    ),
    # issue 22's shape: d_model 256, 8 x 32 heads, WikiText-2's 33,278-word vocabulary with adaptive clusters
    "d256": dict(
        model=dict(vocab_size=33278, d_model=256, d_embed=256, n_layer=4, n_head=8, d_head=32, d_inner=1024,
                   cutoffs=[2000, 10000, 20000], div_val=1, mem_len=128, clamp_len=-1, dropout=0.1, dropatt=0.0),
        batch=8, tgt_len=128, train_steps=6, eval_steps=6,
    ),
    "wide": dict(
        model=dict(vocab_size=30000, d_model=512, d_embed=512, n_layer=6, n_head=8, d_head=64, d_inner=2048,
                   cutoffs=[5000, 15000], div_val=1, mem_len=128, clamp_len=-1, dropout=0.1, dropatt=0.0),
        batch=8, tgt_len=128, train_steps=5, eval_steps=6,
    ),
}


def legacy_config(model: dict) -> dict:
    """TransfoXLConfig kwargs equivalent to our preset (tie_projs [False, True, ...] is the legacy default)."""
    return dict(model, adaptive=True, untie_r=True, pre_lnorm=False, same_length=False, attn_type=0,
                sample_softmax=-1, eos_token_id=0, init="normal", init_std=0.02, proj_init_std=0.01)


def ensure_legacy_python(path: str | None) -> str:
    """The legacy interpreter: `--legacy-python`, else a venv under ~/.cache built on first use (torch 2.13 first,
    then transformers 4.35.0 and numpy<2, the last release that still has Transformer-XL)."""
    if path:
        return path
    python = DEFAULT_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(DEFAULT_VENV)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run(pip + ["torch==2.13.0", "--index-url", "https://download.pytorch.org/whl/cpu"], check=True)
        subprocess.run(pip + ["transformers==4.35.0", "numpy<2", "safetensors"], check=True)
    return str(python)


MODES = {  # row label -> worker options; "ours" holds options for our side only
    "train": dict(mode="train", replay_matmuls=True),
    "eval": dict(mode="eval"),
    "train_bf16": dict(mode="train", autocast="bf16"),
    # a trade-off row, not the same work: ours recomputes each layer in backward, the legacy model cannot
    "train_ckpt": dict(mode="train", ours=dict(checkpointing=True)),
}


def measure(name: str, spec: dict, legacy_python: str, repeats: int, workdir: Path, modes=("train", "eval"),
            optimizer: str = "adam-fused", allocator: str = "keep", threads: int = 2) -> dict:
    model_dir = workdir / f"{name}-legacy"
    created = run_worker(legacy_python, WORKER, dict(impl="legacy", mode="create", seed=1234, model_dir=str(model_dir),
                                                     config=legacy_config(spec["model"])))
    n_seg = max(spec["train_steps"], spec["eval_steps"]) + 3
    ids = word_level_ids(spec["model"]["vocab_size"], max_tokens=spec["batch"] * (n_seg * spec["tgt_len"] + 1))
    data_path = workdir / f"{name}-segments.pt"
    torch.save(torch.stack(stream_segments(ids, spec["batch"], spec["tgt_len"], n_seg)), data_path)
    result = {"n_params": created["n_params"], "spec": spec}
    for label in modes:
        options = MODES[label]
        steps = spec[f"{options['mode']}_steps"]
        runs = {"ours": [], "legacy": []}
        failures = {}
        for _ in range(repeats):  # alternate so that load changes on the shared machine hit both sides alike
            for impl, python in (("ours", OUR_PYTHON), ("legacy", legacy_python)):
                if impl in failures:
                    continue
                shared = {key: value for key, value in options.items() if key != "ours"}
                own = options.get("ours", {}) if impl == "ours" else {}
                worker_args = dict(shared, **own, impl=impl, model_dir=str(model_dir), data_path=str(data_path),
                                   warmup=2, steps=steps, optimizer=optimizer, allocator=allocator,
                                   threads=threads)
                try:
                    runs[impl].append(run_worker(python, WORKER, worker_args))
                except RuntimeError as error:
                    if "autocast" not in options:
                        raise
                    failures[impl] = str(error).strip().splitlines()[-1]  # e.g. legacy div_val > 1 under bf16
        result[label] = {impl: {"error": failures[impl]} if impl in failures else digest(r) for impl, r in runs.items()}
    return result


def digest(runs: list[dict]) -> dict:
    """Median over repeats of each run's median step time; peak memory medians; each run's matmul floor (its FLOPs at
    its own torch.mm rate) and their median; all raw numbers kept."""
    per_run = [statistics.median(r["times"]) for r in runs]
    step = statistics.median(per_run)
    rates = [r["matmul_flops_per_s"] for r in runs]
    return {
        "tokens_per_s": runs[0]["tokens_per_step"] / step,
        "step_s_median": step,
        "step_s_per_run": per_run,
        "page_faults_per_step": statistics.median(statistics.median(r["page_faults"]) for r in runs),
        "rss_growth_mib": statistics.median(r["peak_bytes"] for r in runs) / 2**20,
        "rss_growth_mib_per_run": [r["peak_bytes"] / 2**20 for r in runs],
        "peak_method": runs[0]["peak_method"],
        "first_losses": runs[0]["losses"][:3],
        "matmul_flops_per_step": runs[0]["matmul_flops_per_step"],
        "matmul_flops_per_s_per_run": rates,
        "matmul_floor_s": statistics.median(r["matmul_flops_per_step"] / r["matmul_flops_per_s"] for r in runs),
        "replayed_matmul_s": (statistics.median(r["replayed_matmuls"]["seconds"] for r in runs)
                              if runs[0].get("replayed_matmuls") else None),
        "replayed_matmuls_per_run": [r.get("replayed_matmuls") for r in runs],
        "tensor_peak_mib": statistics.median(r["tensor_peak_bytes"] for r in runs) / 2**20,
        "resident_mib": statistics.median(r["resident_bytes"] for r in runs) / 2**20,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--legacy-python", default=None, help="interpreter with transformers==4.35.0")
    parser.add_argument("--presets", nargs="+", default=list(BENCH_PRESETS), choices=list(BENCH_PRESETS))
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per side and measurement")
    parser.add_argument("--optimizer", default="adam-fused", choices=["adam", "adam-fused"],
                        help="the same on both sides: torch.optim.Adam, default or fused=True")
    add_allocator_option(parser)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of every measured process (both sides)")
    parser.add_argument("--bf16", action="store_true", help="also time training under bfloat16 autocast")
    parser.add_argument("--checkpointing", action="store_true",
                        help="also time our training with activation checkpointing against legacy plain training")
    parser.add_argument("--output", default="benchmarks/results/causal_lm.json")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads {args.threads} is invalid; expected an integer >= 1")
    legacy_python = ensure_legacy_python(args.legacy_python)
    set_threads()
    modes = ("train", "eval") + ("train_bf16",) * args.bf16 + ("train_ckpt",) * args.checkpointing
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.presets:
            results[name] = measure(name, BENCH_PRESETS[name], legacy_python, args.repeats, Path(tmp), modes,
                                    args.optimizer, args.allocator, args.threads)
    rows = []
    for name, res in results.items():
        for mode in modes:
            ours, legacy = res[mode]["ours"], res[mode]["legacy"]
            if "error" in ours or "error" in legacy:
                rows.append([name, f"{mode} tokens/s", ours.get("error", ours.get("tokens_per_s")),
                             legacy.get("error", legacy.get("tokens_per_s")), "fails"])
                continue
            rows.append([name, f"{mode} tokens/s", ours["tokens_per_s"], legacy["tokens_per_s"],
                         ours["tokens_per_s"] / legacy["tokens_per_s"]])
            rows.append([name, f"{mode} tensor peak MiB (weights included)", ours["tensor_peak_mib"],
                         legacy["tensor_peak_mib"], ours["tensor_peak_mib"] / max(legacy["tensor_peak_mib"], 1e-9)])
            rows.append([name, f"{mode} RSS growth MiB (weights excluded)", ours["rss_growth_mib"],
                         legacy["rss_growth_mib"], ours["rss_growth_mib"] / max(legacy["rss_growth_mib"], 1e-9)])
            rows.append([name, f"{mode} minor page faults per step", ours["page_faults_per_step"],
                         legacy["page_faults_per_step"], ""])
        ours, legacy = res["train"]["ours"], res["train"]["legacy"]
        rates = ours["matmul_flops_per_s_per_run"] + legacy["matmul_flops_per_s_per_run"]
        rows.append([name, "train matmul GFLOP / step", ours["matmul_flops_per_step"] / 1e9,
                     legacy["matmul_flops_per_step"] / 1e9,
                     ours["matmul_flops_per_step"] / legacy["matmul_flops_per_step"]])
        rows.append([name, "torch.mm 2048^2 GFLOP/s in the train workers", f"{min(rates) / 1e9:.0f}-"
                     f"{max(rates) / 1e9:.0f}", "", ""])
        rows.append([name, "train step s (matmul floor s)",
                     f"{ours['step_s_median']:.3g} ({ours['matmul_floor_s']:.3g})",
                     f"{legacy['step_s_median']:.3g} ({legacy['matmul_floor_s']:.3g})", ""])
        rows.append([name, "largest float32 ratio doing our products (legacy step / our floor)", "", "",
                     legacy["step_s_median"] / ours["matmul_floor_s"]])
        rows.append([name, "train step's matrix products replayed alone, s", ours["replayed_matmul_s"],
                     legacy["replayed_matmul_s"], ours["replayed_matmul_s"] / legacy["replayed_matmul_s"]])
        rows.append([name, "legacy step / our products replayed alone", "", "",
                     legacy["step_s_median"] / ours["replayed_matmul_s"]])
        rows.append([name, "step / its own products replayed alone (issue 22: <= 1.25)",
                     ours["step_s_median"] / ours["replayed_matmul_s"],
                     legacy["step_s_median"] / legacy["replayed_matmul_s"], ""])
    table = print_table(["preset", "metric", "ours", "legacy 4.35", "ours / legacy"], rows)
    write_json(args.output, {"results": results, "table": table, "repeats": args.repeats, "optimizer": args.optimizer,
                             "allocator": args.allocator, "threads": args.threads})
    return results


if __name__ == "__main__":
    main()
