"""What drafters with a model of their own share: drafting a chain, and keeping a cache in step.

Both the draft-model drafter and the EAGLE drafter draft a chain token by token
from the same processing the target uses (`specwise.sampling.draft_token`),
and both keep their cache in step with the context lazily, by the longest prefix
the cached tokens share with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specwise.config import SamplingParams
from specwise.drafters.base import DraftProposal
from specwise.sampling import draft_token, seen_token_mask


def common_prefix_length(cached: Sequence[int], ids: Sequence[int], most: int) -> int:
    """The length of the longest common prefix of `cached` and `ids`, at most `most`."""
    limit = min(len(cached), most)
    if limit <= 0:
        return 0
    same = torch.as_tensor(cached[:limit]) == torch.as_tensor(list(ids[:limit]))
    return limit if bool(same.all()) else int((~same).nonzero()[0])


def draft_chain(logits: torch.Tensor, context: Sequence[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None,
                next_logits: Callable[[int, int], torch.Tensor]) -> DraftProposal:
    """Draft k tokens one at a time after `context`.

    logits [V]: the drafter's logits for the first draft token, as wide as the target's.
    next_logits(i, token): after draft token i (0-based) was drawn, the logits [V] for
    token i + 1; called for i < k - 1 only. Draft token i takes position len(context) + i, whose
    noise it is drawn with when the generator is position-keyed (coupled verification).
    """
    vocab = logits.shape[-1]
    seen = seen_token_mask(context, [], vocab)[0] if sampling.repetition_penalty != 1.0 else None
    tokens: list[int] = []
    rows: list[torch.Tensor] = []
    for i in range(k):
        token, probs = draft_token(logits, sampling, seen, generator, position=len(context) + i)
        if probs is not None:
            rows.append(probs)  # [V]: exactly what the token was drawn from
        tokens.append(token)
        if seen is not None:
            seen = seen.clone()
            seen[token] = True
        if i + 1 < k:
            logits = next_logits(i, token)
    draft_probs = None if sampling.greedy else torch.stack(rows)  # [k, V]
    return DraftProposal(torch.tensor(tokens, dtype=torch.long), draft_probs)
