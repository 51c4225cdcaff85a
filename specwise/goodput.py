"""The goodput rule: each batched request's draft length, chosen for the most tokens per second in total.

In a batched pass every draft row of one request competes with the rows of the
others: it costs the pass time whether or not it is accepted. With per-token
acceptance a_i, a request drafting k_i tokens commits on average

    E_i(k_i) = 1 + a_i + ... + a_i^k_i = (1 - a_i^(k_i + 1)) / (1 - a_i)

tokens per step, and the step costs T(rows) with rows = sum(k_i + 1), plus each
request's drafting time. A drafter may also propose nothing (an n-gram drafter
without a match): with q_i the share of steps where it proposes, a cap of k_i
gives 1 + q_i (E_i(k_i) - 1) tokens for 1 + q_i k_i rows. The planner picks the
caps k_i (0 allowed) that maximise

    goodput = sum tokens_i(k_i) / (T(rows) + sum draft_i(k_i))

greedily: starting from k = 0 for all, it adds the one draft token that raises
goodput most until none does (E_i is concave in k_i, so the greedy choice is
near the optimum). This is the rule of SmartSpec (Liu et al., arXiv 2406.14066).

T(rows) is fitted, a + b * rows, to the batcher's own recent passes; until it
has seen two different row counts it uses a prior T(n) (the target's measured
cost from `specwise bench cost`) when given one, else it plans nothing and each
request keeps its own k. It plans nothing either for a request alone in its batch
(nothing competes with its rows: its own adaptive or fixed k stands, as without
batching) or for one it has not yet seen propose a few times; a request planned
to draft nothing is given one draft token now and then, so that its acceptance
is measured again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from specwise.estimators import WEAK_PRIOR, AcceptanceRate, DecayedRate, LinearCost, expected_acceptance_length

_WINDOW = 64  # recent passes the cost fit reads
_WARMUP = 3  # proposing steps seen before a request is planned
_PROBE_EVERY = 16  # steps between single-token probes of a request planned to draft nothing


def _acceptance() -> AcceptanceRate:
    # A new request starts at the weak prior, which fades as its own steps come in; the ceiling
    # keeps a request that has accepted everything so far from counting as certain to go on.
    return AcceptanceRate(start=WEAK_PRIOR, prior=(0.0, 0.0), ceiling=0.999)


@dataclass
class _Member:
    k_max: int | None = None  # the most this request may draft (None: not planned)
    acceptance: AcceptanceRate = field(default_factory=_acceptance)
    draft_cost: DecayedRate = field(default_factory=lambda: DecayedRate.mean(0.0))  # seconds per draft token
    proposing: DecayedRate = field(default_factory=lambda: DecayedRate.mean(1.0))  # share of steps that propose
    proposals_seen: int = 0
    since_probe: int = 0

    def tokens(self, k: int) -> float:
        return 1 + self.proposing.value * (expected_acceptance_length(self.acceptance.value, k) - 1)

    def rows(self, k: int) -> float:
        return 1 + self.proposing.value * k


class GoodputPlanner:
    """Per-member draft lengths for the next round, from the measured pass cost and each one's acceptance."""

    def __init__(self, prior: Callable[[int], float] | None = None) -> None:
        self.prior = prior  # rows -> seconds, or None
        self._members: dict[Hashable, _Member] = {}
        # noise must not make rows look free or negative: a floor on the slope and the base
        self._passes = LinearCost(window=_WINDOW, min_slope=1e-6, min_base=0.0)
        self._lock = threading.Lock()
        self._stale = True
        self.last_plan: dict[Hashable, int] = {}

    def join(self, member: Hashable) -> None:
        with self._lock:
            self._members[member] = _Member()
            self._stale = True

    def leave(self, member: Hashable) -> None:
        with self._lock:
            self._members.pop(member, None)
            self.last_plan.pop(member, None)
            self._stale = True

    def limit(self, member: Hashable, k_max: int | None) -> None:
        """The most this member may draft (its own k); None: it is not planned (trees, or no drafter)."""
        with self._lock:
            if member in self._members and self._members[member].k_max != k_max:
                self._members[member].k_max = k_max
                self._stale = True

    def observe(self, member: Hashable, proposed: int, accepted: int, draft_seconds: float = 0.0) -> None:
        """A step of this member: `accepted` of `proposed` draft tokens kept, drafting took draft_seconds."""
        with self._lock:
            state = self._members.get(member)
            if state is None:
                return
            state.since_probe += 1
            planned = self.last_plan.get(member)
            if planned != 0 or proposed > 0:  # a step that could propose: did it?
                state.proposing.add(proposed > 0)
            self._stale = True
            if proposed <= 0:
                return
            state.proposals_seen += 1
            state.since_probe = 0
            state.acceptance.observe(proposed, accepted)
            state.draft_cost.add(draft_seconds / proposed)

    def observe_pass(self, rows: int, seconds: float) -> None:
        with self._lock:
            self._passes.add(rows, seconds)
            self._stale = True

    def cost(self) -> Callable[[int], float] | None:
        """T(rows) from the recent passes (least squares a + b * rows), else the prior, else None."""
        with self._lock:
            return self._cost()

    def _cost(self) -> Callable[[int], float] | None:
        if self._passes.sizes_seen >= 2:
            base, slope = self._passes.line()
            return lambda rows: base + slope * rows
        return self.prior

    def planned_k(self, member: Hashable) -> int | None:
        """This member's draft length for its next block, or None where nothing is planned."""
        with self._lock:
            if self._stale:
                self._plan()
            k = self.last_plan.get(member)
            state = self._members.get(member)
            if k == 0 and state is not None and state.since_probe >= _PROBE_EVERY:
                state.since_probe = 0
                return 1  # measure its drafts again: they may have become good
            return k

    def _plan(self) -> None:
        self._stale = False
        cost = self._cost()
        planned = {m: s for m, s in self._members.items()
                   if s.k_max is not None and s.proposals_seen >= _WARMUP}
        if cost is None or not planned or len(self._members) < 2:
            self.last_plan = {}
            return
        ks = {m: 0 for m in planned}
        others = len(self._members) - len(planned)  # unplanned members: a row each at least

        def goodput(extra: dict) -> float:
            rows = others + sum(planned[m].rows(k) for m, k in extra.items())
            tokens = others + sum(planned[m].tokens(k) for m, k in extra.items())
            drafting = sum(planned[m].draft_cost.value * k for m, k in extra.items())
            return tokens / max(cost(rows) + drafting, 1e-9)

        best = goodput(ks)
        while True:
            choice, choice_value = None, best
            for m, k in ks.items():
                if k >= planned[m].k_max:
                    continue
                ks[m] = k + 1
                value = goodput(ks)
                ks[m] = k
                if value > choice_value:
                    choice, choice_value = m, value
            if choice is None:
                break
            ks[choice] += 1
            best = choice_value
        self.last_plan = ks

    def snapshot(self) -> dict[str, float]:
        """For /metrics: members planned, their mean planned k and mean acceptance."""
        with self._lock:
            plan = dict(self.last_plan)
            acceptance = [s.acceptance.value for s in self._members.values() if s.k_max is not None]
        return {
            "planned_members": float(len(plan)),
            "mean_planned_k": sum(plan.values()) / len(plan) if plan else 0.0,
            "mean_acceptance": sum(acceptance) / len(acceptance) if acceptance else 0.0,
        }
