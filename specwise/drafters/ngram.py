"""Prompt lookup: propose what followed the last earlier occurrence of the context's suffix.

No model: the drafter searches prompt + generated text for the longest suffix of
n tokens (ngram_max down to ngram_min) that occurred before, and proposes the
tokens that followed its most recent earlier occurrence. Proposals are chosen
deterministically, so they are point masses (draft_probs None).

Chains and trees read one index of every start of each n-gram (`NgramIndex`), which a
generation extends by the tokens each step commits, so they cannot disagree about what
the context holds, and neither scans it: a scan with tensor ops cost 0.15 ms a call at a
few hundred tokens, paid in every plain step's shadow draft of adaptive k.

As a tree (`propose_tree`), the continuations of several earlier occurrences
become branches, merged where they agree, ranked as the chain ranks them: longest
suffix matches first, most recent first, so the chain proposal is the tree's first path.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch

from specwise.config import SamplingParams
from specwise.drafters.base import DraftProposal, TreeProposal, register_drafter
from specwise.drafters.chain import common_prefix_length
from specwise.verify.result import VerifyResult


class NgramIndex:
    """Every start of every n-gram (ngram_min <= n <= ngram_max) of a growing context that ends before
    its last token (so has a continuation), ascending: the last is the most recent. A call indexes only
    the tokens added since the last one (it still copies the context and compares it with the indexed
    one, a C-speed list compare). A context that shares only a prefix with the indexed one (a rollback,
    another generation) first drops what indexes the rest, or starts afresh where that is cheaper."""

    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.ids: list[int] = []
        self._starts: dict[int, dict[tuple[int, ...], list[int]]] = {
            n: {} for n in range(ngram_min, ngram_max + 1)}

    def update(self, context: Sequence[int]) -> list[int]:
        """Index `context` (a list, tensor or other sequence of ids); returns it as a list."""
        ids = context.tolist() if isinstance(context, torch.Tensor) else list(context)
        old = len(self.ids)
        if ids[:old] != self.ids:
            self._truncate(common_prefix_length(self.ids, ids, len(ids)))
            old = len(self.ids)
        # Starts s with s + n <= len - 1: n-grams that end before the last token (they have a continuation).
        for n, table in self._starts.items():
            for start in range(max(0, old - n), len(ids) - n):
                table.setdefault(tuple(ids[start:start + n]), []).append(start)
        self.ids = ids
        return ids

    def _truncate(self, size: int) -> None:
        """Keep the index of the first `size` tokens only."""
        ids = self.ids
        if 2 * size < len(ids):  # dropping more than it keeps: indexing the rest afresh costs less
            for table in self._starts.values():
                table.clear()
            self.ids = []
            return
        for n, table in self._starts.items():
            # Latest first, so each start dropped is the last in its n-gram's list.
            for start in range(len(ids) - n - 1, max(0, size - n) - 1, -1):
                key = tuple(ids[start:start + n])
                starts = table[key]
                starts.pop()
                if not starts:
                    del table[key]
        self.ids = ids[:size]

    def matches(self, context: Sequence[int]) -> Iterator[tuple[int, list[int]]]:
        """Index `context`, then (n, starts) for each of its suffixes of n tokens, longest first,
        that occurred earlier: starts ascending, where those occurrences begin (the index's own
        lists, valid until the next call)."""
        return self._matches(self.update(context))

    def _matches(self, ids: list[int]) -> Iterator[tuple[int, list[int]]]:
        size = len(ids)
        for n in range(min(self.ngram_max, size - 1), self.ngram_min - 1, -1):
            starts = self._starts[n].get(tuple(ids[size - n:]))
            if starts:
                yield n, starts

    def match(self, context: Sequence[int]) -> tuple[int, int]:
        """(n, start): the longest suffix of n tokens that occurred earlier, and where its most recent
        earlier occurrence starts; (0, -1) if none."""
        n, starts = next(self.matches(context), (0, [-1]))
        return n, starts[-1]

    def continuation(self, context: Sequence[int], k: int) -> list[int]:
        """The up-to-k tokens after the most recent earlier match of the longest suffix."""
        n, start = self.match(context)
        return self.ids[start + n:start + n + k] if n else []

    def continuations(self, context: Sequence[int], length: int) -> Iterator[list[int]]:
        """The up-to-`length` tokens after each earlier occurrence of the context's suffix, ranked as
        the chain ranks them: longest suffixes first, then most recent occurrences first (the first
        is `continuation`)."""
        ids = self.update(context)
        return (ids[start + n:start + n + length] for n, starts in self._matches(ids) for start in reversed(starts))


def tree_of_continuations(continuations: Iterable[list[int]], nodes: int, limits: Sequence[int]) -> TreeProposal:
    """The continuations as branches, in order, merged where they agree: at most `nodes` nodes, at most
    limits[level] distinct children under each node of a level (len(limits) levels); a continuation
    stops where it finds no room. Each costs a short walk, so at most 8 x nodes are walked: the cap
    bounds the work on long repetitive contexts, whose continuations mostly repeat each other."""
    tokens: list[int] = []
    parents: list[int] = []
    children: list[dict[int, int]] = [{}]  # row 0: the context, row i + 1: node i; token -> node
    for tried, continuation in enumerate(continuations):
        if len(tokens) >= nodes or tried >= 8 * nodes:
            break
        node = -1
        for level, token in enumerate(continuation[:len(limits)]):
            child = children[node + 1].get(token)
            if child is None:
                if len(tokens) >= nodes or len(children[node + 1]) >= limits[level]:
                    break
                child = len(tokens)
                tokens.append(token)
                parents.append(node)
                children[node + 1][token] = child
                children.append({})
            node = child
    return TreeProposal(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), None)


class NgramDrafter:
    """Prompt-lookup drafter (point-mass proposals)."""

    free_drafts = True  # cheap point masses: adaptive k may take shadow drafts (FreeDrafter)
    name = "ngram"

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max; got {ngram_min}, {ngram_max}")
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.index = NgramIndex(ngram_min, ngram_max)

    def start(self, prompt_ids: Sequence[int], sampling: SamplingParams,
              generator: torch.Generator) -> None:
        pass

    def propose(self, context: Sequence[int], k: int) -> DraftProposal:
        return DraftProposal(torch.tensor(self.index.continuation(context, k), dtype=torch.long), None)

    def match_length(self, context: Sequence[int]) -> int:
        """The longest suffix (ngram_min to ngram_max tokens) that occurred earlier; 0: none."""
        return self.index.match(context)[0]

    def propose_tree(self, context: Sequence[int], nodes: int, depth: int, branching: int,
                     shape: Sequence[int] | None = None) -> TreeProposal:
        """The index's continuations of the context's suffix as branches (distinct tokens under each
        node; point masses), so the chain proposal is the first path. A shape caps the children per
        node level by level; the context has only so many earlier continuations, so the tree may be
        smaller than the shape."""
        if nodes <= 0 or depth <= 0 or branching <= 0:
            return TreeProposal.empty()
        limits = list(shape) if shape is not None else [branching] * depth  # children per node, by level
        return tree_of_continuations(self.index.continuations(context, depth), nodes, limits)

    def observe(self, result: VerifyResult) -> None:
        pass


class NoDrafter:
    """Proposes nothing: plain autoregressive decoding through the same engine."""

    name = "none"

    def start(self, prompt_ids: Sequence[int], sampling: SamplingParams,
              generator: torch.Generator) -> None:
        pass

    def propose(self, context: Sequence[int], k: int) -> DraftProposal:
        return DraftProposal.empty()

    def propose_tree(self, context: Sequence[int], nodes: int, depth: int, branching: int,
                     shape: Sequence[int] | None = None) -> TreeProposal:
        return TreeProposal.empty()

    def observe(self, result: VerifyResult) -> None:
        pass


register_drafter("ngram", lambda ctx: NgramDrafter(
    ctx.options.get("ngram_min", ctx.spec.ngram_min), ctx.options.get("ngram_max", ctx.spec.ngram_max)))
register_drafter("none", lambda ctx: NoDrafter())
