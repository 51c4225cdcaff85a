"""Token-level verification: speculative sampling (Leviathan, Kalman and Matias, ICML 2023,
arXiv 2211.17192; Chen et al. 2023, arXiv 2302.01318).

For i = 1..k the draft token x_i is accepted with probability a_i = min(1, t_i(x_i) / d_i(x_i)).
At the first rejection the verifier samples the recovered token from
normalize(max(t_i - d_i, 0)) and stops; when all k are accepted it samples the bonus
token from t_{k+1}. The committed tokens then follow the target's distribution exactly.

All k ratios and residual rows are computed at once; P(exactly j accepted) =
a_1 ... a_j (1 - a_{j+1}), and a_1 ... a_k for j = k. `token_verification_plan` returns
these probabilities from the code `verify_tokens` runs (specwise.verify.chain).
"""

from __future__ import annotations

import torch

from specwise.verify.chain import ChainRule, ChainStep, VerificationPlan, residuals_in_place
from specwise.verify.common import clipped_ratio
from specwise.verify.result import VerifyResult


def _accept_probs(step: ChainStep) -> torch.Tensor:  # [k]
    """a_i for every position; step.target's first k rows become max(t_i - d_i, 0)."""
    accept = clipped_ratio(step.target_at_draft, step.draft_at_draft)  # [k]
    residuals_in_place(step, torch.ones_like(accept))
    return accept


def _first_rejection(accept: torch.Tensor) -> torch.Tensor:  # [k] -> [k + 1]
    """P(exactly j accepted): x_i is accepted iff u_i < a_i, so P = a exactly for u ~ U[0, 1),
    also at a = 0 and a = 1."""
    one = accept.new_ones(1)
    all_before = torch.cumprod(torch.cat([one, accept]), dim=0)  # [k + 1] P(x_1..x_j all accepted)
    return all_before * torch.cat([1.0 - accept, one])


TOKEN_LEVEL = ChainRule(_accept_probs, _first_rejection)


def verify_tokens(
    draft_tokens: torch.Tensor,  # [k] long
    draft_probs: torch.Tensor | None,  # [k, V], or None for point masses
    target_probs: torch.Tensor,  # [k + 1, V]
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Token-level rejection sampling: accepted prefix + a recovered or bonus token."""
    return TOKEN_LEVEL.verify(draft_tokens, draft_probs, target_probs, generator)


def token_verification_plan(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                            target_probs: torch.Tensor) -> VerificationPlan:
    """The exact probabilities of token-level verification for one draft block (shapes as
    verify_tokens): position_probs holds a_1..a_k."""
    return TOKEN_LEVEL.plan(draft_tokens, draft_probs, target_probs)
