"""The estimates k is chosen from, each written once: tokens per step, acceptance, and the target's T(n).

Adaptive k (specwise.adaptive) and the batch's goodput planner (specwise.goodput) read
the same three things (docs/DESIGN.md, "Cost model"):

- `expected_acceptance_length(α, k)`: E[τ] = (1 − α^(k+1)) / (1 − α), the tokens a step
  commits on average when each of its k draft tokens is accepted with probability α
  (`expected_acceptance_length_split`: the first with one probability, the later ones with another);
- `DecayedRate`: a ratio of sums that decay at every observation, so the estimate follows
  the text as it changes; `AcceptanceRate` is the one over the verifier's decisions (and
  the same type measures drafting seconds per token and the share of steps that propose);
- `LinearCost`: T(n) = base + slope · n, fitted by least squares to the passes seen,
  weighted by decay^age or over a window of the latest; `MeasuredCost`: T(n) read from a
  measured table (`specwise bench cost`, specwise.cost_model), linear between its points.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence

DECAY = 0.9  # the weight of the past in every decayed estimate: about the last ten steps count
WEAK_PRIOR = (1.0, 2.0)  # one success in two trials: a new estimate starts at α = 0.5
_MIN_SECONDS = 1e-6  # no pass is free: keeps tokens per second finite
_SPREAD = 1e-9  # less spread in n than this is one block size: no slope can be told


def expected_acceptance_length(alpha: float, k: int) -> float:
    """E[τ] for k draft tokens each accepted independently with probability α."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_acceptance_length_split(first: float, later: float, k: int) -> float:
    """E[τ] for k draft tokens when the first is accepted with probability `first` and each later one,
    its predecessors accepted, with probability `later`: 1 + first · (1 + later + … + later^(k−1))."""
    if k <= 0:
        return 1.0
    return 1.0 + first * (k if later >= 1.0 else (1.0 - later ** k) / (1.0 - later))


class DecayedRate:
    """numerator / denominator over sums that every `add` first multiplies by `decay`.

    start: the sums before any observation; they decay with the evidence (a starting value
        that fades). `DecayedRate.mean(value)` starts an exponential moving mean there.
    prior: pseudo-counts added when the rate is read; they never fade (keep it off 0 and 1).
    ceiling: the largest value it reports. empty: its value while both sums are 0.
    """

    def __init__(self, decay: float = DECAY, start: tuple[float, float] = (0.0, 0.0),
                 prior: tuple[float, float] = (0.0, 0.0), ceiling: float = math.inf, empty: float = 0.0) -> None:
        self.decay = decay
        self.numerator, self.denominator = start
        self.prior = prior
        self.ceiling = ceiling
        self.empty = empty

    @classmethod
    def mean(cls, value: float, decay: float = DECAY) -> DecayedRate:
        """A moving mean starting at `value`: after add(x), the mean is decay · mean + (1 − decay) · x."""
        weight = 1.0 / (1.0 - decay)  # the total weight of an endless decayed history
        return cls(decay, start=(value * weight, weight))

    def add(self, numerator: float, denominator: float = 1.0) -> None:
        self.numerator = self.decay * self.numerator + numerator
        self.denominator = self.decay * self.denominator + denominator

    @property
    def value(self) -> float:
        denominator = self.denominator + self.prior[1]
        if denominator == 0:
            return self.empty
        return min(self.ceiling, (self.numerator + self.prior[0]) / denominator)


class AcceptanceRate(DecayedRate):
    """α from the verifier's decisions: a block of `proposed` tokens of which the first `accepted`
    were kept observed `accepted` successes in accepted + [accepted < proposed] trials (acceptance
    stops at the first rejection). By default the weak prior is added when read and never fades."""

    def __init__(self, decay: float = DECAY, start: tuple[float, float] = (0.0, 0.0),
                 prior: tuple[float, float] = WEAK_PRIOR, ceiling: float = math.inf) -> None:
        super().__init__(decay, start, prior, ceiling)

    def observe(self, proposed: int, accepted: int) -> None:
        """One block's decisions; a step that proposed nothing tells nothing."""
        if proposed > 0:
            self.add(accepted, accepted + (1 if accepted < proposed else 0))


class LinearCost:
    """T(n) = base + slope · n, fitted by weighted least squares to the passes seen (n rows, seconds).

    decay: each new pass multiplies the weight of the earlier ones by it (1: they all count alike);
    window: only the latest `window` passes count (None: all of them);
    min_slope: the least slope it reports: noise must not make an extra row look cheaper than
        free (0), or free (a small positive floor, for a planner that would otherwise hand rows out);
    min_base: the least intercept (None: whatever the line says).
    Until it has seen two block sizes it is flat at the mean of what it has seen (`sizes_seen`
    tells); before any pass it says one second, a unit that ranks nothing.
    """

    def __init__(self, decay: float = 1.0, window: int | None = None, min_slope: float = 0.0,
                 min_base: float | None = None) -> None:
        if window is not None and decay != 1.0:
            raise ValueError("a windowed fit weighs its passes alike: give decay or window, not both")
        self.decay, self.min_slope, self.min_base = decay, min_slope, min_base
        self._recent: deque[tuple[int, float]] | None = deque(maxlen=window) if window else None
        self._sums = [0.0] * 5  # weighted sums of 1, n, n², t, n·t

    @classmethod
    def through(cls, points: Iterable[tuple[int, float]], **options) -> LinearCost:
        """A fit that starts from these points, one pass's weight each (e.g. two points of a measured
        table): the passes it sees next outweigh them as they accumulate."""
        fit = cls(**options)
        for n, seconds in points:
            fit._include(n, seconds)
        return fit

    def add(self, n: int, seconds: float) -> None:
        """One pass over n rows that took `seconds`."""
        if self._recent is None:
            self._include(n, seconds, keep=self.decay)
            return
        self._recent.append((n, seconds))
        self._sums = [0.0] * 5
        for rows, took in self._recent:
            self._include(rows, took)

    def _include(self, n: int, seconds: float, keep: float = 1.0) -> None:
        """Add a pass of weight 1 to the sums, after multiplying them by `keep`."""
        terms = (1, n, n * n, seconds, n * seconds)
        self._sums = [keep * total + term for total, term in zip(self._sums, terms)]

    @property
    def sizes_seen(self) -> int:
        """0 before any pass, 1 while every pass had one block size, else 2 (a slope can be fitted)."""
        if self._sums[0] == 0:
            return 0
        return 2 if self._spread() > _SPREAD else 1

    def _spread(self) -> float:
        w, n, nn = self._sums[:3]
        return nn / w - (n / w) ** 2

    def line(self) -> tuple[float, float]:
        """(base, slope) of the fitted line."""
        w, n, _, t, nt = self._sums
        mean_n, mean_t = n / w, t / w
        spread = self._spread()
        slope = self.min_slope
        if spread > _SPREAD:
            slope = max(self.min_slope, (nt / w - mean_n * mean_t) / spread)
        base = mean_t - slope * mean_n
        if self.min_base is not None:
            base = max(self.min_base, base)
        return base, slope

    def __call__(self, n: int) -> float:
        if self._sums[0] == 0:
            return 1.0
        base, slope = self.line()
        return max(_MIN_SECONDS, base + slope * n)


class MeasuredCost:
    """T(n) through measured (n, seconds) points: linear between two of them, the first one's below
    the first, and beyond the last along the line through the last two."""

    def __init__(self, points: Sequence[tuple[int, float]]) -> None:
        if not points:
            raise ValueError("a measured T(n) needs at least one measured n")
        self.points = sorted((int(n), float(s)) for n, s in points)

    def __call__(self, n: int) -> float:
        table = self.points
        for (n0, s0), (n1, s1) in zip(table, table[1:]):
            if n <= n1:
                return s0 + (s1 - s0) * (max(n, n0) - n0) / (n1 - n0)
        if len(table) == 1:
            return table[0][1]
        (n0, s0), (n1, s1) = table[-2], table[-1]
        return s1 + (s1 - s0) * (n - n1) / (n1 - n0)
