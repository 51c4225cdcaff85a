"""Prompt lookup: propose what followed the last earlier occurrence of the context's suffix.

No model: the drafter searches prompt + generated text for the longest suffix of
n tokens (ngram_max down to ngram_min) that occurred before, and proposes the
tokens that followed its most recent earlier occurrence. Proposals are chosen
deterministically, so they are point masses (draft_probs None).

As a tree (`propose_tree`), the continuations of several earlier occurrences
become branches, merged where they agree: longest suffix matches first, most
recent first, so the chain proposal is the tree's first path.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from specwise.config import SamplingParams
from specwise.drafters.base import DraftProposal, TreeProposal, register_drafter
from specwise.verify.result import VerifyResult


def suffix_matches(context: torch.Tensor, ngram_min: int, ngram_max: int) -> Iterator[tuple[int, torch.Tensor]]:
    """(n, starts) for each suffix length n, ngram_max down to ngram_min, that occurred earlier:
    starts [m] long, ascending, where those earlier occurrences begin."""
    size = int(context.numel())
    for n in range(min(ngram_max, size - 1), ngram_min - 1, -1):
        suffix = context[size - n:]
        # Windows starting at 0 .. size-n-1: every occurrence except the suffix itself.
        windows = context[:size - 1].unfold(0, n, 1)  # [size - n, n]
        starts = torch.nonzero((windows == suffix).all(dim=1)).flatten()
        if starts.numel():
            yield n, starts


def lookup_continuation(context: torch.Tensor, k: int, ngram_min: int, ngram_max: int) -> torch.Tensor:
    """The up-to-k tokens after the most recent earlier match of the longest suffix; [<=k] long."""
    for n, starts in suffix_matches(context, ngram_min, ngram_max):
        begin = int(starts[-1]) + n
        return context[begin:begin + k].clone()
    return torch.empty(0, dtype=torch.long)


def earlier_continuations(context: torch.Tensor, length: int, ngram_min: int,
                          ngram_max: int) -> Iterator[list[int]]:
    """The up-to-`length` tokens after each earlier occurrence of the context's suffix:
    longest suffixes first, then most recent occurrences first."""
    for n, starts in suffix_matches(context, ngram_min, ngram_max):
        for start in reversed(starts.tolist()):
            yield context[start + n:start + n + length].tolist()


class NgramDrafter:
    """Prompt-lookup drafter (point-mass proposals)."""

    free_drafts = True  # cheap point masses: adaptive k may take shadow drafts (FreeDrafter)
    name = "ngram"

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max; got {ngram_min}, {ngram_max}")
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max

    def start(self, prompt_ids: Sequence[int], sampling: SamplingParams,
              generator: torch.Generator) -> None:
        pass

    def propose(self, context: Sequence[int], k: int) -> DraftProposal:
        tokens = lookup_continuation(torch.as_tensor(list(context), dtype=torch.long), k,
                                     self.ngram_min, self.ngram_max)
        return DraftProposal(tokens, None)

    def match_length(self, context: Sequence[int]) -> int:
        """The longest suffix (ngram_min to ngram_max tokens) that occurred earlier; 0: none."""
        found = suffix_matches(torch.as_tensor(list(context), dtype=torch.long), self.ngram_min, self.ngram_max)
        return next((n for n, _ in found), 0)

    def propose_tree(self, context: Sequence[int], nodes: int, depth: int, branching: int,
                     shape: Sequence[int] | None = None) -> TreeProposal:
        """Earlier continuations as branches (distinct tokens under each node; point masses).
        A shape caps the children per node level by level; the context has only so many
        earlier continuations, so the tree may be smaller than the shape."""
        tokens: list[int] = []
        parents: list[int] = []
        children: list[dict[int, int]] = [{}]  # row 0: the context, row i + 1: node i; token -> node
        if nodes <= 0 or depth <= 0 or branching <= 0:
            return TreeProposal.empty()
        limits = list(shape) if shape is not None else [branching] * depth  # children per node, by level
        ids = torch.as_tensor(list(context), dtype=torch.long)
        # Each continuation costs a short walk; the cap bounds the work on long repetitive contexts.
        for tried, continuation in enumerate(earlier_continuations(ids, depth, self.ngram_min, self.ngram_max)):
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
