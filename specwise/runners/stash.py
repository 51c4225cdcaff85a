"""The lean runner's stash: rows a self-drafter ran through the runner's first layers, which its next
pass reuses instead of running them again (LeanRunner._execute). The runner owns it (`LeanRunner.stash`,
voided by anything else that changes its cache); specwise.runners.early_exit fills it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specwise.runners.block_layout import BlockLayout


@dataclass
class LayerStash:
    """Rows run through layers [0, exit_layer) at cache places start, start + 1, ... (their entries of
    those layers are in the cache), with their states after layer exit_layer - 1."""

    start: int
    exit_layer: int
    tokens: list[int] = field(default_factory=list)
    hidden: list[torch.Tensor] = field(default_factory=list)  # one [hidden] per row

    def covered(self, layout: BlockLayout, ids: Sequence[int]) -> int:
        """How many leading rows of a chain block laid out at `layout` the stash holds: the same token at
        the same place, every earlier row too (a row's state depends on the rows before it)."""
        if layout.tree is not None or layout.start != self.start:
            return 0
        count = 0
        for mine, theirs in zip(self.tokens, ids):
            if mine != int(theirs):
                break
            count += 1
        return count

    def states(self, rows: int) -> torch.Tensor:
        """The first `rows` rows' states after layer exit_layer - 1: [rows, hidden]."""
        return torch.stack(self.hidden[:rows])
