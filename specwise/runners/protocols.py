"""What the engine and the drafters use of a model runner, as protocols checked with isinstance.

`ModelRunner` is what every runner does: append tokens and get their logits in one
pass, drop the last n cache entries (rollback after a rejected draft), know the
cache's length. The others are capabilities a runner may add; code that needs one
checks for it with `isinstance` before decoding starts and names the runner's type
when it is missing:

- `TreeRunner`: score a draft tree in one pass and keep only the accepted path;
- `TreeExtendingRunner`: grow the previous pass's tree instead of rescoring it;
- `FeatureRunner`: record hidden states of chosen decoder layers (feature drafters);
- `OutputRestrictingRunner`: compute logits for a subset of the vocabulary (drafters);
- `LayerRangeRunner`: run a range of its decoder layers, and reuse rows a self-drafter ran through
  its first layers (layerskip);
- `PlannedRunner`: a batched sequence whose draft length the batch plans (specwise.batching).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol, runtime_checkable

import torch


class RollbackError(RuntimeError):
    """The model's KV cache cannot drop its last entries, so drafts cannot be undone."""


@runtime_checkable
class ModelRunner(Protocol):
    """What the engine and the draft-model drafter use of a model."""

    vocab_size: int  # width of the logits (the embedding matrix, >= the tokenizer's vocabulary)
    max_context: int

    @property
    def length(self) -> int: ...

    def reset(self) -> None: ...

    def forward(self, ids: Sequence[int], *, logits: bool = True) -> torch.Tensor | None: ...

    def rollback(self, n: int) -> None: ...


@runtime_checkable
class TreeRunner(ModelRunner, Protocol):
    """A runner that can also score a draft tree in one pass (tree drafting and verification)."""

    def forward_tree(self, ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Append tree nodes; node i sees the cache, its ancestors and itself, at position
        length + its depth. parents[i] < i, -1 for a child of the last cached token.
        Returns logits [len(ids), vocab] (float32)."""

    def keep(self, start: int, indices: Sequence[int]) -> None:
        """Of the entries from `start` on, keep only those at start + indices, contiguously."""


@runtime_checkable
class TreeExtendingRunner(TreeRunner, Protocol):
    """A tree runner whose forward_tree also takes extend=True: grow the tree of the previous
    forward_tree call, its nodes counted first, so a drafter feeds each level once."""

    can_extend_trees: ClassVar[bool]  # declares the extend keyword of forward_tree

    def forward_tree(self, ids: Sequence[int], parents: Sequence[int], *, extend: bool = False) -> torch.Tensor:
        ...


@runtime_checkable
class FeatureRunner(ModelRunner, Protocol):
    """A runner that records hidden states on request: forward(..., hidden_layers=...) (and
    forward_tree, where it has one) sets last_hidden to the outputs of those decoder layers
    (0-based, before any final norm) for the fed tokens, [n, len(hidden_layers), hidden]."""

    last_hidden: torch.Tensor | None

    def forward(self, ids: Sequence[int], *, logits: bool = True,
                hidden_layers: Sequence[int] | None = None) -> torch.Tensor | None: ...


@runtime_checkable
class OutputRestrictingRunner(ModelRunner, Protocol):
    """A runner that can compute logits for some tokens only (a drafter's restricted vocabulary)."""

    def restrict_output(self, token_ids: Sequence[int] | None) -> None:
        """Logits for these token ids only, -inf for every other token; None: all again."""


@runtime_checkable
class PlannedRunner(ModelRunner, Protocol):
    """A runner shared with other sequences in batched passes, whose batch plans each one's draft
    length for the most tokens per second in total (specwise.goodput)."""

    def limit(self, k_max: int | None) -> None:
        """The most this sequence may draft per step (None: not planned, e.g. trees)."""

    def planned_k(self) -> int | None:
        """The draft length for the next block, or None where the batch plans nothing yet."""

    def observe(self, proposed: int, accepted: int, draft_seconds: float) -> None:
        """How the last block fared: drives the next plans."""


@runtime_checkable
class LayerRangeRunner(FeatureRunner, Protocol):
    """A runner that runs a range of its decoder layers over given states (`run_layers`, beside the
    lean runner's pass interface: `embed`, `reserve`, `logits`) and whose next pass reuses the rows a
    self-drafter stashed after running them through its first layers (specwise.runners.early_exit)."""

    num_layers: int
    stash: object | None  # a LayerStash, or None

    @property
    def means(self): ...

    def run_layers(self, plan, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout,
                   layers: range, order: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def embed(self, ids: Sequence[int], positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...
