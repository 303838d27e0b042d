"""Greedy generation speed (issue 22, item 3): our `TransformerXLForCausalLM.generate` (the memory is the cache) vs
transformers 5 `GPT2LMHeadModel` of the same depth, width and vocabulary with its KV cache, and vs transformers 4.35
`TransfoXLLMHeadModel.generate` (the legacy model, memory carried as `mems`). Ours decodes from ring buffers of
`mem_len` slots (`static_decoding.DecodeState`): `ours` with the step run eagerly (the default), `ours_compiled` with
it compiled by torch.compile (`model.static_decoding = "compiled"`; the warm-up call compiles it).

Shape: issue 22's d_model 256 model (4 layers, 8 heads x 32, d_inner 1,024, WikiText-2's 33,278 words, adaptive
softmax with cutoffs 2k/10k/20k, div_val 1, mem_len 128); GPT-2 gets the same n_layer, n_embd, n_head, n_inner and
a full 33,278-word output layer. Work: `--modes` (default greedy decoding, `do_sample=False`, one beam; also top-k and
top-p sampling, a logits processor and beam search, `MODES`) of exactly `--new-tokens` (200)
tokens after a `--prompt-len` (16) token prompt of WikiText-2 words, batch 1 and 8 (rows = different places in the
text), float32, 2 threads (`--threads`), no end-of-sequence stop (`eos_token_id` unset on every side, so every run
makes the same number of steps).

Weights. GPT-2 and the legacy model compute every logit at every step, so their speed does not depend on their
(random, seeded) weights. Ours does: greedy decoding, top-k sampling, the repetition penalty and beam search skip the
tail clusters of the adaptive softmax that cannot hold a token they read (`adaptive_softmax_fused.top_k_log_probs`),
which depends on what the model predicts. So ours is timed twice: with random weights and after `--train-steps` (300)
Adam steps on WikiText-2 train (batches 8 x 128, memory carried, lr 1e-3, about 5 minutes; the checkpoint is kept in
`--trained-dir` and reused by later runs), `ours_trained` / `ours_trained_compiled`. At this shape random weights
make every tail cluster less likely than a row's best shortlist words, so every tail is skipped (counted 2026-11-30:
greedy and beam-4 at batch 1 and 8 multiplied by the head alone at every step): the skip's best case. The 300-step
model (loss 6.1) is unsure: greedy batch 8 computes the first tail for 47% of its rows, beam-4 every tail for nearly
every row (the skip then costs what the full distribution does): near its worst case.

`floor` and `floor_ours` are not models: what a decoder pays per step beside its backbone when the mode needs every
log-probability (`distribution_floor`: the output layer, then transformers' copy of the logits, processors and token
choice, timed alone); `floor` with GPT-2's output product, the least any exact decoder of this vocabulary pays,
`floor_ours` with our adaptive softmax's full distribution. Their "vs GPT-2" is the most a decoder with that output
layer could reach against GPT-2 in the same run, however fast its backbone.

Every measurement runs in a fresh process; the sides alternate `--repeats` times (so load changes on the
shared machine hit them alike) and each process times `--calls` generate calls after one warm-up call; the reported
tokens/s is new tokens (batch x new tokens) over the median call time, median over processes. Ratios are against
GPT-2 measured in the same run.

    python benchmarks/bench_generate.py --legacy-python /work/venv435/bin/python
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
    OUR_PYTHON,
    emit,
    print_table,
    run_worker,
    set_threads,
    word_level_ids,
    worker_args,
    write_json,
)

SHAPE = dict(vocab_size=33278, d_model=256, d_embed=256, n_layer=4, n_head=8, d_head=32, d_inner=1024,
             cutoffs=[2000, 10000, 20000], div_val=1, mem_len=128, clamp_len=-1, dropout=0.0, dropatt=0.0)
IMPLS = ("ours", "ours_compiled", "ours_trained", "ours_trained_compiled", "gpt2", "legacy", "floor", "floor_ours")
FLOOR_PRODUCTS = {"floor": "gpt2", "floor_ours": "ours"}  # `distribution_floor`'s output layer per side


def build(impl: str, trained_dir: str | None = None):
    """The model of one side, seeded, in eval mode, with no end-of-sequence id (fixed-length generation)."""
    torch.manual_seed(0)
    if impl in ("ours_trained", "ours_trained_compiled"):
        from modeling_xl import TransformerXLForCausalLM

        model = TransformerXLForCausalLM.from_pretrained(trained_dir)
        model.static_decoding = "compiled" if impl == "ours_trained_compiled" else "eager"
    elif impl in ("ours", "ours_compiled"):
        from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM

        model = TransformerXLForCausalLM(TransformerXLConfig(**SHAPE))
        # the one-token step from ring buffers: "eager" (the default) or compiled with torch.compile
        model.static_decoding = "compiled" if impl == "ours_compiled" else "eager"
    elif impl == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config(vocab_size=SHAPE["vocab_size"], n_positions=1024, n_embd=SHAPE["d_model"],
                                           n_layer=SHAPE["n_layer"], n_head=SHAPE["n_head"],
                                           n_inner=SHAPE["d_inner"], resid_pdrop=0.0, embd_pdrop=0.0,
                                           attn_pdrop=0.0, bos_token_id=None, eos_token_id=None))
    else:
        from transformers import TransfoXLConfig, TransfoXLLMHeadModel

        model = TransfoXLLMHeadModel(TransfoXLConfig(**SHAPE, adaptive=True, untie_r=True, pre_lnorm=False,
                                                     same_length=False, attn_type=0, sample_softmax=-1))
    model.eval()
    for config in (model.config, model.generation_config):
        config.eos_token_id = None
        config.pad_token_id = 0
    return model


# How generate is called (issue 33 item 4: sampling and logits processors compute every log-probability, where greedy
# decoding skips the tails that cannot win): each mode's keyword arguments on top of the fixed-length ones.
MODES = {
    "greedy": dict(do_sample=False),
    "top-k": dict(do_sample=True, top_k=40),
    "top-p": dict(do_sample=True, top_p=0.9, temperature=0.8),
    "repetition-penalty": dict(do_sample=False, repetition_penalty=1.2),
    "beam-4": dict(do_sample=False, num_beams=4),
}


def generate_kwargs(impl: str, new_tokens: int, mode: str = "greedy") -> dict:
    return {"max_new_tokens": new_tokens, "num_beams": 1, "eos_token_id": None, "pad_token_id": 0, **MODES[mode]}


def time_generate(model, impl: str, prompts: torch.Tensor, new_tokens: int, calls: int,
                  mode: str = "greedy") -> tuple[list[float], list]:
    """Seconds of `calls` generate calls after one warm-up; also the first row of the last call's new tokens."""
    kwargs = generate_kwargs(impl, new_tokens, mode)
    times = []
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(prompts, **kwargs)  # warm-up
        for _ in range(calls):
            begin = time.perf_counter()
            out = model.generate(prompts, **kwargs)
            times.append(time.perf_counter() - begin)
    if out.shape != (prompts.size(0), prompts.size(1) + new_tokens):
        raise RuntimeError(f"{impl} generated shape {tuple(out.shape)}, expected "
                           f"{(prompts.size(0), prompts.size(1) + new_tokens)}")
    return times, out[0, prompts.size(1):].tolist()


def prompts_for(batch: int, prompt_len: int) -> torch.Tensor:
    """`batch` prompts of WikiText-2 word ids, taken 1,000 words apart."""
    ids = word_level_ids(SHAPE["vocab_size"], max_tokens=1000 * batch + prompt_len)
    return torch.stack([ids[1000 * b : 1000 * b + prompt_len] for b in range(batch)])


def train(trained_dir: Path, steps: int) -> None:
    """`steps` Adam steps of our model on WikiText-2 train (8 streams x 128 tokens, memory carried), then saved."""
    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM

    torch.manual_seed(0)
    model = TransformerXLForCausalLM(TransformerXLConfig(**dict(SHAPE, dropout=0.1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    ids = word_level_ids(SHAPE["vocab_size"], max_tokens=8 * 128 * (steps + 1) + 1)
    streams = ids[: (ids.numel() - 1) // 8 * 8 + 1]
    rows = (streams.numel() - 1) // 8
    x, y = streams[:-1][: 8 * rows].view(8, rows), streams[1:][: 8 * rows].view(8, rows)
    mems = None
    for step in range(steps):
        start = (step * 128) % (rows - 128)
        out = model(input_ids=x[:, start:start + 128], next_token_labels=y[:, start:start + 128], mems=mems)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        optimizer.zero_grad()
        mems = out.mems
        if step % 50 == 0 or step == steps - 1:
            print(f"train step {step}: loss {out.loss.item():.3f}", flush=True)
    model.save_pretrained(trained_dir)


def mode_processors(mode: str):
    """`mode`'s generation config and the logits processors `generate` builds from it (GPT-2's, as a model of this
    vocabulary would)."""
    from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel, LogitsProcessorList

    config = GenerationConfig(**MODES[mode], max_new_tokens=1, pad_token_id=0)
    holder = GPT2LMHeadModel(GPT2Config(vocab_size=SHAPE["vocab_size"], n_embd=8, n_layer=1, n_head=1,
                                        bos_token_id=None, eos_token_id=None))  # only builds the processors
    return config, holder._get_logits_processor(config, 16, None, None, LogitsProcessorList())


def distribution_floor(batch: int, mode: str, product: str = "gpt2", steps: int = 50) -> float:
    """Milliseconds per decoding step that a decoder of `SHAPE`'s vocabulary pays in `mode` beside its backbone when
    the mode needs every log-probability (sampling, processors, beams; not greedy, where ours skips the tails that
    cannot win): the output layer on [batch x beams, d_model] hidden states, then what transformers' `generate` does
    with the [batch x beams, V] result in `mode` (its float32 copy of the logits, the mode's processors as `generate`
    builds them, and the token choice: softmax and multinomial, argmax, or beam search's log-softmax, running scores
    and top-2k), median of `steps`. `product` is the output layer: "gpt2", GPT-2's [d_model, V] `lm_head` (F.linear,
    no bias), the least any exact decoder of this vocabulary pays with it; "ours", our adaptive softmax's full
    distribution (`full_log_probs`, random weights). Not counted: the backbone and a beam search's cache reorder."""
    vocab, width = SHAPE["vocab_size"], SHAPE["d_model"]
    torch.manual_seed(0)
    if product == "ours":
        from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM
        from modeling_xl.adaptive_softmax_fused import full_log_probs

        head = TransformerXLForCausalLM(TransformerXLConfig(**SHAPE)).eval().lm_head

        def output_layer(hidden):
            return full_log_probs(head, hidden)
    else:
        table = torch.randn(vocab, width) * width**-0.5

        def output_layer(hidden):
            return torch.nn.functional.linear(hidden, table)
    config, processors = mode_processors(mode)
    beams = config.num_beams or 1
    hidden = torch.randn(batch * beams, width)  # one row per beam, as a beam decoder holds them
    history = torch.randint(0, vocab, (batch * beams, 16))
    beam_scores = torch.zeros(batch, beams, 1)
    times = []
    with torch.no_grad():
        for _ in range(steps + 5):
            begin = time.perf_counter()
            logits = output_layer(hidden).to(copy=True, dtype=torch.float32)
            if beams > 1:
                scores = processors(history, torch.log_softmax(logits, -1))
                torch.topk((scores.view(batch, beams, -1) + beam_scores).view(batch, -1), 2 * beams, dim=1)
            elif config.do_sample:
                torch.multinomial(torch.softmax(processors(history, logits), -1), 1)
            else:
                processors(history, logits).argmax(-1)
            times.append(time.perf_counter() - begin)
    return statistics.median(times[5:]) * 1e3


def worker(args: dict) -> dict:
    set_threads(args["threads"])
    if args["impl"] in ("floor", "floor_ours"):  # not models: `distribution_floor`, as if it decoded every step
        ms = distribution_floor(args["batch"], args.get("mode", "greedy"), FLOOR_PRODUCTS[args["impl"]])
        return {"times": [ms * args["new_tokens"] / 1e3] * args["calls"], "first_row_tokens": []}
    model = build(args["impl"], args.get("trained_dir"))
    prompts = prompts_for(args["batch"], args["prompt_len"])
    times, tokens = time_generate(model, args["impl"], prompts, args["new_tokens"], args["calls"],
                                  args.get("mode", "greedy"))
    return {"times": times, "first_row_tokens": tokens[:10]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--legacy-python", default="/work/venv435/bin/python",
                        help="interpreter with transformers==4.35.0 (the legacy side is skipped when it is missing)")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per side and batch size")
    parser.add_argument("--calls", type=int, default=3, help="timed generate calls per process")
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument("--modes", nargs="+", default=["greedy"], choices=list(MODES),
                        help="how generate is called: greedy, sampling (top-k 40; top-p 0.9 at temperature 0.8), a "
                             "logits processor (repetition penalty 1.2), beam search (4 beams)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of every side")
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--trained-dir", default="benchmarks/results/generate_trained_d256",
                        help="our trained checkpoint: made here (--train-steps) unless it exists")
    parser.add_argument("--output", default="benchmarks/results/generate.json")
    args = parser.parse_args(argv)
    pythons = {impl: OUR_PYTHON for impl in IMPLS}
    pythons["legacy"] = args.legacy_python
    impls = [i for i in args.impls if i != "legacy" or Path(args.legacy_python).exists()]
    trained_dir = Path(args.trained_dir).resolve()
    if {"ours_trained", "ours_trained_compiled"} & set(impls) and not (trained_dir / "config.json").exists():
        set_threads(args.threads)
        train(trained_dir, args.train_steps)
    results = {}
    for mode in args.modes:
        for batch in args.batches:
            runs = {impl: [] for impl in impls}
            for _ in range(args.repeats):  # alternate the sides, a fresh process each
                for impl in impls:
                    runs[impl].append(run_worker(pythons[impl], __file__, dict(
                        impl=impl, batch=batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens, mode=mode,
                        calls=args.calls, threads=args.threads, trained_dir=str(trained_dir))))
            key = f"{mode} batch={batch}"
            results[key] = {}
            for impl, rs in runs.items():
                per_run = [statistics.median(r["times"]) for r in rs]
                seconds = statistics.median(per_run)
                results[key][impl] = {"tokens_per_s": batch * args.new_tokens / seconds, "call_s": seconds,
                                      "call_s_per_run": per_run, "raw": rs}
    rows = []
    for key, res in results.items():
        reference = res["gpt2"]["tokens_per_s"] if "gpt2" in res else None
        for impl in impls:
            tps = res[impl]["tokens_per_s"]
            rows.append([key, impl, tps, res[impl]["call_s"] * 1e3 / args.new_tokens,
                         "" if reference is None else tps / reference])
    table = print_table(["mode, batch", "model", "new tokens/s", "ms / step", "vs GPT-2 (issue 33: ours >= 1.0)"],
                        rows)
    write_json(args.output, {"results": results, "table": table,
                             "args": vars(args)})
    return results


if __name__ == "__main__":
    if "--args" in sys.argv:
        emit(worker(worker_args()))
    else:
        main()
