"""Tree verification: several candidates per position, tried in order (recursive rejection
sampling, as in Recursive Speculative Decoding, Jeon et al. 2024, arXiv 2402.14160).

A draft tree has n nodes; node i holds token c = tokens[i] and hangs under parents[i]
(-1: the root, i.e. the context). Verification walks down from the root. At the current
node, with running target distribution t (first: the target's row for that node), its
children c_1..c_m are tried in the order they were drawn. For child j let d_j be the
drafter's distribution at the parent with c_1..c_{j-1} zeroed and renormalized (the
children are a sample without replacement; one-hot at c_j for point masses):

- accept c_j with probability min(1, t(c_j) / d_j(c_j)); it becomes the current node
  (an accepted token) and its own target row becomes t;
- else t <- normalize(max(t - d_j, 0)) and the next child is tried.

When every child is rejected the recovered token is sampled from the final t; when the
accepted path ends at a leaf the bonus token is sampled from the leaf's target row. The
committed tokens then follow the target's distribution exactly.

Greedy (temperature 0): follow the child equal to the target's argmax; the committed
token after the path is the argmax of its last row (`verify_tree_greedy`).

On the device: siblings are sequential under the rule, but different parents are
independent, so the plan runs one round per sibling rank (the j-th children of every node
at once), each over [parents, V] rows. The tree's shape and tokens are known on the host,
so every index is built there and sent in one transfer. The path is found from the nodes'
0/1 decisions by the same arithmetic that gives the plan's probabilities of reaching and
ending at each node (`_path_probs`), so exact enumeration of `tree_verification_plan`
proves what `verify_tree` runs. One uniform per node, then one for the committed token,
and one host synchronisation at the end, as for chains (specwise.verify.chain).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specwise.verify.common import (NextTokenRows, check_probabilities, clipped_ratio, float64_rows, read_back,
                                    sample_row, send_indices, step_uniforms)
from specwise.verify.result import TreeVerifyResult
from specwise.verify.tree_shape import DraftTree, check_tree


@dataclass(frozen=True)
class TreeVerificationPlan(NextTokenRows):
    """The probabilities of one tree verification step; sampling draws from nothing else.

    Rows of [n + 1] tensors follow target_probs: row 0 is the root, row i + 1 is node i.

    accept_probs: [n] P(node i is accepted | its parent is on the accepted path and its
        earlier siblings were rejected): what node i's uniform is compared against.
    reach_probs: [n + 1] P(the node is on the accepted path); 1 for the root.
    path_end_probs: [n + 1] P(the accepted path ends at that node).
    next_token_weights: [n + 1, V] row r is proportional to the distribution of the token
        committed after a path ending at r: the residual left after all of r's children
        were rejected, or r's target row (the bonus) for a leaf. Unnormalized, every row
        with positive mass; `next_token_dists` normalizes.
    All float64, on the device of target_probs.
    """

    accept_probs: torch.Tensor  # [n]
    reach_probs: torch.Tensor  # [n + 1]
    path_end_probs: torch.Tensor  # [n + 1]
    next_token_weights: torch.Tensor  # [n + 1, V]

    @property
    def expected_tokens(self) -> float:
        """E[tokens committed per step] = E[accepted nodes] + 1 (the acceptance length)."""
        return 1.0 + float(self.reach_probs[1:].sum())


@dataclass(frozen=True)
class _Rank:
    """One sibling rank's indices on the device (m nodes with a j-th child)."""

    rows: torch.Tensor  # [m] the parents' rows
    kids: torch.Tensor  # [m] their j-th children
    kid_rows: torch.Tensor  # [m] the children's own rows (kids + 1)
    tokens: torch.Tensor  # [m] the children's tokens
    removed: tuple[torch.Tensor, torch.Tensor]  # (position in the rank, token) of each earlier sibling


@dataclass(frozen=True)
class _TreeIndex:
    tree: DraftTree
    ranks: list[_Rank]
    parent_rows: torch.Tensor  # [n] each node's parent's row
    depth: int  # the deepest node's depth (0: children of the root)


def _index(tree: DraftTree, device: torch.device) -> _TreeIndex:
    """The tree's indices, built on the host and sent in one transfer."""
    lists = [[p + 1 for p in tree.parents]]
    for rank in tree.ranks():
        removed = [(i, token) for i, tried in enumerate(rank.earlier) for token in sorted(set(tried))]
        lists += [rank.rows, rank.kids, [c + 1 for c in rank.kids], [tree.tokens[c] for c in rank.kids],
                  [i for i, _ in removed], [token for _, token in removed]]
    parent_rows, *per_rank = send_indices(device, *lists)
    ranks = []
    for j in range(0, len(per_rank), 6):
        rows, kids, kid_rows, tokens, removed_at, removed_tokens = per_rank[j:j + 6]
        ranks.append(_Rank(rows, kids, kid_rows, tokens, (removed_at, removed_tokens)))
    return _TreeIndex(tree, ranks, parent_rows, max(tree.depths(), default=0))


@dataclass(frozen=True)
class _StepPlan:
    accept: torch.Tensor  # [n]
    next_token_weights: torch.Tensor  # [n + 1, V] unnormalized
    target_valid: torch.Tensor  # [] bool
    draft_valid: torch.Tensor  # [] bool


def _accept_probs(index: _TreeIndex, draft_probs: torch.Tensor | None, target_probs: torch.Tensor) -> _StepPlan:
    device = target_probs.device
    target = float64_rows(target_probs, device)
    weights, mass = target.rows, target.sums  # [n + 1, V] running targets (unnormalized), [n + 1]
    draft = None if draft_probs is None else float64_rows(draft_probs, device)
    accept = torch.zeros(len(index.tree.tokens), dtype=torch.float64, device=device)
    for rank in index.ranks:  # rank j reads the running rows rank j - 1 left
        t = weights.index_select(0, rank.rows)  # [m, V]
        m_t = mass.index_select(0, rank.rows)  # [m]
        x = rank.tokens[:, None]  # [m, 1]
        t_x = t.gather(1, x)[:, 0]
        if draft is None:
            a = clipped_ratio(t_x / m_t, torch.ones_like(t_x))
            rejectable = a < 1.0  # else t is all at x and rejection has probability zero
            t.scatter_(1, x, torch.where(rejectable, torch.zeros_like(t_x), t_x)[:, None])  # max(t - one-hot, 0)
            new_t, new_mass = t, torch.where(rejectable, t.sum(dim=1), m_t)
        else:
            a, new_t, new_mass = _try_siblings(t, m_t, t_x, rank, draft.rows.index_select(0, rank.kids),
                                               draft.sums.index_select(0, rank.kids))
        accept.index_copy_(0, rank.kids, a)
        weights.index_copy_(0, rank.rows, new_t)
        mass.index_copy_(0, rank.rows, new_mass)
    draft_valid = torch.ones((), dtype=torch.bool, device=device) if draft is None else draft.valid
    return _StepPlan(accept, weights, target.valid, draft_valid)


def _try_siblings(t: torch.Tensor, mass: torch.Tensor, t_x: torch.Tensor, rank: _Rank, draft: torch.Tensor,
                  draft_sum: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """P(accept x) = min(1, t(x) / d_j(x)) for one sibling rank of every parent at once, and t's
    update max(t - d_j, 0) (up to a factor) for the next sibling. t: [m, V] running rows with
    masses [m]; draft: [m, V] each child's draft row, read with its earlier siblings' tokens
    removed. Returns the acceptance probabilities [m], the new running rows and their masses."""
    m, vocab = t.shape
    removed = torch.zeros(m, vocab, dtype=torch.bool, device=t.device)  # [m, V] earlier siblings' tokens
    removed[rank.removed] = True
    left = draft_sum - torch.where(removed, draft, torch.zeros_like(draft)).sum(dim=1)  # [m]
    x = rank.tokens[:, None]  # [m, 1]
    d_x = torch.where(removed.gather(1, x)[:, 0], torch.zeros_like(left), draft.gather(1, x)[:, 0] / left)
    has_left = left > 0
    # No draft mass left: x cannot be a real sample (a broken contract); read d_j as zero.
    a = clipped_ratio(t_x / mass, torch.where(has_left, d_x, torch.zeros_like(d_x)))
    residual = t - draft * (mass / left)[:, None]  # mass * (t / mass - d_j)
    residual = torch.where(removed, t, residual).clamp_min_(0.0)  # d_j is zero at removed tokens
    residual_mass = residual.sum(dim=1)
    # Where t == d_j (zero residual) rejection has probability zero: keep t so a sample stays defined.
    update = has_left & (residual_mass > 0)
    return a, torch.where(update[:, None], residual, t), torch.where(update, residual_mass, mass)


def _path_probs(index: _TreeIndex, accept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """P(on the accepted path) and P(the path ends there) by row, [n + 1] each, from each node's
    acceptance probability [n] (given its parent on the path and its earlier siblings rejected).

    Given the nodes' 0/1 decisions (u_i < accept_i) instead, both are 0/1: the path itself and a
    one-hot vector at its last row.
    """
    rows = len(index.tree.tokens) + 1
    first = accept.new_ones(rows)  # P(first accepted child of its parent | parent on the path); root: 1
    none_yet = accept.new_ones(rows)  # P(every child so far rejected | on the path)
    for rank in index.ranks:
        a = accept.index_select(0, rank.kids)
        before = none_yet.index_select(0, rank.rows)
        first.index_copy_(0, rank.kid_rows, before * a)
        none_yet.index_copy_(0, rank.rows, before * (1.0 - a))
    reach = first.clone()
    for _ in range(index.depth):  # each round carries the ancestors' product one level further down
        reach[1:] = first[1:] * reach.index_select(0, index.parent_rows)
    return reach, reach * none_yet


def tree_verification_plan(
    tokens: torch.Tensor,  # [n] long
    parents: torch.Tensor | Sequence[int],  # [n], -1 for children of the root
    draft_probs: torch.Tensor | None,  # [n, V]: row i at node i's parent; None for point masses
    target_probs: torch.Tensor,  # [n + 1, V]: row 0 after the context, row i + 1 after node i
) -> TreeVerificationPlan:
    """The exact probabilities of tree verification for one draft tree, from the arithmetic
    verify_tree runs."""
    index = _index(check_tree(tokens, parents, draft_probs, target_probs), target_probs.device)
    plan = _accept_probs(index, draft_probs, target_probs)
    check_probabilities(*read_back(plan.target_valid, plan.draft_valid))
    reach, end = _path_probs(index, plan.accept)
    return TreeVerificationPlan(plan.accept, reach, end, plan.next_token_weights)


def verify_tree(
    tokens: torch.Tensor,  # [n] long
    parents: torch.Tensor | Sequence[int],  # [n], -1 for children of the root
    draft_probs: torch.Tensor | None,  # [n, V]: row i at node i's parent; None for point masses
    target_probs: torch.Tensor,  # [n + 1, V]: row 0 after the context, row i + 1 after node i
    generator: torch.Generator | None = None,
) -> TreeVerifyResult:
    """Tree verification: the accepted path + a recovered or bonus token, with one host
    synchronisation."""
    tree = check_tree(tokens, parents, draft_probs, target_probs)
    n, device = len(tree.tokens), target_probs.device
    index = _index(tree, device)
    plan = _accept_probs(index, draft_probs, target_probs)
    # Drawn up front, so the generator advances the same way whatever path is taken.
    draws = step_uniforms(n, generator, device)  # [n + 1]
    _, end = _path_probs(index, (draws[:n] < plan.accept).to(torch.float64))  # one-hot at the path's end
    end_row = end.argmax()
    token = sample_row(plan.next_token_weights.index_select(0, end_row.reshape(1))[0], draws[n])
    row, next_token, target_valid, draft_valid = read_back(end_row, token, plan.target_valid, plan.draft_valid)
    check_probabilities(target_valid, draft_valid)
    return tree.result(row - 1, next_token)


def verify_tree_greedy(
    tokens: torch.Tensor,  # [n] long
    parents: torch.Tensor | Sequence[int],  # [n], -1 for children of the root
    draft_probs: torch.Tensor | None,  # ignored: only the target's argmax matters
    target_probs: torch.Tensor,  # [n + 1, V] probabilities or processed logits
    generator: torch.Generator | None = None,  # ignored; accepted for a uniform signature
) -> TreeVerifyResult:
    """Follow the child equal to the target's argmax (first index on ties, as plain greedy
    decoding breaks them; the earliest such sibling if several hold it); then commit the
    argmax of the path's last row. Nothing is random; one read-back of the [n + 1] choices."""
    tree = check_tree(tokens, parents, None, target_probs)
    choices = torch.argmax(target_probs, dim=-1).tolist()  # [n + 1]
    node = tree.descend(lambda row, child: tree.tokens[child] == choices[row])
    return tree.result(node, choices[node + 1])
