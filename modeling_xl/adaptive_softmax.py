"""Adaptive input embeddings and adaptive log-softmax (Baevski & Auli 2019; Grave et al. 2017), as in Transformer-XL.

The vocabulary (sorted by frequency) is split by `cutoffs` into a head of `cutoffs[0]` tokens and tail clusters.
Cluster i is embedded in `d_embed // div_val**i` dimensions and projected to d_model. The softmax predicts
P(token) = P_head(token) for head tokens and P_head(cluster) * P_cluster(token | cluster) for tail tokens.

Weights are tied between input and output (`tie_word_embeddings`), projections per cluster when `tie_projs[i]`.
Parameter layout follows the legacy checkpoints so import is a plain rename:
    with div_val == 1: one table [V, d_embed], one input projection (when d_embed != d_model), one output projection
    per cluster; with div_val > 1: one table and one projection per cluster.
A projection weight is [d_model, d_emb_i]: the input uses `emb @ W^T`, the output `hidden @ W`.

This file is the maths: `AdaptiveLogSoftmax.log_probs` (every log-probability, one line per term of the
factorisation) and `AdaptiveLogSoftmax.nll` (per target, plain ops). `forward` runs the kernels of
`adaptive_softmax_fused` where `kernel_registry` has them (training's NLL through custom autograd nodes,
generation's distribution written once), checked against these references in tests/test_adaptive_softmax.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .input_checks import require
from .kernel_registry import kernel
from .precision import at_least_float32


def cluster_bounds(vocab_size: int, cutoffs: list[int]) -> list[tuple[int, int]]:
    """Token ranges of the clusters: cutoffs [20, 50], V=97 -> [(0, 20), (20, 50), (50, 97)]."""
    ends = [0, *cutoffs, vocab_size]
    return list(zip(ends[:-1], ends[1:]))


def needs_projections(config) -> bool:
    """Legacy rule: projections exist unless there is a single table as wide as the model."""
    return config.div_val > 1 or config.d_embed != config.d_model


class Projection(nn.Module):
    """A bias-free [d_model, d_in] matrix shared by the input (`x @ W^T`) and the output (`x @ W`) side."""

    def __init__(self, d_model: int, d_in: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d_model, d_in))


class OutputTable(nn.Module):
    """A cluster's output weight [tokens, d_emb] and bias [tokens]: what `AdaptiveLogSoftmax.cluster_weights` reads
    (the weight tied to the embedding's table), never called as a layer. Not an `nn.Linear`: tools that adapt every
    linear layer (peft's `target_modules="all-linear"`) leave a model's output embeddings alone, and they recognise
    those by the one module `get_output_embeddings()` returns, which here is the whole softmax, its tables inside."""

    def __init__(self, d_in: int, tokens: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(tokens, d_in))
        self.bias = nn.Parameter(torch.zeros(tokens))


class AdaptiveEmbedding(nn.Module):
    """Token ids [B, T] -> embeddings [B, T, d_model], scaled by sqrt(d_model) as in the paper's code."""

    def __init__(self, config):
        super().__init__()
        self.bounds = cluster_bounds(config.vocab_size, config.cutoffs)
        self.scale = config.d_model**0.5
        self.div_val = config.div_val
        if config.div_val == 1:
            self.emb_layers = nn.ModuleList([nn.Embedding(config.vocab_size, config.d_embed)])
            projs = [Projection(config.d_model, config.d_embed)] if needs_projections(config) else []
        else:
            dims = [config.d_embed // config.div_val**i for i in range(len(self.bounds))]
            self.emb_layers = nn.ModuleList(nn.Embedding(hi - lo, d) for (lo, hi), d in zip(self.bounds, dims))
            projs = [Projection(config.d_model, d) for d in dims]
        self.emb_projs = nn.ModuleList(projs)

    @property
    def weight(self) -> nn.Parameter:
        """The head cluster's table. With tied weights it is the softmax's `weight` (the same Parameter): that is how
        Accelerate's FSDP2 sees the tie and puts embedding and softmax in one unit (`get_output_embeddings`)."""
        return self.emb_layers[0].weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.div_val == 1:  # the table the softmax may share: the "embedding" kernel defers its gradient
            lookup = kernel("embedding", input_ids.device.type)
            emb = lookup(self.emb_layers[0], input_ids) if lookup is not None else None
            emb = self.emb_layers[0](input_ids) if emb is None else emb
            if len(self.emb_projs):
                emb = F.linear(emb, self.emb_projs[0].weight)
            return emb * self.scale
        flat = input_ids.reshape(-1)
        if torch.compiler.is_compiling():
            return self.masked_forward(flat).view(*input_ids.shape, -1) * self.scale
        rows, pieces = [], []
        # Every cluster runs, even with no token in this batch, so DDP sees all parameters used.
        for (lo, hi), table, proj in zip(self.bounds, self.emb_layers, self.emb_projs):
            idx = ((flat >= lo) & (flat < hi)).nonzero().squeeze(1)
            rows.append(idx)
            pieces.append(F.linear(table(flat[idx] - lo), proj.weight))
        pieces = torch.cat(pieces)  # [N, d_model], in cluster order
        emb = pieces.new_zeros(flat.numel(), pieces.size(-1)).index_copy(0, torch.cat(rows), pieces)
        return emb.view(*input_ids.shape, -1) * self.scale

    def masked_forward(self, flat: torch.Tensor) -> torch.Tensor:
        """Unscaled embeddings [N, d_model] of ids [N] (div_val > 1) with shapes that do not depend on the ids, for
        `torch.compile`: every cluster embeds every token and keeps the rows of its own tokens. Selecting each
        cluster's rows (`nonzero`) makes a shape that changes every batch, which the compiler either cannot trace or
        recompiles for. Costs one [N, d_i] x [d_i, d_model] product per cluster over all N tokens instead of the
        cluster's own (small next to the layers).

        The row a token reads is `id - lo` where the token is in the cluster (inside the table because it is) and row
        0 elsewhere, picked by the mask: every lane's index is inside the table by construction, whatever the ids of
        other clusters (docs/troubleshooting.md, "index out of bounds" in a compiled run)."""
        emb = None
        for (lo, hi), table, proj in zip(self.bounds, self.emb_layers, self.emb_projs):
            in_cluster = (flat >= lo) & (flat < hi)  # [N]
            piece = F.linear(table(torch.where(in_cluster, flat - lo, 0)), proj.weight)  # [N, d_model]
            piece = torch.where(in_cluster[:, None], piece, 0.0)
            emb = piece if emb is None else emb + piece
        return emb


class AdaptiveLogSoftmax(nn.Module):
    """Hidden states [N, d_model] -> per-token NLL [N] in input order, or log-probabilities [N, V].

    Log-softmax runs in float32 whatever the input dtype (bf16/fp16 logits lose the tail otherwise).
    """

    def __init__(self, config):
        super().__init__()
        self.vocab_size = config.vocab_size
        self.bounds = cluster_bounds(config.vocab_size, config.cutoffs)
        self.n_clusters = len(self.bounds) - 1
        self.shortlist = self.bounds[0][1]
        self.div_val = config.div_val
        if config.div_val == 1:
            self.out_layers = nn.ModuleList([OutputTable(config.d_embed, config.vocab_size)])
            dims = [config.d_embed] * len(self.bounds)
        else:
            dims = [config.d_embed // config.div_val**i for i in range(len(self.bounds))]
            self.out_layers = nn.ModuleList(OutputTable(d, hi - lo) for (lo, hi), d in zip(self.bounds, dims))
        projs = [Projection(config.d_model, d) for d in dims] if needs_projections(config) else []
        self.out_projs = nn.ModuleList(projs)
        if self.n_clusters:
            self.cluster_weight = nn.Parameter(torch.zeros(self.n_clusters, config.d_embed))
            self.cluster_bias = nn.Parameter(torch.zeros(self.n_clusters))
        self.tail_capacity: tuple[int, ...] | None = None  # rows each tail cluster scores per forward (`nll`)

    @property
    def weight(self) -> nn.Parameter:
        """The head cluster's table (the embedding's `weight` when tied; see `AdaptiveEmbedding.weight`)."""
        return self.out_layers[0].weight

    def cluster_weights(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(weight, bias) of every cluster. With one shared table the clusters are `split` from it, not sliced: the
        gradient of a split is one concatenation, while every slice would back-propagate a zero-filled table of the
        whole vocabulary (three [V, d] fills and adds per step)."""
        if self.div_val == 1:
            sizes = [hi - lo for lo, hi in self.bounds]
            layer = self.out_layers[0]
            return list(zip(layer.weight.split(sizes), layer.bias.split(sizes)))
        return [(layer.weight, layer.bias) for layer in self.out_layers]

    def cluster_logits(self, hidden: torch.Tensor, i: int, weights=None) -> torch.Tensor:
        """Logits of cluster i's tokens (for i == 0 followed by one logit per tail cluster), in float32 (float64 for a
        float64 model).
        `weights`: `cluster_weights()`, passed in by callers that need several clusters (split once).

        With fewer rows than the hidden width (generation: a few tokens at a time) the products are the
        "few_row_logits" kernel's where there is one. Callers may overwrite the returned logits: they are a fresh
        product (with gradients, a contiguous one: autograd refuses such writes into a view).
        """
        weight, bias = (weights or self.cluster_weights())[i]
        if len(self.out_projs):
            hidden = hidden @ self.out_projs[i].weight.to(hidden.dtype)
        tables = [(weight, bias)]
        if i == 0 and self.n_clusters:
            tables.append((self.cluster_weight, self.cluster_bias))
        tables = [(w.to(hidden.dtype), b.to(hidden.dtype)) for w, b in tables]
        few_rows = kernel("few_row_logits", hidden.device.type) if hidden.size(0) < hidden.size(1) else None
        if few_rows is not None:
            return at_least_float32(few_rows(hidden, tables))
        # one product per table, their logits side by side (concatenating the tables would copy them every call)
        return at_least_float32(torch.cat([F.linear(hidden, w, b) for w, b in tables], dim=-1))

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """NLL [N] (0 where target == -100) when `targets` [N] is given, else log-probs [N, V] (float32): `nll` and
        `log_probs` below, or their kernels (`kernel_registry`: "adaptive_softmax_nll", "adaptive_log_probs")."""
        operation = "adaptive_log_probs" if targets is None else "adaptive_softmax_nll"
        fast = kernel(operation, hidden.device.type)
        out = None if fast is None else fast(self, hidden) if targets is None else fast(self, hidden, targets)
        if out is not None:
            return out
        return self.log_probs(hidden) if targets is None else self.nll(hidden, targets)

    def log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """log P(token) for every token [N, V] (float32), the reference: head log-softmax over its tokens and one
        logit per tail cluster; tail tokens add log P(cluster) to their cluster's own log-softmax."""
        weights = self.cluster_weights()
        head_logprob = torch.log_softmax(self.cluster_logits(hidden, 0, weights), dim=-1)
        parts = [head_logprob[:, : self.shortlist]]
        for i in range(1, self.n_clusters + 1):
            tail = torch.log_softmax(self.cluster_logits(hidden, i, weights), dim=-1)
            parts.append(head_logprob[:, self.shortlist + i - 1, None] + tail)
        return torch.cat(parts, dim=-1)

    def nll(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """-log P(target) [N], 0 where target == -100: the per-target reference (also what torch.compile traces).
        With `tail_capacity` set, each tail cluster scores only its own rows (`routed_log_probs`), else every row
        (`masked_log_probs`); either way the shapes do not depend on the targets."""
        valid = targets >= 0
        cluster = torch.bucketize(targets, self._tail_starts(targets.device), right=True)  # 0 = shortlist
        cluster = cluster.masked_fill(~valid, 0)  # an ignored target scores the head's column 0, then is zeroed
        head_column = torch.where(cluster == 0, targets, self.shortlist + cluster - 1).masked_fill(~valid, 0)
        if self.tail_capacity is not None:
            logprob = self.routed_log_probs(hidden, targets, cluster, head_column, self.tail_capacity)
        else:
            logprob = self.masked_log_probs(hidden, targets, cluster, head_column)
        return torch.where(valid, -logprob, 0.0)

    def routed_log_probs(self, hidden, targets, cluster, head_column, capacity: tuple[int, ...]) -> torch.Tensor:
        """log P(target) [N], each tail cluster i scoring only its own rows, routed into `capacity[i - 1]` slots: the
        rows sorted by cluster (stably), cluster i's window of that many rows from its first, the slots past its
        count masked. Shapes depend on the capacity alone (no `nonzero`, no host synchronisation), so the step
        compiles and captures once. Exact while no cluster has more targets than its capacity, which is checked
        in the graph (`input_checks.require`); `training.tail_capacity` reads the largest count of a run's data.
        Example, N = 6, clusters [0, 2, 1, 0, 2, 2], capacity (2, 3): sorted rows [0, 3, 2, 1, 4, 5]; cluster 1's
        window [2, 1] (slot 1 masked: count 1), cluster 2's [1, 4, 5]."""
        weights = self.cluster_weights()
        head = torch.log_softmax(self.cluster_logits(hidden, 0, weights), dim=-1)
        logprob = head.gather(1, head_column[:, None]).squeeze(1)  # head column: the token's or its cluster's
        order = torch.argsort(cluster, stable=True)  # rows by cluster, in order within each
        # [clusters + 1]; a comparison, not `bincount`, whose output length depends on the data (a graph break)
        counts = (cluster[:, None] == torch.arange(self.n_clusters + 1, device=cluster.device)).sum(0)
        starts = torch.cumsum(counts, 0) - counts
        for i in range(1, self.n_clusters + 1):
            lo, hi = self.bounds[i]
            slots = torch.arange(capacity[i - 1], device=hidden.device)
            require(counts[i] <= capacity[i - 1], f"tail cluster {i} has more targets than its capacity "
                    f"{capacity[i - 1]} (tail_capacity); expected at most that many per forward, or tail_capacity=None")
            rows = order[(starts[i] + slots).clamp(max=order.size(0) - 1)]  # [C]
            used = slots < counts[i]
            tail = torch.log_softmax(self.cluster_logits(hidden[rows], i, weights), dim=-1)  # [C, hi - lo]
            in_tail = tail.gather(1, (targets[rows] - lo).clamp(0, hi - lo - 1)[:, None]).squeeze(1)
            logprob = logprob.index_add(0, rows, torch.where(used, in_tail, 0.0))
        return logprob

    def masked_log_probs(self, hidden, targets, cluster, head_column) -> torch.Tensor:
        """log P(target) [N] with shapes that do not depend on the targets, for `torch.compile` (see `forward`):
        every tail cluster scores every row and each row keeps its own cluster's term. Selecting the rows of each
        cluster (`nonzero`) gives shapes that change every batch, which the compiler cannot trace without
        recompiling. Plain ops (no custom autograd nodes), for the compiler to fuse. Costs the tail clusters' products
        over all N rows instead of their own rows (benchmarks/bench_compile.py)."""
        weights = self.cluster_weights()
        head = torch.log_softmax(self.cluster_logits(hidden, 0, weights), dim=-1)
        logprob = head.gather(1, head_column[:, None]).squeeze(1)  # head column: the token's or its cluster's
        for i in range(1, self.n_clusters + 1):
            lo, hi = self.bounds[i]
            tail = torch.log_softmax(self.cluster_logits(hidden, i, weights), dim=-1)  # [N, hi - lo]
            in_tail = tail.gather(1, (targets - lo).clamp(0, hi - lo - 1)[:, None]).squeeze(1)
            logprob = logprob + torch.where(cluster == i, in_tail, 0.0)
        return logprob

    def _tail_starts(self, device) -> torch.Tensor:
        """First token id of every tail cluster, for `bucketize`."""
        return torch.tensor([lo for lo, _ in self.bounds[1:]], dtype=torch.long, device=device)


def resize_vocabulary(embedding: AdaptiveEmbedding, softmax: AdaptiveLogSoftmax | None, config, new_size: int,
                      mean_resizing: bool = True) -> None:
    """Grow or shrink the vocabulary to `new_size` tokens in place: the last cluster's rows (the input table's, and
    the softmax's weight and bias) are added or cut at the end, so every kept token keeps its id and its vectors.
    New rows are the mean of their table's existing rows (`mean_resizing`) or drawn as at initialisation. A softmax
    weight that is the input table's own parameter stays tied to the resized table. Updates `config.vocab_size`."""
    low = embedding.bounds[-1][0]
    if not isinstance(new_size, int) or isinstance(new_size, bool) or new_size <= low:
        raise ValueError(f"new_num_tokens={new_size!r} is invalid; expected an integer > {low} (the last cluster "
                         f"starts at token {low}, cutoffs={list(config.cutoffs)})")

    table = embedding.emb_layers[-1]
    table_start = 0 if embedding.div_val == 1 else low  # the first token id of the last table's rows
    tied = softmax is not None and softmax.out_layers[-1].weight is table.weight
    table.weight = nn.Parameter(_resize_rows(table.weight.data, new_size - table_start, mean_resizing,
                                             config.init_std))
    table.num_embeddings = new_size - table_start
    if softmax is not None:
        layer = softmax.out_layers[-1]
        layer.weight = table.weight if tied else nn.Parameter(
            _resize_rows(layer.weight.data, new_size - table_start, mean_resizing, config.init_std))
        layer.bias = nn.Parameter(_resize_rows(layer.bias.data, new_size - table_start, mean_resizing, 0.0))
        softmax.vocab_size = new_size
        softmax.bounds = cluster_bounds(new_size, list(config.cutoffs))
        softmax.shortlist = softmax.bounds[0][1]
    embedding.bounds = cluster_bounds(new_size, list(config.cutoffs))
    config.vocab_size = new_size


def _resize_rows(old: torch.Tensor, rows: int, mean_resizing: bool, std: float) -> torch.Tensor:
    """`old` [n, ...] cut to or extended to `rows` rows; new rows are the mean of the old ones or normal(0, std)."""
    if rows <= old.size(0):
        return old[:rows].clone()
    extra = old.new_empty(rows - old.size(0), *old.shape[1:])
    if mean_resizing:
        extra.copy_(at_least_float32(old).mean(0).to(old.dtype).expand_as(extra))
    else:
        extra.normal_(0.0, std)
    return torch.cat([old, extra])


def tied_weight_map(config) -> dict[str, str]:
    """{output parameter: input parameter} pairs tied as in the authors' code: the weights per cluster when
    `tie_word_embeddings`, the projections by `tie_projs` alone (whatever `tie_word_embeddings` says; with
    div_val == 1 every tied output projection shares the single input projection)."""
    emb, out = "transformer.word_emb", "lm_head"
    n_tables = 1 if config.div_val == 1 else len(config.cutoffs) + 1
    tied = {}
    if config.tie_word_embeddings:
        tied = {f"{out}.out_layers.{i}.weight": f"{emb}.emb_layers.{i}.weight" for i in range(n_tables)}
    if needs_projections(config):
        for i, tie in enumerate(config.tie_projs):
            if tie:
                tied[f"{out}.out_projs.{i}.weight"] = f"{emb}.emb_projs.{0 if config.div_val == 1 else i}.weight"
    return tied
