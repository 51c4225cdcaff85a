"""What the verifiers share: input checks, the plan of a chain step and its float64 inputs,
residual rows, and drawing a step's outcome from its plan.

Token-level and block verification (token.py, block.py) compute different plans
from the same `Step` and draw from them the same way; greedy verification
(greedy.py) and tree verification (tree.py) share the input checks and the
float64 helpers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specwise.sampling import sample
from specwise.verify.result import VerifyResult


@dataclass(frozen=True)
class InputNames:
    """How error messages name a verifier's inputs: a chain's or a tree's."""

    tokens: str  # the argument holding the draft tokens
    size: str  # its length's letter
    tokens_note: str  # said after the expected token shape
    rows_note: str  # what target_probs' rows are for
    draft_note: str  # what draft_probs' rows are


CHAIN = InputNames("draft_tokens", "k", "", "draft tokens (the last row is for the bonus token)",
                   "same V as target_probs")
TREE = InputNames("tokens", "n", " (one token per tree node)",
                  "tree nodes (row 0 after the context, row i + 1 after node i)",
                  "row i: the drafter's distribution at node i's parent, same V as target_probs")


def is_integer_tensor(x: object) -> bool:
    return (
        isinstance(x, torch.Tensor)
        and not x.is_floating_point()
        and not x.is_complex()
        and x.dtype != torch.bool
    )


def describe(x: object) -> str:
    """A value as an error message shows what it got."""
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__


def check_tokens(tokens: torch.Tensor, names: InputNames = CHAIN) -> None:
    """Refuse anything but a 1-D integer tensor of draft tokens."""
    if not is_integer_tensor(tokens) or tokens.dim() != 1:
        raise ValueError(f"{names.tokens} must be a 1-D integer tensor [{names.size}]{names.tokens_note}; "
                         f"got {describe(tokens)}")


def check_probs(tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                names: InputNames = CHAIN) -> list[int]:
    """Validate the shapes of target_probs [m + 1, V] and draft_probs [m, V] (or None) for m
    checked draft tokens, and that the tokens lie in the vocabulary; return them as a list."""
    m = tokens.numel()
    size = names.size
    if not isinstance(target_probs, torch.Tensor) or target_probs.dim() != 2:
        raise ValueError(f"target_probs must be a 2-D tensor [{size} + 1, V]; got {describe(target_probs)}")
    if target_probs.shape[0] != m + 1:
        raise ValueError(
            f"target_probs must have {size} + 1 = {m + 1} rows for {size} = {m} {names.rows_note}; "
            f"got shape {tuple(target_probs.shape)}"
        )
    vocab = target_probs.shape[1]
    if vocab == 0:
        raise ValueError("target_probs has an empty vocabulary dimension (V = 0)")
    if draft_probs is not None and (
        not isinstance(draft_probs, torch.Tensor) or tuple(draft_probs.shape) != (m, vocab)
    ):
        got = tuple(draft_probs.shape) if isinstance(draft_probs, torch.Tensor) else type(draft_probs).__name__
        raise ValueError(
            f"draft_probs must have shape [{size}, V] = [{m}, {vocab}] ({names.draft_note}), "
            f"or be None for point masses; got {got}"
        )
    token_list = tokens.tolist()
    if not all(0 <= x < vocab for x in token_list):
        raise ValueError(f"{names.tokens} must lie in [0, V) = [0, {vocab}); got {token_list}")
    return token_list


def check_inputs(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
) -> list[int]:
    """Validate a chain step's shapes (cheaply) and return the draft tokens as a list."""
    check_tokens(draft_tokens)
    return check_probs(draft_tokens, draft_probs, target_probs)


def float64_rows(probs: torch.Tensor, name: str) -> tuple[torch.Tensor, list[float]]:
    """A float64 copy of probs and its row sums. Rows are not normalized here (that would
    cost a pass over [rows, V]): callers fold 1 / sum into the scalars and scales they use."""
    rows = probs.detach().to(torch.float64, copy=True)  # [m, V]
    sums = rows.sum(dim=1).tolist()
    if rows.numel() and (not all(0.0 < s < math.inf for s in sums) or float(rows.min()) < 0.0):
        raise ValueError(f"{name} must hold probabilities: finite, non-negative, every row with positive mass")
    return rows, sums


def clipped_ratio(num: float, den: float) -> float:
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

    @classmethod
    def of(cls, position_probs: list[float], num_accepted_probs: list[float],
           next_token_weights: torch.Tensor) -> VerificationPlan:
        """A plan from its probabilities as lists (made float64 tensors)."""
        return cls(torch.tensor(position_probs, dtype=torch.float64),
                   torch.tensor(num_accepted_probs, dtype=torch.float64), next_token_weights)

    @property
    def next_token_dists(self) -> torch.Tensor:  # [k + 1, V]
        return self.next_token_weights / self.next_token_weights.sum(dim=1, keepdim=True)

    @property
    def expected_tokens(self) -> float:
        """E[tokens committed per step] = E[accepted] + 1 (the acceptance length)."""
        return 1.0 + sum(j * p for j, p in enumerate(self.num_accepted_probs.tolist()))


@dataclass(frozen=True)
class Step:
    """One chain step's inputs in float64, shared by the token-level and block plans."""

    tokens: list[int]  # x_1..x_k
    index: torch.Tensor  # [k, 1] long, the draft tokens as a gather/scatter index
    target_probs: torch.Tensor  # [k + 1, V] as given (target below is overwritten in place)
    target: torch.Tensor  # [k + 1, V] float64 copy of target_probs, unnormalized
    target_sums: list[float]  # [k + 1]
    draft: torch.Tensor | None  # [k, V] float64 copy of draft_probs, unnormalized; None: point masses
    draft_sums: list[float]  # [k] (1 for point masses)
    target_at_draft: list[float]  # t_i(x_i), i = 1..k, normalized
    draft_at_draft: list[float]  # d_i(x_i), i = 1..k, normalized (1 for point masses)


def prepare_step(
    draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor
) -> Step:
    """Check a chain step's inputs and take their float64 copies."""
    tokens = check_inputs(draft_tokens, draft_probs, target_probs)
    k = len(tokens)
    target, target_sums = float64_rows(target_probs, "target_probs")
    index = draft_tokens.long().reshape(k, 1).to(target.device)
    t_x = [t / s for t, s in zip(target[:k].gather(1, index).flatten().tolist(), target_sums)]
    if draft_probs is None:
        draft, draft_sums, d_x = None, [1.0] * k, [1.0] * k
    else:
        draft, draft_sums = float64_rows(draft_probs, "draft_probs")
        d_x = [d / s for d, s in zip(draft.gather(1, index).flatten().tolist(), draft_sums)]
    return Step(tokens, index, target_probs.detach(), target, target_sums, draft, draft_sums, t_x, d_x)


def residuals_in_place(step: Step, weights: list[float]) -> list[float]:
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


def draw(
    step: Step,
    plan: VerificationPlan,
    generator: torch.Generator | None,
    num_accepted: Callable[[list[float], list[float]], int],
) -> VerifyResult:
    """Draw one uniform per draft position, then the accepted prefix's length from them
    (num_accepted(uniforms, plan.position_probs)), then the recovered or bonus token."""
    uniforms = torch.rand(len(step.tokens), generator=generator, dtype=torch.float64).tolist()
    accepted = num_accepted(uniforms, plan.position_probs.tolist())
    next_token = sample(plan.next_token_weights[accepted], generator)
    return VerifyResult(
        tokens=step.tokens[:accepted] + [next_token], num_accepted=accepted, num_proposed=len(step.tokens)
    )
