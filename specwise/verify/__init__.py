"""Verification rules: pure functions from (draft_tokens, draft_probs, target_probs) to a VerifyResult.

Every rule has the signature
    fn(draft_tokens [k], draft_probs [k, V] | None, target_probs [k + 1, V], generator=None) -> VerifyResult
and commits the accepted draft prefix plus one recovered or bonus token. The coupled rule takes
position-keyed noise instead of a generator (a StepNoise, `PositionNoise.at(start)`): its
committed tokens are plain sampling's with that noise (coupled.py).

Tree rules (a draft tree instead of a chain) have the signature
    fn(tokens [n], parents [n], draft_probs [n, V] | None, target_probs [n + 1, V], generator=None)
        -> TreeVerifyResult
and commit the accepted path plus one recovered or bonus token.

Each rule has one implementation, the one the engine runs: a tensor program on the
probabilities' own device with one host synchronisation per step (greedy.py; token.py and
block.py over chain.py; tree.py over tree_shape.py; helpers in common.py). Each sampling
rule's plan (`*_verification_plan`: the probability of every outcome) is computed by the
same code, so the tests that enumerate the plans exactly prove what the engine runs. The
coupled rule is a deterministic function of its noise; its plans state the law of its decisions
for drafts drawn without that noise, and its tests check it against them and, token for token,
against plain sampling.
"""

from __future__ import annotations

from typing import Callable

from specwise.verify.block import block_verification_plan, verify_block
from specwise.verify.chain import VerificationPlan
from specwise.verify.coupled import (coupled_verification_plan, tree_coupled_verification_plan, verify_coupled,
                                     verify_tree_coupled)
from specwise.verify.greedy import verify_greedy
from specwise.verify.result import TreeVerifyResult, VerifyResult
from specwise.verify.token import token_verification_plan, verify_tokens
from specwise.verify.tree import TreeVerificationPlan, tree_verification_plan, verify_tree, verify_tree_greedy

VERIFIERS: dict[str, Callable[..., VerifyResult]] = {
    "greedy": verify_greedy,
    "token": verify_tokens,
    "block": verify_block,
    "coupled": verify_coupled,
}

# Keyed like VERIFIERS so one verifier name serves chains and trees; block verification
# has no tree form here, so "block" is absent.
TREE_VERIFIERS: dict[str, Callable[..., TreeVerifyResult]] = {
    "greedy": verify_tree_greedy,
    "token": verify_tree,
    "coupled": verify_tree_coupled,
}


def _lookup(registry: dict[str, Callable], name: str, what: str) -> Callable:
    try:
        return registry[name]
    except (KeyError, TypeError):
        allowed = ", ".join(repr(n) for n in registry)
        raise ValueError(f"unknown {what} {name!r}; allowed: {allowed}") from None


def get_verifier(name: str) -> Callable[..., VerifyResult]:
    """The chain verification rule registered under `name`."""
    return _lookup(VERIFIERS, name, "verifier")


def get_tree_verifier(name: str) -> Callable[..., TreeVerifyResult]:
    """The tree verification rule registered under `name`."""
    return _lookup(TREE_VERIFIERS, name, "tree verifier")


__all__ = [
    "TREE_VERIFIERS",
    "VERIFIERS",
    "TreeVerificationPlan",
    "TreeVerifyResult",
    "VerificationPlan",
    "VerifyResult",
    "block_verification_plan",
    "coupled_verification_plan",
    "get_tree_verifier",
    "get_verifier",
    "token_verification_plan",
    "tree_coupled_verification_plan",
    "tree_verification_plan",
    "verify_block",
    "verify_coupled",
    "verify_greedy",
    "verify_tokens",
    "verify_tree",
    "verify_tree_coupled",
    "verify_tree_greedy",
]
