"""A prefix cache: the KV entries of earlier prompts and outputs, reused by later requests that share a prefix.

The entries are kept in blocks of `BLOCK_TOKENS` tokens. A block is found by its tokens and its
parent block (the block before it in the sequence), so a lookup walks the prompt block by block
from the start and stops at the first block it has not seen. Blocks shared by several sequences (a
system prompt, a document asked about twice, the earlier turns of a chat) are stored once. The keys
hold the tokens themselves, not a hash of them, so two different prefixes can never meet in one block.

The match is token-exact, not only whole blocks: a sequence's last, partial block is stored too (a
leaf of fewer tokens), and where the walk stops, the children of the last block it found are
compared token by token with the prompt; the child sharing the most leading tokens gives those
tokens' entries (an entry depends only on the tokens up to its own, so a block's first j entries
serve any prompt that agrees with its first j tokens). This matters for chats: turn n's prompt
leaves turn n - 1's sequence where the answer ends, anywhere inside a block, and every token read
again costs a pass row (a second turn re-read up to 15 tokens, 0.2-0.4 s on two cores, before).

Why blocks rather than a token-level radix tree: the byte bound and least-recently-used eviction
stay exact and cheap (an ordered dict of blocks), a lookup costs one dict probe per 16 tokens plus
one comparison with the few children where it stops, and there is no node splitting. Eviction keeps
the tree whole: a lookup or a store touches a chain from its last block to its first, so a parent is
always used at least as recently as its children, and the least recently used block is always one
that no cached block continues (partial blocks are always leaves).

Only entries that do not depend on how they were computed can be shared without changing a token:
the cache is used where the runner's prefill is exact (`specwise.runners.passes.exact_prefill`:
the gguf format's native pass), and skipped elsewhere.

Requests share a cache only inside their sharing scope (`specwise.drafters.scope`), as the suffix
drafter's memory is scoped: a server scopes each API key and `user`, so a tenant never hits
another tenant's entries (a hit is faster, and the timing would tell). Scope None shares nothing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specwise.drafters.scope import Scope, current_scope
from specwise.runners.passes import exact_prefill

BLOCK_TOKENS = 16
CURRENT = object()  # restore/store's default scope: the one the calling thread runs in
DEFAULT_PREFIX_CACHE_BYTES = 256 << 20  # a library decoder's: ~4,500 tokens of a 1.5B model's float32 entries


@dataclass
class PrefixCacheStats:
    """What a prefix cache has done, for /metrics and reports (counts since it was made)."""

    lookups: int = 0  # prompts looked up
    hits: int = 0  # lookups that found at least one block
    hit_tokens: int = 0  # prompt tokens whose entries came from the cache
    stored_tokens: int = 0  # tokens of new blocks stored
    evicted_tokens: int = 0  # tokens of blocks evicted
    evictions: int = 0  # blocks evicted


@dataclass
class _Block:
    id: int
    keys: torch.Tensor  # [layers, kv_heads, tokens, head_dim]: block_tokens, or fewer in a partial block
    values: torch.Tensor

    @property
    def tokens(self) -> int:
        return self.keys.shape[2]

    @property
    def bytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()


def _shared_length(a: tuple, b: Sequence[int]) -> int:
    """How many leading tokens a and b share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def cache_runner(runner):
    """The runner whose cache tensors hold a generation's entries (a batch member's own runner), or None
    where entries cannot be shared exactly: no pass interface, or a prefill that is not exact."""
    inner = getattr(runner, "runner", runner)  # a BatchMember wraps its runner
    means = getattr(inner, "means", None)
    # On the class: `cache` is a property that raises while the cache is not allocated.
    if means is None or not exact_prefill(means) or not all(
            hasattr(type(inner), name) for name in ("layout", "reserve", "cache", "append", "reset")):
        return None
    return inner


class PrefixCache:
    """Cached KV entries by block, per model and sharing scope, at most `max_bytes` in all (LRU)."""

    def __init__(self, max_bytes: int = DEFAULT_PREFIX_CACHE_BYTES, *, block_tokens: int = BLOCK_TOKENS) -> None:
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"the prefix cache's max_bytes must be an integer >= 0 (0: off); got {max_bytes!r}")
        if not isinstance(block_tokens, int) or block_tokens < 1:
            raise ValueError(f"block_tokens must be an integer >= 1; got {block_tokens!r}")
        self.max_bytes = max_bytes
        self.block_tokens = block_tokens
        self.stats = PrefixCacheStats()
        # key (model, scope, parent block id, tokens) -> block, least recently used first
        self._blocks: OrderedDict[tuple, _Block] = OrderedDict()
        self._children: dict[tuple, set[tuple]] = {}  # (model, scope, parent id) -> keys of its children
        self._bytes = 0
        self._tokens = 0
        self._next_id = 0
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        """Bytes of the entries held now."""
        return self._bytes

    @property
    def tokens(self) -> int:
        """Tokens whose entries are held now."""
        return self._tokens

    @property
    def blocks(self) -> int:
        return len(self._blocks)

    def bytes_per_token(self) -> int | None:
        """Bytes one cached token takes (None until a block is held)."""
        with self._lock:
            block = next(iter(self._blocks.values()), None)
        return None if block is None else block.bytes // block.tokens

    @torch.inference_mode()  # the runner's cache may have been allocated inside a pass's inference mode
    def restore(self, runner, ids: Sequence[int], scope: Scope | object = CURRENT) -> int:
        """Reset `runner`'s cache and fill it with the cached entries of the longest prefix of `ids`
        found; return its length in tokens (0: nothing found, the cache is empty).
        scope: the sharing scope (default: the current one, `specwise.drafters.scope`)."""
        scope = current_scope() if scope is CURRENT else scope
        inner = cache_runner(runner)
        runner.reset()
        if inner is None or scope is None or self.max_bytes == 0:
            return 0
        with self._lock:
            self.stats.lookups += 1
            chain, length = self._find(inner, list(ids), scope)
            if not chain:
                return 0
            layout = inner.layout(list(ids[:length]))
            inner.reserve(length)
            keys, values = inner.cache
            start = 0
            for key in chain:
                block = self._blocks[key]
                used = min(block.tokens, length - start)  # the last block may serve its first tokens only
                keys[:, :, start:start + used] = block.keys[:, :, :used]
                values[:, :, start:start + used] = block.values[:, :, :used]
                start += used
            inner.append(layout)
            self._touch(chain)
            self.stats.hits += 1
            self.stats.hit_tokens += length
        return length

    def cached_tokens(self, runner, ids: Sequence[int], scope: Scope | object = CURRENT) -> int:
        """How many leading tokens of `ids` `restore` would take from the cache now, without touching
        the entries' recency or the counters: what a scheduler asks before choosing."""
        scope = current_scope() if scope is CURRENT else scope
        inner = cache_runner(runner)
        if inner is None or scope is None or self.max_bytes == 0:
            return 0
        with self._lock:
            return self._find(inner, list(ids), scope)[1]

    @torch.inference_mode()
    def store(self, runner, ids: Sequence[int], scope: Scope | object = CURRENT) -> int:
        """Keep the entries of `ids` (the tokens at `runner`'s cache slots 0, 1, ...: at most its
        length): whole blocks, and the rest as a partial block unless a block held already starts
        with it; return the tokens of the new blocks stored. scope: as in restore."""
        scope = current_scope() if scope is CURRENT else scope
        inner = cache_runner(runner)
        if inner is None or scope is None or self.max_bytes == 0:
            return 0
        ids = list(ids[:inner.length])
        keys, values = inner.cache
        size, model = self.block_tokens, id(inner.model)
        added = 0
        with self._lock:
            parent, chain = -1, []
            for start in range(0, len(ids), size):
                tokens = tuple(ids[start:start + size])
                key = (model, scope, parent, tokens)
                block = self._blocks.get(key)
                if block is None and len(tokens) < size:
                    covering = self._longest_child(model, scope, parent, tokens)
                    if covering is not None and _shared_length(covering[3], tokens) == len(tokens):
                        chain.append(covering)  # a block held already starts with this tail
                        break
                if block is None:
                    block = _Block(self._next_id, keys[:, :, start:start + len(tokens)].clone(),
                                   values[:, :, start:start + len(tokens)].clone())
                    self._next_id += 1
                    self._add(key, block)
                    added += len(tokens)
                chain.append(key)
                parent = block.id
            self._touch(chain)
            self.stats.stored_tokens += added
            self._evict_to(self.max_bytes)
        return added

    def evict_tokens(self, tokens: int) -> int:
        """Evict least recently used blocks holding at least `tokens` tokens (or all); return the tokens
        evicted. A server makes room this way for a request its KV budget would not admit."""
        with self._lock:
            before = self._tokens
            while self._blocks and before - self._tokens < tokens:
                self._evict_one()
            return before - self._tokens

    def clear(self) -> None:
        with self._lock:
            self._evict_to(0)

    def _find(self, inner, ids: list[int], scope: Scope) -> tuple[list[tuple], int]:
        """The keys of the cached blocks starting `ids` and how many of its tokens they hold (holding
        the lock): whole blocks while they match, then the child of the last one that shares the
        most leading tokens with the rest (a partial block, or a whole one that the prompt leaves)."""
        size, model, parent = self.block_tokens, id(inner.model), -1
        chain: list[tuple] = []
        length = 0
        while True:
            tokens = tuple(ids[length:length + size])
            if not tokens:
                return chain, length
            key = (model, scope, parent, tokens)
            block = self._blocks.get(key) if len(tokens) == size else None
            if block is None:
                break
            chain.append(key)
            length += size
            parent = block.id
        child = self._longest_child(model, scope, parent, tokens)
        if child is not None:
            chain.append(child)
            length += _shared_length(child[3], tokens)
        return chain, length

    def _longest_child(self, model: int, scope: Scope, parent: int, tokens: Sequence[int]) -> tuple | None:
        """The key of the child of `parent` sharing the most leading tokens with `tokens` (None: none
        shares one)."""
        best, best_length = None, 0
        for key in self._children.get((model, scope, parent), ()):
            shared = _shared_length(key[3], tokens)
            if shared > best_length:
                best, best_length = key, shared
        return best

    def _add(self, key: tuple, block: _Block) -> None:
        """Hold a new block; a partial sibling that it starts with is no longer needed."""
        for other in [k for k in self._children.get(key[:3], ()) if len(k[3]) < len(key[3])
                      and key[3][:len(k[3])] == k[3]]:
            self._remove(other)
        self._blocks[key] = block
        self._children.setdefault(key[:3], set()).add(key)
        self._bytes += block.bytes
        self._tokens += block.tokens

    def _remove(self, key: tuple) -> _Block:
        block = self._blocks.pop(key)
        siblings = self._children[key[:3]]
        siblings.discard(key)
        if not siblings:
            del self._children[key[:3]]
        self._bytes -= block.bytes
        self._tokens -= block.tokens
        return block

    def _touch(self, chain: list[tuple]) -> None:
        """Mark a chain used, its first block last: parents stay more recent than their children."""
        for key in reversed(chain):
            self._blocks.move_to_end(key)

    def _evict_to(self, limit: int) -> None:
        while self._blocks and self._bytes > limit:
            self._evict_one()

    def _evict_one(self) -> None:
        block = self._remove(next(iter(self._blocks)))
        self.stats.evictions += 1
        self.stats.evicted_tokens += block.tokens
