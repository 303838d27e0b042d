"""Adaptive input embeddings and adaptive log-softmax (Baevski & Auli 2019; Grave et al. 2017), as in Transformer-XL.

The vocabulary (sorted by frequency) is split by `cutoffs` into a head of `cutoffs[0]` tokens and tail clusters.
Cluster i is embedded in `d_embed // div_val**i` dimensions and projected to d_model. The softmax predicts
P(token) = P_head(token) for head tokens and P_head(cluster) * P_cluster(token | cluster) for tail tokens.

Weights are tied between input and output (`tie_word_embeddings`), projections per cluster when `tie_projs[i]`.
Parameter layout follows the legacy checkpoints so import is a plain rename:
    with div_val == 1: one table [V, d_embed], one input projection (when d_embed != d_model), one output projection
    per cluster; with div_val > 1: one table and one projection per cluster.
A projection weight is [d_model, d_emb_i]: the input uses `emb @ W^T`, the output `hidden @ W`.

The plain maths is `AdaptiveLogSoftmax.forward(hidden)` without targets (every log-probability, one line per term of
the factorisation) and `masked_log_probs` (per target, plain ops). Training's `forward(hidden, targets)` computes the
same NLL through the custom autograd nodes below (`SharedTableLogits`, `GatheredLogSoftmax`, `TableGradient`), which
save memory and copies; tests/test_adaptive_softmax.py checks its values and gradients against the plain log-softmax.
"""

from __future__ import annotations

import itertools
import sys

import torch
import torch.nn.functional as F
from torch import nn

from .precision import at_least_float32



def cluster_bounds(vocab_size: int, cutoffs: list[int]) -> list[tuple[int, int]]:
    """Token ranges of the clusters: cutoffs [20, 50], V=97 -> [(0, 20), (20, 50), (50, 97)]."""
    ends = [0, *cutoffs, vocab_size]
    return list(zip(ends[:-1], ends[1:]))


class GatheredLogSoftmax(torch.autograd.Function):
    """`log_softmax(logits, -1).gather(1, index[:, None]).squeeze(1)` for logits [N, C], index [N] -> [N].

    Autograd for the plain ops keeps the log-probabilities and, in backward, allocates a zero-filled [N, C] for the
    gather's gradient and another [N, C] for the log-softmax's: three tables of the largest activation of a step (the
    head's logits) alive at the start of backward. Here the gradient g * (onehot - softmax) is written into the saved
    log-probabilities themselves: one table. Backward consumes that buffer, so a second backward through the same
    graph (retain_graph=True) raises autograd's in-place-modification error instead of a wrong gradient.
    With `consume` the log-probabilities are written over the logits (in row blocks of at most 4 MiB of scratch), so
    that logits and log-probabilities are never alive at once: at the `wide` preset the head's are 19 MiB each, and
    the end of the forward pass was a training step's peak once the layers' activations had shrunk. The logits must
    then be a tensor no other node needs (a product's output); they are returned, marked dirty, holding the
    log-probabilities. Returns (gathered [N], log-probabilities [N, C]).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, index: torch.Tensor, consume: bool):
        ctx.set_materialize_grads(False)
        if consume:
            rows = max(1, 4 * 2**20 // max(1, logits.size(1) * logits.element_size()))
            for block in logits.split(rows):
                block.copy_(torch.log_softmax(block, dim=-1))
            ctx.mark_dirty(logits)
            logprob = logits
        else:
            logprob = torch.log_softmax(logits, dim=-1)
        ctx.save_for_backward(logprob, index)
        return logprob.gather(1, index[:, None]).squeeze(1), logprob

    @staticmethod
    def backward(ctx, grad: torch.Tensor | None, grad_logprob: torch.Tensor | None):
        # d/dlogits of sum(g * gathered) + sum(G * logprob) = onehot * g + G - softmax * (g + rowsum(G))
        logprob, index = ctx.saved_tensors
        total = torch.zeros(logprob.size(0), dtype=logprob.dtype, device=logprob.device) if grad is None else (
            grad.to(logprob.dtype))
        if grad_logprob is not None:
            total = total + grad_logprob.sum(-1).to(logprob.dtype)
        grad_logits = logprob.exp_().mul_(-total[:, None])
        if grad is not None:
            grad_logits.scatter_add_(1, index[:, None], grad[:, None].to(logprob.dtype))
        if grad_logprob is not None:
            grad_logits += grad_logprob
        return grad_logits, None, None


def gathered_log_softmax(logits: torch.Tensor, index: torch.Tensor, consume: bool = False) -> torch.Tensor:
    """Log-probability of column `index[i]` in row i of `log_softmax(logits)`; see `GatheredLogSoftmax` (`consume`:
    the logits' buffer may be overwritten, under autograd)."""
    if torch.is_grad_enabled() and logits.requires_grad:
        return GatheredLogSoftmax.apply(logits, index, consume)[0]
    return torch.log_softmax(logits, dim=-1).gather(1, index[:, None]).squeeze(1)


class TableGradient:
    """The tied table's gradient, deferred from the softmax to the embedding lookup.

    The output softmax is the first node of backward and the embedding lookup the last. Computed in the softmax's
    backward, the table's gradient ([V, d], 61 MB at the `wide` benchmark preset) would be allocated while every
    activation of the step is still alive, the peak of a training step. Instead `SharedTableLogits` leaves here, per
    cluster, what that cluster's rows of the gradient are made of (its logits' gradient and the hidden states they
    multiply, both already alive), or the rows themselves where they are smaller (the head at the `wide` preset:
    5,000 x 512 floats against 1,024 x 5,002 logits plus 1,024 x 512 hidden states, 10 instead of 22 MiB held through
    the layers' backward), and `TiedEmbeddingLookup`'s backward, when activations are gone, builds the gradient of both
    uses of the table in one buffer. Created per forward by the causal and permutation LMs and handed to both nodes.
    Terms are kept per backward pass (autograd's graph-task id): the lookup takes those of its own pass and drops any
    left by an earlier pass that never reached it (`torch.autograd.grad` of other inputs with `retain_graph=True`),
    and a term arriving in a pass whose lookup has already run is computed where it arises. The lookup must be in the
    graph: `table_gradient_for` hands one out only when the table is looked up from input ids in the same forward.
    """

    def __init__(self):
        # (backward pass, pieces): see `write_rows`
        self.terms: list[tuple[int, list[tuple[int, torch.Tensor, torch.Tensor | None]]]] = []
        self.looked_up: set[int] = set()  # backward passes in which the lookup has run

    def defer(self, sizes, grads, hiddens) -> bool:
        """Keep one softmax term for the lookup of this backward pass; False if that lookup has already run, or under
        compiled autograd (see `compiled_autograd_active`): the caller then computes the term where it is. A cluster
        whose rows of the gradient take fewer bytes than its logits' gradient and hidden states is multiplied out
        now, so that only the product is held."""
        task = torch._C._current_graph_task_id()
        if task in self.looked_up or compiled_autograd_active():
            return False
        pieces = []
        for (lo, rows, hidden), grad in zip(cluster_pieces(sizes, grads, hiddens), grads):
            smaller = rows.size(1) * hidden.size(1) < grad.numel() + hidden.numel()  # than what they are made of
            pieces.append((lo, torch.mm(rows.t(), hidden), None) if smaller else (lo, rows, hidden))
        self.terms.append((task, pieces))
        return True

    def take_into(self, grad_weight: torch.Tensor | None) -> bool:
        """Called by the lookup: write the terms of this backward pass into `grad_weight` (None: drop them), forget
        the rest; returns whether anything was written."""
        task = torch._C._current_graph_task_id()
        self.looked_up.add(task)
        terms, self.terms = [t for t in self.terms if t[0] == task], []
        if grad_weight is None:
            return False
        for i, (_, pieces) in enumerate(terms):
            write_rows(grad_weight, pieces, accumulate=i > 0)
        return bool(terms)


def compiled_autograd_active() -> bool:
    """Whether backward is being traced or run by compiled autograd (`torch._dynamo.compiled_autograd`). It traces a
    graph in which every input that requires grad gets a gradient tensor, so the softmax must not hand its share of
    the table to the lookup (returning None for the table there): it computes it itself. Compiled autograd cannot be
    on unless its module has been imported."""
    module = sys.modules.get("torch._dynamo.compiled_autograd")
    return module is not None and bool(getattr(module, "compiled_autograd_enabled", False)
                                       or getattr(module, "in_compiled_autograd_region", False))


def cluster_pieces(sizes, grads, hiddens) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """(first table row, logits' gradient over the cluster's own columns, hidden states) per cluster."""
    starts = [0, *itertools.accumulate(sizes)][:-1]
    return [(lo, grad[:, :size], hidden) for lo, size, grad, hidden in zip(starts, sizes, grads, hiddens)]


def write_rows(grad_weight, pieces, accumulate: bool) -> None:
    """grad_weight[rows of each piece] (+)= its rows of the table's gradient. A piece is (first row, logits'
    gradient [N, rows], hidden [N, d]), whose rows are logits' gradient^T @ hidden, or (first row, rows [rows, d],
    None), multiplied out already."""
    for lo, a, hidden in pieces:
        target = grad_weight[lo : lo + (a.size(0) if hidden is None else a.size(1))]
        if hidden is None:
            target.add_(a) if accumulate else target.copy_(a)
        elif accumulate:
            target.addmm_(a.t(), hidden)
        else:
            torch.mm(a.t(), hidden, out=target)


class TiedEmbeddingLookup(torch.autograd.Function):
    """`F.embedding(ids, weight)` whose backward also adds the deferred softmax terms of `TableGradient` (one [V, d]
    buffer for both uses of a tied table). Inputs: weight [V, d], ids (any shape), the `TableGradient`."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, ids: torch.Tensor, deferred: TableGradient) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.deferred, ctx.table_shape = deferred, weight.shape
        return F.embedding(ids, weight)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (ids,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            ctx.deferred.take_into(None)
            return None, None, None
        grad_weight = grad_out.new_empty(ctx.table_shape)
        if not ctx.deferred.take_into(grad_weight):
            grad_weight.zero_()
        grad_weight.index_add_(0, ids.reshape(-1), grad_out.reshape(-1, grad_out.size(-1)))
        return grad_weight, None, None


def table_gradient_for(embedding: nn.Module, output_layer: nn.Module, input_ids, inputs_embeds,
                       ) -> TableGradient | None:
    """A `TableGradient` for one forward when the output layer's weight is `embedding`'s own table, that table is
    looked up from `input_ids` with gradients on, and both are plain `nn.Embedding` / `nn.Linear` modules that nothing
    hooks into (the deferred path computes their products itself, so a hook, an adapter or a subclass would be
    skipped); outside `torch.compile` (where the plain ops are traced instead) and compiled autograd. Else None, and
    both modules run as they are."""
    plain = (_unhooked(embedding, nn.Embedding) and _unhooked(output_layer, nn.Linear)
             and embedding.padding_idx is None and embedding.max_norm is None and not embedding.sparse
             and not embedding.scale_grad_by_freq)
    if (not plain or output_layer.weight is not embedding.weight or not embedding.weight.requires_grad
            or input_ids is None or inputs_embeds is not None or not torch.is_grad_enabled()
            or torch.compiler.is_compiling() or compiled_autograd_active()):
        return None
    return TableGradient()


def _unhooked(module: nn.Module, cls: type) -> bool:
    """`module` is exactly a `cls`, with no hooks of its own and no global module hooks."""
    from torch.nn.modules import module as module_hooks

    own = (module._forward_hooks, module._forward_pre_hooks, module._backward_hooks, module._backward_pre_hooks)
    everyone = (module_hooks._global_forward_hooks, module_hooks._global_forward_pre_hooks,
                module_hooks._global_backward_hooks, module_hooks._global_backward_pre_hooks)
    return type(module) is cls and not any(own) and not any(everyone)


def tied_embedding(embedding: nn.Module, input_ids: torch.Tensor, table_gradient: TableGradient | None):
    """`embedding(input_ids)`; with a `TableGradient` (see `table_gradient_for`) through `TiedEmbeddingLookup`."""
    if table_gradient is None:
        return embedding(input_ids)
    return TiedEmbeddingLookup.apply(embedding.weight, input_ids, table_gradient)


def tied_output_logits(output_layer: nn.Module, hidden: torch.Tensor, table_gradient: TableGradient | None):
    """`output_layer(hidden)` for an output layer tied to the input table; with a `TableGradient` its weight's
    gradient is left to the embedding lookup (`SharedTableLogits` with one cluster), except under autocast or with
    dtypes that differ, where the layer runs as it is."""
    weight, bias = output_layer.weight, output_layer.bias
    if (table_gradient is None or bias is None or hidden.dtype != weight.dtype
            or torch.is_autocast_enabled(hidden.device.type)):
        return output_layer(hidden)
    (logits,) = SharedTableLogits.apply(weight, bias, None, None, [weight.size(0)], table_gradient,
                                        hidden.reshape(-1, hidden.size(-1)))
    return logits.view(*hidden.shape[:-1], weight.size(0))


class SharedTableLogits(torch.autograd.Function):
    """Logits of every cluster from one shared output table (div_val == 1), as one autograd node.

    Cluster i's logits are `hiddens[i] @ weight[rows of i].T + bias[rows of i]`; the head (i = 0) also gets one logit
    per tail cluster from `cluster_weight`, `cluster_bias`. Written with `split` or slices, autograd would build the
    table's gradient from per-cluster pieces: `split` concatenates them into a new [V, d] while they are all alive
    (the peak of a `wide` training step), slices zero-fill a [V, d] per cluster. Here each cluster's weight gradient
    is one matrix product written straight into its rows of a single [V, d] buffer, or, given a `TableGradient`
    (tied to the input embedding), left to the embedding lookup's backward at the end of the step.
    Inputs: weight [V, d], bias [V], cluster_weight [C, d] or None, cluster_bias [C] or None, sizes (rows per
    cluster, summing to V), a `TableGradient` or None, then one hidden [N_i, d] per cluster. Returns one logits tensor
    per cluster.
    """

    @staticmethod
    def forward(ctx, weight, bias, cluster_weight, cluster_bias, sizes, deferred, *hiddens):
        ctx.sizes, ctx.deferred = sizes, deferred
        ctx.has_clusters = cluster_weight is not None
        ctx.save_for_backward(weight, cluster_weight, *hiddens)
        outputs = []
        for i, (hidden, w, b) in enumerate(zip(hiddens, weight.split(sizes), bias.split(sizes))):
            if i == 0 and ctx.has_clusters:
                w, b = torch.cat([w, cluster_weight]), torch.cat([b, cluster_bias])
            outputs.append(F.linear(hidden, w, b))
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        weight, cluster_weight, *hiddens = ctx.saved_tensors
        sizes, deferred = ctx.sizes, ctx.deferred
        grad_weight = grad_bias = grad_cluster_weight = grad_cluster_bias = None
        if ctx.needs_input_grad[0]:
            if deferred is None or not deferred.defer(sizes, grads, tuple(hiddens)):
                grad_weight = torch.empty_like(weight)
                write_rows(grad_weight, cluster_pieces(sizes, grads, hiddens), accumulate=False)
        if ctx.needs_input_grad[1]:
            grad_bias = torch.cat([grad[:, :size].sum(0) for size, grad in zip(sizes, grads)])
        grad_hiddens = []
        lo = 0
        for i, (hidden, grad) in enumerate(zip(hiddens, grads)):
            hi = lo + sizes[i]
            grad_hidden = grad[:, : sizes[i]] @ weight[lo:hi]
            if i == 0 and ctx.has_clusters:
                cluster_rows = grad[:, sizes[0] :]
                grad_cluster_weight = cluster_rows.t() @ hidden
                grad_cluster_bias = cluster_rows.sum(0)
                grad_hidden = grad_hidden.addmm_(cluster_rows, cluster_weight)
            grad_hiddens.append(grad_hidden)
            lo = hi
        return grad_weight, grad_bias, grad_cluster_weight, grad_cluster_bias, None, None, *grad_hiddens


def few_row_logits(hidden: torch.Tensor, tables: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """`F.linear(hidden, cat(weights), cat(biases))` for few rows ([N, d], N < d): each table's product computed
    transposed, table @ hidden^T with the table as the left operand, and a single row as two copies of itself. With
    the table out of cache (as between decoding steps), an [8,000, 256] table against 2-8 rows took 0.5-1.1 ms that
    way and 1.6-3.8 ms as hidden @ table^T, against one row 0.5 ms instead of 1.1 (the one-column product is a
    matrix-vector kernel; `benchmarks/bench_softmax_products.py`). Returns [N, rows of all tables]: a transposed view
    without gradients, a contiguous tensor with them."""
    columns = (hidden if hidden.size(0) != 1 else hidden.repeat(2, 1)).t()  # one row: as two, see above
    by_rows = [torch.addmm(bias[:, None], weight, columns) for weight, bias in tables]  # each [rows of the table, N]
    logits = (by_rows[0] if len(by_rows) == 1 else torch.cat(by_rows))[:, : hidden.size(0)].t()
    # autograd refuses in-place writes into a view by a node with several outputs: a fresh tensor then
    return logits.clone(memory_format=torch.contiguous_format) if torch.is_grad_enabled() else logits


def needs_projections(config) -> bool:
    """Legacy rule: projections exist unless there is a single table as wide as the model."""
    return config.div_val > 1 or config.d_embed != config.d_model


class Projection(nn.Module):
    """A bias-free [d_model, d_in] matrix shared by the input (`x @ W^T`) and the output (`x @ W`) side."""

    def __init__(self, d_model: int, d_in: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d_model, d_in))


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

    def forward(self, input_ids: torch.Tensor, table_gradient: TableGradient | None = None) -> torch.Tensor:
        """`table_gradient`: see `TableGradient` (div_val == 1 only; the softmax shares this table)."""
        if self.div_val == 1:
            emb = tied_embedding(self.emb_layers[0], input_ids, table_gradient)
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
        `torch.compile`: every cluster embeds every token (ids clamped into its table) and keeps the rows of its own
        tokens. Selecting each cluster's rows (`nonzero`) makes a shape that changes every batch, which the compiler
        either cannot trace or recompiles for. Costs one [N, d_i] x [d_i, d_model] product per cluster over all N
        tokens instead of the cluster's own (small next to the layers)."""
        emb = None
        for (lo, hi), table, proj in zip(self.bounds, self.emb_layers, self.emb_projs):
            piece = F.linear(table((flat - lo).clamp(0, hi - lo - 1)), proj.weight)  # [N, d_model]
            piece = torch.where(((flat >= lo) & (flat < hi))[:, None], piece, 0.0)
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
            self.out_layers = nn.ModuleList([nn.Linear(config.d_embed, config.vocab_size)])
            dims = [config.d_embed] * len(self.bounds)
        else:
            dims = [config.d_embed // config.div_val**i for i in range(len(self.bounds))]
            self.out_layers = nn.ModuleList(nn.Linear(d, hi - lo) for (lo, hi), d in zip(self.bounds, dims))
        projs = [Projection(config.d_model, d) for d in dims] if needs_projections(config) else []
        self.out_projs = nn.ModuleList(projs)
        if self.n_clusters:
            self.cluster_weight = nn.Parameter(torch.zeros(self.n_clusters, config.d_embed))
            self.cluster_bias = nn.Parameter(torch.zeros(self.n_clusters))

    @property
    def weight(self) -> nn.Parameter:
        """The head cluster's table (the embedding's `weight` when tied; see `AdaptiveEmbedding.weight`)."""
        return self.out_layers[0].weight

    def cluster_weights(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(weight, bias) of every cluster. With one shared table the clusters are `split` from it, not sliced: the
        gradient of a split is one concatenation, while every slice would back-propagate a zero-filled table of the
        whole vocabulary (three [V, d] fills and adds per step, 13% of a `wide` benchmark step)."""
        if self.div_val == 1:
            sizes = [hi - lo for lo, hi in self.bounds]
            layer = self.out_layers[0]
            return list(zip(layer.weight.split(sizes), layer.bias.split(sizes)))
        return [(layer.weight, layer.bias) for layer in self.out_layers]

    def cluster_logits(self, hidden: torch.Tensor, i: int, weights=None) -> torch.Tensor:
        """Logits of cluster i's tokens (for i == 0 followed by one logit per tail cluster), in float32 (float64 for a
        float64 model).
        `weights`: `cluster_weights()`, passed in by callers that need several clusters (split once).

        With fewer rows than the hidden width (generation: a few tokens at a time) the products are
        `few_row_logits`'; for i == 0 the two products (head, cluster rows) are then joined instead of the two tables
        ([N, S + C] copied, not [S + C, d]). Callers may overwrite the returned logits
        (`gathered_log_softmax(..., consume=True)`): they are a fresh product (with gradients, a contiguous copy of
        it: autograd refuses such writes into a view).
        """
        weight, bias = (weights or self.cluster_weights())[i]
        if len(self.out_projs):
            hidden = hidden @ self.out_projs[i].weight.to(hidden.dtype)
        tables = [(weight, bias)]
        if i == 0 and self.n_clusters:
            tables.append((self.cluster_weight, self.cluster_bias))
        tables = [(w.to(hidden.dtype), b.to(hidden.dtype)) for w, b in tables]
        if hidden.size(0) < hidden.size(1):
            return at_least_float32(few_row_logits(hidden, tables))
        weight, bias = (torch.cat([w for w, _ in tables]), torch.cat([b for _, b in tables])) if len(tables) > 1 else (
            tables[0])
        return at_least_float32(F.linear(hidden, weight, bias))

    def every_cluster_logits(self, hiddens: list[torch.Tensor],
                             table_gradient: TableGradient | None = None) -> list[torch.Tensor]:
        """`cluster_logits(hiddens[i], i)` for every cluster i (float32). With one shared table (div_val == 1) all of
        them come from one `SharedTableLogits` node, whose backward writes the table's gradient in place (or leaves it
        to `table_gradient`); under autocast (where the products change dtype) each cluster goes through
        `cluster_logits`."""
        shared = self.div_val == 1 and not torch.is_autocast_enabled(hiddens[0].device.type)
        if not shared or hiddens[0].dtype != self.out_layers[0].weight.dtype:
            weights = self.cluster_weights()
            return [self.cluster_logits(hidden, i, weights) for i, hidden in enumerate(hiddens)]
        if len(self.out_projs):
            hiddens = [hidden @ proj.weight for hidden, proj in zip(hiddens, self.out_projs)]
        layer = self.out_layers[0]
        clusters = (self.cluster_weight, self.cluster_bias) if self.n_clusters else (None, None)
        sizes = [hi - lo for lo, hi in self.bounds]
        return [at_least_float32(logits) for logits in SharedTableLogits.apply(layer.weight, layer.bias, *clusters, sizes,
                                                                     table_gradient, *hiddens)]

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor | None = None,
                table_gradient: TableGradient | None = None) -> torch.Tensor:
        """NLL [N] (0 where target == -100) when `targets` [N] is given, else log-probs [N, V] (float32).
        `table_gradient`: see `TableGradient` (the causal LM passes one when the table is tied to the input)."""
        if targets is None:
            weights = self.cluster_weights()
            head_logprob = torch.log_softmax(self.cluster_logits(hidden, 0, weights), dim=-1)
            parts = [head_logprob[:, : self.shortlist]]
            for i in range(1, self.n_clusters + 1):
                tail = torch.log_softmax(self.cluster_logits(hidden, i, weights), dim=-1)
                parts.append(head_logprob[:, self.shortlist + i - 1, None] + tail)
            return torch.cat(parts, dim=-1)
        # One gather from the head for every token: its own column (shortlist) or its cluster's column (tails).
        # Row-indexing the head per cluster instead would back-propagate through index_put into zero-filled [N, C]
        # tables, one per cluster (14% of a `tiny` training step); the gather's gradient is written in place.
        valid = targets >= 0
        cluster = torch.bucketize(targets, self._tail_starts(targets.device), right=True)  # 0 = shortlist
        head_column = torch.where(cluster == 0, targets, self.shortlist + cluster - 1).masked_fill(~valid, 0)
        if torch.compiler.is_compiling():
            return torch.where(valid, -self.masked_log_probs(hidden, targets, cluster, head_column), 0.0)
        # Every cluster runs, on an empty selection too, so that all parameters take part in the graph.
        rows = [(cluster == i).nonzero().squeeze(1) for i in range(1, self.n_clusters + 1)]
        logits = self.every_cluster_logits([hidden, *(hidden[idx] for idx in rows)], table_gradient)
        # each cluster's logits are a fresh product that nothing else reads: turned into log-probs in place
        logprob = gathered_log_softmax(logits[0], head_column, consume=True)  # [N, shortlist + clusters] -> [N]
        for i, idx in enumerate(rows, start=1):
            local = targets[idx] - self.bounds[i][0]
            logprob = logprob.index_add(0, idx, gathered_log_softmax(logits[i], local, consume=True))
        return torch.where(valid, -logprob, 0.0)

    def masked_log_probs(self, hidden, targets, cluster, head_column) -> torch.Tensor:
        """log P(target) [N] with shapes that do not depend on the targets, for `torch.compile` (see `forward`):
        every tail cluster scores every row and each row keeps its own cluster's term. Selecting the rows of each
        cluster (`nonzero`) gives shapes that change every batch, which the compiler cannot trace without
        recompiling. Plain ops (no custom autograd nodes), for the compiler to fuse. Costs the tail clusters' products
        over all N rows instead of their own rows (measured in benchmarks/bench_compile.py)."""
        weights = self.cluster_weights()
        head = torch.log_softmax(self.cluster_logits(hidden, 0, weights), dim=-1)
        logprob = head.gather(1, head_column[:, None]).squeeze(1)  # head column: the token's or its cluster's
        for i in range(1, self.n_clusters + 1):
            lo, hi = self.bounds[i]
            tail = torch.log_softmax(self.cluster_logits(hidden, i, weights), dim=-1)  # [N, hi - lo]
            in_tail = tail.gather(1, (targets - lo).clamp(0, hi - lo - 1)[:, None]).squeeze(1)
            logprob = logprob + torch.where(cluster == i, in_tail, 0.0)
        return logprob

    def argmax_log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """Log-probabilities [N, V] (float32) as `forward(hidden)` gives them, except for tail clusters that cannot
        hold a row's most likely token: there they are -inf for that row. What greedy decoding needs, at a fraction
        of the cost.

        A tail token's log-probability is log P(cluster) + log P(token | cluster) <= log P(cluster). Clusters are
        visited in id order; once a row has a token at least as likely as a cluster (ties go to the lower id, as
        `argmax` does), none of that cluster's tokens can be the row's argmax, and the cluster's logits are computed
        only for the other rows. A trained model's greedy choice is mostly a frequent (shortlist) word, so a step
        multiplies by the head's `shortlist + n_clusters` rows instead of the whole vocabulary's (33,278 x 256 ->
        2,003 x 256 floats read per token at the d_model 256 benchmark shape), and a batch pays for a tail only on
        the rows that may need it.

        Entries are `forward`'s: the same products, bit for bit where every row computes a cluster; where only some
        rows do, the tail's product runs over those rows only, which may round differently (float32: about 1e-7
        relative), so the argmax can differ from `forward`'s only between tokens whose log-probabilities are that
        close."""
        weights = self.cluster_weights()
        head_logprob = torch.log_softmax(self.cluster_logits(hidden, 0, weights), dim=-1)
        parts = [head_logprob[:, : self.shortlist]]
        best = parts[0].max(dim=-1).values  # [N] the best log-probability found so far in each row
        for i in range(1, self.n_clusters + 1):
            cluster_logprob = head_logprob[:, self.shortlist + i - 1]
            needed = cluster_logprob > best  # rows where this cluster may hold the best token
            count = int(needed.sum())
            if count == hidden.size(0):  # every row: forward's own product
                part = cluster_logprob[:, None] + torch.log_softmax(self.cluster_logits(hidden, i, weights), dim=-1)
            else:
                lo, hi = self.bounds[i]
                part = head_logprob.new_full((hidden.size(0), hi - lo), float("-inf"))
                if count:
                    rows = needed.nonzero().squeeze(1)
                    tail = torch.log_softmax(self.cluster_logits(hidden[rows], i, weights), dim=-1)
                    part[rows] = cluster_logprob[rows, None] + tail
            if count:
                best = torch.maximum(best, part.max(dim=-1).values)
            parts.append(part)
        return torch.cat(parts, dim=-1)

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
        layer.out_features = new_size - table_start
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
