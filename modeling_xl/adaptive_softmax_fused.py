"""The kernels of the adaptive softmax (`kernel_registry` routes to them, on every device; the maths is
`adaptive_softmax`): custom autograd nodes that save memory and copies in training, and the products of generation.

- Training NLL (`shared_table_nll`): every cluster's logits from one node (`SharedTableLogits`), log-probabilities
  written over the logits and gathered (`GatheredLogSoftmax`), the tied table's gradient deferred to the embedding
  lookup (`TableGradient`, `TiedEmbeddingLookup`). Checked against `AdaptiveLogSoftmax.nll`, values and gradients
  (tests/test_adaptive_softmax.py).
- The full distribution without gradients (`full_log_probs`, sampling and logits processors): with one shared
  table (div_val 1, no projections) one product for every token of every cluster and each cluster's log-softmax
  written back over its columns, as a plain output layer writes its logits; greedy decoding and top-k sampling
  (`top_k_log_probs`) skip the tail clusters that cannot hold one of a row's k best tokens.
- `few_row_logits`: the products of a few rows against a table.
Per-forward state (which table's gradient is deferred, whether `generate` decodes greedily) is held in context
variables set by the heads for the duration of one call (`deferred_table_gradient`, `top_k_decoding`), never in a
forward signature.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn

from .precision import at_least_float32


class GatheredLogSoftmax(torch.autograd.Function):
    """`log_softmax(logits, -1).gather(1, index[:, None]).squeeze(1)` for logits [N, C], index [N] -> [N].

    Autograd for the plain ops keeps the log-probabilities and, in backward, allocates a zero-filled [N, C] for the
    gather's gradient and another [N, C] for the log-softmax's: three tables of the largest activation of a step (the
    head's logits) alive at the start of backward. Here the gradient g * (onehot - softmax) is written into the saved
    log-probabilities themselves: one table. Backward consumes that buffer, so a second backward through the same
    graph (retain_graph=True) raises autograd's in-place-modification error instead of a wrong gradient.
    With `consume` the log-probabilities are written over the logits (in row blocks of at most 4 MiB of scratch), so
    that logits and log-probabilities are never alive at once: the head's are the largest activations, and
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
    backward, the table's gradient ([V, d]) would be allocated while every
    activation of the step is still alive, the peak of a training step. Instead `SharedTableLogits` leaves here, per
    cluster, what that cluster's rows of the gradient are made of (its logits' gradient and the hidden states they
    multiply, both already alive), or the rows themselves where they are smaller (a head cluster of fewer rows than the
    batch has tokens), and `TiedEmbeddingLookup`'s backward, when activations are gone, builds the gradient of both
    uses of the table in one buffer. Created per forward by the causal and permutation LMs and handed to both nodes.
    Terms are kept per backward pass (autograd's graph-task id): the lookup takes those of its own pass and drops any
    left by an earlier pass that never reached it (`torch.autograd.grad` of other inputs with `retain_graph=True`),
    and a term arriving in a pass whose lookup has already run is computed where it arises. The lookup must be in the
    graph: `table_gradient_for` hands one out only when the table is looked up from input ids in the same forward.
    """

    def __init__(self, table: torch.Tensor):
        self.table = table  # the tied weight whose gradient this defers
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
    looked up from `input_ids` with gradients on, the embedding is a plain `nn.Embedding` that nothing hooks into (the
    deferred path computes its lookup itself, so a hook, an adapter or a subclass would be skipped) and the output
    table (`adaptive_softmax.OutputTable`, whose weight is only ever read) has no hooks either; outside
    `torch.compile` (where the plain ops are traced instead) and compiled autograd. Else None, and both modules run as
    they are."""
    plain = (_unhooked(embedding, nn.Embedding) and _unhooked(output_layer, type(output_layer))
             and embedding.padding_idx is None and embedding.max_norm is None and not embedding.sparse
             and not embedding.scale_grad_by_freq)
    if (not plain or output_layer.weight is not embedding.weight or not embedding.weight.requires_grad
            or input_ids is None or inputs_embeds is not None or not torch.is_grad_enabled()
            or torch.compiler.is_compiling() or compiled_autograd_active()):
        return None
    return TableGradient(embedding.weight)


def _unhooked(module: nn.Module, cls: type) -> bool:
    """`module` is exactly a `cls`, with no hooks of its own and no global module hooks."""
    from torch.nn.modules import module as module_hooks

    own = (module._forward_hooks, module._forward_pre_hooks, module._backward_hooks, module._backward_pre_hooks)
    everyone = (module_hooks._global_forward_hooks, module_hooks._global_forward_pre_hooks,
                module_hooks._global_backward_hooks, module_hooks._global_backward_pre_hooks)
    return type(module) is cls and not any(own) and not any(everyone)


def tied_output_logits(output_layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor | None:
    """`output_layer(hidden)` for an output layer tied to the input table, its weight's gradient left to the embedding
    lookup (`SharedTableLogits` with one cluster) when the forward in progress defers that table's gradient; None
    otherwise, under autocast or with dtypes that differ (the caller runs the layer)."""
    weight, bias = output_layer.weight, output_layer.bias
    table_gradient = active_table_gradient(weight)
    if (table_gradient is None or bias is None or hidden.dtype != weight.dtype
            or torch.is_autocast_enabled(hidden.device.type)):
        return None
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


def few_rows_pay_off() -> bool:
    """Whether this CPU runs few-row products faster as table @ hidden^T (`few_row_logits`) than as `F.linear`: where
    torch's widest CPU kernels are AVX2. Measured both ways on two machines (benchmarks/README.md, "Few-row products
    per CPU"): faster on an AMD EPYC (AVX2), slower on an Intel Xeon with AVX-512 (a [33,278, 256] table: 1 row
    1.6 ms against F.linear's 0.76, 32 rows 7.5 against 3.1). Elsewhere, not measured: F.linear, the reference."""
    return torch.backends.cpu.get_cpu_capability() == "AVX2"


FEW_ROWS_PAY_OFF = few_rows_pay_off()  # read once: torch's CPU capability is fixed when torch is imported


def few_row_logits(hidden: torch.Tensor, tables: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """`F.linear(hidden, cat(weights), cat(biases))` for few rows ([N, d], N < d): each table's product computed
    transposed, table @ hidden^T with the table as the left operand, and a single row as two copies of itself. With the
    table out of cache (as between decoding steps) that is the faster order for few rows, and a single row as two beats
    the one-column product's matrix-vector kernel (`benchmarks/bench_softmax_products.py`). Returns [N, rows of all
    tables]: a transposed view without gradients, a contiguous tensor with them."""
    by_rows = [torch.addmm(bias[:, None], weight, few_columns(hidden)) for weight, bias in tables]  # [rows, N] each
    logits = (by_rows[0] if len(by_rows) == 1 else torch.cat(by_rows))[:, : hidden.size(0)].t()
    # autograd refuses in-place writes into a view by a node with several outputs: a fresh tensor then
    return logits.clone(memory_format=torch.contiguous_format) if torch.is_grad_enabled() else logits


def few_columns(hidden: torch.Tensor) -> torch.Tensor:
    """hidden^T [d, N] as `few_row_logits` multiplies it: a single row as two copies of itself (see there)."""
    return (hidden if hidden.size(0) != 1 else hidden.repeat(2, 1)).t()


def few_row_logits_contiguous(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`F.linear(hidden, weight, bias)` as a contiguous [N, rows] tensor, in `few_row_logits`' product order: the
    bias is added as the product is transposed (one pass; addmm would first copy the broadcast bias into its
    output, and the transposition would be a second pass)."""
    by_rows = torch.mm(weight, few_columns(hidden))[:, : hidden.size(0)]  # [rows, N]
    return torch.add(by_rows.t(), bias, out=by_rows.new_empty(hidden.size(0), weight.size(0)))


def every_cluster_logits(softmax, hiddens: list[torch.Tensor],
                         table_gradient: TableGradient | None = None) -> list[torch.Tensor]:
    """`softmax.cluster_logits(hiddens[i], i)` for every cluster i (float32). With one shared table (div_val == 1) all
    of them come from one `SharedTableLogits` node, whose backward writes the table's gradient in place (or leaves it
    to `table_gradient`); under autocast (where the products change dtype) each cluster goes through
    `cluster_logits`."""
    shared = softmax.div_val == 1 and not torch.is_autocast_enabled(hiddens[0].device.type)
    if not shared or hiddens[0].dtype != softmax.out_layers[0].weight.dtype:
        weights = softmax.cluster_weights()
        return [softmax.cluster_logits(hidden, i, weights) for i, hidden in enumerate(hiddens)]
    if len(softmax.out_projs):
        hiddens = [hidden @ proj.weight for hidden, proj in zip(hiddens, softmax.out_projs)]
    layer = softmax.out_layers[0]
    clusters = (softmax.cluster_weight, softmax.cluster_bias) if softmax.n_clusters else (None, None)
    sizes = [hi - lo for lo, hi in softmax.bounds]
    return [at_least_float32(logits) for logits in SharedTableLogits.apply(layer.weight, layer.bias, *clusters, sizes,
                                                                 table_gradient, *hiddens)]


@torch.no_grad()
def top_k_log_probs(softmax, hidden: torch.Tensor, k: int, penalty: float = 1.0,
                    spread: bool = False) -> torch.Tensor:
    """Log-probabilities [N, V] (float32, without gradients) as `forward(hidden)` gives them, except for tail
    clusters that cannot hold one of a row's k most likely tokens: there they are -inf for that row, or with `spread`
    the cluster's probability shared evenly among its tokens (log P(cluster) - log size), so that every row still sums
    to 1 (beam search takes a log-softmax of the scores). `softmax` an `AdaptiveLogSoftmax`. What greedy decoding
    (k = 1), top-k sampling and beam search (k = the beams it keeps) need, at a fraction of the cost.

    A tail token's log-probability is log P(cluster) + log P(token | cluster) <= log P(cluster). Clusters are
    visited in id order; once a row has k tokens at least as likely as a cluster, none of that cluster's tokens can
    rank above them, and the cluster's logits are computed only for the other rows. (k = 1: the best so far includes
    the tails computed before, and a tie goes to the lower id, as `argmax` does, so a cluster is needed only where it
    is strictly more likely than the best so far; k > 1: the k-th best of the shortlist, and transformers' top-k keeps
    every token tied with the k-th, so a tie counts as needed. Where the shortlist leaves no tail to skip in any row
    and there is one shared table, `one_product_log_probs` runs instead: one product costs less than one per
    cluster.) `penalty` >= 1: the scores
    are read after processors that may lower a token's score s to no less than min(penalty * s, s / penalty)
    (transformers' repetition penalty), so a cluster is needed where it reaches that bound of the k-th best; a
    skipped token's score can only fall. A trained model's likely words are mostly frequent (shortlist) words, so a
    step multiplies by the head's `shortlist + n_clusters` rows instead of the whole vocabulary's (33,278 x 256 ->
    2,003 x 256 floats read per token at the d_model 256 benchmark shape), and a batch pays for a tail only on the
    rows that may need it.

    Entries are `softmax.log_probs`': the same products, bit for bit where every row computes a cluster; where only
    some rows do, the tail's product runs over those rows only, which may round differently (float32: about 1e-7
    relative), so the chosen tokens can differ from `forward`'s only between tokens whose log-probabilities are
    that close."""
    weights = softmax.cluster_weights()
    head_logprob = torch.log_softmax(softmax.cluster_logits(hidden, 0, weights), dim=-1)
    shortlist, rows_in = softmax.shortlist, hidden.size(0)
    best = head_logprob[:, :shortlist].topk(min(k, shortlist), dim=-1).values  # [N, <= k] the k best so far per row
    if bool(_may_rank(best, head_logprob[:, shortlist:], k, penalty).all()):  # no tail can be skipped anywhere
        every = one_product_log_probs(softmax, hidden)  # one product of the whole table is cheaper than one per cluster
        if every is not None:
            return every
    out = head_logprob.new_empty(rows_in, softmax.bounds[-1][1])  # [N, V], every cluster written once
    out[:, :shortlist] = head_logprob[:, :shortlist]
    for i in range(1, softmax.n_clusters + 1):
        cluster_logprob = head_logprob[:, shortlist + i - 1]
        lo, hi = softmax.bounds[i]
        needed = _may_rank(best, cluster_logprob, k, penalty)
        count = _write_cluster(softmax, hidden, weights, i, out[:, lo:hi], cluster_logprob, needed, spread)
        if count and k == 1 and i < softmax.n_clusters:  # the best so far, for the next cluster
            best = torch.maximum(best, out[:, lo:hi].amax(dim=-1, keepdim=True))
    return out


def _may_rank(best: torch.Tensor, cluster_logprob: torch.Tensor, k: int, penalty: float) -> torch.Tensor:
    """Rows whose tokens of a cluster of log-probability `cluster_logprob` ([N], or [N, C] for C clusters) may rank
    among their k best, given `best` ([N, <= k]: the k best so far, descending); see `top_k_log_probs`."""
    if best.size(1) < k:  # fewer than k tokens seen: every row may need the cluster
        return torch.ones_like(cluster_logprob, dtype=torch.bool)
    kth = best[:, -1:] if cluster_logprob.dim() == 2 else best[:, -1]
    bound = kth if penalty == 1.0 else torch.minimum(kth * penalty, kth / penalty)
    return cluster_logprob > bound if k == 1 else cluster_logprob >= bound


def _write_cluster(softmax, hidden: torch.Tensor, weights, i: int, part: torch.Tensor, cluster_logprob: torch.Tensor,
                   needed: torch.Tensor, spread: bool) -> int:
    """Cluster i's log-probabilities into `part` ([N, cluster size]) for the `needed` rows; the other rows get -inf,
    or with `spread` the cluster's probability shared evenly. Returns the number of rows computed."""
    count = int(needed.sum())
    if count == hidden.size(0):  # every row: forward's own product
        torch.add(torch.log_softmax(softmax.cluster_logits(hidden, i, weights), dim=-1), cluster_logprob[:, None],
                  out=part)
        return count
    if spread:
        part.copy_((cluster_logprob[:, None] - math.log(part.size(1))).expand(-1, part.size(1)))
    else:
        part.fill_(float("-inf"))
    if count:
        rows = needed.nonzero().squeeze(1)
        part[rows] = cluster_logprob[rows, None] + torch.log_softmax(softmax.cluster_logits(hidden[rows], i, weights),
                                                                     dim=-1)
    return count


# The TableGradient of the forward in progress (set by the LM heads around one forward), and the softmax that
# `generate` is decoding with greedily, by top-k sampling or by beam search, with `top_k_log_probs`' arguments (set
# around its loop).
_DEFERRED: ContextVar["TableGradient | None"] = ContextVar("deferred_table_gradient", default=None)
_TOP_K: ContextVar[tuple[object, int, float, bool] | None] = ContextVar("top_k_softmax", default=None)


@contextlib.contextmanager
def deferred_table_gradient(table_gradient: "TableGradient | None"):
    """Within the block, the embedding lookup and the softmax of `table_gradient.table` defer that table's gradient
    to the lookup (`TableGradient`); None: nothing is deferred (and nothing is set: torch.compile, which cannot trace
    context variables, gets None from `table_gradient_for`)."""
    if table_gradient is None and torch.compiler.is_compiling():
        yield None
        return
    token = _DEFERRED.set(table_gradient)
    try:
        yield table_gradient
    finally:
        _DEFERRED.reset(token)


def active_table_gradient(weight: torch.Tensor) -> "TableGradient | None":
    """The TableGradient of the forward in progress when it is for `weight`'s table, else None (always under
    torch.compile, which traces the plain ops instead)."""
    if torch.compiler.is_compiling():
        return None
    deferred = _DEFERRED.get()
    return deferred if deferred is not None and deferred.table is weight else None


@contextlib.contextmanager
def top_k_decoding(softmax: nn.Module, k: int, penalty: float = 1.0, spread: bool = False):
    """Within the block, `softmax`'s full distribution is asked for by decoding that reads only each row's k most
    likely tokens (greedy decoding: k = 1; top-k sampling; beam search, which keeps (1 + end-of-sequence ids, at least
    2) x beams) and no other score,
    after processors that lower a score by at most `penalty`: `full_log_probs` gives `top_k_log_probs` (the same k
    best; tail clusters that cannot hold one of them left at -inf, or with `spread` given their probability evenly)."""
    token = _TOP_K.set((softmax, k, penalty, spread))
    try:
        yield
    finally:
        _TOP_K.reset(token)


def greedy_decoding(softmax: nn.Module, penalty: float = 1.0):
    """`top_k_decoding` with k = 1: greedy decoding whose scores nothing else reads."""
    return top_k_decoding(softmax, 1, penalty)


def embedding_lookup(embedding: nn.Module, input_ids: torch.Tensor) -> torch.Tensor | None:
    """`embedding(input_ids)` through `TiedEmbeddingLookup` when the forward in progress defers this table's gradient;
    None otherwise (the caller runs the module)."""
    deferred = active_table_gradient(embedding.weight)
    return None if deferred is None else TiedEmbeddingLookup.apply(embedding.weight, input_ids, deferred)


def shared_table_nll(softmax, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
    """`softmax.nll(hidden, targets)` [N] through the autograd nodes above; None under torch.compile (the plain
    reference then runs, for the compiler to trace: its shapes do not depend on the targets), and off the CPU when
    the softmax has a `tail_capacity` (the reference's routing then needs no host synchronisation, which this
    node's `nonzero` does)."""
    if torch.compiler.is_compiling() or (softmax.tail_capacity is not None and hidden.device.type != "cpu"):
        return None
    valid = targets >= 0
    cluster = torch.bucketize(targets, softmax._tail_starts(targets.device), right=True)  # 0 = shortlist
    head_column = torch.where(cluster == 0, targets, softmax.shortlist + cluster - 1).masked_fill(~valid, 0)
    # One gather from the head for every token: its own column (shortlist) or its cluster's column (tails).
    # Row-indexing the head per cluster instead would back-propagate through index_put into zero-filled [N, C]
    # tables, one per cluster (14% of a `tiny` training step); the gather's gradient is written in place.
    # Every cluster runs, on an empty selection too, so that all parameters take part in the graph.
    rows = [(cluster == i).nonzero().squeeze(1) for i in range(1, softmax.n_clusters + 1)]
    deferred = active_table_gradient(softmax.out_layers[0].weight)
    logits = every_cluster_logits(softmax, [hidden, *(hidden[idx] for idx in rows)], deferred)
    # each cluster's logits are a fresh product that nothing else reads: turned into log-probs in place
    logprob = gathered_log_softmax(logits[0], head_column, consume=True)  # [N, shortlist + clusters] -> [N]
    for i, idx in enumerate(rows, start=1):
        local = targets[idx] - softmax.bounds[i][0]
        logprob = logprob.index_add(0, idx, gathered_log_softmax(logits[i], local, consume=True))
    return torch.where(valid, -logprob, 0.0)


def full_log_probs(softmax, hidden: torch.Tensor) -> torch.Tensor | None:
    """`softmax.log_probs(hidden)` [N, V] without gradients: under `top_k_decoding` `top_k_log_probs`, else
    `one_product_log_probs`. None elsewhere (the reference runs)."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling():  # the buffer is written in place
        return None
    decoding = _TOP_K.get()
    if decoding is not None and decoding[0] is softmax:
        return top_k_log_probs(softmax, hidden, *decoding[1:])
    return one_product_log_probs(softmax, hidden)


def one_product_log_probs(softmax, hidden: torch.Tensor) -> torch.Tensor | None:
    """`softmax.log_probs(hidden)` [N, V] without gradients, with one shared table as wide as the model (div_val 1,
    no projections): one product of every token's row, [N, V], plus the cluster logits [N, C]; then each cluster's
    log-softmax, plus log P(cluster) for the tails, written back over its columns, so that the distribution is one
    buffer written once, as a plain output layer writes its logits. (A fused log-softmax per cluster: faster than
    subtracting a logsumexp.) On the CPU with fewer rows than the width (generation) the products take
    `few_row_logits`' form, table @ hidden^T, where it pays off (`few_rows_pay_off`). None for other tables, or under
    autocast."""
    if softmax.div_val != 1 or len(softmax.out_projs) or torch.is_autocast_enabled(hidden.device.type):
        return None
    layer = softmax.out_layers[0]
    tables = [(layer.weight, layer.bias)]
    if softmax.n_clusters:
        tables.append((softmax.cluster_weight, softmax.cluster_bias))
    tables = [(w.to(hidden.dtype), b.to(hidden.dtype)) for w, b in tables]
    few_rows = FEW_ROWS_PAY_OFF and hidden.device.type == "cpu" and hidden.size(0) < hidden.size(1)  # see there

    def product(table):
        return at_least_float32(few_row_logits_contiguous(hidden, *table) if few_rows else F.linear(hidden, *table))

    logits = product(tables[0])  # [N, V], every cluster's tokens
    clusters = product(tables[1]) if softmax.n_clusters else None  # [N, C]
    shortlist = softmax.shortlist
    if not softmax.n_clusters:
        return torch.log_softmax(logits, -1)
    head = torch.log_softmax(torch.cat([logits[:, :shortlist], clusters], 1), -1)  # [N, shortlist + C]
    logits[:, :shortlist] = head[:, :shortlist]
    for i, (lo, hi) in enumerate(softmax.bounds[1:]):
        part = logits[:, lo:hi]  # log P(token) = log P(token | cluster i) + log P(cluster i)
        torch.add(torch.log_softmax(part, -1), head[:, shortlist + i, None], out=part)
    return logits


@contextlib.contextmanager
def deferring_table_gradient(embedding: nn.Module, output_layer: nn.Module, input_ids, inputs_embeds):
    """Within the block (one forward of an LM head), the tied table's gradient is deferred to its lookup where
    `table_gradient_for` allows it."""
    with deferred_table_gradient(table_gradient_for(embedding, output_layer, input_ids, inputs_embeds)):
        yield
