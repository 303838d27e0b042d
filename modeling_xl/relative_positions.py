"""Relative positions of Transformer-XL and XLNet as pure functions: the distance table, its sinusoid embedding, the
shift that moves per-distance scores onto keys, and the causal mask (Dai et al. 2019, Sec. 3.3; the legacy code's
`_rel_shift` and `dec_attn_mask`). Each has a worked example in its docstring and a test against a naive loop
(tests/test_relative_attention.py). Notation as in `relative_attention`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def relative_positions(klen: int, qlen: int = 0, clamp_len: int = -1, bidirectional: bool = False) -> torch.Tensor:
    """Relative distances, largest first, covered by the position table.

    Unidirectional (Transformer-XL): `klen-1, ..., 1, 0` (a query never looks forward).
    Bidirectional (XLNet): `klen, ..., 1, 0, -1, ..., -qlen+1`.
    Distances beyond `clamp_len` (when > 0) share the vector of `clamp_len`. Example, klen=5, clamp_len=3:
    `[4, 3, 2, 1, 0] -> [3, 3, 2, 1, 0]`.
    """
    if bidirectional:
        pos = torch.arange(klen, -qlen, -1.0)
    else:
        pos = torch.arange(klen - 1, -1, -1.0)
    if clamp_len > 0:
        pos = pos.clamp(-clamp_len, clamp_len)
    return pos


def sinusoid_table(pos: torch.Tensor, dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Sinusoid embedding `[sin(p * w_k), cos(p * w_k)]`, w_k = 1 / 10000^(2k / dim) (Vaswani et al. 2017): [R, dim]
    in `dtype`, computed in float32 or wider (a float64 model gets a float64 table, as the authors' code builds it
    in the model's dtype; a 16-bit model a float32 table rounded once)."""
    compute = torch.promote_types(dtype, torch.float32)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=compute, device=pos.device) / dim))
    angles = torch.outer(pos.to(compute), inv_freq)  # [R, dim/2]
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)


def rel_shift(x: torch.Tensor, klen: int, shift: int) -> torch.Tensor:
    """Move row i of `x` left by `shift - i` and keep `klen` columns: `out[..., i, j] = x[..., i, j + shift - i]`.

    `x[..., i, c]` holds the score of query i against relative-position row c; with the table starting at distance
    `start` (row c = distance `start - c`) and M memory slots, query i (absolute M + i) meets key j at distance
    M + i - j, i.e. row `j + (start - M) - i`, so `shift = start - M` (`T - 1` for Transformer-XL, `T` for XLNet).

    Worked example (T=3, klen=R=3, shift=2; letters are the distance-ordered scores of each row, '?' garbage that the
    causal mask hides):
        x = [[a2 a1 a0]      out = [[a0  ?  ?]
             [b2 b1 b0]   ->        [b1 b0  ?]
             [c2 c1 c0]]            [c2 c1 c0]]
    Implementation: pad one zero column on the right (rows of R + 1), flatten, and read T rows of length R starting
    `shift` elements in: row i then starts at i * (R + 1) + shift - i. One copy (the pad), no gather.
    """
    *lead, qlen, rlen = x.shape
    if klen > rlen or not 0 <= shift <= qlen:
        raise ValueError(f"rel_shift: klen={klen}, shift={shift} do not fit {qlen} queries x {rlen} positions")
    padded = F.pad(x, (0, 1))  # [..., T, R + 1]
    window = padded.flatten(-2)[..., shift : shift + qlen * rlen]  # T * R elements, `shift` in
    return window.view(*lead, qlen, rlen)[..., :klen]  # [..., T, K]


def causal_mask(qlen: int, mlen: int, same_length: bool = False, mem_len: int = 0, device=None) -> torch.Tensor:
    """Boolean [T, K] mask, True where query i may NOT attend key j.

    Query i sits at absolute position M + i: it sees keys j <= M + i (memory plus the causal part of the segment).
    With `same_length` (the paper's evaluation setting), every query sees the same number of keys: the newest
    `mem_len` keys up to and including itself once the memory is full (M = mem_len), at most `mem_len` before; the
    authors' PyTorch code and transformers do this (their TensorFlow code shows each query M + 1 keys). Example T=3,
    M=2, mem_len=2, same_length (x = hidden; each query sees 2 keys):
        [. . . x x]      [x . . x x]
        [. . . . x]  ->  [x x . . x]
        [. . . . .]      [x x x . .]
    """
    klen = mlen + qlen
    ones = torch.ones(qlen, klen, dtype=torch.bool, device=device)
    mask = torch.triu(ones, diagonal=1 + mlen)
    if same_length and mem_len > 0:  # with no memory window the legacy formula would hide every key: ignore it
        visible = klen - mem_len
        shift = qlen - visible if visible > 0 else qlen
        mask = mask | torch.tril(ones, diagonal=-shift)
    return mask


def with_key_padding(mask: torch.Tensor, attention_mask: torch.Tensor, mlen: int) -> torch.Tensor:
    """Add padding keys to a [T, K] mask (True = hidden): returns [B, 1, T, K] (broadcast over heads).

    `attention_mask` [B, T] (the memory counts as real tokens) or [B, M+T] marks real tokens with 1 and padding with 0.
    A query always keeps its own key, as XLNet's content stream does, so a padding query attends to itself instead of
    to nothing. Example, T=3, M=0, causal, attention_mask=[[0, 1, 1]] (left padding; x = hidden):
        [. x x]      [. x x]
        [. . x]  ->  [x . x]
        [. . .]      [x . .]
    """
    qlen, klen = mask.shape
    batch = attention_mask.size(0)
    if attention_mask.dim() != 2 or attention_mask.size(1) not in (qlen, klen):
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}; expected [batch, seq_len={qlen}] "
                         f"or [batch, mem_len + seq_len={klen}]")
    real = attention_mask.to(device=mask.device, dtype=torch.bool)
    if real.size(1) == qlen and mlen > 0:  # the memory is all real tokens
        real = torch.cat([real.new_ones(batch, mlen), real], dim=1)  # [B, K]
    own_key = torch.arange(klen, device=mask.device)[None, :] == torch.arange(qlen, device=mask.device)[:, None] + mlen
    padding = ~real[:, None, :] & ~own_key  # [B, T, K]
    return (mask[None] | padding)[:, None]  # [B, 1, T, K]
