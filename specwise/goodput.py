"""The goodput rule: each batched request's draft length, chosen for the most tokens per second in total.

In a batched pass every draft row of one request competes with the rows of the
others: it costs the pass time whether or not it is accepted. With per-token
acceptance a_i, a request drafting k_i tokens commits on average

    E_i(k_i) = 1 + a_i + ... + a_i^k_i = (1 - a_i^(k_i + 1)) / (1 - a_i)

tokens per step, and the step costs T(rows) with rows = sum(k_i + 1), plus each
request's drafting time. The planner picks the k_i (0 allowed) that maximise

    goodput = sum E_i(k_i) / (T(rows) + sum draft_i(k_i))

greedily: starting from k = 0 for all, it adds the one draft token that raises
goodput most until none does (E_i is concave in k_i, so the greedy choice is
near the optimum). This is the rule of SmartSpec (Liu et al., arXiv 2406.14066).

T(rows) is fitted, a + b * rows, to the batcher's own recent passes; until it
has seen two different row counts it uses a prior T(n) (the target's measured
cost from `specwise bench cost`) when given one, else it plans nothing and each
request keeps its own k.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

_DECAY = 0.9  # weight of the past in each request's acceptance and drafting cost
_PRIOR_ACCEPTANCE = (1.0, 2.0)  # (accepted, reached): a new request starts at a = 0.5
_WINDOW = 64  # recent passes the cost fit reads


@dataclass
class _Member:
    k_max: int | None = None  # the most this request may draft (None: not planned)
    accepted: float = _PRIOR_ACCEPTANCE[0]
    reached: float = _PRIOR_ACCEPTANCE[1]
    draft_seconds_per_token: float = 0.0
    planned: int | None = None

    @property
    def acceptance(self) -> float:
        return min(self.accepted / self.reached, 0.999)


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a step commits on average when each draft token is accepted with this probability."""
    return (1 - acceptance ** (k + 1)) / (1 - acceptance)


class GoodputPlanner:
    """Per-member draft lengths for the next round, from the measured pass cost and each one's acceptance."""

    def __init__(self, prior: Callable[[int], float] | None = None) -> None:
        self.prior = prior  # rows -> seconds, or None
        self._members: dict[Hashable, _Member] = {}
        self._passes: deque[tuple[int, float]] = deque(maxlen=_WINDOW)
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
            if state is None or proposed <= 0:
                return
            # Positions reached: every accepted one, plus the first rejected one if any.
            reached = accepted + (1 if accepted < proposed else 0)
            state.accepted = _DECAY * state.accepted + accepted
            state.reached = _DECAY * state.reached + reached
            per_token = draft_seconds / proposed
            state.draft_seconds_per_token = _DECAY * state.draft_seconds_per_token + (1 - _DECAY) * per_token
            self._stale = True

    def observe_pass(self, rows: int, seconds: float) -> None:
        with self._lock:
            self._passes.append((rows, seconds))
            self._stale = True

    def cost(self) -> Callable[[int], float] | None:
        """T(rows) from the recent passes (least squares a + b * rows), else the prior, else None."""
        with self._lock:
            return self._cost()

    def _cost(self) -> Callable[[int], float] | None:
        if len({rows for rows, _ in self._passes}) >= 2:
            n = len(self._passes)
            mean_r = sum(r for r, _ in self._passes) / n
            mean_t = sum(t for _, t in self._passes) / n
            var = sum((r - mean_r) ** 2 for r, _ in self._passes)
            slope = sum((r - mean_r) * (t - mean_t) for r, t in self._passes) / var
            slope = max(slope, 1e-6)  # noise must not make rows look free or negative
            base = max(mean_t - slope * mean_r, 0.0)
            return lambda rows: base + slope * rows
        return self.prior

    def planned_k(self, member: Hashable) -> int | None:
        """This member's draft length for its next block, or None where nothing is planned."""
        with self._lock:
            if self._stale:
                self._plan()
            return self.last_plan.get(member)

    def _plan(self) -> None:
        self._stale = False
        cost = self._cost()
        planned = {m: s for m, s in self._members.items() if s.k_max is not None}
        if cost is None or not planned:
            self.last_plan = {}
            return
        ks = {m: 0 for m in planned}
        fixed_rows = len(self._members)  # every member's last token

        def goodput(extra: dict) -> float:
            rows = fixed_rows + sum(extra.values())
            tokens = sum(expected_tokens(planned[m].acceptance, k) for m, k in extra.items())
            drafting = sum(planned[m].draft_seconds_per_token * k for m, k in extra.items())
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
            acceptance = [s.acceptance for s in self._members.values() if s.k_max is not None]
        return {
            "planned_members": float(len(plan)),
            "mean_planned_k": sum(plan.values()) / len(plan) if plan else 0.0,
            "mean_acceptance": sum(acceptance) / len(acceptance) if acceptance else 0.0,
        }
