"""A draft tree as verification reads it: its tokens, validated parents, each node's children
in drawn order, and the sibling ranks and depths that let one rank or level of the tree be
processed at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specwise.verify.common import TREE, check_probs, check_tokens, describe, is_integer_tensor
from specwise.verify.result import TreeVerifyResult


@dataclass(frozen=True)
class SiblingRank:
    """The j-th children of every node that has one (host lists, one entry per such node)."""

    rows: list[int]  # the parents' rows (0: the root, i + 1: node i)
    kids: list[int]  # their j-th children
    earlier: list[list[int]]  # the tokens of each child's earlier siblings


@dataclass(frozen=True)
class DraftTree:
    """A validated draft tree (`check_tree` builds it)."""

    tokens: list[int]  # [n]
    parents: list[int]  # [n], -1 for children of the root
    children: list[list[int]]  # [n + 1]: the nodes under row r (0: root, i + 1: node i), in drawn order

    def depths(self) -> list[int]:
        """Each node's depth, 0 for a child of the root."""
        depth: list[int] = []
        for parent in self.parents:
            depth.append(0 if parent < 0 else depth[parent] + 1)
        return depth

    def ranks(self) -> list[SiblingRank]:
        """Per sibling rank j (as many as the widest node has children): every j-th child."""
        ranks: list[SiblingRank] = []
        for row, kids in enumerate(self.children):
            for j, child in enumerate(kids):
                if j == len(ranks):
                    ranks.append(SiblingRank([], [], []))
                ranks[j].rows.append(row)
                ranks[j].kids.append(child)
                ranks[j].earlier.append([self.tokens[c] for c in kids[:j]])
        return ranks

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


def check_tree(
    tokens: torch.Tensor,
    parents: torch.Tensor | Sequence[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
) -> DraftTree:
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
    return DraftTree(token_list, parent_list, children)
