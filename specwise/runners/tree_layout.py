"""Who sees whom in a draft tree: the attention pattern and positions of tree nodes.

Shared by the runners' tree passes (`forward_tree`) and the EAGLE drafter, which
grows its trees level by level in its own cache. A node's position is the first new
position plus its offset: its depth − 1 (a child of the cache has depth 1 and offset 0;
docs/DESIGN.md, "Words").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def tree_layout(parents: Sequence[int], grown: tuple[torch.Tensor, Sequence[int]] | None = None
                ) -> tuple[torch.Tensor, list[int]]:
    """Who sees whom in a tree: visible [n, n] bool (ancestors and self) and each node's position
    offset (its depth − 1: 0 for a child of the cache).

    grown: the (visible, offsets) of an earlier tree these nodes extend; their indices then
    come after its nodes (so parents may name them) and the result covers both.
    """
    old_visible, old_offsets = grown if grown is not None else (torch.zeros(0, 0, dtype=torch.bool), [])
    old, n = len(old_offsets), len(parents)
    visible = torch.zeros(old + n, old + n, dtype=torch.bool, device=old_visible.device)
    visible[:old, :old] = old_visible
    offsets = list(old_offsets) + [0] * n
    for i, parent in enumerate(parents, start=old):
        if not -1 <= parent < i:
            raise ValueError(f"parent {parent} of node {i - old} must be -1 or an earlier node")
        if parent >= 0:
            visible[i] = visible[parent]
            offsets[i] = offsets[parent] + 1
        visible[i, i] = True
    return visible, offsets
