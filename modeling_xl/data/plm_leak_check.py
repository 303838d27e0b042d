"""Check that a (perm_mask, target_mapping) pair is a valid XLNet factorization order: no target can learn its own
token or the token of a later target, directly or through the content stream of another position.

Information flow in two-stream attention (Yang et al. 2019, eq. 4): the query stream of target t reads the content
stream h_j of every j with ``perm_mask[t, j] = 0``; the content stream h_j reads h_m for ``perm_mask[j, m] = 0`` and
always itself. Over several layers the query of t therefore receives the content of every position reachable from t
along "may see" edges. Used by the sampler tests and by the model-level no-leak test (which perturbs input tokens
of earlier / later targets according to the order returned here).
"""

from __future__ import annotations

import torch


def _check_shapes(perm_mask: torch.Tensor, target_mapping: torch.Tensor, target_mask: torch.Tensor | None):
    if perm_mask.dim() != 3 or perm_mask.shape[1] != perm_mask.shape[2]:
        raise ValueError(f"perm_mask must have shape [B, L, L], got {tuple(perm_mask.shape)}")
    batch, length = perm_mask.shape[0], perm_mask.shape[1]
    if target_mapping.dim() != 3 or target_mapping.shape[0] != batch or target_mapping.shape[2] != length:
        shape = tuple(target_mapping.shape)
        raise ValueError(f"target_mapping must have shape [B={batch}, K, L={length}], got {shape}")
    expected = (batch, target_mapping.shape[1])
    if target_mask is not None and tuple(target_mask.shape) != expected:
        raise ValueError(f"target_mask must have shape {list(expected)}, got {tuple(target_mask.shape)}")


def target_positions(target_mapping: torch.Tensor, target_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Position of each prediction (long [B, K]; -1 on padded rows). Raises if a real row is not one-hot."""
    real = target_mapping.sum(-1) > 0 if target_mask is None else target_mask > 0
    row_sums = target_mapping.sum(-1)
    if not torch.all(row_sums[real] == 1) or not torch.all((target_mapping == 0) | (target_mapping == 1)):
        raise ValueError("target_mapping rows of real targets must be one-hot")
    if torch.any(row_sums[~real] != 0):
        raise ValueError("target_mapping rows of padded targets (target_mask = 0) must be all zero")
    return torch.where(real, target_mapping.argmax(-1), torch.full_like(row_sums, -1, dtype=torch.long))


def derive_target_order(
    perm_mask: torch.Tensor, target_mapping: torch.Tensor, target_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Rank of each prediction in the factorization order (long [B, K], -1 on padded rows).

    The rank of a target is the number of other targets it may see; in a valid order the target ranked r sees
    exactly the r targets ranked below it. Example: predictions at positions [4, 7, 9] where 7 sees no target,
    4 sees 7, and 9 sees 4 and 7 -> ranks [1, 0, 2] (7 is predicted first, then 4, then 9).
    """
    _check_shapes(perm_mask, target_mapping, target_mask)
    positions = target_positions(target_mapping, target_mask)
    real = positions >= 0
    safe = positions.clamp(min=0)
    sees = perm_mask.gather(1, safe[:, :, None].expand(-1, -1, perm_mask.shape[2])) == 0  # [B, K, L] row of target k
    sees_targets = sees.gather(2, safe[:, None, :].expand(-1, positions.shape[1], -1))  # [B, K, K]
    sees_targets &= real[:, None, :] & real[:, :, None]
    return torch.where(real, sees_targets.sum(-1), torch.full_like(positions, -1))


def _reachability(may_see: torch.Tensor) -> torch.Tensor:
    """Reflexive transitive closure of a boolean relation [B, L, L] by repeated squaring."""
    eye = torch.eye(may_see.shape[-1], dtype=torch.bool, device=may_see.device)
    reach = may_see | eye
    while True:
        wider = (reach.float() @ reach.float()) > 0
        if torch.equal(wider, reach):
            return reach
        reach = wider


def assert_no_leak(
    perm_mask: torch.Tensor, target_mapping: torch.Tensor, target_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Raise ``AssertionError`` if some target can (even indirectly) see itself or a target not earlier in the order.

    Checks, per sample: (1) every target has ``perm_mask[t, t] = 1``; (2) the ranks of ``derive_target_order`` are a
    permutation of 0..n-1 and target t sees target u iff rank u < rank t (a total order); (3) following "may see"
    edges through content streams (transitive closure), the query of t reaches no target with rank >= rank t.
    Returns the ranks (long [B, K], -1 on padded rows) for the caller's own checks.
    Example: L = 2, both targets, perm_mask [[1, 0], [1, 1]]: target 1 first (rank 0), target 0 sees it (rank 1): ok.
    """
    ranks = derive_target_order(perm_mask, target_mapping, target_mask)
    positions = target_positions(target_mapping, target_mask)
    reach = _reachability(perm_mask == 0)
    informed = ((perm_mask == 0).float() @ reach.float()) > 0  # [B, L, L]: what the query stream at i can learn
    for b in range(perm_mask.shape[0]):
        real = positions[b] >= 0
        pos, rank = positions[b][real], ranks[b][real]
        assert len(set(pos.tolist())) == len(pos), f"sample {b}: two predictions at the same position"
        assert torch.all(perm_mask[b, pos, pos] == 1), f"sample {b}: a target may see itself"
        assert sorted(rank.tolist()) == list(range(len(rank))), f"sample {b}: targets are not totally ordered: {rank}"
        direct = perm_mask[b][pos][:, pos] == 0
        assert torch.equal(direct, rank[None, :] < rank[:, None]), f"sample {b}: target visibility is not the order"
        learns = informed[b][pos][:, pos]
        leaked = learns & (rank[None, :] >= rank[:, None])
        if leaked.any():
            t, u = leaked.nonzero()[0].tolist()
            raise AssertionError(
                f"sample {b}: target at position {pos[t].item()} (rank {rank[t].item()}) can learn the token at "
                f"position {pos[u].item()} (rank {rank[u].item()}) through the content stream"
            )
    return ranks
