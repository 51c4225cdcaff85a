"""Tree verification (recursive rejection sampling) as a tensor program on the probabilities' device.

The rule of tree.py: at each node its children are tried in drawn order against a running
target distribution, so siblings are sequential. Different parents are independent,
though, so this runs one round per sibling rank (the j-th children of every node at
once: as many rounds as the widest node has children), each round over [parents, V]
rows on the device. The tree's shape and tokens are known on the host, so every index
is built there and nothing is read back until the end: one host synchronisation for the
accepted path's last node, the committed token and whether the inputs were probabilities.

The arithmetic is the reference plan's (float64; tests/test_verify_vectorized.py checks
the plans agree to float64 rounding and the decisions for the same draws are the same);
tree.py's plan stays the reference that exact enumeration proves lossless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specwise.verify.result import TreeVerifyResult
from specwise.verify.tree import _check_tree, _Tree
from specwise.verify.vectorized import _NOT_PROBABILITIES, _clipped_ratio, _rows, _sample_row


@dataclass(frozen=True)
class DeviceTreePlan:
    """accept_probs [n] and next_token_weights [n + 1, V] (unnormalized) as in TreeVerificationPlan,
    as device tensors; valid [] bool: the inputs were probabilities."""

    accept_probs: torch.Tensor
    next_token_weights: torch.Tensor
    valid: torch.Tensor


def _depths(tree: _Tree) -> list[int]:
    """Each node's depth, 0 for a child of the root."""
    depth: list[int] = []
    for parent in tree.parents:
        depth.append(0 if parent < 0 else depth[parent] + 1)
    return depth


def _ranks(tree: _Tree) -> list[list[tuple[int, int, list[int]]]]:
    """Per sibling rank j: (row, child, earlier siblings' tokens) for every row with a j-th child."""
    ranks: list[list[tuple[int, int, list[int]]]] = []
    for row, kids in enumerate(tree.children):
        for j, child in enumerate(kids):
            if j == len(ranks):
                ranks.append([])
            ranks[j].append((row, child, [tree.tokens[c] for c in kids[:j]]))
    return ranks


def _plan(tree: _Tree, draft_probs: torch.Tensor | None, target_probs: torch.Tensor) -> DeviceTreePlan:
    n, device = len(tree.tokens), target_probs.device
    weights, mass, valid = _rows(target_probs)  # [n + 1, V] running targets (unnormalized), [n + 1]
    draft = draft_sums = None
    if draft_probs is not None:
        draft, draft_sums, draft_valid = _rows(draft_probs.to(device, non_blocking=True))
        valid = valid & draft_valid
    accept = torch.zeros(n, dtype=torch.float64, device=device)
    for rank in _ranks(tree):
        rows = torch.tensor([r for r, _, _ in rank], dtype=torch.long, device=device)
        kids = torch.tensor([c for _, c, _ in rank], dtype=torch.long, device=device)
        x = torch.tensor([tree.tokens[c] for _, c, _ in rank], dtype=torch.long, device=device)
        t = weights.index_select(0, rows)  # [m, V]
        m_t = mass.index_select(0, rows)  # [m]
        t_x = t.gather(1, x[:, None])[:, 0]
        if draft is None:
            a = _clipped_ratio(t_x / m_t, torch.ones_like(t_x))
            rejectable = a < 1.0  # else t is all at x and rejection has probability zero
            t.scatter_(1, x[:, None], torch.where(rejectable, torch.zeros_like(t_x), t_x)[:, None])
            new_t, new_mass = t, torch.where(rejectable, t.sum(dim=1), m_t)
        else:
            a, new_t, new_mass = _try_siblings(t, m_t, t_x, x, rank, draft.index_select(0, kids),
                                               draft_sums.index_select(0, kids))
        accept.index_copy_(0, kids, a)
        weights.index_copy_(0, rows, new_t)
        mass.index_copy_(0, rows, new_mass)
    return DeviceTreePlan(accept, weights, valid)


def _try_siblings(t: torch.Tensor, mass: torch.Tensor, t_x: torch.Tensor, x: torch.Tensor,
                  rank: list[tuple[int, int, list[int]]], draft: torch.Tensor, draft_sum: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tree.py's _try_sibling for one sibling rank of every parent at once: rows t [m, V] with
    masses [m]; each child's draft row [m, V] is read with its earlier siblings' tokens removed.
    Returns the acceptance probabilities [m], the new running rows and their masses."""
    m, vocab = t.shape
    removed = torch.zeros(m, vocab, dtype=torch.bool, device=t.device)  # [m, V] earlier siblings' tokens
    coords = [(i, token) for i, (_, _, tried) in enumerate(rank) for token in sorted(set(tried))]
    if coords:
        removed[tuple(torch.tensor(coords, dtype=torch.long, device=t.device).T)] = True
    left = draft_sum - torch.where(removed, draft, torch.zeros_like(draft)).sum(dim=1)  # [m]
    x_removed = removed.gather(1, x[:, None])[:, 0]
    d_x = torch.where(x_removed, torch.zeros_like(left), draft.gather(1, x[:, None])[:, 0] / left)
    has_left = left > 0
    # No draft mass left: x cannot be a real sample (a broken contract); read d_j as zero.
    a = _clipped_ratio(t_x / mass, torch.where(has_left, d_x, torch.zeros_like(d_x)))
    residual = t - draft * (mass / left)[:, None]
    residual = torch.where(removed, t, residual).clamp_min_(0.0)
    residual_mass = residual.sum(dim=1)
    # Where t == d_j (zero residual) rejection has probability zero: keep t so a sample stays defined.
    update = has_left & (residual_mass > 0)
    return a, torch.where(update[:, None], residual, t), torch.where(update, residual_mass, mass)


def tree_plan(tokens: torch.Tensor, parents: torch.Tensor | Sequence[int], draft_probs: torch.Tensor | None,
              target_probs: torch.Tensor) -> DeviceTreePlan:
    """The tree plan's acceptance probabilities and next-token rows, computed on the device."""
    return _plan(_check_tree(tokens, parents, draft_probs, target_probs), draft_probs, target_probs)


def verify_tree_vectorized(
    tokens: torch.Tensor,  # [n] long
    parents: torch.Tensor | Sequence[int],  # [n], -1 for children of the root
    draft_probs: torch.Tensor | None,  # [n, V]: row i at node i's parent; None for point masses
    target_probs: torch.Tensor,  # [n + 1, V]: row 0 after the context, row i + 1 after node i
    generator: torch.Generator | None = None,
) -> TreeVerifyResult:
    """verify_tree on target_probs' device with one host synchronisation."""
    tree = _check_tree(tokens, parents, draft_probs, target_probs)
    plan = _plan(tree, draft_probs, target_probs)
    n, device = len(tree.tokens), target_probs.device
    # The reference's draws in its order: one uniform per node, then one for the committed token.
    uniforms = torch.rand(n, generator=generator, dtype=torch.float64)
    last = torch.rand((), generator=generator, dtype=torch.float64)
    host = torch.cat([uniforms, last.reshape(1)])
    draws = (host.pin_memory() if device.type == "cuda" else host).to(device, non_blocking=True)
    accepted = draws[:n] < plan.accept_probs  # [n]
    # A node is on the path when it is the first accepted child of a node on the path.
    on_path = torch.zeros(n + 1, dtype=torch.bool, device=device)  # by row: 0 is the root
    on_path[0] = True
    none_before = torch.ones(n + 1, dtype=torch.bool, device=device)  # no earlier sibling accepted yet
    for rank in _ranks(tree):  # parents precede children, so a parent's row is final before its kids
        rows = torch.tensor([r for r, _, _ in rank], dtype=torch.long, device=device)
        kids = torch.tensor([c for _, c, _ in rank], dtype=torch.long, device=device)
        hit = accepted.index_select(0, kids) & none_before.index_select(0, rows)
        none_before.index_copy_(0, rows, none_before.index_select(0, rows) & ~accepted.index_select(0, kids))
        on_path.index_copy_(0, kids + 1, hit)
    depth = _depths(tree)
    parent_rows = torch.tensor([p + 1 for p in tree.parents], dtype=torch.long, device=device)
    for _ in range(max(depth, default=0)):  # each round carries an ancestor's flag one level down
        on_path[1:] &= on_path.index_select(0, parent_rows)
    depths = torch.tensor([0] + [d + 1 for d in depth], dtype=torch.long, device=device)
    end_row = (on_path.long() * depths).argmax()  # the deepest node on the path (0: the root)
    token = _sample_row(plan.next_token_weights.index_select(0, end_row.reshape(1))[0], draws[n])
    end, next_token, valid = torch.stack([end_row, token, plan.valid.long()]).tolist()  # the one sync
    if not valid:
        raise ValueError(f"target_probs and draft_probs {_NOT_PROBABILITIES}")
    return tree.result(end - 1, next_token)
