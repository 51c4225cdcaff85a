"""Verification rules: pure functions from (draft_tokens, draft_probs, target_probs) to a VerifyResult.

Every rule has the signature
    fn(draft_tokens [k], draft_probs [k, V] | None, target_probs [k + 1, V], generator=None) -> VerifyResult
and commits the accepted draft prefix plus one recovered or bonus token.

Tree rules (a draft tree instead of a chain) have the signature
    fn(tokens [n], parents [n], draft_probs [n, V] | None, target_probs [n + 1, V], generator=None)
        -> TreeVerifyResult
and commit the accepted path plus one recovered or bonus token.

Each sampling rule has two forms with the same decisions for the same draws: the
reference (token.py, block.py, tree.py), which computes the step's exact float64 plan
on the host so that tests can enumerate it, and a vectorized form (vectorized.py,
tree_vectorized.py) that runs on the probabilities' device with one host
synchronisation per step. The engine uses the vectorized forms on every device
(`vectorized=True`); greedy verification is one argmax and one read-back either way.
"""

from __future__ import annotations

from typing import Callable

from specwise.verify.block import block_verification_plan, verify_block
from specwise.verify.common import VerificationPlan
from specwise.verify.greedy import verify_greedy
from specwise.verify.result import TreeVerifyResult, VerifyResult
from specwise.verify.token import token_verification_plan, verify_tokens
from specwise.verify.tree import TreeVerificationPlan, tree_verification_plan, verify_tree, verify_tree_greedy
from specwise.verify.tree_vectorized import verify_tree_vectorized
from specwise.verify.vectorized import verify_block_vectorized, verify_tokens_vectorized

VERIFIERS: dict[str, Callable[..., VerifyResult]] = {
    "greedy": verify_greedy,
    "token": verify_tokens,
    "block": verify_block,
}


VECTORIZED_VERIFIERS: dict[str, Callable[..., VerifyResult]] = {
    "greedy": verify_greedy,
    "token": verify_tokens_vectorized,
    "block": verify_block_vectorized,
}


def get_verifier(name: str, *, vectorized: bool = False) -> Callable[..., VerifyResult]:
    """The verification rule registered under `name` (vectorized: its on-device form)."""
    try:
        return (VECTORIZED_VERIFIERS if vectorized else VERIFIERS)[name]
    except (KeyError, TypeError):
        allowed = ", ".join(repr(n) for n in VERIFIERS)
        raise ValueError(f"unknown verifier {name!r}; allowed: {allowed}") from None


# Keyed like VERIFIERS so one verifier name serves chains and trees; block verification
# has no tree form here, so "block" is absent.
TREE_VERIFIERS: dict[str, Callable[..., TreeVerifyResult]] = {
    "greedy": verify_tree_greedy,
    "token": verify_tree,
}


VECTORIZED_TREE_VERIFIERS: dict[str, Callable[..., TreeVerifyResult]] = {
    "greedy": verify_tree_greedy,
    "token": verify_tree_vectorized,
}


def get_tree_verifier(name: str, *, vectorized: bool = False) -> Callable[..., TreeVerifyResult]:
    """The tree verification rule registered under `name` (vectorized: its on-device form)."""
    try:
        return (VECTORIZED_TREE_VERIFIERS if vectorized else TREE_VERIFIERS)[name]
    except (KeyError, TypeError):
        allowed = ", ".join(repr(n) for n in TREE_VERIFIERS)
        raise ValueError(f"unknown tree verifier {name!r}; allowed: {allowed}") from None


__all__ = [
    "TREE_VERIFIERS",
    "VECTORIZED_TREE_VERIFIERS",
    "VECTORIZED_VERIFIERS",
    "VERIFIERS",
    "TreeVerificationPlan",
    "TreeVerifyResult",
    "VerificationPlan",
    "VerifyResult",
    "block_verification_plan",
    "get_tree_verifier",
    "get_verifier",
    "token_verification_plan",
    "tree_verification_plan",
    "verify_block",
    "verify_block_vectorized",
    "verify_greedy",
    "verify_tokens",
    "verify_tokens_vectorized",
    "verify_tree",
    "verify_tree_greedy",
    "verify_tree_vectorized",
]
