"""Greedy verification: temperature 0, where speculative decoding must reproduce plain
greedy decoding token for token.

Draft token x_i is accepted iff it equals the target's argmax at position i (first index
on ties, as torch.argmax breaks them, so the tie-breaking matches plain greedy decoding).
After the first mismatch the recovered token is the target's argmax there; when all k
are accepted the bonus token is the argmax of the last row. Nothing is random.
"""

from __future__ import annotations

import torch

from specwise.sampling import first_argmax
from specwise.verify.result import VerifyResult
from specwise.verify.common import check_inputs


def verify_greedy(
    draft_tokens: torch.Tensor,  # [k] long
    draft_probs: torch.Tensor | None,  # ignored: only the target's argmax matters
    target_probs: torch.Tensor,  # [k + 1, V] probabilities or processed logits
    generator: torch.Generator | None = None,  # ignored; accepted for a uniform signature
) -> VerifyResult:
    """Accepted prefix (draft tokens equal to the target's argmax) + the argmax after it."""
    tokens = check_inputs(draft_tokens, None, target_probs)
    choices = first_argmax(target_probs).tolist()  # [k + 1]
    k = len(tokens)
    num_accepted = next((i for i in range(k) if tokens[i] != choices[i]), k)
    return VerifyResult(
        tokens=tokens[:num_accepted] + [choices[num_accepted]], num_accepted=num_accepted, num_proposed=k
    )
