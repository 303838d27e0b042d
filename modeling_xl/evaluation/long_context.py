"""Long-context evaluation of a causal Transformer-XL: stream perplexity / bits per character, memory-length sweeps,
and the paper's vanilla sliding-window baseline (Dai et al. 2019, Sec. 4.4 "evaluation speed").

State reuse: the token stream is cut into `batch_size` contiguous rows and read `tgt_len` tokens at a time; each
segment attends to its `mem_len` cached hidden states per layer, so every token is encoded once.
Vanilla: every prediction re-encodes its own window of the `context_len` previous tokens from scratch (no memory),
as Al-Rfou et al. (2018) evaluate: one forward pass of `context_len` tokens per predicted token.
Both score the same targets, so their perplexities and costs compare directly.
"""

from __future__ import annotations

import math
import time

import torch

from ..data.streams import EvalStreams
from ..runtime.validators import check_int
from .stream_scoring import bits_per_character, perplexity, recurrence_settings, stream_nll


def check_vanilla_span(context_len: int, num_targets: int, num_tokens: int, targets_name: str = "num_targets") -> None:
    """The vanilla windows read tokens [0, context_len + num_targets); ValueError if the stream is shorter."""
    if context_len + num_targets > num_tokens:
        raise ValueError(f"context_len={context_len} + {targets_name}={num_targets} exceeds the {num_tokens} "
                         "tokens of the stream; expected a longer stream or fewer targets")


def score_summary(nll: float, tokens: int, char_level: bool, chars: int | None = None) -> dict:
    """{"loss", "perplexity"} and, at character/byte level, "bpc" = NLL / ln 2 per character (default: one
    character per token). Example: 100 tokens, 69.31 nats -> loss 0.693, perplexity 2.0, bpc 1.0."""
    summary = {"loss": nll / tokens if tokens else float("nan"), "perplexity": perplexity(nll, tokens)}
    if char_level:
        summary["bpc"] = bits_per_character(nll, chars if chars is not None else tokens)
    return summary


def stream_targets(tokens: torch.Tensor, first_target: int = 0) -> torch.Tensor:
    """Inputs and `next_token_labels` of one stream, ignoring (-100) targets before position `first_target`
    (so a vanilla window and state reuse can score exactly the same tokens). Returns [2, N - 1]."""
    tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
    labels = tokens[1:].clone()
    labels[: max(first_target - 1, 0)] = -100
    return torch.stack([tokens[:-1], labels])


@torch.no_grad()
def evaluate_stream(model, tokens, *, tgt_len: int, mem_len: int, clamp_len: int = -1, same_length: bool = False,
                    batch_size: int = 1, char_level: bool = False, chars_per_token: float = 1.0,
                    max_segments: int | None = None, device=None) -> dict:
    """State-reuse evaluation of a 1-D token stream: perplexity = exp(total NLL / total targets) over the whole stream.

    Returns {"loss", "perplexity", ("bpc"), "tokens", "seconds", "tokens_per_second", "tgt_len", "mem_len",
    "clamp_len", "same_length", "attended_context"} with attended_context the most keys a query sees: mem_len +
    tgt_len (the last query of a segment), or mem_len with same_length (every query sees the newest mem_len keys), and
    same_length as used (off when mem_len == 0).
    """
    check_int("tgt_len", tgt_len)
    check_int("batch_size", batch_size)
    check_int("mem_len", mem_len, minimum=0)
    same_length = same_length and mem_len > 0  # the mask ignores it without memory (`causal_mask`): report that
    device = device or next(model.parameters()).device
    streams = EvalStreams(tokens, batch_size, tgt_len)
    batches = ({k: v.to(device) for k, v in batch.items()} for batch in streams)
    start = time.perf_counter()
    with recurrence_settings(model.config, mem_len, clamp_len, same_length):
        nll, count = stream_nll(model, batches, device, max_segments)
    seconds = time.perf_counter() - start
    return {**score_summary(nll, count, char_level, round(count * chars_per_token)), "tokens": count,
            "seconds": seconds, "tokens_per_second": count / seconds if seconds else float("inf"),
            "tgt_len": tgt_len, "mem_len": mem_len, "clamp_len": clamp_len, "same_length": same_length,
            "attended_context": mem_len if same_length else mem_len + tgt_len}


def memory_sweep(model, tokens, mem_lens: list[int], **kwargs) -> list[dict]:
    """`evaluate_stream` once per memory length (the paper's point: longer memory keeps helping)."""
    if not mem_lens:
        raise ValueError("mem_lens is empty; expected at least one memory length")
    return [evaluate_stream(model, tokens, mem_len=mem_len, **kwargs) for mem_len in mem_lens]


@torch.no_grad()
def vanilla_nll(model, tokens, context_len: int, num_targets: int, *, batch_size: int = 16, clamp_len: int = -1,
                device=None) -> tuple[float, int, float]:
    """The vanilla baseline: target t (for t in [context_len, context_len + num_targets)) is predicted from a fresh
    window `tokens[t - context_len : t]` with no memory; `batch_size` windows share a forward pass.
    Returns (summed NLL, targets, seconds)."""
    tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
    check_int("context_len", context_len)
    check_int("num_targets", num_targets)
    check_int("batch_size", batch_size)
    check_vanilla_span(context_len, num_targets, tokens.numel())
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64)
    start = time.perf_counter()
    try:
        with recurrence_settings(model.config, 0, clamp_len, False):
            for first in range(context_len, context_len + num_targets, batch_size):
                targets = torch.arange(first, min(first + batch_size, context_len + num_targets))
                windows = targets[:, None] - context_len + torch.arange(context_len)  # [b, context_len]
                out = model(input_ids=tokens[windows].to(device), logits_to_keep=1)
                log_probs = out.logits[:, -1]  # [b, V]
                total -= log_probs.gather(1, tokens[targets].to(device)[:, None]).double().sum().cpu()
    finally:
        model.train(was_training)
    return float(total), num_targets, time.perf_counter() - start


def reuse_vs_vanilla(model, tokens, *, context_len: int, num_targets: int, tgt_len: int, clamp_len: int = -1,
                     vanilla_batch_size: int = 16, device=None) -> dict:
    """Perplexity and wall time of vanilla windows vs state reuse on the same `num_targets` targets.

    State reuse reads one stream (batch 1) with mem_len = context_len, so every query sees at least `context_len`
    previous tokens (the vanilla window sees exactly `context_len`). The vanilla side batches `vanilla_batch_size`
    windows per pass, which favours it: the measured speed-up is a lower bound for equal batching.
    """
    tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
    check_int("tgt_len", tgt_len)
    v_nll, v_count, v_seconds = vanilla_nll(model, tokens, context_len, num_targets, batch_size=vanilla_batch_size,
                                            clamp_len=clamp_len, device=device)
    span = tokens[: context_len + num_targets]
    inputs, labels = stream_targets(span, first_target=context_len)
    device = device or next(model.parameters()).device
    segments = [{"input_ids": inputs[None, i : i + tgt_len].to(device),
                 "next_token_labels": labels[None, i : i + tgt_len].to(device)}
                for i in range(0, inputs.numel(), tgt_len)]
    start = time.perf_counter()
    with recurrence_settings(model.config, context_len, clamp_len, False):
        r_nll, r_count = stream_nll(model, segments, device)
    r_seconds = time.perf_counter() - start
    if r_count != v_count:
        raise RuntimeError(f"state reuse scored {r_count} targets and vanilla {v_count}; expected the same targets")
    return {
        "context_len": context_len, "targets": v_count, "tgt_len": tgt_len, "clamp_len": clamp_len,
        "vanilla_batch_size": vanilla_batch_size,
        "vanilla_perplexity": perplexity(v_nll, v_count), "vanilla_seconds": v_seconds,
        "reuse_perplexity": perplexity(r_nll, r_count), "reuse_seconds": r_seconds,
        "speedup": v_seconds / r_seconds if r_seconds else math.inf,
    }


def sweep_table(rows: list[dict], metric: str = "perplexity") -> str:
    """Markdown table of a memory sweep: one row per memory length."""
    lines = [f"| mem_len | tgt_len | attended context | {metric} | tokens | tokens/s |", "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['mem_len']} | {row['tgt_len']} | {row['attended_context']} | {row[metric]:.3f} | "
                     f"{row['tokens']} | {row['tokens_per_second']:.0f} |")
    return "\n".join(lines)


def plot_sweep(rows: list[dict], path, metric: str = "perplexity") -> None:
    """PNG of the metric against the memory length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r["mem_len"] for r in rows], [r[metric] for r in rows], marker="o")
    ax.set_xlabel("memory length (mem_len)")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} vs memory (tgt_len {rows[0]['tgt_len']})")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def load_eval_tokens(tokenizer, dataset_name: str, dataset_config_name: str | None = None, split: str = "validation",
                     text_column: str = "text", max_eval_tokens: int | None = None) -> torch.Tensor:
    """One split of a corpus (a Hub name, a local file/folder, or "builtin"; see `modeling_xl.data.corpora`) as the
    1-D token stream the training run evaluates on (`tokenize_split`: e.g. `<eos>` after every line), cut to its
    first `max_eval_tokens` tokens (None: the whole split; at least 2, one input and its target)."""
    from ..data.corpora import load_corpus
    from ..data.tokenize import tokenize_split

    check_int("max_eval_tokens", max_eval_tokens, minimum=2, allow_none=True)
    corpus = load_corpus(dataset_name, dataset_config_name, text_column=text_column)
    if split not in corpus:
        raise ValueError(f"split={split!r} is not in {dataset_name!r}; expected one of {sorted(corpus)}")
    ids = tokenize_split(corpus[split], tokenizer, text_column=text_column, split=split)
    ids = torch.from_numpy(ids.astype("int64"))
    if ids.numel() < 2:
        raise ValueError(f"split {split!r} of {dataset_name!r} has {ids.numel()} tokens; expected at least 2")
    return ids[:max_eval_tokens] if max_eval_tokens is not None else ids


def results_markdown(results: dict, metric: str) -> str:
    """The model-card section: main evaluation, memory sweep table and plot, vanilla vs state reuse."""
    main = results["evaluation"]
    lines = ["## Long-context evaluation (`scripts/evaluate_lm.py`)", "",
             f"Split `{results['split']}` of `{results['dataset']}`, {main['tokens']} tokens, stream {metric} "
             f"(exp of total NLL / tokens), memory carried across segments.", "",
             "| tgt_len | mem_len | clamp_len | same_length | " + metric + " |", "|---|---|---|---|---|",
             f"| {main['tgt_len']} | {main['mem_len']} | {main['clamp_len']} | {main['same_length']} | "
             f"{main[metric]:.3f} |"]
    if results.get("sweep"):
        lines += ["", "### Memory-length sweep", "", sweep_table(results["sweep"], metric), "",
                  f"![{metric} vs memory]({results['sweep_plot']})"]
    if results.get("vanilla"):
        v = results["vanilla"]
        lines += ["", "### Vanilla sliding window vs state reuse", "",
                  f"{v['targets']} targets, context {v['context_len']} tokens; vanilla re-encodes a window per target "
                  f"({v['vanilla_batch_size']} windows per pass), state reuse reads segments of {v['tgt_len']} with "
                  f"mem_len {v['context_len']} (batch 1).", "",
                  "| mode | perplexity | seconds |", "|---|---|---|",
                  f"| vanilla | {v['vanilla_perplexity']:.3f} | {v['vanilla_seconds']:.2f} |",
                  f"| state reuse | {v['reuse_perplexity']:.3f} | {v['reuse_seconds']:.2f} |", "",
                  f"State reuse is **{v['speedup']:.1f}x** faster (the paper reports 363x at context 800 on GPU)."]
    return "\n".join(lines)
