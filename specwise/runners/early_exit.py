"""Drafting with a target's own first layers (early exit), and the stash its scoring pass reuses.

`EarlyExit` runs a lean runner's layers [0, E) for one draft row at a time, at the places right after
the cached context: the row's entries of those layers go into the target's own cache, its state after
layer E - 1 into a `LayerStash` on the runner, and the final norm and output layer of that state give
the draft logits (no weights of its own). The next pass of the runner (the target scoring
[last committed] + block) then skips layers [0, E) for the rows the stash holds with the same token at
the same place, a prefix of the block: it runs layers [0, E) for the rest only (after the stashed ones),
then layers [E, L) for all rows (LeanRunner._execute). Anything else that changes the cache (rollback,
reset, keep, another pass, a prefix restored) voids the stash.

Why this is exact: a row's state after layer E - 1 depends only on its token, its place and the entries
of layers [0, E) it attends to, which are the committed ones and the block's earlier rows, written
the same way. On the compiled GGUF pass every row is computed as in a one-token pass (row independence,
docs/DESIGN.md), so the reused states and entries are bitwise those a full pass computes itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specwise.runners.block_layout import BlockLayout
from specwise.runners.checks import check_window
from specwise.runners.passes import choose_pass
from specwise.runners.stash import LayerStash

if TYPE_CHECKING:
    from specwise.runners.lean import LeanRunner


class EarlyExit:
    """Draft rows through a lean runner's layers [0, exit_layer), stashed for its next pass."""

    def __init__(self, runner: LeanRunner, exit_layer: int) -> None:
        if not 1 <= exit_layer < runner.num_layers:
            raise ValueError(f"the exit layer must be in [1, {runner.num_layers - 1}] for a target of "
                             f"{runner.num_layers} decoder layers; got {exit_layer}")
        self.runner = runner
        self.exit_layer = exit_layer

    def begin(self) -> None:
        """Start a block right after the cached context (voiding an earlier stash)."""
        self.runner.stash = LayerStash(self.runner.length, self.exit_layer)

    @torch.inference_mode()
    def row(self, token: int) -> torch.Tensor:
        """Run `token` through layers [0, exit_layer) at the place after the block's rows so far; stash it
        and return its exit logits [vocab] (float32): the final norm and the output layer of its state."""
        runner, stash = self.runner, self.runner.stash
        if stash is None or stash.exit_layer != self.exit_layer:
            raise ValueError("the stash was voided since begin(): call begin() before drafting a block")
        place = stash.start + len(stash.tokens)
        check_window(place, 1, runner.max_context)
        layout = BlockLayout.chain(place, 1, runner.device)
        hidden, cos, sin = runner.embed([token], layout.positions)  # [1, hidden], [1, head_dim] each
        runner.reserve(place + 1)
        plan = choose_pass(1, True, runner.means)
        hidden, _ = runner.run_layers(plan, hidden, cos, sin, layout, range(self.exit_layer))
        stash.tokens.append(int(token))
        stash.hidden.append(hidden[0].clone())
        return runner.logits(hidden)[0]
