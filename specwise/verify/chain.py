"""What token-level and block verification share: a chain step's float64 inputs, the residual
rows its recovered token is drawn from, its plan, and how a rule runs (`ChainRule`).

A chain rule is two functions of a step, and both the plan and the verifier run them:
`position_probs` gives what each draft position's uniform is compared against ([k]) and leaves
the recovered tokens' weights in the step's first k target rows; `num_accepted` maps acceptance
at each position ([k]) to P(exactly j draft tokens accepted) ([k + 1]). Given the probabilities
it gives the plan; given the 0/1 decisions u_i < position_probs[i] it gives a one-hot vector at
the number the verifier accepts. Exact enumeration of the plan thus proves the verifier's own
arithmetic.

Everything runs on the probabilities' device, in float64, with every position at once where
the rule allows. The uniforms come from the caller's CPU generator, k for the positions and
then one for the committed token, and travel to the device with the work; the step ends with
one host synchronisation (the number accepted, the committed token, and whether the inputs
were probabilities). On a GPU the row sums over the vocabulary are reduced in another order
than on the CPU: the plans then agree to float64 rounding, and a decision can differ only where
a uniform falls within that rounding of its threshold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specwise.verify.common import (NextTokenRows, check_inputs, check_probabilities, float64_rows, read_back,
                                    sample_row, send_indices, step_uniforms)
from specwise.verify.result import VerifyResult

@dataclass(frozen=True)
class VerificationPlan(NextTokenRows):
    """The probabilities of one chain verification step; sampling draws from nothing else.

    position_probs: [k] what each draft position's uniform is compared against
        (token-level: accept x_i given x_1..x_{i-1} were accepted; block: h_i).
    num_accepted_probs: [k + 1] P(exactly j draft tokens are accepted), j = 0..k.
    next_token_weights: [k + 1, V] row j is proportional to the distribution of the token
        committed after j accepted ones: the recovered token for j < k, the bonus for
        j == k. Left unnormalized (every row has positive mass) because sampling does
        not need it; `next_token_dists` normalizes.
    All float64, on the device of target_probs.
    """

    position_probs: torch.Tensor  # [k]
    num_accepted_probs: torch.Tensor  # [k + 1]
    next_token_weights: torch.Tensor  # [k + 1, V]

    @property
    def expected_tokens(self) -> float:
        """E[tokens committed per step] = E[accepted] + 1 (the acceptance length)."""
        return 1.0 + sum(j * p for j, p in enumerate(self.num_accepted_probs.tolist()))


@dataclass(frozen=True)
class ChainStep:
    """One chain step's inputs in float64 on the device of target_probs."""

    tokens: list[int]  # x_1..x_k
    index: torch.Tensor  # [k, 1] long, the draft tokens as a gather/scatter index
    target_probs: torch.Tensor  # [k + 1, V] as given (target below is overwritten in place)
    target: torch.Tensor  # [k + 1, V] float64 copy of target_probs, unnormalized
    target_sums: torch.Tensor  # [k + 1]
    draft: torch.Tensor | None  # [k, V] float64 copy of draft_probs, unnormalized; None: point masses
    draft_sums: torch.Tensor  # [k] (ones for point masses)
    target_at_draft: torch.Tensor  # [k] t_i(x_i), normalized
    draft_at_draft: torch.Tensor  # [k] d_i(x_i), normalized (ones for point masses)
    target_valid: torch.Tensor  # [] bool: target_probs held probabilities
    draft_valid: torch.Tensor  # [] bool: draft_probs held probabilities (true for point masses)


def prepare_step(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                 target_probs: torch.Tensor) -> ChainStep:
    """Check a chain step's shapes and take float64 copies of its probabilities."""
    tokens = check_inputs(draft_tokens, draft_probs, target_probs)
    k, device = len(tokens), target_probs.device
    target = float64_rows(target_probs, device)
    index = send_indices(device, tokens)[0].reshape(k, 1)  # [k, 1]
    t_x = target.rows[:k].gather(1, index).flatten() / target.sums[:k]
    if draft_probs is None:
        ones = torch.ones(k, dtype=torch.float64, device=device)
        draft, draft_sums, d_x = None, ones, ones
        draft_valid = torch.ones((), dtype=torch.bool, device=device)
    else:
        copy = float64_rows(draft_probs, device)
        draft, draft_sums, draft_valid = copy.rows, copy.sums, copy.valid
        d_x = draft.gather(1, index).flatten() / draft_sums
    return ChainStep(tokens, index, target_probs.detach(), target.rows, target.sums, draft, draft_sums,
                     t_x, d_x, target.valid, draft_valid)


def residuals_in_place(step: ChainStep, weights: torch.Tensor) -> torch.Tensor:
    """Turn rows 0..k-1 of step.target (t_1..t_k) into max(w_i * t_i - d_i, 0), each up to a
    positive factor, and return their masses sum_y max(w_i * t_i(y) - d_i(y), 0) [k] with t_i
    and d_i normalized. weights: [k] w_i for those rows.

    A row of zero mass (t_i == d_i, reached with probability zero) falls back to t_i, so a
    sample is always defined.
    """
    k = len(step.tokens)
    rows = step.target[:k]  # [k, V]
    # Rows are scaled by the draft's row sum, so the draft is subtracted as given (no extra pass).
    rows.mul_((weights * step.draft_sums / step.target_sums[:k]).reshape(k, 1))
    if step.draft is None:
        rows.scatter_(1, step.index, rows.gather(1, step.index).sub_(1.0).clamp_min_(0.0))
    else:
        rows.sub_(step.draft).clamp_min_(0.0)
    masses = rows.sum(dim=1) / step.draft_sums  # [k]
    empty = (masses <= 0).reshape(k, 1)
    rows.copy_(torch.where(empty, step.target_probs[:k].to(torch.float64), rows))
    return masses


@dataclass(frozen=True)
class ChainRule:
    """A chain verification rule: what tells token-level and block verification apart.

    position_probs: step -> [k], filling step.target's first k rows with the recovered tokens'
        weights (row k stays the bonus row t_{k+1}).
    num_accepted: [k] acceptance at each position -> [k + 1] P(exactly j accepted).
    """

    position_probs: Callable[[ChainStep], torch.Tensor]
    num_accepted: Callable[[torch.Tensor], torch.Tensor]

    def plan(self, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
             target_probs: torch.Tensor) -> VerificationPlan:
        """The step's exact probabilities, from the arithmetic `verify` runs."""
        step = prepare_step(draft_tokens, draft_probs, target_probs)
        position = self.position_probs(step)  # [k]
        check_probabilities(*read_back(step.target_valid, step.draft_valid))
        return VerificationPlan(position, self.num_accepted(position), step.target)

    def verify(self, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
               generator: torch.Generator | None = None) -> VerifyResult:
        """The accepted prefix and a recovered or bonus token, with one host synchronisation."""
        step = prepare_step(draft_tokens, draft_probs, target_probs)
        k = len(step.tokens)
        position = self.position_probs(step)  # [k]
        draws = step_uniforms(k, generator, step.target.device)  # [k + 1]
        outcome = self.num_accepted((draws[:k] < position).to(torch.float64))  # [k + 1] one-hot at j
        accepted = outcome.argmax()
        token = sample_row(step.target.index_select(0, accepted.reshape(1))[0], draws[k])
        j, next_token, target_valid, draft_valid = read_back(accepted, token, step.target_valid, step.draft_valid)
        check_probabilities(target_valid, draft_valid)
        return VerifyResult(tokens=step.tokens[:j] + [next_token], num_accepted=j, num_proposed=k)
