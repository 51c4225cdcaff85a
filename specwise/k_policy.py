"""How many tokens a chain step drafts: one k policy per generation, fixed, adaptive or planned.

The engine chooses the policy when a generation starts (`choose_k_policy`, which also
settles SpecConfig.adaptive "auto" for the generation's sampling settings), asks it for
each step's k (`next_k`) and tells it how the step went (`observe`, before the step's
tokens join the context). The policy is the only place that knows why k is what it is:

- `FixedK`: SpecConfig.k, every step;
- `AdaptiveK`: the rule of specwise.adaptive over the measured acceptance and costs; in a
  plain step (k = 0) it asks a free drafter for a one-token shadow draft that the target
  never scores, so that acceptance keeps being measured without drafting;
- `PlannedK`: a batched sequence (specwise.batching) whose batch plans its k for the most
  tokens per second over all its sequences (specwise.goodput); where the batch plans
  nothing yet, the sequence's own fixed or adaptive k stands.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from specwise.adaptive import AdaptiveBlockSize
from specwise.config import SamplingParams, SpecConfig
from specwise.drafters.base import Drafter, FreeDrafter, RetrievalDrafter
from specwise.stats import PhaseClock
from specwise.runners.protocols import ModelRunner, PlannedRunner


@dataclass(frozen=True)
class StepOutcome:
    """What a k policy learns from one chain step."""

    k: int  # the draft length asked for (0: a plain step)
    proposed: int  # draft tokens the drafter gave, at most k
    accepted: int  # of those, kept by the verifier
    committed: int  # the step's first committed token
    draft_seconds: float
    score_seconds: float


class KPolicy(Protocol):
    def next_k(self, context: Sequence[int]) -> int:
        """The draft length for the next step from `context` (the engine caps it by the room left)."""

    def observe(self, context: Sequence[int], step: StepOutcome) -> None:
        """How the step went; context is as the step proposed from (its tokens not yet appended)."""


class FixedK:
    def __init__(self, k: int) -> None:
        self.k = k

    def next_k(self, context: Sequence[int]) -> int:
        return self.k

    def observe(self, context: Sequence[int], step: StepOutcome) -> None:
        pass


class AdaptiveK:
    """specwise.adaptive's rule, fed each step's measurements and, in plain steps, shadow drafts
    (their time is drafting time); for a retrieval drafter, also each step's match length (its
    lookup is drafting time too)."""

    def __init__(self, rule: AdaptiveBlockSize, drafter: Drafter, clock: PhaseClock) -> None:
        self.rule, self.drafter, self.clock = rule, drafter, clock

    def next_k(self, context: Sequence[int]) -> int:
        if not self.rule.by_match:
            return self.rule.next_k()
        with self.clock("draft"):
            match = self.drafter.match_length(context)  # type: ignore[attr-defined]
        return self.rule.next_k(match)

    def observe(self, context: Sequence[int], step: StepOutcome) -> None:
        self.rule.observe(step.proposed, step.accepted, step.draft_seconds, step.score_seconds)
        if step.k == 0 and self.rule.shadows:
            with self.clock("draft"):
                shadow = self.drafter.propose(context, 1)
            guess = int(shadow.tokens[0]) if len(shadow) else None
            self.rule.observe_shadow(guess, step.committed, self.clock.last["draft"],
                                     point_mass=shadow.probs is None)


class PlannedK:
    """The batch's plan where it has one, else the sequence's own policy; both observe every step."""

    def __init__(self, own: KPolicy, batch: PlannedRunner) -> None:
        self.own, self.batch = own, batch

    def next_k(self, context: Sequence[int]) -> int:
        k = self.own.next_k(context)  # asked every step: an adaptive rule counts its plain steps and probes
        planned = self.batch.planned_k()
        return k if planned is None else planned

    def observe(self, context: Sequence[int], step: StepOutcome) -> None:
        self.own.observe(context, step)
        self.batch.observe(step.proposed, step.accepted, step.draft_seconds)


def choose_k_policy(spec: SpecConfig, sampling: SamplingParams, drafter: Drafter, target: ModelRunner,
                    clock: PhaseClock, target_prior: Callable[[], Callable[[int], float] | None] | None = None,
                    verifier: str | None = None) -> KPolicy:
    """The policy of one chain generation. target_prior: gives the target's measured T(n), where
    adaptive k starts from one (specwise.cost_model), or None; asked only where k is adaptive.
    verifier: the rule the generation verifies with (None: the one the spec resolves to)."""
    verifier = verifier or spec.resolve_verifier(sampling)
    # "auto": fixed k for a seeded sampled request, unless coupled verification makes k change no token
    adaptive = spec.resolve_adaptive(sampling, verifier)
    own: KPolicy = FixedK(spec.k)
    if adaptive:
        free = isinstance(drafter, FreeDrafter) and bool(drafter.free_drafts)
        prior = target_prior() if target_prior is not None else None
        rule = AdaptiveBlockSize(spec.k, spec.k_min, spec.k_max, target_prior=prior, shadow_drafts=free,
                                 by_match=spec.k_by_match and free and isinstance(drafter, RetrievalDrafter))
        own = AdaptiveK(rule, drafter, clock)
    if not isinstance(target, PlannedRunner):
        return own
    # The batch plans k only where k changes no output: greedy or coupled verification (their tokens are
    # plain decoding's whatever k is), or adaptive k (it follows timings anyway); a seeded sampled request
    # verified otherwise with a fixed k draws the same random numbers whatever runs beside it, so it
    # repeats exactly.
    plannable = drafter.name != "none" and (sampling.greedy or verifier == "coupled" or adaptive)
    target.limit((spec.k_max if adaptive else spec.k) if plannable else None)
    return PlannedK(own, target) if plannable else own
