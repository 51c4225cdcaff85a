"""Argument checks both runners make, so that they refuse the same things with the same words."""

from __future__ import annotations

from collections.abc import Sequence


def check_window(length: int, n: int, max_context: int) -> None:
    """Refuse to append n tokens to a cache of `length` beyond the model's context window."""
    if length + n > max_context:
        raise ValueError(
            f"context of {length + n} tokens exceeds the model's window of "
            f"{max_context}; shorten the prompt or lower max_new_tokens")


def check_tree(ids: Sequence[int], parents: Sequence[int], length: int, max_context: int) -> None:
    """Refuse tree nodes without exactly one parent entry each, or beyond the context window."""
    if len(ids) != len(parents):
        raise ValueError(f"{len(ids)} tree tokens but {len(parents)} parents")
    check_window(length, len(ids), max_context)


def check_hidden_layers(layers: Sequence[int] | None, count: int) -> frozenset[int]:
    """The set of requested hidden layers (none for None), each checked to be in [0, count)."""
    if layers is None:
        return frozenset()
    bad = [i for i in layers if not 0 <= i < count]
    if bad:
        raise ValueError(f"hidden_layers must be in [0, {count}); got {bad}")
    return frozenset(layers)
