"""Block verification (Sun, Mendlovic, Leviathan et al., ICLR 2025, arXiv 2403.10444).

Same inputs as token-level verification, never fewer expected tokens per step, and
optimal among valid verifiers. It judges the draft block as a whole instead of
stopping at the first token that token-level verification would reject:

- w_0 = 1; w_i = min(1, w_{i-1} * t_i(x_i) / d_i(x_i)) for i = 1..k.
- r_i = sum_y max(w_i * t_{i+1}(y) - d_{i+1}(y), 0) and h_i = r_i / (r_i + 1 - w_i)
  for i = 0..k-1 (h_i = 1 when the denominator is 0); h_k = w_k.
- With independent uniforms eta_1..eta_k, the number of accepted draft tokens is the
  largest i with eta_i <= h_i, or 0 if there is none.
- After j accepted tokens comes the recovered token, sampled from
  normalize(max(w_j * t_{j+1} - d_{j+1}, 0)), or for j = k the bonus token from t_{k+1}.

`block_verification_plan` computes every probability of a step (pure, proven lossless
by the exact-enumeration tests); `verify_block` only draws from it.
"""

from __future__ import annotations

import torch

from specwise.verify.common import Step, VerificationPlan, clipped_ratio, draw, prepare_step, residuals_in_place
from specwise.verify.result import VerifyResult


def block_verification_plan(
    draft_tokens: torch.Tensor,  # [k] long
    draft_probs: torch.Tensor | None,  # [k, V], or None for point masses
    target_probs: torch.Tensor,  # [k + 1, V]
) -> VerificationPlan:
    """The exact probabilities of block verification for one draft block.

    position_probs holds h_1..h_k (h_0 = 1 always, so it is left out).
    """
    return _block_plan(prepare_step(draft_tokens, draft_probs, target_probs))


def _block_plan(step: Step) -> VerificationPlan:
    k = len(step.tokens)
    weights = [1.0]  # w_0..w_k
    for t, d in zip(step.target_at_draft, step.draft_at_draft):
        weights.append(clipped_ratio(weights[-1] * t, d))
    r = residuals_in_place(step, weights[:k])  # r_0..r_{k-1}

    h = []  # h_1..h_k
    for i in range(1, k):
        den = r[i] + 1.0 - weights[i]
        h.append(r[i] / den if den > 0 else 1.0)
    if k:
        h.append(weights[k])

    # P(j accepted) = h_j * prod_{i > j} (1 - h_i), with h_0 = 1.
    num_accepted = [0.0] * (k + 1)
    none_later = 1.0
    for j in range(k, 0, -1):
        num_accepted[j] = h[j - 1] * none_later
        none_later *= 1.0 - h[j - 1]
    num_accepted[0] = none_later
    return VerificationPlan.of(h, num_accepted, step.target)


def verify_block(
    draft_tokens: torch.Tensor,  # [k] long
    draft_probs: torch.Tensor | None,  # [k, V], or None for point masses
    target_probs: torch.Tensor,  # [k + 1, V]
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Block verification: accepted prefix + a recovered or bonus token."""
    step = prepare_step(draft_tokens, draft_probs, target_probs)
    return draw(step, _block_plan(step), generator, _last_hit)


def _last_hit(eta: list[float], h: list[float]) -> int:
    # eta < h rather than eta <= h: the same probability for continuous eta, and h = 0
    # then never fires even when torch.rand returns exactly 0.
    return next((i for i in range(len(h), 0, -1) if eta[i - 1] < h[i - 1]), 0)
