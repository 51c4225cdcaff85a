"""The decoders' prefix caches inside the server's KV budget.

The KV budget (`kv_budget_tokens`) bounds the KV cache the server holds: the admitted requests'
reservations (prompt plus max_tokens each) and the prefix caches' blocks (specwise.prefix_cache),
counted in tokens. A prefix cache holds at most the whole budget's bytes of its model's entries
(less where its decoder was given a smaller prefix_cache_bytes); when a request would not fit
beside the admitted ones and the cached blocks, the scheduler evicts cached blocks, least recently
used first, until it fits (`Scheduler._admit`). So caching never makes a request wait or be refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from specwise.prefix_cache import PrefixCache, cache_runner


def entry_bytes(runner) -> int:
    """Bytes of one token's keys and values in a lean runner's cache: every layer and KV head."""
    element = torch.finfo(runner.dtype).bits // 8
    return 2 * len(runner.layers) * runner.num_kv_heads * runner.head_dim * element


def budget_prefix_caches(decoders: Mapping[str, Any], kv_budget_tokens: int | None) -> list[PrefixCache]:
    """The decoders' prefix caches that can hold entries (an exact prefill), each bounded by the bytes of
    the whole KV budget; the scheduler counts their tokens in the budget."""
    caches = []
    for decoder in decoders.values():
        cache = getattr(decoder, "prefix_cache", None)
        runner = cache_runner(getattr(decoder, "runner", None))
        if not isinstance(cache, PrefixCache) or runner is None or cache.max_bytes == 0:
            continue
        if kv_budget_tokens is not None:
            cache.max_bytes = min(cache.max_bytes, kv_budget_tokens * entry_bytes(runner))
        caches.append(cache)
    return caches
