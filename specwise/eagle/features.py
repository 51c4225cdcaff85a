"""The target's hidden states at chosen layers: what the head is fed.

Both runners record them on request, as `FeatureRunner`s (`forward(..., hidden_layers=...)` sets
`runner.last_hidden`, [n, layers, hidden], the outputs of those decoder layers
before any final norm); without the request a pass costs exactly what it did.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specwise.runners.protocols import FeatureRunner, ModelRunner


def teacher_forced(runner: ModelRunner, ids: Sequence[int],
                   layers: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One prefill of `ids` from an empty cache: (logits [n, vocab] float32, hidden [n, layers, H])."""
    if not isinstance(runner, FeatureRunner):  # HFRunner and LeanRunner are
        raise ValueError(f"{type(runner).__name__} cannot record hidden states; use runner 'hf' or 'lean'")
    runner.reset()
    logits = runner.forward(list(ids), hidden_layers=list(layers))
    return logits, runner.last_hidden
