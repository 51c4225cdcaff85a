"""Suffix drafting (SuffixDecoding, Oliaro et al., arXiv 2411.04975): free drafts that grow
with repetition, within a request and across requests.

Two suffix tries (specwise.drafters.suffix_trie) are searched together: one over the
current request (prompt and committed tokens, extended as tokens are committed) and
one over earlier requests of the same sharing scope (specwise.drafters.suffix_store,
bounded in tokens, oldest request dropped first). A step:

1. match: the longest suffix of the context, up to half the tries' depth, that some
   earlier occurrence in either trie continues;
2. draft: from there, the continuations most frequent over both tries (counts added),
   best first by path frequency (the product of each step's share among the
   continuations), keeping a branch only while that frequency is at least the
   threshold. The draft is at most `factor` x the match length deep, so a longer
   match earns a longer draft.

Chains for the chain engine (the single most frequent path), trees for the tree
engine (the most frequent paths under the node budget, siblings most frequent
first). Tokens are chosen deterministically: point masses (probs None), verified
like the n-gram drafter's.

A request joins the shared trie when the drafter starts its next one (in `start`,
counted as that generation's prefill).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch

from specwise.config import SamplingParams, SpecConfig
from specwise.drafters.base import DraftProposal, TreeProposal, register_drafter
from specwise.drafters.scope import Scope, current_scope
from specwise.drafters.suffix_store import StoreUsage, SuffixStore
from specwise.drafters.suffix_trie import Cursor, SuffixTrie
from specwise.verify.result import VerifyResult

Cursors = list[tuple[SuffixTrie, Cursor]]


_DEFAULTS = SpecConfig()  # the suffix_* settings' defaults, one home for them (specwise.config)


class SuffixDrafter:
    """Suffix-trie drafter over the current request and earlier ones (point-mass proposals)."""

    free_drafts = True  # cheap point masses: adaptive k may take shadow drafts (FreeDrafter)
    name = "suffix"
    remembers_requests = True  # earlier generations stay in its memory (RememberingDrafter)

    def __init__(self, depth: int = _DEFAULTS.suffix_depth, factor: int = _DEFAULTS.suffix_factor,
                 min_percent: int = _DEFAULTS.suffix_min_percent, cache_tokens: int = _DEFAULTS.suffix_cache_tokens,
                 store: SuffixStore | None = None) -> None:
        if depth < 2:
            raise ValueError(f"suffix depth must be >= 2; got {depth}")
        if factor < 1:
            raise ValueError(f"suffix factor must be >= 1; got {factor}")
        if not 0 <= min_percent <= 100:
            raise ValueError(f"suffix min_percent must be in [0, 100]; got {min_percent}")
        self.depth, self.factor, self.min_prob = depth, factor, min_percent / 100
        if store is not None and (store.depth, store.limit) != (depth, cache_tokens):
            raise ValueError(f"a shared suffix store must index depth {depth} and keep {cache_tokens} tokens; "
                             f"this one has depth {store.depth} and keeps {store.limit}")
        self.store = store if store is not None else SuffixStore(depth, cache_tokens)  # shared: one bound
        self._scope: Scope = None
        self._request: list[int] = []  # prompt + committed tokens of the current generation
        self._local = SuffixTrie(depth)
        self._sid = self._local.open()

    # ------------------------------------------------------------------ protocol

    def start(self, prompt_ids: Sequence[int], sampling: SamplingParams,
              generator: torch.Generator) -> None:
        self.store.add(self._scope, self._request)  # the previous generation, now finished
        self._scope = current_scope()
        self._request = [int(t) for t in prompt_ids]
        self._local = SuffixTrie(self.depth)
        self._sid = self._local.open()
        self._local.extend(self._sid, self._request)

    def observe(self, result: VerifyResult) -> None:
        self._request.extend(result.tokens)  # indexed at the next propose: timed as drafting

    def propose(self, context: Sequence[int], k: int) -> DraftProposal:
        with self.store.reading():
            tokens, _ = self._draft(context, k, k, [1] * k)
        return DraftProposal(torch.tensor(tokens, dtype=torch.long), None)

    def propose_tree(self, context: Sequence[int], nodes: int, depth: int, branching: int,
                     shape: Sequence[int] | None = None) -> TreeProposal:
        limits = list(shape) if shape is not None else [branching] * depth
        with self.store.reading():
            tokens, parents = self._draft(context, nodes, min(depth, len(limits)), limits)
        return TreeProposal(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), None)

    def match_length(self, context: Sequence[int]) -> int:
        """The longest suffix of the context that either trie continues (see `match`); 0: none."""
        with self.store.reading():
            self._sync(context)
            return self.match(context)[0]

    def usage(self) -> StoreUsage:
        """What the shared store holds (tokens, its bound, nodes, requests, scopes)."""
        return self.store.usage()

    def clear(self) -> None:
        """Forget every earlier request, in every scope."""
        self.store.clear()

    # ------------------------------------------------------------------ drafting

    def _sync(self, context: Sequence[int]) -> None:
        """Index the committed tokens the local trie has not seen yet."""
        request = self._request
        if len(context) != len(request) or (request and context[-1] != request[-1]):
            if len(context) > len(request) and list(context[:len(request)]) == request:
                request.extend(int(t) for t in context[len(request):])  # observe was not called
            else:  # not the generation `start` was told about: index this context from scratch
                self._request = [int(t) for t in context]
                self._local = SuffixTrie(self.depth)
                self._sid = self._local.open()
        indexed = self._local.tokens
        if indexed < len(self._request):
            self._local.extend(self._sid, self._request[indexed:])

    def match(self, context: Sequence[int]) -> tuple[int, Cursors]:
        """The longest suffix of the context (at most depth // 2 tokens) that an earlier occurrence
        continues, in either trie: its length and its cursors in the tries that hold it."""
        tries = [self._local] + [t for t in (self.store.trie(self._scope),) if t is not None]

        def cursors(m: int) -> Cursors:
            path = context[len(context) - m:]
            found = [(trie, trie.find(path)) for trie in tries]
            return [(trie, c) for trie, c in found if c is not None and trie.has_children(c)]

        low, high = 0, min(len(context), self.depth // 2)
        best: Cursors = []
        while low < high:  # a suffix continued somewhere: every shorter one is too
            mid = (low + high + 1) // 2
            found = cursors(mid)
            if found:
                low, best = mid, found
            else:
                high = mid - 1
        return low, best

    def _draft(self, context: Sequence[int], nodes: int, depth: int,
               limits: Sequence[int]) -> tuple[list[int], list[int]]:
        """Tokens and parents of the most frequent continuations: at most `nodes` nodes,
        limits[level] children per node at each level, `depth` levels and factor x the match."""
        self._sync(context)
        matched, root = self.match(context)
        depth = min(depth, self.factor * matched, self.depth - matched)
        tokens: list[int] = []
        parents: list[int] = []
        if nodes <= 0 or depth <= 0:
            return tokens, parents
        children = [0]  # row 0: the context, row i + 1: node i; children added so far
        heap: list[tuple[float, int, int, int, int, Cursors]] = []
        order = 0  # ties: first pushed, first taken

        def push(parent: int, at: Cursors, frequency: float, level: int) -> None:
            nonlocal order
            merged: dict[int, int] = {}
            for trie, cursor in at:
                for token, n in trie.children(cursor).items():
                    merged[token] = merged.get(token, 0) + n
            total = sum(merged.values())
            for token, n in sorted(merged.items(), key=lambda item: -item[1]):
                share = frequency * n / total
                if share < self.min_prob:
                    break
                heapq.heappush(heap, (-share, order, parent, token, level, at))
                order += 1

        push(-1, root, 1.0, 0)
        while heap and len(tokens) < nodes:
            negative, _, parent, token, level, at = heapq.heappop(heap)
            if children[parent + 1] >= limits[level]:
                continue
            children[parent + 1] += 1
            tokens.append(token)
            parents.append(parent)
            children.append(0)
            if level + 1 < depth:
                below = [(trie, c) for trie, cursor in at if (c := trie.step(cursor, token)) is not None]
                push(len(tokens) - 1, below, -negative, level + 1)
        return tokens, parents


def _factory(ctx) -> SuffixDrafter:
    spec, options = ctx.spec, ctx.options
    depth = int(options.get("depth", spec.suffix_depth))
    cache_tokens = int(options.get("cache_tokens", spec.suffix_cache_tokens))
    store = None
    if ctx.shared is not None:  # the decoder's suffix drafters keep earlier requests in one store
        store = ctx.shared.setdefault(("suffix-store", depth, cache_tokens), SuffixStore(depth, cache_tokens))
    return SuffixDrafter(depth, int(options.get("factor", spec.suffix_factor)),
                         int(options.get("min_percent", spec.suffix_min_percent)), cache_tokens, store)


register_drafter("suffix", _factory)
