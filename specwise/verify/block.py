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

The running weight w_i is a loop of k scalar operations that stay on the device; the
residual rows are computed at once. P(exactly j accepted) = h_j (1 - h_{j+1}) ... (1 - h_k)
with h_0 = 1. `block_verification_plan` returns these probabilities from the code
`verify_block` runs (specwise.verify.chain).
"""

from __future__ import annotations

import torch

from specwise.verify.chain import ChainRule, ChainStep, VerificationPlan, residuals_in_place
from specwise.verify.common import clipped_ratio
from specwise.verify.result import VerifyResult


def _stop_probs(step: ChainStep) -> torch.Tensor:  # [k]
    """h_1..h_k; step.target's first k rows become max(w_i * t_{i+1} - d_{i+1}, 0)."""
    k = len(step.tokens)
    weights = [torch.ones((), dtype=torch.float64, device=step.target.device)]  # w_0..w_k, no host sync
    for t_x, d_x in zip(step.target_at_draft, step.draft_at_draft):
        weights.append(clipped_ratio(weights[-1] * t_x, d_x))
    w = torch.stack(weights)  # [k + 1]
    r = residuals_in_place(step, w[:k])  # [k] r_0..r_{k-1}
    den = r[1:] + 1.0 - w[1:k]
    h_k = w[1:][-1:]  # [1] w_k; [0] for k = 0
    return torch.cat([torch.where(den > 0, r[1:] / den, torch.ones_like(den)), h_k])


def _last_hit(h: torch.Tensor) -> torch.Tensor:  # [k] -> [k + 1]
    """P(exactly j accepted): the largest i with eta_i < h_i. eta < h rather than eta <= h:
    the same probability for continuous eta, and h = 0 then never fires even when
    torch.rand returns exactly 0."""
    one = h.new_ones(1)
    none_after = torch.cumprod((1.0 - h).flip(0), dim=0).flip(0)  # [k] (1 - h_i) ... (1 - h_k)
    return torch.cat([one, h]) * torch.cat([none_after, one])


BLOCK = ChainRule(_stop_probs, _last_hit)


def verify_block(
    draft_tokens: torch.Tensor,  # [k] long
    draft_probs: torch.Tensor | None,  # [k, V], or None for point masses
    target_probs: torch.Tensor,  # [k + 1, V]
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Block verification: accepted prefix + a recovered or bonus token."""
    return BLOCK.verify(draft_tokens, draft_probs, target_probs, generator)


def block_verification_plan(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                            target_probs: torch.Tensor) -> VerificationPlan:
    """The exact probabilities of block verification for one draft block (shapes as
    verify_block): position_probs holds h_1..h_k (h_0 = 1 always, so it is left out)."""
    return BLOCK.plan(draft_tokens, draft_probs, target_probs)
