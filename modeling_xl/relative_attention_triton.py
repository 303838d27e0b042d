"""Flash-style Transformer-XL attention in Triton: the position term computed inside each tile, no [B, H, T, K] tensor.

Notation as in `relative_attention` (batch-first): B batch, H heads, D d_head, T queries, K = M + T keys, R rows of
the position table W_R R (row c = distance `shift + M - c`... see `rel_shift`), u, v the content and position biases.

The score of query i and key j is
    S_ij = ((q_i + u) . k_j  +  (q_i + v) . r_{j + shift - i}) / sqrt(D)          (r = W_R R, [H, R, D])
and the output softmax(S, masked) @ V, as `relative_attention.relative_attention` computes it. The reference builds
the whole [B, H, T, R] position product and shifts it; here each program takes a tile of BLOCK_M queries and walks
over BLOCK_N keys at a time (online softmax, Dao et al. 2022). Within a tile, query a (of i0 + a) and key b (of
j0 + b) meet table row j0 - i0 + shift + (b - a): a band of BLOCK_M + BLOCK_N - 1 consecutive rows. The tile's
position term is one product of its (q + v) rows with that band, [BLOCK_M, BLOCK_M + BLOCK_N], read back along the
diagonals (`tl.gather` with index b - a + BLOCK_M - 1). Worked example, BLOCK_M = BLOCK_N = 2, band rows w0..w3:
    band product   [[a.w0 a.w1 a.w2 a.w3]      tile (query a: keys b=0,1 -> rows 1,2;
                    [c.w0 c.w1 c.w2 c.w3]]           query c: keys 0,1 -> rows 0,1)  = [[a.w1 a.w2], [c.w0 c.w1]]
Memory: the inputs, the output and one log-sum-exp per query; nothing grows with T x K but the boolean mask [T, K]
(shared by all rows and heads) that says which keys a query may see: evaluation at tgt 128 / mem 1600 needs memory
linear in the memory length.

Backward recomputes the probabilities tile by tile from the saved log-sum-exp (two kernels: one per key block for
dk, dv; one per query block for d(q + u), d(q + v) and the table's gradient dr: each tile stores its band of rows,
and `sum_bands` adds the bands up, without atomics). The mask is read per tile; `key_ranges` bounds each query
block's loop to the keys its mask shows (causal: the key blocks after the diagonal are never visited).

XLNet's segment term (Sec. 2.5) is one more score term, (q_i + s) . e[seg_i != seg_j]: the two products per query
come in as `seg` [B, H, T, 2] (computed by torch, so their gradient reaches q, s and e through autograd), and the
kernel picks one per key by the segment mismatch [B, T, K]. `two_stream_attention_triton` runs XLNet's two streams
on this kernel. A query row with no visible key weighs every key alike, as the reference does (its scores are all
the same finite minimum).

Not covered: attention dropout (callers fall back to another implementation). Tested against the reference with
`TRITON_INTERPRET=1` on the CPU (tests/test_triton_attention.py) and on CUDA by `benchmarks/gpu_check.py`.
"""

from __future__ import annotations

import importlib.util
import math
import os

import torch


def available(device_type: str = "cuda") -> bool:
    """Whether the kernel can run on `device_type`: triton is installed (`pip install triton`; CUDA builds of torch
    bring it), and the device is CUDA, or the CPU under triton's interpreter (`TRITON_INTERPRET=1` set before the
    kernel's first use: tests)."""
    if importlib.util.find_spec("triton") is None:
        return False
    if device_type == "cuda":
        return torch.cuda.is_available()
    return device_type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") == "1"


def _kernels():
    """The kernels, imported on first use (see `relative_attention_triton_kernels`)."""
    from .relative_attention_triton_kernels import backward_keys_kernel, backward_queries_kernel, forward_kernel

    return forward_kernel, backward_keys_kernel, backward_queries_kernel


def key_ranges(mask: torch.Tensor | None, batch: int, qlen: int, klen: int, block_m: int) -> torch.Tensor:
    """For every query block, [first visible key, last visible key + 1] over its rows: int32 [Bm, blocks, 2], Bm = 1
    when the mask is shared by all rows, else B. The kernels visit only the key blocks inside. Computed on the device
    from the mask (no synchronisation with the host). Example, T=4, K=6, M=2, causal, block_m=2: query rows see keys
    [0, 3), [0, 4), [0, 5), [0, 6) -> blocks [[0, 4], [0, 6]]."""
    blocks = -(-qlen // block_m)
    device = mask.device if mask is not None else None
    if mask is None:
        ranges = torch.tensor([0, klen], dtype=torch.int32, device=device)
        return ranges.expand(1, blocks, 2).contiguous()
    visible = ~mask.reshape(-1, qlen, klen)  # [Bm, T, K]
    as_int = visible.to(torch.uint8)
    seen = visible.any(-1)
    first = torch.where(seen, as_int.argmax(-1), 0)
    last = torch.where(seen, klen - as_int.flip(-1).argmax(-1), klen)  # exclusive end
    pad = blocks * block_m - qlen
    first = torch.nn.functional.pad(first, (0, pad), value=klen).view(-1, blocks, block_m).amin(-1)
    last = torch.nn.functional.pad(last, (0, pad), value=0).view(-1, blocks, block_m).amax(-1)
    return torch.stack([first, last], -1).to(torch.int32).contiguous()


def _mask_3d(mask: torch.Tensor | None, batch: int, qlen: int, klen: int) -> tuple[torch.Tensor | None, int]:
    """The mask as a contiguous bool [Bm, T, K] (Bm 1 or B) and its batch stride (0 when shared)."""
    if mask is None:
        return None, 0
    if mask.dim() == 4:
        if mask.size(1) != 1:
            raise ValueError(f"mask has shape {tuple(mask.shape)}; expected [T, K], [B, T, K] or [B, 1, T, K]")
        mask = mask[:, 0]
    mask = mask.reshape(-1, qlen, klen).contiguous()
    if mask.size(0) not in (1, batch):
        raise ValueError(f"mask has {mask.size(0)} rows; expected 1 or batch={batch}")
    return mask, (0 if mask.size(0) == 1 else qlen * klen)


# Tiles (BLOCK_M = BLOCK_N, num_warps) per device type, or "autotune": the first call of each shape times every
# candidate of CANDIDATES (forward and backward on that call's inputs) and keeps the fastest (`choose_tile`). The
# interpreter (CPU tests) uses the smallest tiles tl.dot takes, so that small test shapes cross several blocks.
# CUDA's candidates: the tiles the H200 runs timed at most 1.25x the fastest at wt103-base's training shape (64 x 64
# with 4 and 8 warps, 32 x 32; benchmarks/README.md, "GPU"; 128 x 128 took 2.4x as long); each costs a compilation
# per kernel and dtype.
TILES = {"cuda": "autotune", "cpu": (16, 1)}
CANDIDATES = {"cuda": [(64, 4), (64, 8), (32, 4)], "cpu": [(16, 1), (32, 1)]}
CHOSEN: dict[tuple, tuple[int, int]] = {}  # shape -> the tile autotuning chose for it
TIMED_CALLS = 3  # forward + backward calls timed per candidate (after one untimed call that compiles it)


def choose_tile(q, u, v, key, value, r, mask3, stride_mb: int, shift: int, seg=None, mismatch=None,
                backward: bool = True) -> tuple[int, int]:
    """(block, num_warps) for this call: TILES' setting for the device, or under "autotune" the fastest candidate for
    this shape (batch, heads, lengths, head width, dtype, mask shape, segment term, TABLE_GRADIENT, and whether a
    backward follows: then forward + backward are timed, else the forward alone), timed once per shape and
    remembered in CHOSEN. Inside a CUDA graph capture, where nothing may be timed, an untimed shape takes the first
    candidate. Candidates the compiler refuses (registers, shared memory) are skipped."""
    device = q.device.type
    setting = TILES.get(device, TILES["cuda"])
    if setting != "autotune":
        return setting
    shape = (device, tuple(q.shape), key.size(2), r.size(1), key.dtype, mask3 is None or tuple(mask3.shape),
             seg is None, TABLE_GRADIENT, backward)
    if shape not in CHOSEN:
        candidates = CANDIDATES.get(device, CANDIDATES["cuda"])
        if q.is_cuda and torch.cuda.is_current_stream_capturing():
            return candidates[0]
        CHOSEN[shape] = _fastest(candidates, (q, u, v, key, value, r, mask3, stride_mb, shift, seg, mismatch),
                                 backward)
    return CHOSEN[shape]


def _fastest(candidates: list[tuple[int, int]], inputs: tuple, backward: bool) -> tuple[int, int]:
    import time

    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources

    q = inputs[0]
    grad_out = torch.randn(q.shape, dtype=q.dtype, device=q.device)
    timings, refused = {}, {}
    for tile in candidates:
        def call():
            out, lse, ranges = launch_forward(*inputs, tile)
            if backward:
                launch_backward(*inputs, ranges, out, lse, grad_out, tile)

        try:
            call()
            _synchronize(q.device)
            begin = time.perf_counter()
            for _ in range(TIMED_CALLS):
                call()
            _synchronize(q.device)
            timings[tile] = time.perf_counter() - begin
        except (OutOfResources, CompilationError) as error:
            refused[tile] = f"{type(error).__name__}: {error}"
    if not timings:
        raise RuntimeError(f"no tile of {candidates} ran the Triton relative attention here: {refused}")
    return min(timings, key=timings.get)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _precision(dtype: torch.dtype) -> str:
    """tl.dot's precision: exact float32 unless torch itself allows TF32 for float32 products."""
    if dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return "ieee"


def _strides4(x: torch.Tensor) -> tuple[int, ...]:
    return tuple(x.stride())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


# How the backward adds up the position table's gradient: "bands" (each tile stores its band rows, then
# `sum_bands`: plain stores, deterministic) or "atomic" (fp32 atomic adds into the table, the first version's way).
# benchmarks/gpu_check.py times both.
TABLE_GRADIENT = "bands"


def sum_bands(bands: torch.Tensor, block: int, shift: int, rlen: int) -> torch.Tensor:
    """The position table's gradient [H, R, D] from every tile's band of rows, bands [B, H, Qb, Kb, 2 * block, D]
    (query block q, key block k; zeros for tiles never visited). Tiles with square blocks of `block` rows on one
    block diagonal d = k - q share their band: table rows base(d) .. base(d) + 2 block - 1, base(d) = d block -
    (block - 1) + shift. So the bands are summed over the batch and along each diagonal, and then neighbouring
    diagonals overlap-added (the second half of diagonal d lies on the first half of d + 1); rows outside the table
    (where the kernel read zeros) are dropped. Example, block 2, Qb = 1, Kb = 2, shift 1: diagonals 0 and 1 cover
    rows 0..3 and 2..5; rows 2..3 receive both."""
    heads, blocks_q, blocks_k, width, d_head = bands.shape[1:]
    if width != 2 * block:
        raise ValueError(f"bands have {width} rows each; expected 2 * block = {2 * block} (square tiles)")
    per_tile = bands.sum(0)  # [H, Qb, Kb, 2 block, D]
    diagonals = per_tile.new_zeros(heads, blocks_q + blocks_k - 1, width, d_head)  # index d + Qb - 1
    for q in range(blocks_q):
        diagonals[:, blocks_q - 1 - q: blocks_q - 1 - q + blocks_k] += per_tile[:, q]
    rows = per_tile.new_zeros(heads, blocks_q + blocks_k, block, d_head)
    rows[:, :-1] += diagonals[:, :, :block]
    rows[:, 1:] += diagonals[:, :, block:]
    rows = rows.flatten(1, 2)  # rows[j] is table row base + j
    base = -(blocks_q - 1) * block - (block - 1) + shift
    table = per_tile.new_zeros(heads, rlen, d_head)
    lo, hi = max(0, base), min(rlen, base + rows.size(1))
    if lo < hi:
        table[:, lo:hi] = rows[:, lo - base: hi - base]
    return table


def launch_forward(q, u, v, key, value, r, mask3, stride_mb: int, shift: int, seg, mismatch, tile: tuple[int, int]):
    """The forward kernel on inputs already in one dtype (r contiguous, the mask from `_mask_3d`; seg fp32
    [B * H, T, 2] and mismatch bytes [B, T, K], contiguous, or None): returns (out [B, H, T, D], the log-sum-exp per
    query fp32 [B * H, T], the key ranges of the tile's query blocks)."""
    (batch, heads, qlen, d_head), klen, rlen = q.shape, key.size(2), r.size(1)
    block, warps = tile
    ranges = key_ranges(mask3, batch, qlen, klen, block)
    out = torch.empty(batch, qlen, heads, d_head, dtype=key.dtype, device=q.device).transpose(1, 2)
    lse = torch.empty(batch * heads, qlen, dtype=torch.float32, device=q.device)
    _kernels()[0][(_cdiv(qlen, block), batch * heads)](
        q, key, value, r, u, v, _mask_arg(mask3, q), ranges, out, lse, *_segment_args(seg, mismatch, lse),
        *_strides4(q), *_strides4(key), *_strides4(value), *r.stride(), *u.stride(),
        *_mask_strides(mask3, stride_mb), *_range_strides(ranges),
        *_strides4(out), heads, qlen, klen, rlen, d_head, shift, (1.0 / math.sqrt(d_head)) * math.log2(math.e),
        HAS_MASK=mask3 is not None, HAS_SEG=seg is not None, BLOCK_M=block, BLOCK_N=block,
        BLOCK_D=max(16, _next_power_of_2(d_head)), PRECISION=_precision(key.dtype), num_warps=warps)
    return out, lse, ranges


def _segment_args(seg, mismatch, placeholder) -> tuple[torch.Tensor, torch.Tensor]:
    """(SEG, MIS) for the kernels: the segment products and the mismatch as bytes, or placeholder pointers."""
    if seg is None:
        return placeholder, placeholder
    return seg, mismatch.view(torch.uint8)


def launch_backward(q, u, v, key, value, r, mask3, stride_mb: int, shift: int, seg, mismatch, ranges, out, lse,
                    grad_out, tile: tuple[int, int]) -> tuple[torch.Tensor | None, ...]:
    """The two backward kernels (and `sum_bands`): the gradients of (q, u, v, key, value, r, seg) in fp32 (that of
    seg None without one)."""
    (batch, heads, qlen, d_head), klen, rlen = q.shape, key.size(2), r.size(1)
    block, warps = tile
    delta = (grad_out.float() * out.float()).sum(-1).reshape(batch * heads, qlen).contiguous()
    f32 = dict(dtype=torch.float32, device=q.device)
    grad_key, grad_value = (torch.empty(batch, heads, klen, d_head, **f32) for _ in range(2))
    grad_qu, grad_qv = (torch.empty(batch, heads, qlen, d_head, **f32) for _ in range(2))
    n_query_blocks, n_key_blocks = _cdiv(qlen, block), _cdiv(klen, block)
    bands = TABLE_GRADIENT == "bands"
    grad_r = (torch.zeros(batch * heads, n_query_blocks, n_key_blocks, 2 * block, d_head, **f32)
              if bands else torch.zeros(heads, rlen, d_head, **f32))
    common = (*_strides4(q), *_strides4(key), *_strides4(value), *r.stride(), *u.stride(),
              *_mask_strides(mask3, stride_mb), *_range_strides(ranges), *_strides4(grad_out),
              heads, qlen, klen, rlen, d_head, shift, (1.0 / math.sqrt(d_head)) * math.log2(math.e))
    meta = dict(HAS_MASK=mask3 is not None, HAS_SEG=seg is not None, BLOCK_M=block, BLOCK_N=block,
                BLOCK_D=max(16, _next_power_of_2(d_head)), PRECISION=_precision(key.dtype), num_warps=warps)
    mask_arg, segment = _mask_arg(mask3, q), _segment_args(seg, mismatch, lse)
    grad_seg = torch.empty(batch * heads, qlen, 2, **f32) if seg is not None else None
    _kernels()[1][(n_key_blocks, batch * heads)](
        q, key, value, r, u, v, mask_arg, ranges, grad_out, lse, delta, grad_key, grad_value, *segment, *common,
        n_query_blocks, **meta)
    _kernels()[2][(n_query_blocks, batch * heads)](
        q, key, value, r, u, v, mask_arg, ranges, grad_out, lse, delta, grad_qu, grad_qv, grad_r, *segment,
        lse if grad_seg is None else grad_seg, *common, n_query_blocks, n_key_blocks, **meta, BANDS=bands)
    if bands:
        grad_r = sum_bands(grad_r.view(batch, heads, n_query_blocks, n_key_blocks, 2 * block, d_head), block,
                           shift=shift, rlen=rlen)
    scale = 1.0 / math.sqrt(d_head)
    grad_qu.mul_(scale)
    grad_qv.mul_(scale)
    return (grad_qu + grad_qv, grad_qu.sum((0, 2)), grad_qv.sum((0, 2)), grad_key.mul_(scale), grad_value,
            grad_r.mul_(scale), None if grad_seg is None else grad_seg.mul_(scale).view(batch, heads, qlen, 2))


class TritonRelativeAttention(torch.autograd.Function):
    """softmax(((q + u) . k + rel_shift((q + v) . r)) / sqrt(D), masked) @ value by the Triton kernels above.

    Inputs as `relative_attention.relative_attention` (no dropout): q [B, H, T, D]; u, v [H, D]; key, value
    [B, H, K, D]; r [H, R, D]; mask bool [T, K] / [B, 1, T, K] (True = hidden) or None; shift; and for XLNet's
    segment term seg [B, H, T, 2] ((q + s) . e_same, (q + s) . e_different) with mismatch bool [B, T, K], or None.
    Everything is computed in the keys' dtype (seg in fp32; fp32 accumulation), and gradients come back in each
    input's own dtype. Saved for backward: the inputs, the output and one log-sum-exp per query; the backward uses
    the forward's tile. `grad_enabled`: whether gradients were on where the caller applied it (autotuning then times
    the backward too; inside `forward` they are always off)."""

    @staticmethod
    def forward(ctx, q, u, v, key, value, r, mask, shift: int, seg=None, mismatch=None, grad_enabled: bool = True):
        dtype = key.dtype
        ctx.input_dtypes = [t.dtype for t in (q, u, v, key, value, r)] + [None if seg is None else seg.dtype]
        with torch.autocast(key.device.type, enabled=False):
            q, u, v, value, r = (t.to(dtype) for t in (q, u, v, value, r))
            r = r.contiguous()
            batch, heads, qlen, klen = *q.shape[:3], key.size(2)
            mask3, stride_mb = _mask_3d(mask, batch, qlen, klen)
            if seg is not None:
                seg = seg.float().reshape(batch * heads, qlen, 2).contiguous()
                mismatch = mismatch.to(torch.bool).expand(batch, qlen, klen).contiguous()
            inputs = (q, u, v, key, value, r, mask3, stride_mb, shift, seg, mismatch)
            tile = choose_tile(*inputs, backward=grad_enabled and any(ctx.needs_input_grad))
            out, lse, ranges = launch_forward(*inputs, tile)
        ctx.save_for_backward(q, u, v, key, value, r, mask3, seg, mismatch, ranges, out, lse)
        ctx.shift, ctx.stride_mb, ctx.tile = shift, stride_mb, tile
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, u, v, key, value, r, mask3, seg, mismatch, ranges, out, lse = ctx.saved_tensors
        with torch.autocast(grad_out.device.type, enabled=False):
            grads = launch_backward(q, u, v, key, value, r, mask3, ctx.stride_mb, ctx.shift, seg, mismatch, ranges,
                                    out, lse, grad_out.to(key.dtype), ctx.tile)
        grads = [None if g is None else g.to(dtype) for g, dtype in zip(grads, ctx.input_dtypes)]
        return (*grads[:6], None, None, grads[6], None, None)


def _mask_arg(mask3: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """The mask as bytes (1 = hidden) for the kernels, or any tensor as a placeholder pointer when there is none."""
    return mask3.view(torch.uint8) if mask3 is not None else like


def _mask_strides(mask3: torch.Tensor | None, stride_mb: int) -> tuple[int, int, int]:
    return (stride_mb, *mask3.stride()[1:]) if mask3 is not None else (0, 0, 0)


def _range_strides(ranges: torch.Tensor) -> tuple[int, int]:
    return (ranges.stride(0) if ranges.size(0) > 1 else 0, ranges.stride(1))


def check_runnable(device_type: str, dropout_p: float) -> None:
    """Refuse what the kernel cannot run: attention dropout (`kernel_registry.attention_implementation` sends calls
    with dropout elsewhere), and a device without triton."""
    if dropout_p:
        raise ValueError(f"dropout_p={dropout_p}: the Triton relative attention has no attention dropout; expected 0 "
                         "(use attn_implementation='sdpa' with dropatt > 0)")
    if not available(device_type):
        raise RuntimeError(f"the Triton relative attention cannot run on {device_type!r} here: it needs triton and "
                           "a CUDA device (or TRITON_INTERPRET=1 on the CPU, for tests)")


def triton_relative_attention(q, key, value, r, u, v, mask, shift: int, dropout_p: float = 0.0):
    """`relative_attention.relative_attention` by the Triton kernels (same arguments; returns (out, None)).
    Attention dropout is not implemented: `dropout_p` must be 0."""
    check_runnable(q.device.type, dropout_p)
    return TritonRelativeAttention.apply(q, u, v, key, value, r, mask, shift, None, None,
                                         torch.is_grad_enabled()), None
