"""Token-level verification: speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

For i = 1..k the draft token x_i is accepted with probability min(1, t_i(x_i) / d_i(x_i)).
At the first rejection the verifier samples the recovered token from
normalize(max(t_i - d_i, 0)) and stops; when all k are accepted it samples the bonus
token from t_{k+1}. The committed tokens then follow the target's distribution exactly.

All probabilities of one step live in a pure plan (`token_verification_plan`): the
exact-enumeration tests prove the plan lossless, and `verify_tokens` only draws from it.
This module also holds what block verification shares with it: input checks, the plan
type, residual rows and sampling from a plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specwise.sampling import sample
from specwise.verify.result import VerifyResult


@dataclass(frozen=True)
class VerificationPlan:
    """The probabilities of one verification step; sampling draws from nothing else.

    position_probs: [k] what each draft position's uniform is compared against
        (token-level: accept x_i given x_1..x_{i-1} were accepted; block: h_i).
    num_accepted_probs: [k + 1] P(exactly j draft tokens are accepted), j = 0..k.
    next_token_weights: [k + 1, V] row j is proportional to the distribution of the token
        committed after j accepted ones: the recovered token for j < k, the bonus for
        j == k. Left unnormalized (every row has positive mass) because sampling does
        not need it; `next_token_dists` normalizes.
    All float64.
    """

    position_probs: torch.Tensor  # [k]
    num_accepted_probs: torch.Tensor  # [k + 1]
    next_token_weights: torch.Tensor  # [k + 1, V]

    @property
    def next_token_dists(self) -> torch.Tensor:  # [k + 1, V]
        return self.next_token_weights / self.next_token_weights.sum(dim=1, keepdim=True)

    @property
    def expected_tokens(self) -> float:
        """E[tokens committed per step] = E[accepted] + 1 (the acceptance length)."""
        return 1.0 + sum(j * p for j, p in enumerate(self.num_accepted_probs.tolist()))


def _check_inputs(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
) -> list[int]:
    """Validate shapes (cheaply) and return the draft tokens as a list."""
    if (
        not isinstance(draft_tokens, torch.Tensor)
        or draft_tokens.dim() != 1
        or draft_tokens.is_floating_point()
        or draft_tokens.is_complex()
        or draft_tokens.dtype == torch.bool
    ):
        got = (
            f"{draft_tokens.dtype} tensor of shape {tuple(draft_tokens.shape)}"
            if isinstance(draft_tokens, torch.Tensor)
            else type(draft_tokens).__name__
        )
        raise ValueError(f"draft_tokens must be a 1-D integer tensor [k]; got {got}")
    k = draft_tokens.numel()
    if not isinstance(target_probs, torch.Tensor) or target_probs.dim() != 2:
        got = tuple(target_probs.shape) if isinstance(target_probs, torch.Tensor) else type(target_probs).__name__
        raise ValueError(f"target_probs must be a 2-D tensor [k + 1, V]; got {got}")
    if target_probs.shape[0] != k + 1:
        raise ValueError(
            f"target_probs must have k + 1 = {k + 1} rows for k = {k} draft tokens "
            f"(the last row is for the bonus token); got shape {tuple(target_probs.shape)}"
        )
    vocab = target_probs.shape[1]
    if vocab == 0:
        raise ValueError("target_probs has an empty vocabulary dimension (V = 0)")
    if draft_probs is not None and (
        not isinstance(draft_probs, torch.Tensor) or tuple(draft_probs.shape) != (k, vocab)
    ):
        got = tuple(draft_probs.shape) if isinstance(draft_probs, torch.Tensor) else type(draft_probs).__name__
        raise ValueError(
            f"draft_probs must have shape [k, V] = [{k}, {vocab}] (same V as target_probs), "
            f"or be None for point masses; got {got}"
        )
    tokens = draft_tokens.tolist()
    if not all(0 <= x < vocab for x in tokens):
        raise ValueError(f"draft_tokens must lie in [0, V) = [0, {vocab}); got {tokens}")
    return tokens


def _float64_rows(probs: torch.Tensor, name: str) -> tuple[torch.Tensor, list[float]]:
    """A float64 copy of probs and its row sums. Rows are not normalized here (that would
    cost a pass over [rows, V]): callers fold 1 / sum into the scalars and scales they use."""
    rows = probs.detach().to(torch.float64, copy=True)  # [m, V]
    sums = rows.sum(dim=1).tolist()
    if rows.numel() and (not all(0.0 < s < math.inf for s in sums) or float(rows.min()) < 0.0):
        raise ValueError(f"{name} must hold probabilities: finite, non-negative, every row with positive mass")
    return rows, sums


def _clipped_ratio(num: float, den: float) -> float:
    """min(1, num / den), with den == 0 read as an infinite ratio unless num == 0 too.

    A token drafted from d_i has d_i(x_i) > 0 with probability 1, so den == 0 only arises
    when a caller breaks the contract; this choice never divides by zero and never
    accepts a token to which the target gives probability zero.
    """
    if num <= 0.0:
        return 0.0
    if num >= den:
        return 1.0
    return num / den


@dataclass(frozen=True)
class _Step:
    """One step's inputs in float64, shared by the token-level and block plans."""

    tokens: list[int]  # x_1..x_k
    index: torch.Tensor  # [k, 1] long, the draft tokens as a gather/scatter index
    target_probs: torch.Tensor  # [k + 1, V] as given (target below is overwritten in place)
    target: torch.Tensor  # [k + 1, V] float64 copy of target_probs, unnormalized
    target_sums: list[float]  # [k + 1]
    draft: torch.Tensor | None  # [k, V] float64 copy of draft_probs, unnormalized; None: point masses
    draft_sums: list[float]  # [k] (1 for point masses)
    target_at_draft: list[float]  # t_i(x_i), i = 1..k, normalized
    draft_at_draft: list[float]  # d_i(x_i), i = 1..k, normalized (1 for point masses)


def _prepare(
    draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor
) -> _Step:
    tokens = _check_inputs(draft_tokens, draft_probs, target_probs)
    k = len(tokens)
    target, target_sums = _float64_rows(target_probs, "target_probs")
    index = draft_tokens.long().reshape(k, 1).to(target.device)
    t_x = [t / s for t, s in zip(target[:k].gather(1, index).flatten().tolist(), target_sums)]
    if draft_probs is None:
        draft, draft_sums, d_x = None, [1.0] * k, [1.0] * k
    else:
        draft, draft_sums = _float64_rows(draft_probs, "draft_probs")
        d_x = [d / s for d, s in zip(draft.gather(1, index).flatten().tolist(), draft_sums)]
    return _Step(tokens, index, target_probs.detach(), target, target_sums, draft, draft_sums, t_x, d_x)


def _residuals_in_place(step: _Step, weights: list[float]) -> list[float]:
    """Turn rows 0..k-1 of step.target (t_1..t_k) into max(w_i * t_i - d_i, 0), each up to
    a positive factor, and return their masses sum_y max(w_i * t_i(y) - d_i(y), 0) with
    t_i and d_i normalized. weights: w_i for each of those rows.

    A row with zero mass (t_i == d_i, reached with probability zero) falls back to t_i,
    so a sample is always defined.
    """
    k = len(step.tokens)
    rows = step.target[:k]  # [k, V]
    # Rows are scaled by the draft's row sum, so the draft is subtracted as given (no extra pass).
    scale = [w * d / t for w, d, t in zip(weights, step.draft_sums, step.target_sums)]
    rows.mul_(torch.tensor(scale, dtype=torch.float64, device=rows.device).reshape(k, 1))
    if step.draft is None:
        rows.scatter_(1, step.index, rows.gather(1, step.index).sub_(1.0).clamp_min_(0.0))
    else:
        rows.sub_(step.draft).clamp_min_(0.0)
    masses = [m / d for m, d in zip(rows.sum(dim=1).tolist(), step.draft_sums)]
    for i, mass in enumerate(masses):
        if mass <= 0.0:
            rows[i] = step.target_probs[i]
    return masses


def token_verification_plan(
    draft_tokens: torch.Tensor,  # [k] long
    draft_probs: torch.Tensor | None,  # [k, V], or None for point masses
    target_probs: torch.Tensor,  # [k + 1, V]
) -> VerificationPlan:
    """The exact probabilities of token-level verification for one draft block."""
    return _token_plan(_prepare(draft_tokens, draft_probs, target_probs))


def _token_plan(step: _Step) -> VerificationPlan:
    accept = [_clipped_ratio(t, d) for t, d in zip(step.target_at_draft, step.draft_at_draft)]
    num_accepted = []
    reach = 1.0  # P(x_1..x_j all accepted)
    for a in accept:
        num_accepted.append(reach * (1.0 - a))
        reach *= a
    num_accepted.append(reach)
    _residuals_in_place(step, [1.0] * len(accept))
    return VerificationPlan(
        position_probs=torch.tensor(accept, dtype=torch.float64),
        num_accepted_probs=torch.tensor(num_accepted, dtype=torch.float64),
        next_token_weights=step.target,
    )


def _commit(
    tokens: list[int], plan: VerificationPlan, num_accepted: int, generator: torch.Generator | None
) -> VerifyResult:
    """The accepted prefix plus the recovered or bonus token drawn from the plan."""
    next_token = sample(plan.next_token_weights[num_accepted], generator)
    return VerifyResult(
        tokens=tokens[:num_accepted] + [next_token], num_accepted=num_accepted, num_proposed=len(tokens)
    )


def verify_tokens(
    draft_tokens: torch.Tensor,  # [k] long
    draft_probs: torch.Tensor | None,  # [k, V], or None for point masses
    target_probs: torch.Tensor,  # [k + 1, V]
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Token-level rejection sampling: accepted prefix + a recovered or bonus token."""
    step = _prepare(draft_tokens, draft_probs, target_probs)
    plan = _token_plan(step)
    k = len(step.tokens)
    # Accept x_i iff u_i < a_i: P(u < a) = a exactly for u ~ U[0, 1), also at a = 0 and a = 1.
    uniforms = torch.rand(k, generator=generator, dtype=torch.float64).tolist()
    accept = plan.position_probs.tolist()
    num_accepted = next((i for i in range(k) if uniforms[i] >= accept[i]), k)
    return _commit(step.tokens, plan, num_accepted, generator)
