"""Token-level verification: speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

For i = 1..k the draft token x_i is accepted with probability min(1, t_i(x_i) / d_i(x_i)).
At the first rejection the verifier samples the recovered token from
normalize(max(t_i - d_i, 0)) and stops; when all k are accepted it samples the bonus
token from t_{k+1}. The committed tokens then follow the target's distribution exactly.

All probabilities of one step live in a pure plan (`token_verification_plan`): the
exact-enumeration tests prove the plan lossless, and `verify_tokens` only draws from it.
What block verification shares with it (input checks, the plan type, residual rows,
drawing from a plan) is in specwise.verify.common.
"""

from __future__ import annotations

import torch

from specwise.verify.common import Step, VerificationPlan, clipped_ratio, draw, prepare_step, residuals_in_place
from specwise.verify.result import VerifyResult


def token_verification_plan(
    draft_tokens: torch.Tensor,  # [k] long
    draft_probs: torch.Tensor | None,  # [k, V], or None for point masses
    target_probs: torch.Tensor,  # [k + 1, V]
) -> VerificationPlan:
    """The exact probabilities of token-level verification for one draft block."""
    return _token_plan(prepare_step(draft_tokens, draft_probs, target_probs))


def _token_plan(step: Step) -> VerificationPlan:
    accept = [clipped_ratio(t, d) for t, d in zip(step.target_at_draft, step.draft_at_draft)]
    num_accepted = []
    reach = 1.0  # P(x_1..x_j all accepted)
    for a in accept:
        num_accepted.append(reach * (1.0 - a))
        reach *= a
    num_accepted.append(reach)
    residuals_in_place(step, [1.0] * len(accept))
    return VerificationPlan.of(accept, num_accepted, step.target)


def verify_tokens(
    draft_tokens: torch.Tensor,  # [k] long
    draft_probs: torch.Tensor | None,  # [k, V], or None for point masses
    target_probs: torch.Tensor,  # [k + 1, V]
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Token-level rejection sampling: accepted prefix + a recovered or bonus token."""
    step = prepare_step(draft_tokens, draft_probs, target_probs)
    return draw(step, _token_plan(step), generator, _first_rejection)


def _first_rejection(uniforms: list[float], accept: list[float]) -> int:
    # Accept x_i iff u_i < a_i: P(u < a) = a exactly for u ~ U[0, 1), also at a = 0 and a = 1.
    return next((i for i, (u, a) in enumerate(zip(uniforms, accept)) if u >= a), len(accept))
