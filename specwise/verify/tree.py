"""Tree verification: several candidates per position, tried in order (recursive rejection
sampling, as in Recursive Speculative Decoding, Jeon et al. 2024, arXiv 2402.14160).

A draft tree has n nodes; node i holds token c = tokens[i] and hangs under parents[i]
(-1: the root, i.e. the context). Verification walks down from the root. At the current
node, with running target distribution t (first: the target's row for that node), its
children c_1..c_m are tried in the order they were drawn. For child j let d_j be the
drafter's distribution at the parent with c_1..c_{j-1} zeroed and renormalized (the
children are a sample without replacement; one-hot at c_j for point masses):

- accept c_j with probability min(1, t(c_j) / d_j(c_j)); it becomes the current node
  and its own target row becomes t;
- else t <- normalize(max(t - d_j, 0)) and the next child is tried.

When every child is rejected the recovered token is sampled from the final t; when the
accepted path ends at a leaf the bonus token is sampled from the leaf's target row. The
committed tokens then follow the target's distribution exactly.

Greedy (temperature 0): follow the child equal to the target's argmax; the committed
token after the path is the argmax of its last row (`verify_tree_greedy`).

As for chains, all probabilities live in a pure plan (`tree_verification_plan`), proven
lossless by exact enumeration in tests/test_verify_tree.py; `verify_tree` only draws from it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specwise.sampling import sample
from specwise.verify.result import TreeVerifyResult
from specwise.verify.common import (TREE, check_probs, check_tokens, clipped_ratio, describe, float64_rows,
                                    is_integer_tensor)


@dataclass(frozen=True)
class TreeVerificationPlan:
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
    All float64.
    """

    accept_probs: torch.Tensor  # [n]
    reach_probs: torch.Tensor  # [n + 1]
    path_end_probs: torch.Tensor  # [n + 1]
    next_token_weights: torch.Tensor  # [n + 1, V]

    @property
    def next_token_dists(self) -> torch.Tensor:  # [n + 1, V]
        return self.next_token_weights / self.next_token_weights.sum(dim=1, keepdim=True)

    @property
    def expected_tokens(self) -> float:
        """E[tokens committed per step] = E[accepted nodes] + 1 (the acceptance length)."""
        return 1.0 + float(self.reach_probs[1:].sum())


@dataclass(frozen=True)
class _Tree:
    tokens: list[int]  # [n]
    parents: list[int]  # [n], -1 for children of the root
    children: list[list[int]]  # [n + 1]: the nodes under row r (0: root, i + 1: node i), in drawn order

    def path_to(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node` (empty for the root, -1)."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def descend(self, accepts: Callable[[int, int], bool]) -> int:
        """Walk down from the root: at row r, take the first child c with accepts(r, c);
        return the last node reached (-1: the root)."""
        node = -1
        while True:
            row = node + 1
            node_next = next((c for c in self.children[row] if accepts(row, c)), None)
            if node_next is None:
                return node
            node = node_next

    def result(self, last: int, next_token: int) -> TreeVerifyResult:
        """The path ending at node `last` plus the recovered or bonus token."""
        nodes = self.path_to(last)
        return TreeVerifyResult(
            tokens=[self.tokens[i] for i in nodes] + [next_token],
            num_accepted=len(nodes),
            num_proposed=len(self.tokens),
            accepted_nodes=nodes,
        )


def _check_tree(
    tokens: torch.Tensor,
    parents: torch.Tensor | Sequence[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
) -> _Tree:
    """Validate shapes and the tree's structure (cheaply)."""
    check_tokens(tokens, TREE)
    n = tokens.numel()
    if isinstance(parents, torch.Tensor):
        if not is_integer_tensor(parents) or parents.dim() != 1:
            raise ValueError(f"parents must be a 1-D integer tensor [n] or a list of ints; got {describe(parents)}")
        parent_list = parents.tolist()
    elif isinstance(parents, Sequence) and all(isinstance(p, int) and not isinstance(p, bool) for p in parents):
        parent_list = list(parents)
    else:
        raise ValueError(f"parents must be a 1-D integer tensor [n] or a list of ints; got {describe(parents)}")
    if len(parent_list) != n:
        raise ValueError(f"parents must have one entry per node: n = {n} (len(tokens)); got {len(parent_list)}")
    for i, p in enumerate(parent_list):
        if not -1 <= p < i:
            raise ValueError(
                f"parents[{i}] = {p}: a node's parent must be an earlier node (0 <= parent < {i}) or -1 "
                "for a child of the root; order the nodes so that every parent comes before its children"
            )
    token_list = check_probs(tokens, draft_probs, target_probs, TREE)
    children: list[list[int]] = [[] for _ in range(n + 1)]
    for i, p in enumerate(parent_list):
        children[p + 1].append(i)
    return _Tree(token_list, parent_list, children)


def tree_verification_plan(
    tokens: torch.Tensor,  # [n] long
    parents: torch.Tensor | Sequence[int],  # [n], -1 for children of the root
    draft_probs: torch.Tensor | None,  # [n, V]: row i at node i's parent; None for point masses
    target_probs: torch.Tensor,  # [n + 1, V]: row 0 after the context, row i + 1 after node i
) -> TreeVerificationPlan:
    """The exact probabilities of tree verification for one draft tree."""
    return _tree_plan(_check_tree(tokens, parents, draft_probs, target_probs), draft_probs, target_probs)


def _tree_plan(tree: _Tree, draft_probs: torch.Tensor | None, target_probs: torch.Tensor) -> TreeVerificationPlan:
    n = len(tree.tokens)
    # Rows stay unnormalized: each running t carries its mass as a scalar instead of a pass over V.
    weights, target_sums = float64_rows(target_probs, "target_probs")  # [n + 1, V]
    draft, draft_sums = (None, [1.0] * n) if draft_probs is None else float64_rows(draft_probs, "draft_probs")

    accept = [0.0] * n
    for row, kids in enumerate(tree.children):
        if not kids:
            continue  # a leaf keeps its target row: the bonus distribution
        t, mass = weights[row], target_sums[row]  # a view: the final residual lands in the plan
        tried: list[int] = []  # the earlier siblings' tokens
        for child in kids:
            x = tree.tokens[child]
            if draft is None:
                accept[child] = clipped_ratio(float(t[x]) / mass, 1.0)
                if accept[child] < 1.0:  # else t is all at x and rejection has probability zero
                    t[x] = 0.0  # max(t - one-hot(x), 0) is t without x
                    mass = float(t.sum())
            else:
                accept[child], mass = _try_sibling(t, mass, x, draft[child], draft_sums[child], tried)
            tried.append(x)

    reach = [1.0] + [0.0] * n
    end = [0.0] * (n + 1)
    for row, kids in enumerate(tree.children):  # parents precede children, so reach[row] is final here
        none_yet = reach[row]  # P(on the path and every child so far rejected)
        for child in kids:
            reach[child + 1] = none_yet * accept[child]
            none_yet *= 1.0 - accept[child]
        end[row] = none_yet
    return TreeVerificationPlan(
        accept_probs=torch.tensor(accept, dtype=torch.float64),
        reach_probs=torch.tensor(reach, dtype=torch.float64),
        path_end_probs=torch.tensor(end, dtype=torch.float64),
        next_token_weights=weights,
    )


def _try_sibling(
    t: torch.Tensor,  # [V] running target, unnormalized, updated in place
    mass: float,  # t.sum()
    x: int,  # the sibling's token
    draft_row: torch.Tensor,  # [V] the drafter's row it was drawn from, unnormalized
    draft_sum: float,  # draft_row.sum()
    tried: list[int],  # the earlier siblings' tokens, removed from draft_row
) -> tuple[float, float]:
    """P(accept x) = min(1, t(x) / d_j(x)); t becomes max(t - d_j, 0) (up to a factor) for
    the next sibling. Returns the acceptance probability and t's new mass."""
    removed = sorted(set(tried))
    left = draft_sum - (float(draft_row[removed].sum()) if removed else 0.0)
    if left <= 0.0:
        # The drafter has no mass left, so x cannot be a real sample (a broken contract).
        # Read d_j as zero: accept whenever the target allows, never divide by zero.
        return clipped_ratio(float(t[x]) / mass, 0.0), mass
    d_x = 0.0 if x in removed else float(draft_row[x]) / left
    accept = clipped_ratio(float(t[x]) / mass, d_x)
    residual = t.sub(draft_row, alpha=mass / left)  # [V] mass * (t / mass - d_j)
    if removed:
        residual[removed] = t[removed]  # d_j is zero there
    residual_mass = float(residual.clamp_min_(0.0).sum())
    if residual_mass <= 0.0:
        # t == d_j, where rejection has probability zero: keep t so that a sample stays defined.
        return accept, mass
    t.copy_(residual)
    return accept, residual_mass


def verify_tree(
    tokens: torch.Tensor,  # [n] long
    parents: torch.Tensor | Sequence[int],  # [n], -1 for children of the root
    draft_probs: torch.Tensor | None,  # [n, V]: row i at node i's parent; None for point masses
    target_probs: torch.Tensor,  # [n + 1, V]: row 0 after the context, row i + 1 after node i
    generator: torch.Generator | None = None,
) -> TreeVerifyResult:
    """Tree verification: the accepted path + a recovered or bonus token."""
    tree = _check_tree(tokens, parents, draft_probs, target_probs)
    plan = _tree_plan(tree, draft_probs, target_probs)
    # One uniform per node, drawn up front, so the generator advances the same way whatever
    # path is taken. Accept iff u < a: P(u < a) = a exactly for u ~ U[0, 1), also at a = 0 and 1.
    uniforms = torch.rand(len(tree.tokens), generator=generator, dtype=torch.float64).tolist()
    accept = plan.accept_probs.tolist()
    node = tree.descend(lambda row, child: uniforms[child] < accept[child])
    return tree.result(node, sample(plan.next_token_weights[node + 1], generator))


def verify_tree_greedy(
    tokens: torch.Tensor,  # [n] long
    parents: torch.Tensor | Sequence[int],  # [n], -1 for children of the root
    draft_probs: torch.Tensor | None,  # ignored: only the target's argmax matters
    target_probs: torch.Tensor,  # [n + 1, V] probabilities or processed logits
    generator: torch.Generator | None = None,  # ignored; accepted for a uniform signature
) -> TreeVerifyResult:
    """Follow the child equal to the target's argmax (first index on ties, as plain greedy
    decoding breaks them; the earliest such sibling if several hold it); then commit the
    argmax of the path's last row. Nothing is random."""
    tree = _check_tree(tokens, parents, None, target_probs)
    choices = torch.argmax(target_probs, dim=-1).tolist()  # [n + 1]
    node = tree.descend(lambda row, child: tree.tokens[child] == choices[row])
    return tree.result(node, choices[node + 1])
