"""Where a block's rows go in one sequence's cache and which entries each attends to (a lean runner's
pass interface, specwise.runners.lean), and the masks a pass derives from that."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BlockLayout:
    """Where a block's rows go in one sequence's cache, and which entries each row attends to."""

    start: int  # the cache's length before the block: row i writes slot start + i
    positions: torch.Tensor  # [n] rotary positions: start + i in a chain, the tree's base + depth in a tree
    visible: torch.Tensor | None  # [n, start + n] True: may attend; None: a chain (row i sees 0..start + i)
    tree: tuple[int, torch.Tensor, list[int]] | None  # a tree's (base, visible, depths) for extend/keep, else None

    @property
    def rows(self) -> int:
        return len(self.positions)

    @staticmethod
    def chain(start: int, rows: int, device: torch.device | str = "cpu") -> BlockLayout:
        """A chain of `rows` rows after `start` cached entries: row i at place and position start + i."""
        return BlockLayout(start, torch.arange(start, start + rows, device=device), None, None)

    def after(self, rows: int) -> BlockLayout:
        """A chain's rows from `rows` on, as a block of their own after the first `rows` ones."""
        if self.tree is not None:
            raise ValueError("after() splits a chain, not a tree")
        return BlockLayout(self.start + rows, self.positions[rows:], None, None)


def layers_of(captured: torch.Tensor, order: Sequence[int], layers: Sequence[int]) -> torch.Tensor:
    """Of hidden states recorded after the `order` layers, [n, len(order), hidden], those of `layers`
    in their order: [n, len(layers), hidden]."""
    return captured[:, [list(order).index(i) for i in layers]]


def windowed(mask: torch.Tensor, window: int) -> torch.Tensor:
    """Of each row's visible entries [n, entries], the last `window` only (a sliding-window layer). A
    row's visible entries hold one position each, up to its own, in cache order (a chain, or a tree
    node's context and ancestors), so the last `window` of them are the positions within the window."""
    return mask & (mask.flip(-1).cumsum(-1).flip(-1) <= window)


def visible_keys(mask: torch.Tensor, end: int) -> list[int | torch.Tensor]:
    """For each row of a pass, the cache entries it attends to: a prefix length when they are
    contiguous from 0 (a chain), else their indices (a tree node sees its ancestors only)."""
    rows: list[int | torch.Tensor] = []
    for row in mask[:, :end]:
        count = int(row.sum())
        rows.append(count if bool(row[:count].all()) else row.nonzero().flatten())
    return rows
