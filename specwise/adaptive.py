"""Adaptive block size: pick k each step to maximize expected tokens per second.

The rule (docs/DESIGN.md, "Cost model"; the estimates are specwise.estimators'):
- α is estimated online from the verifier's decisions: a step that proposed k
  tokens and accepted a of them observed a successes in a + [a < k] Bernoulli
  trials (acceptance stops at the first rejection). Counts decay by `decay`
  per step, so the estimate follows the text as it changes; a weak prior of
  one success in two trials keeps it off 0 and 1.
- costs are measured online too: the drafter's seconds per draft token, and
  the target's seconds per scoring pass as a straight line in the block size,
  T(n) = a + b·n, fitted by decayed least squares over the steps seen (on a
  memory-bound machine b ≈ 0; on a compute-bound CPU b is a large part of a).
  A measured table of T(n) (`specwise bench cost`) can be given instead.
- k = argmax over {0} ∪ [k_min, k_max] of E[τ] / (k · draft_cost + T(k + 1)),
  with E[τ] = (1 − α^(k+1)) / (1 − α) (docs/DESIGN.md, "Cost model"). k = 0 means
  plain decoding: drafting does not pay. Then one step in `probe_every` still
  drafts k_min tokens, so that α keeps being measured and drafting resumes when
  the text becomes predictable. For a drafter whose drafts are point masses and
  cost next to nothing (n-gram, suffix), plain steps measure α for free instead:
  the engine asks it for a one-token *shadow draft* that the target never
  scores, and the draft would have been accepted exactly when it equals the token
  the step committed (a point mass is accepted with the probability that plain
  decoding draws that token, greedy or sampled). Then no step drafts only to
  measure, and drafting where it does not pay costs nothing after the first steps.
The first two steps try the configured k, then 0, so that the cost
line is fitted over two block sizes from the start (not k_max: where T(n) is
steep, one step at k_max costs several plain steps). With a measured table of
the target's T(n) as a prior (`target_prior`, from `specwise bench cost`; the
engine finds it by model, dtype, threads and runner) the line starts from two
points of that table, worth one step each, and only the configured k is tried
first: the online measurements then take over as they accumulate, one plain
step in `probe_every` keeping two block sizes in them.
With shadow drafts the rule starts plain instead, and α low (SHADOW_START):
measuring costs nothing, so drafting waits until the shadows show the
drafter agreeing with the text. A short answer that a drafter
cannot predict (a fact, a translation) is then never slowed by drafts that fail.
Until the line has seen two block sizes, an extra row is taken to cost
UNMEASURED_ROW_SHARE of a one-token pass, not nothing.

A drafter that copies what followed an earlier occurrence of the context's end (n-gram,
suffix: `RetrievalDrafter`) says before each step how long that match is, and the match
says how far to trust the copy: over plain outputs of the six Spec-Bench tasks, the n-gram
drafter's first token was right 21 % of the time after a one-token match, 54 % after two,
59 % after three and 85 % after four, and once the first was right, the next ones 61-92 %.
For such a drafter (`by_match`) the rule keeps, per match-length bucket (`match_bucket`),
the first token's acceptance and the later tokens' apart, and chooses each step's k from
the bucket of that step's match with E[τ] = 1 + α₁ (1 − α₂^k) / (1 − α₂): a one-token
match then drafts nothing where an extra row costs more than a fifth of a pass, and a long
one drafts far.
"""

from __future__ import annotations

from collections.abc import Callable

from specwise.estimators import (DECAY, AcceptanceRate, DecayedRate, LinearCost, expected_acceptance_length,
                                 expected_acceptance_length_split)

# α where shadow drafts measure it: it starts at no success in two trials, which fades with the evidence, and
# half a success in one trial that stays (it keeps α off 0 and 1): 0.17 at the start, below the share of a pass
# that an extra row costs on our CPUs.
SHADOW_START, SHADOW_PRIOR = (0.0, 2.0), (0.5, 1.0)
# Until the cost line has two block sizes, an extra row costs this share of a one-token pass (CPUs:
# 0.15-0.3, docs/DESIGN.md "Cost model"); the first drafting step then measures it.
UNMEASURED_ROW_SHARE = 0.25


def best_block_size(alpha: float, k_min: int, k_max: int, draft_cost: float,
                    target_cost: Callable[[int], float], later: float | None = None) -> int:
    """The k in {0} ∪ [k_min, k_max] with the highest expected tokens per second (0: plain decoding);
    `later`: the later draft tokens' own acceptance (None: alpha, like the first's)."""
    def rate(k: int) -> float:
        tau = (expected_acceptance_length(alpha, k) if later is None
               else expected_acceptance_length_split(alpha, later, k))
        return tau / (k * draft_cost + target_cost(k + 1))
    return max([0] + list(range(k_min, k_max + 1)), key=rate)


def match_bucket(match: int) -> int:
    """The bucket of a retrieval drafter's match length: 0-3 apart, then 4-7 and 8 or more."""
    return match if match < 4 else 4 if match < 8 else 5


class MatchAcceptance:
    """One match bucket's acceptance: of the first draft token, and of each later one given the
    ones before it were accepted."""

    def __init__(self, decay: float, shadows: bool) -> None:
        self.first = (AcceptanceRate(decay, start=SHADOW_START, prior=SHADOW_PRIOR) if shadows
                      else AcceptanceRate(decay))
        self.later = AcceptanceRate(decay)

    def observe(self, proposed: int, accepted: int) -> None:
        self.first.observe(min(proposed, 1), min(accepted, 1))
        if accepted >= 1:
            self.later.observe(proposed - 1, accepted - 1)


class AdaptiveBlockSize:
    """Online estimate of α and costs; proposes the next k."""

    def __init__(self, k: int, k_min: int, k_max: int, decay: float = DECAY,
                 target_cost: Callable[[int], float] | None = None, probe_every: int = 8,
                 target_prior: Callable[[int], float] | None = None, shadow_drafts: bool = False,
                 by_match: bool = False) -> None:
        self.k_min, self.k_max = k_min, k_max
        self.decay = decay
        self.by_match = by_match  # next_k is given the drafter's match length (see the module docstring)
        self.matches: dict[int, MatchAcceptance] = {}  # by match_bucket
        self._bucket: MatchAcceptance | None = None  # the bucket of the step under way (by_match)
        self.k = min(max(k, k_min), k_max)
        self.probe_every = probe_every
        self.steps_without_drafting = 0  # steps where the rule chose plain decoding
        self.shadow_trials = 0  # plain steps whose shadow draft was counted
        self._shadows = shadow_drafts  # the drafter can give them (FreeDrafter), until they turn out not free
        self._since_probe = 0
        self._steps = 0
        self.acceptance = (AcceptanceRate(decay, start=SHADOW_START, prior=SHADOW_PRIOR) if shadow_drafts
                           else AcceptanceRate(decay))
        self._draft_cost = DecayedRate(decay)  # seconds per draft token
        self._shadow_cost = DecayedRate(decay)  # seconds per shadow draft
        self._fixed_target_cost = target_cost
        self.prior_used = target_prior is not None and target_cost is None
        # The steps before k follows the estimates (see the module docstring).
        self._warmup = [0] if shadow_drafts else [self.k] if self.prior_used else [self.k, 0]
        self._line = LinearCost(decay)  # the target's seconds per scoring pass
        if self.prior_used:
            self._line = LinearCost.through(((n, target_prior(n)) for n in (1, k_max + 1)), decay=decay)

    @property
    def alpha(self) -> float:
        return self.acceptance.value

    def target_cost(self, n: int) -> float:
        """Estimated seconds for the target to score n tokens."""
        if self._fixed_target_cost is not None:
            return self._fixed_target_cost(n)
        if self._line.sizes_seen < 2:
            return self._line(1) * (1 + UNMEASURED_ROW_SHARE * (n - 1))
        return self._line(n)

    @property
    def draft_cost(self) -> float:
        return self._draft_cost.value

    def bucket(self, match: int) -> MatchAcceptance:
        """The acceptance of a match length's bucket (made on first use)."""
        key = match_bucket(match)
        if key not in self.matches:
            self.matches[key] = MatchAcceptance(self.decay, self._shadows)
        return self.matches[key]

    def observe(self, proposed: int, accepted: int, draft_seconds: float, score_seconds: float) -> None:
        self._line.add(proposed + 1, score_seconds)
        if proposed:
            self.acceptance.observe(proposed, accepted)
            self._draft_cost.add(draft_seconds, proposed)
            if self._bucket is not None:
                self._bucket.observe(proposed, accepted)
        self._steps += 1
        self._choose()

    def _choose(self) -> None:
        """After the warm-up, k follows the current estimates (by_match: next_k chooses from its bucket's)."""
        if self._steps >= len(self._warmup) and not self.by_match:
            self.k = best_block_size(self.alpha, self.k_min, self.k_max, self.draft_cost, self.target_cost)

    # A shadow draft is free when it costs at most this share of a one-token target pass.
    SHADOW_SHARE = 0.02

    @property
    def shadows(self) -> bool:
        """Whether the engine should ask for a shadow draft in plain steps (see the module docstring)."""
        return self._shadows

    def observe_shadow(self, draft_token: int | None, committed_token: int, seconds: float,
                       point_mass: bool = True) -> None:
        """A plain step's shadow draft: the drafter's first token (None: it proposed nothing, no trial),
        the token the step committed, and the seconds the draft took. A draft that is not a point mass, or
        that costs more than SHADOW_SHARE of a target pass, ends shadow drafts: probes measure α again."""
        self._shadow_cost.add(seconds)
        # A mean over a few calls: a suffix drafter's first call also indexes the prompt.
        costly = (self._shadow_cost.denominator >= 2.5
                  and self._shadow_cost.value > self.SHADOW_SHARE * self.target_cost(1))
        if not point_mass or costly:
            self._shadows = False
            return
        if draft_token is None:
            return
        self.acceptance.add(draft_token == committed_token, 1)
        if self._bucket is not None:
            self._bucket.first.add(draft_token == committed_token, 1)
        self.shadow_trials += 1
        self._choose()

    def next_k(self, match: int | None = None) -> int:
        """The next step's k; `match`: the drafter's match length for that step's context (by_match)."""
        self._bucket = self.bucket(match) if self.by_match and match is not None else None
        if self._steps < len(self._warmup):
            return self._warmup[self._steps]
        if self._bucket is not None:
            k = best_block_size(self._bucket.first.value, self.k_min, self.k_max, self.draft_cost,
                                self.target_cost, later=self._bucket.later.value)
        elif self.by_match:  # no match length given: the pooled estimate
            k = best_block_size(self.alpha, self.k_min, self.k_max, self.draft_cost, self.target_cost)
        else:
            k = self.k
        if k == 0:
            self._since_probe += 1
            if self._since_probe >= self.probe_every and not self._shadows:
                self._since_probe = 0
                return self.k_min  # keep measuring α while not drafting
            self.steps_without_drafting += 1
        elif self.prior_used:
            # Steps at one block size cannot tell the line's slope from its height: with no probing
            # warm-up, one plain step in probe_every keeps the measured line honest (a stale prior
            # would otherwise hold k where it is).
            self._since_probe += 1
            if self._since_probe >= self.probe_every:
                self._since_probe = 0
                return 0
        return k
