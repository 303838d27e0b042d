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

Not covered: attention dropout (callers fall back to another implementation), XLNet's two streams, a query row with
no visible key (the reference gives it uniform weights over every key; this kernel zeros; no mask built by the
backbones has such a row: a query always sees its own key). Tested against the reference with `TRITON_INTERPRET=1`
on the CPU (tests/test_triton_attention.py) and on CUDA by `benchmarks/gpu_check.py`.
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


# Tiles (BLOCK_M = BLOCK_N, num_warps) per device type: 64 x 64 on a GPU (benchmarks/gpu_check.py times the others);
# the interpreter (CPU tests) uses the smallest tiles tl.dot takes, so that small test shapes cross several blocks.
TILES = {"cuda": (64, 4), "cpu": (16, 1)}


def _tiles(device_type: str) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps)."""
    block, warps = TILES.get(device_type, TILES["cuda"])
    return block, block, warps


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


class TritonRelativeAttention(torch.autograd.Function):
    """softmax(((q + u) . k + rel_shift((q + v) . r)) / sqrt(D), masked) @ value by the Triton kernels above.

    Inputs as `relative_attention.relative_attention` (no dropout): q [B, H, T, D]; u, v [H, D]; key, value
    [B, H, K, D]; r [H, R, D]; mask bool [T, K] / [B, 1, T, K] (True = hidden) or None; shift. Everything is computed
    in the keys' dtype (fp32 accumulation), and gradients come back in each input's own dtype. Saved for backward:
    the inputs, the output and one log-sum-exp per query."""

    @staticmethod
    def forward(ctx, q, u, v, key, value, r, mask, shift: int):
        dtype = key.dtype
        ctx.input_dtypes = [t.dtype for t in (q, u, v, key, value, r)]
        with torch.autocast(key.device.type, enabled=False):
            q, u, v, value, r = (t.to(dtype) for t in (q, u, v, value, r))
            r = r.contiguous()
            (batch, heads, qlen, d_head), klen, rlen = q.shape, key.size(2), r.size(1)
            block_m, block_n, warps = _tiles(q.device.type)
            mask3, stride_mb = _mask_3d(mask, batch, qlen, klen)
            ranges = key_ranges(mask3, batch, qlen, klen, block_m)
            out = torch.empty(batch, qlen, heads, d_head, dtype=dtype, device=q.device).transpose(1, 2)
            lse = torch.empty(batch * heads, qlen, dtype=torch.float32, device=q.device)
            grid = (_cdiv(qlen, block_m), batch * heads)
            _kernels()[0][grid](
                q, key, value, r, u, v, _mask_arg(mask3, q), ranges, out, lse,
                *_strides4(q), *_strides4(key), *_strides4(value), *r.stride(), *u.stride(),
                *_mask_strides(mask3, stride_mb), *_range_strides(ranges),
                *_strides4(out), heads, qlen, klen, rlen, d_head, shift, (1.0 / math.sqrt(d_head)) * math.log2(math.e),
                HAS_MASK=mask3 is not None, BLOCK_M=block_m, BLOCK_N=block_n,
                BLOCK_D=max(16, _next_power_of_2(d_head)), PRECISION=_precision(dtype), num_warps=warps)
        ctx.save_for_backward(q, u, v, key, value, r, mask3, ranges, out, lse)
        ctx.shift, ctx.stride_mb = shift, stride_mb
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, u, v, key, value, r, mask3, ranges, out, lse = ctx.saved_tensors
        with torch.autocast(grad_out.device.type, enabled=False):
            grad_out = grad_out.to(key.dtype)
            (batch, heads, qlen, d_head), klen, rlen = q.shape, key.size(2), r.size(1)
            block_m, block_n, warps = _tiles(q.device.type)
            delta = (grad_out.float() * out.float()).sum(-1).reshape(batch * heads, qlen).contiguous()
            f32 = dict(dtype=torch.float32, device=q.device)
            grad_key, grad_value = torch.empty(batch, heads, klen, d_head, **f32), torch.empty(batch, heads, klen,
                                                                                             d_head, **f32)
            grad_qu, grad_qv = torch.empty(batch, heads, qlen, d_head, **f32), torch.empty(batch, heads, qlen, d_head,
                                                                                         **f32)
            n_query_blocks, n_key_blocks = _cdiv(qlen, block_m), _cdiv(klen, block_n)
            bands = TABLE_GRADIENT == "bands"
            grad_r = (torch.zeros(batch * heads, n_query_blocks, n_key_blocks, block_m + block_n, d_head, **f32)
                      if bands else torch.zeros(heads, rlen, d_head, **f32))
            common = (*_strides4(q), *_strides4(key), *_strides4(value), *r.stride(), *u.stride(),
                      *_mask_strides(mask3, ctx.stride_mb), *_range_strides(ranges), *_strides4(grad_out),
                      heads, qlen, klen, rlen, d_head, ctx.shift, (1.0 / math.sqrt(d_head)) * math.log2(math.e))
            meta = dict(HAS_MASK=mask3 is not None, BLOCK_M=block_m, BLOCK_N=block_n,
                        BLOCK_D=max(16, _next_power_of_2(d_head)), PRECISION=_precision(key.dtype),
                        num_warps=warps)
            mask_arg = _mask_arg(mask3, q)
            _kernels()[1][(n_key_blocks, batch * heads)](
                q, key, value, r, u, v, mask_arg, ranges, grad_out, lse, delta, grad_key, grad_value, *common,
                n_query_blocks, **meta)
            _kernels()[2][(n_query_blocks, batch * heads)](
                q, key, value, r, u, v, mask_arg, ranges, grad_out, lse, delta, grad_qu, grad_qv, grad_r, *common,
                n_query_blocks, n_key_blocks, **meta, BANDS=bands)
            if bands:
                grad_r = sum_bands(grad_r.view(batch, heads, n_query_blocks, n_key_blocks, block_m + block_n,
                                               d_head), block_m, shift=ctx.shift, rlen=rlen)
            scale = 1.0 / math.sqrt(d_head)
            grad_qu.mul_(scale)
            grad_qv.mul_(scale)
            grad_q = grad_qu + grad_qv
            grads = (grad_q, grad_qu.sum((0, 2)), grad_qv.sum((0, 2)), grad_key.mul_(scale), grad_value,
                     grad_r.mul_(scale))
        return (*(g.to(dtype) for g, dtype in zip(grads, ctx.input_dtypes)), None, None)


def _mask_arg(mask3: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """The mask as bytes (1 = hidden) for the kernels, or any tensor as a placeholder pointer when there is none."""
    return mask3.view(torch.uint8) if mask3 is not None else like


def _mask_strides(mask3: torch.Tensor | None, stride_mb: int) -> tuple[int, int, int]:
    return (stride_mb, *mask3.stride()[1:]) if mask3 is not None else (0, 0, 0)


def _range_strides(ranges: torch.Tensor) -> tuple[int, int]:
    return (ranges.stride(0) if ranges.size(0) > 1 else 0, ranges.stride(1))


def triton_relative_attention(q, key, value, r, u, v, mask, shift: int, dropout_p: float = 0.0):
    """`relative_attention.relative_attention` by the Triton kernels (same arguments; returns (out, None)).
    Attention dropout is not implemented: `dropout_p` must be 0 (`kernel_registry.attention_implementation`
    sends calls with dropout elsewhere)."""
    if dropout_p:
        raise ValueError(f"dropout_p={dropout_p}: the Triton relative attention has no attention dropout; expected 0 "
                         "(use attn_implementation='sdpa' with dropatt > 0)")
    if not available(q.device.type):
        raise RuntimeError(f"the Triton relative attention cannot run on {q.device.type!r} here: it needs triton and "
                           "a CUDA device (or TRITON_INTERPRET=1 on the CPU, for tests)")
    return TritonRelativeAttention.apply(q, u, v, key, value, r, mask, shift), None
