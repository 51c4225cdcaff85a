"""SpecStats: what one generation (or many, merged) did, collected in one place.

Logs, CLI summaries, benchmark tables and the server's Prometheus metrics only
read these numbers. Vocabulary as in docs/DESIGN.md, "Words": τ (acceptance length) = accepted
+ 1 per step; α = accepted / proposed; per-position acceptance i = fraction of
steps that proposed at least i tokens whose first i were all accepted.

With tree drafting, `proposed` counts tree nodes and `accepted` the accepted path's
length, so α is per node (a wide tree has a low α by design) and τ keeps its
meaning; positions are depths: proposed_at[d] counts steps whose tree reached
depth d + 1 and accepted_at[d] steps whose accepted path did.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class SpecStats:
    steps: int = 0
    proposed: int = 0  # draft tokens (tree nodes) offered to the verifier
    accepted: int = 0  # draft tokens kept (a tree's accepted path)
    new_tokens: int = 0  # tokens emitted (after truncation at a stop or max_new_tokens)
    # index i (0-based) counts steps that proposed / accepted at least i + 1 draft tokens (trees: depth i + 1)
    proposed_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    steps_without_draft: int = 0  # steps where the drafter proposed nothing
    tree_steps: int = 0  # steps that verified a tree rather than a chain
    draft_seconds: float = 0.0
    score_seconds: float = 0.0  # target forward passes (prefill included)
    verify_seconds: float = 0.0
    total_seconds: float = 0.0
    prefill_seconds: float = 0.0
    prompt_tokens: int = 0  # the prompt's tokens
    cached_tokens: int = 0  # of them, those whose KV entries came from the prefix cache (not read again)
    # The seed of the generation's randomness: the request's or one drawn for it (None: greedy, which draws
    # nothing, or stats merged over generations). SamplingParams.seed = this repeats the output.
    seed: int | None = None

    def record_step(self, num_proposed: int, num_accepted: int, depth: int | None = None) -> None:
        """One step: num_proposed draft tokens (or tree nodes), num_accepted kept; depth is a
        tree's depth (None: a chain, whose depth is its length)."""
        self.steps += 1
        self.proposed += num_proposed
        self.accepted += num_accepted
        if num_proposed == 0:
            self.steps_without_draft += 1
        if depth is None:
            depth = num_proposed
        else:
            self.tree_steps += 1
        _grow(self.proposed_at, depth)
        _grow(self.accepted_at, depth)
        for i in range(depth):
            self.proposed_at[i] += 1
        for i in range(num_accepted):
            self.accepted_at[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """α: accepted draft tokens / proposed draft tokens (0 when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def acceptance_length(self) -> float:
        """τ: mean tokens committed per step, accepted + 1 (plain decoding: 1)."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """Index i: of the steps that proposed position i + 1 (a tree: depth i + 1), the
        fraction that accepted it."""
        return [a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at)]

    @property
    def other_seconds(self) -> float:
        return max(0.0, self.total_seconds - self.draft_seconds - self.score_seconds - self.verify_seconds)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    def merge(self, other: "SpecStats") -> "SpecStats":
        """Sum of two stats (over generations); neither input changes."""
        merged = SpecStats()
        for name in ("steps", "proposed", "accepted", "new_tokens", "steps_without_draft", "tree_steps",
                     "draft_seconds", "score_seconds", "verify_seconds", "total_seconds",
                     "prefill_seconds", "prompt_tokens", "cached_tokens"):
            setattr(merged, name, getattr(self, name) + getattr(other, name))
        merged.proposed_at = _add(self.proposed_at, other.proposed_at)
        merged.accepted_at = _add(self.accepted_at, other.accepted_at)
        return merged

    @staticmethod
    def combine(stats: "list[SpecStats]") -> "SpecStats":
        total = SpecStats()
        for item in stats:
            total = total.merge(item)
        return total

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "new_tokens": self.new_tokens,
            "acceptance_rate": round(self.acceptance_rate, 6),
            "acceptance_length": round(self.acceptance_length, 6),
            "per_position_acceptance": [round(x, 6) for x in self.per_position_acceptance],
            "proposed_at": list(self.proposed_at),
            "accepted_at": list(self.accepted_at),
            "steps_without_draft": self.steps_without_draft,
            "tree_steps": self.tree_steps,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "seed": self.seed,
            "tokens_per_second": round(self.tokens_per_second, 4),
            "seconds": {
                "total": round(self.total_seconds, 6),
                "prefill": round(self.prefill_seconds, 6),
                "draft": round(self.draft_seconds, 6),
                "score": round(self.score_seconds, 6),
                "verify": round(self.verify_seconds, 6),
                "other": round(self.other_seconds, 6),
            },
        }


class PhaseClock:
    """Times the phases of a generation into its SpecStats: `with clock("draft"): ...` adds the
    seconds to draft_seconds (likewise prefill, score, verify), and `clock.last["draft"]` keeps
    the latest, which the k policy reads."""

    def __init__(self, stats: SpecStats) -> None:
        self.stats = stats
        self.last: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = self.last[phase] = time.perf_counter() - start
            name = f"{phase}_seconds"
            setattr(self.stats, name, getattr(self.stats, name) + seconds)


def _grow(counts: list[int], size: int) -> None:
    counts.extend([0] * (size - len(counts)))


def _add(a: list[int], b: list[int]) -> list[int]:
    size = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(size)]
