"""Earlier requests' tokens for the suffix drafter: one suffix trie per sharing scope,
at most `limit` tokens over all scopes, the oldest request dropped first.

Scopes never mix: a scope's trie holds only the requests that ran in it, so a lookup
in one scope cannot return another's tokens. The bound is global, so the memory does
not grow with the number of scopes; a scope whose requests were all dropped is gone.
The suffix drafters of one decoder share one store (per trie depth and bound), so
that the bound is the decoder's, whatever the number of drafters.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from specwise.drafters.scope import Scope
from specwise.drafters.suffix_trie import SuffixTrie


@dataclass(frozen=True)
class StoreUsage:
    """What a store holds now, for /metrics and reports."""

    tokens: int
    limit: int
    nodes: int
    requests: int
    scopes: int


class SuffixStore:
    """Per-scope suffix tries of finished requests under one token bound."""

    def __init__(self, depth: int, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0 tokens; got {limit}")
        self.depth = depth
        self.limit = limit
        self._tries: dict[tuple[str, ...], SuffixTrie] = {}
        self._order: deque[tuple[tuple[str, ...], int]] = deque()  # (scope, sequence id), oldest first
        self._tokens = 0
        # Held while a trie changes and while a drafter reads one: the drafters of concurrent
        # generations share a store, and /metrics reads its usage from another thread.
        self._lock = threading.RLock()

    def reading(self) -> threading.RLock:
        """Hold it (`with store.reading():`) while reading a trie of this store."""
        return self._lock

    def trie(self, scope: Scope) -> SuffixTrie | None:
        """The scope's trie of earlier requests, or None when it has none (or shares nothing)."""
        return None if scope is None else self._tries.get(scope)

    def add(self, scope: Scope, tokens: Sequence[int]) -> None:
        """Keep a finished request (prompt and output) for later requests of the same scope."""
        if scope is None or self.limit == 0 or not tokens:
            return
        tokens = list(tokens[-self.limit:])  # a request longer than the bound keeps its end
        with self._lock:
            trie = self._tries.get(scope)
            if trie is None:
                trie = self._tries[scope] = SuffixTrie(self.depth)
            self._order.append((scope, trie.add(tokens)))
            self._tokens += len(tokens)
            while self._tokens > self.limit:
                self._drop_oldest()

    def _drop_oldest(self) -> None:
        scope, sid = self._order.popleft()
        trie = self._tries[scope]
        before = trie.tokens
        trie.remove(sid)
        self._tokens -= before - trie.tokens
        if trie.sequences == 0:
            del self._tries[scope]

    def clear(self) -> None:
        with self._lock:
            self._tries.clear()
            self._order.clear()
            self._tokens = 0

    def usage(self) -> StoreUsage:
        with self._lock:
            return StoreUsage(self._tokens, self.limit, sum(t.nodes for t in self._tries.values()),
                              len(self._order), len(self._tries))
