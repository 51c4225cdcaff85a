"""Token-level and block verification as tensor programs on the probabilities' own device.

The same rules and the same float64 arithmetic as the plans in token.py and block.py
(the reference the exact-enumeration tests prove lossless), written without a host
round trip: every position is computed at once where the rule allows (ratios,
residual rows and their masses, the accept/reject decisions), and only block
verification's running weight w_i = min(1, w_{i-1} t_i(x_i) / d_i(x_i)) is a loop, of
k scalar operations that stay on the device. The uniforms come from the same CPU
generator, in the same order (k for the positions, then one for the committed token),
and are sent to the device with the work. The step ends with one host synchronisation:
reading back the number accepted, the committed token and whether the inputs were
probabilities.

On the CPU every operation is the reference's own, in the same order, so the plans are
bitwise equal and so are the decisions for the same draws (tests/test_verify_vectorized.py).
On a GPU the row sums over the vocabulary are reduced in another order; the plans then
agree to float64 rounding, and a decision can differ only where a uniform falls within
that rounding of its threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specwise.verify.common import check_inputs
from specwise.verify.result import VerifyResult

_NOT_PROBABILITIES = "must hold probabilities: finite, non-negative, every row with positive mass"


@dataclass(frozen=True)
class DevicePlan:
    """A chain step's plan as device tensors (float64): what the reference VerificationPlan holds,
    less the enumeration of P(j accepted), which sampling does not need."""

    position_probs: torch.Tensor  # [k] token-level: accept x_i; block: h_i
    next_token_weights: torch.Tensor  # [k + 1, V] unnormalized: residual rows, then the bonus row
    valid: torch.Tensor  # [] bool: the inputs were probabilities


@dataclass(frozen=True)
class _Inputs:
    tokens: list[int]
    target: torch.Tensor  # [k + 1, V] float64 copy, unnormalized
    target_sums: torch.Tensor  # [k + 1]
    target_probs: torch.Tensor  # [k + 1, V] as given
    index: torch.Tensor  # [k, 1] long
    draft: torch.Tensor | None  # [k, V] float64 copy; None: point masses
    draft_sums: torch.Tensor  # [k] (ones for point masses)
    target_at_draft: torch.Tensor  # [k] t_i(x_i), normalized
    draft_at_draft: torch.Tensor  # [k] d_i(x_i), normalized (ones for point masses)
    valid: torch.Tensor  # [] bool


def _rows(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A float64 copy, its row sums and whether it holds probabilities (on the device: no sync)."""
    rows = probs.detach().to(torch.float64, copy=True)
    sums = rows.sum(dim=1)
    valid = (torch.isfinite(sums) & (sums > 0)).all() & (rows.amin() >= 0) if rows.numel() else \
        torch.ones((), dtype=torch.bool, device=rows.device)
    return rows, sums, valid


def _prepare(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor) -> _Inputs:
    tokens = check_inputs(draft_tokens, draft_probs, target_probs)
    k, device = len(tokens), target_probs.device
    target, target_sums, valid = _rows(target_probs)
    index = torch.tensor(tokens, dtype=torch.long, device=device).reshape(k, 1)
    t_x = target[:k].gather(1, index).flatten() / target_sums[:k]
    if draft_probs is None:
        draft, draft_sums = None, torch.ones(k, dtype=torch.float64, device=device)
        d_x = draft_sums
    else:
        draft, draft_sums, draft_valid = _rows(draft_probs.to(device, non_blocking=True))
        valid = valid & draft_valid
        d_x = draft.gather(1, index).flatten() / draft_sums
    return _Inputs(tokens, target, target_sums, target_probs.detach(), index, draft, draft_sums, t_x, d_x, valid)


def _clipped_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """min(1, num / den) elementwise, 0 where num <= 0 and 1 where den == 0 < num: the
    reference's clipped_ratio (num / den rounds to <= 1 whenever num < den)."""
    return torch.where(num <= 0, torch.zeros_like(num), (num / den).clamp_max(1.0))


def _residuals(step: _Inputs, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows max(w_i t_i - d_i, 0) up to a factor, i < k, in step.target (in place), and their masses
    with t_i, d_i normalized; a row of zero mass falls back to t_i (as the reference's
    residuals_in_place). weights: [k] w_i for those rows."""
    k = len(step.tokens)
    rows = step.target[:k]  # [k, V]
    rows.mul_((weights * step.draft_sums / step.target_sums[:k]).reshape(k, 1))
    if step.draft is None:
        rows.scatter_(1, step.index, rows.gather(1, step.index).sub_(1.0).clamp_min_(0.0))
    else:
        rows.sub_(step.draft).clamp_min_(0.0)
    masses = rows.sum(dim=1) / step.draft_sums  # [k]
    empty = (masses <= 0).reshape(k, 1)
    rows.copy_(torch.where(empty, step.target_probs[:k].to(torch.float64), rows))
    return rows, masses


def token_plan(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
               target_probs: torch.Tensor) -> DevicePlan:
    """Token-level verification's plan, vectorized over the k positions."""
    return _token_plan(_prepare(draft_tokens, draft_probs, target_probs))


def _token_plan(step: _Inputs) -> DevicePlan:
    accept = _clipped_ratio(step.target_at_draft, step.draft_at_draft)  # [k]
    _residuals(step, torch.ones_like(accept))
    return DevicePlan(accept, step.target, step.valid)


def block_plan(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
               target_probs: torch.Tensor) -> DevicePlan:
    """Block verification's plan: h_1..h_k as position_probs."""
    return _block_plan(_prepare(draft_tokens, draft_probs, target_probs))


def _block_plan(step: _Inputs) -> DevicePlan:
    k = len(step.tokens)
    device = step.target.device
    weights = [torch.ones((), dtype=torch.float64, device=device)]  # w_0..w_k: k scalar steps, no sync
    for i in range(k):
        weights.append(_clipped_ratio(weights[-1] * step.target_at_draft[i], step.draft_at_draft[i]))
    w = torch.stack(weights)  # [k + 1]
    _, r = _residuals(step, w[:k])  # r_0..r_{k-1}
    den = r[1:] + 1.0 - w[1:k]
    h = torch.cat([torch.where(den > 0, r[1:] / den, torch.ones_like(den)), w[k:] if k else w[:0]])  # h_1..h_k
    return DevicePlan(h, step.target, step.valid)


def _draw(step: _Inputs, plan: DevicePlan, generator: torch.Generator | None, block: bool) -> VerifyResult:
    k = len(step.tokens)
    device = step.target.device
    # The reference's draws, in its order: k uniforms for the positions, then one for the token.
    uniforms = torch.rand(k, generator=generator, dtype=torch.float64)
    last = torch.rand((), generator=generator, dtype=torch.float64)
    host = torch.cat([uniforms, last.reshape(1)])
    if device.type == "cuda":
        host = host.pin_memory()
    draws = host.to(device, non_blocking=True)
    u, u_last = draws[:k], draws[k]
    if block:  # the largest i with eta_i < h_i, or 0
        positions = torch.arange(1, k + 1, device=device)
        accepted = (positions * (u < plan.position_probs)).amax() if k else torch.zeros((), dtype=torch.long,
                                                                                        device=device)
    else:  # the first i with u_i >= a_i, or k
        accepted = (u < plan.position_probs).long().cumprod(0).sum()
    token = _sample_row(plan.next_token_weights.index_select(0, accepted.reshape(1))[0], u_last)
    # The step's one host synchronisation.
    j, next_token, valid = torch.stack([accepted.long(), token, plan.valid.long()]).tolist()
    if not valid:
        raise ValueError(f"target_probs and draft_probs {_NOT_PROBABILITIES}")
    return VerifyResult(tokens=step.tokens[:j] + [next_token], num_accepted=j, num_proposed=k)


def _sample_row(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """specwise.sampling.sample on the device for a given uniform: the CDF inverted, a token of
    zero weight never returned (u * total rounding up to total falls to the last positive one)."""
    cdf = torch.cumsum(weights, dim=0)  # [V]
    index = torch.searchsorted(cdf, (u * cdf[-1]).reshape(1), right=True)[0]
    last_positive = weights.numel() - 1 - (weights > 0).flip(0).long().argmax()
    return torch.where(index >= weights.numel(), last_positive, index)


def verify_tokens_vectorized(
    draft_tokens: torch.Tensor,  # [k] long
    draft_probs: torch.Tensor | None,  # [k, V], or None for point masses
    target_probs: torch.Tensor,  # [k + 1, V]
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """verify_tokens on target_probs' device with one host synchronisation."""
    step = _prepare(draft_tokens, draft_probs, target_probs)
    return _draw(step, _token_plan(step), generator, block=False)


def verify_block_vectorized(
    draft_tokens: torch.Tensor,  # [k] long
    draft_probs: torch.Tensor | None,  # [k, V], or None for point masses
    target_probs: torch.Tensor,  # [k + 1, V]
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """verify_block on target_probs' device with one host synchronisation."""
    step = _prepare(draft_tokens, draft_probs, target_probs)
    return _draw(step, _block_plan(step), generator, block=True)
