"""Verification rules: pure functions from (draft_tokens, draft_probs, target_probs) to a VerifyResult.

Every rule has the signature
    fn(draft_tokens [k], draft_probs [k, V] | None, target_probs [k + 1, V], generator=None) -> VerifyResult
and commits the accepted draft prefix plus one recovered or bonus token.
"""

from __future__ import annotations

from typing import Callable

from specwise.verify.block import block_verification_plan, verify_block
from specwise.verify.greedy import verify_greedy
from specwise.verify.result import VerifyResult
from specwise.verify.token import VerificationPlan, token_verification_plan, verify_tokens

VERIFIERS: dict[str, Callable[..., VerifyResult]] = {
    "greedy": verify_greedy,
    "token": verify_tokens,
    "block": verify_block,
}


def get_verifier(name: str) -> Callable[..., VerifyResult]:
    """The verification rule registered under `name`."""
    try:
        return VERIFIERS[name]
    except (KeyError, TypeError):
        allowed = ", ".join(repr(n) for n in VERIFIERS)
        raise ValueError(f"unknown verifier {name!r}; allowed: {allowed}") from None


__all__ = [
    "VERIFIERS",
    "VerificationPlan",
    "VerifyResult",
    "block_verification_plan",
    "get_verifier",
    "token_verification_plan",
    "verify_block",
    "verify_greedy",
    "verify_tokens",
]
