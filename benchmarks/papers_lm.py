"""Transformer-XL against GPT-2 at equal budget (issue 48, `bench_papers.py --table xl-vs-gpt2`).

Ours is `scripts/pretrain.py --preset tiny` (the recipe: 1,500 steps of 16 streams x 64 tokens, memory 64, AdamW,
learning rate 3e-3, 50 warmup steps then cosine, clipping 1.0, dropout 0.1). GPT-2 is transformers'
`GPT2LMHeadModel` with ours' depth, width, heads, feed-forward size and dropout, its own tied embedding and output
layer over the same tokenizer, trained here on the same token stream for the same steps and tokens per step with
the same optimizer, schedule and clipping; only its learning rate is tuned (`LEARNING_RATES`, chosen by the
validation perplexity at the main context).

Same stream: ours reads 16 contiguous rows of the training ids, 64 tokens of each a step. GPT-2 with windows of
`length` = 64 k tokens reads, at step t, the window w = t // g of g = 16 / rows consecutive groups of `rows` =
max(16 / k, 1) rows: the 64-token pieces ours reads at steps w k ... w k + k - 1, joined. Over the run both read the
same tokens (the last few windows of the 1,024-token GPT-2 aside: 1,500 is not a multiple of 16), in nearly the
same order, 1,024 a step. A corpus read more than once in the run (tiny-shakespeare: 1,042 steps an epoch) starts
over at the rows' starts for both, as ours' `OrderedStreams` does: ours after every whole segment of a row, GPT-2
after every whole window (up to length / 64 - 1 steps sooner).

Same contexts at evaluation: ours reads the validation stream 64 tokens at a time with memory M (same_length off),
so the target at position p of segment s sees the M + (p - 64 s) + 1 tokens from max(0, 64 s - M) to p. GPT-2
reads window [max(0, 64 s - M), 64 s + 64) and scores only its last 64 targets: every target sees exactly the same
tokens in both. A window longer than GPT-2's `n_positions` (its training length) is not scored.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from common import PeakMemory, run_script, write_marker

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
CORPORA = {  # name -> scripts/pretrain.py's data and tokenizer arguments, and whether it is read character by character
    "wt2": {"data": ["--dataset_name", str(DATA / "wikitext-2")], "tokenizer": [], "char_level": False},
    "shakespeare": {"data": ["--train_file", str(DATA / "tinyshakespeare" / "input.txt")],
                    "tokenizer": ["--tokenizer_type", "char"], "char_level": True},
}
SEGMENT = 64  # ours' evaluation segment = GPT-2's stride
CONTEXTS = (0, 64, 128, 256, 512)  # ours' memory; GPT-2's window = context + SEGMENT
MAIN_CONTEXT = 128  # the recipe's evaluation memory
LEARNING_RATES = (5e-4, 1e-3, 2e-3)
GPT2_LENGTHS = (256, 1024)  # training windows (= n_positions): the tuned anchor, and one that reaches context 512


def recipe() -> dict:
    from modeling_xl.training.recipes import RECIPES

    return dict(RECIPES["tiny"])


# ------------------------------------------------------------------------------------------------------------- ours
def pretrain_ours(corpus: str, folder: Path, steps: int | None = None, seed: int = 42) -> dict:
    """`scripts/pretrain.py --preset tiny` on `corpus` into `folder` (skipped when its results exist)."""
    results = folder / "eval_results.json"
    if not results.exists():
        extra = ["--max_train_steps", str(steps)] if steps else []
        seconds = run_script([sys.executable, REPO / "scripts" / "pretrain.py", "--preset", "tiny",
                              *CORPORA[corpus]["data"], *CORPORA[corpus]["tokenizer"], "--seed", seed, "--eval_steps",
                              10**9, "--token_cache", "false", "--disable_tqdm", "--overwrite_output_dir",
                              "--output_dir", folder, *extra], f"ours on {corpus}")
        write_marker(folder / "wall.json", {"seconds": seconds})
    return {**json.loads(results.read_text()), **json.loads((folder / "wall.json").read_text())}


def token_streams(corpus: str, folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """The training and validation ids ours trained and evaluated on, from the tokenizer saved in `folder` (as
    `scripts/pretrain.py` reads and tokenizes the corpus)."""
    from transformers import AutoTokenizer

    from modeling_xl.data.corpora import load_splits
    from modeling_xl.data.tokenize import tokenize_corpus
    from modeling_xl.training import parse_args
    from modeling_xl.training.data_sources import corpus_source

    args = parse_args(["--preset", "tiny", *CORPORA[corpus]["data"], "--tokenizer_name", str(folder)])
    splits, _ = load_splits(corpus_source(args))
    ids = tokenize_corpus(splits, AutoTokenizer.from_pretrained(folder), text_column=args.text_column)
    return ids["train"].astype(np.int64), ids["validation"].astype(np.int64)


def score_ours(folder: Path, valid: np.ndarray, context: int) -> tuple[float, int]:
    """(summed NLL, targets) of the validation stream, 64 tokens a segment, memory `context`."""
    from modeling_xl import TransformerXLForCausalLM
    from modeling_xl.evaluation.long_context import evaluate_stream

    model = TransformerXLForCausalLM.from_pretrained(folder)
    out = evaluate_stream(model, torch.from_numpy(valid), tgt_len=SEGMENT, mem_len=context, same_length=False)
    return out["loss"] * out["tokens"], out["tokens"]


# ------------------------------------------------------------------------------------------------------------ GPT-2
def gpt2_config(ours_config: dict, length: int, vocab_size: int):
    from transformers import GPT2Config

    eos = ours_config["eos_token_id"]
    return GPT2Config(vocab_size=vocab_size, n_positions=length, n_embd=ours_config["d_model"],
                      n_layer=ours_config["n_layer"], n_head=ours_config["n_head"], n_inner=ours_config["d_inner"],
                      resid_pdrop=ours_config["dropout"], embd_pdrop=ours_config["dropout"],
                      attn_pdrop=ours_config["dropatt"], bos_token_id=eos, eos_token_id=eos)


def gpt2_windows(train: np.ndarray, length: int, steps: int, streams: int = 16, segment: int = SEGMENT):
    """[rows, length] inputs and next-token targets of every step (see the module docstring): the tokens ours' 16
    streams of `segment` tokens a step read, joined into windows of `length`."""
    if length % segment or streams * segment % length:
        raise ValueError(f"length={length}; expected a multiple of segment={segment} that divides "
                         f"{streams} x {segment}")
    row_len = (len(train) - 1) // streams
    rows = max(streams * segment // length, 1)
    groups = streams // rows
    epoch = row_len // length * groups  # steps until every whole window of every row is read; then start over
    if epoch == 0:
        raise ValueError(f"length={length}: longer than a stream of {row_len} tokens; expected a longer corpus")
    for step in range(steps):
        window, first = divmod(step % epoch, groups)
        starts = (np.arange(first * rows, (first + 1) * rows) * row_len + window * length)[:, None]
        pieces = torch.from_numpy(train[starts + np.arange(length + 1)])
        yield pieces[:, :-1], pieces[:, 1:]


def train_gpt2(train: np.ndarray, config, lr: float, steps: int, folder: Path, seed: int = 42) -> dict:
    """GPT-2 trained as the recipe trains ours (AdamW, warmup then cosine, clipping), saved into `folder`."""
    from transformers import GPT2LMHeadModel, get_scheduler

    done = folder / "train.json"
    if done.exists():
        return json.loads(done.read_text())
    rec = recipe()
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, fused=True)
    warmup = rec["warmup_steps"] * steps // rec["max_steps"]
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=warmup, num_training_steps=steps)
    losses, start = [], time.perf_counter()
    model.train()
    for inputs, targets in gpt2_windows(train, config.n_positions, steps):
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer_step(model, loss, optimizer, rec["max_grad_norm"], scheduler)
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            break
    model.save_pretrained(folder)
    result = {"lr": lr, "length": config.n_positions, "steps": len(losses), "warmup_steps": warmup,
              "final_train_loss": float(np.mean(losses[-50:])), "seconds": time.perf_counter() - start,
              "loss_per_100_steps": [float(np.mean(losses[i : i + 100])) for i in range(0, len(losses), 100)]}
    write_marker(done, result)
    return result


def score_windows(model, valid: np.ndarray, context: int, segment: int = SEGMENT, batch: int = 8) -> tuple[float, int]:
    """(summed NLL, targets) of a causal LM without memory, each target scored in the window [max(0, s - context),
    s + segment) of its segment s, the window's last targets only (see the module docstring)."""
    windows = {}  # (window length, targets scored) -> [start, ...]; each is scored by its last targets
    targets = len(valid) - 1
    for first in range(0, targets, segment):
        begin, end = max(0, first - context), min(first + segment, targets)
        windows.setdefault((end - begin, end - first), []).append(begin)
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for (length, scored), begins in windows.items():
            for i in range(0, len(begins), batch):
                starts = np.array(begins[i : i + batch])[:, None] + np.arange(length + 1)
                pieces = torch.from_numpy(valid[starts])
                logits = model(input_ids=pieces[:, :-1], logits_to_keep=scored).logits
                total += torch.nn.functional.cross_entropy(logits.flatten(0, 1).double(),
                                                           pieces[:, -scored:].flatten(), reduction="sum").item()
                count += pieces.shape[0] * scored
    return total, count


def score_gpt2(folder: Path, valid: np.ndarray, context: int) -> tuple[float, int] | None:
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(folder)
    if context + SEGMENT > model.config.n_positions:
        return None  # its position table ends before the window does
    return score_windows(model, valid, context)


# ------------------------------------------------------------------------------------------------------ speed worker
def speed_worker(args: dict) -> dict:
    """Training tokens/s and peak memory of one model in this (fresh) process: `warmup` steps, then `steps` timed
    steps on the real stream, one thread, AdamW as in training, freed host memory kept (as pretraining sets it).
    Peak memory two ways (benchmarks/README.md, Method): the tensor peak of one more step (weights, optimizer state
    and carried memory included) and the resident memory's growth from the built model to the end of the steps."""
    from causal_lm_worker import tensor_peak
    from common import set_threads, use_allocator

    use_allocator("keep")
    set_threads(args["threads"])
    train = np.load(args["train_ids"])
    folder, kind = Path(args["folder"]), args["kind"]
    step = _ours_step(folder) if kind == "ours" else _gpt2_step(folder)
    total = args["steps"] + args["warmup"] + 1
    batches = list(_ours_batches(train, total) if kind == "ours" else gpt2_windows(train, step.length, total))
    times, rss = [], PeakMemory()
    rss.start()
    for index, batch in enumerate(batches[:-1]):
        begin = time.perf_counter()
        step(*batch)
        if index >= args["warmup"]:
            times.append(time.perf_counter() - begin)
    rss_growth = rss.stop()
    median = sorted(times)[len(times) // 2]
    tokens = batches[0][0].numel()
    return {"kind": kind, "tokens_per_step": tokens, "step_s": median, "tokens_per_s": tokens / median,
            "rss_growth_bytes": rss_growth, "rss_method": rss.method,
            **tensor_peak(lambda: step(*batches[-1]))}


def _ours_batches(train: np.ndarray, steps: int):
    from modeling_xl.data.streams import OrderedStreams

    streams = OrderedStreams(train, recipe()["batch_size"], recipe()["tgt_len"])
    for index in range(steps):
        batch = streams.batch(index)
        yield batch["input_ids"], batch["next_token_labels"]


def optimizer_step(model, loss, optimizer, max_norm: float, scheduler=None) -> None:
    """One training step of every side (ours, GPT-2, BERT): backward, clipping at the recipe's norm, the update, the
    schedule's step."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def _ours_step(folder: Path):
    from modeling_xl import TransformerXLForCausalLM

    model = TransformerXLForCausalLM.from_pretrained(folder).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    max_norm = recipe()["max_grad_norm"]
    state = {"mems": None}

    def step(inputs, targets):
        out = model(input_ids=inputs, mems=state["mems"], next_token_labels=targets)
        state["mems"] = out.mems
        optimizer_step(model, out.losses.float().sum() / targets.numel(), optimizer, max_norm)

    return step


def _gpt2_step(folder: Path):
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(folder).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    max_norm = recipe()["max_grad_norm"]

    def step(inputs, targets):
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer_step(model, loss, optimizer, max_norm)

    step.length = model.config.n_positions
    return step
