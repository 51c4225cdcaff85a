"""Adaptive block size: pick k each step to maximize expected tokens per second.

The rule (documented in the README):
- α is estimated online from the verifier's decisions: a step that proposed k
  tokens and accepted a of them observed a successes in a + [a < k] Bernoulli
  trials (acceptance stops at the first rejection). Both counts decay by
  `decay` per step, so the estimate follows the text as it changes.
- costs are measured online too: the drafter's seconds per draft token and the
  target's seconds per scoring pass as a function of its size n = k + 1
  (a table of measured T(n) can be given instead).
- k = argmax over [k_min, k_max] of E[τ] / (k · draft_cost + T(k + 1)),
  with E[τ] = (1 − α^(k+1)) / (1 − α) (DESIGN.md, cost model).
Until a few steps have been seen, the configured k is used.
"""

from __future__ import annotations

from collections.abc import Callable


def expected_acceptance_length(alpha: float, k: int) -> float:
    """E[τ] for k draft tokens each accepted independently with probability α."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_block_size(alpha: float, k_min: int, k_max: int, draft_cost: float,
                    target_cost: Callable[[int], float]) -> int:
    """The k in [k_min, k_max] with the highest expected tokens per second."""
    def rate(k: int) -> float:
        return expected_acceptance_length(alpha, k) / (k * draft_cost + target_cost(k + 1))
    return max(range(k_min, k_max + 1), key=rate)


class AdaptiveBlockSize:
    """Online estimate of α and costs; proposes the next k."""

    def __init__(self, k: int, k_min: int, k_max: int, decay: float = 0.9,
                 warmup_steps: int = 3,
                 target_cost: Callable[[int], float] | None = None) -> None:
        self.k_min, self.k_max = k_min, k_max
        self.k = min(max(k, k_min), k_max)
        self.decay = decay
        self.warmup_steps = warmup_steps
        self._successes = 0.0
        self._trials = 0.0
        self._draft_seconds = 0.0
        self._draft_tokens = 0.0
        self._score_seconds = 0.0
        self._score_steps = 0.0
        self._steps = 0
        self._fixed_target_cost = target_cost

    @property
    def alpha(self) -> float:
        # A weak prior of 1 success in 2 trials keeps the estimate away from 0 and 1.
        return (self._successes + 1.0) / (self._trials + 2.0)

    def _target_cost(self, n: int) -> float:
        if self._fixed_target_cost is not None:
            return self._fixed_target_cost(n)
        # In the memory-bound regime a block of n costs about one pass: use the mean.
        return self._score_seconds / self._score_steps if self._score_steps else 1.0

    def observe(self, proposed: int, accepted: int, draft_seconds: float, score_seconds: float) -> None:
        if proposed == 0:
            return
        d = self.decay
        self._successes = d * self._successes + accepted
        self._trials = d * self._trials + accepted + (1 if accepted < proposed else 0)
        self._draft_seconds = d * self._draft_seconds + draft_seconds
        self._draft_tokens = d * self._draft_tokens + proposed
        self._score_seconds = d * self._score_seconds + score_seconds
        self._score_steps = d * self._score_steps + 1
        self._steps += 1
        if self._steps >= self.warmup_steps:
            draft_cost = self._draft_seconds / self._draft_tokens if self._draft_tokens else 0.0
            self.k = best_block_size(self.alpha, self.k_min, self.k_max, draft_cost, self._target_cost)

    def next_k(self) -> int:
        return self.k
