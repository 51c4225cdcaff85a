"""Position-keyed randomness: the random numbers of a generation's position n come from (seed, n) alone.

Plain sampling at a position is the exponential race over its distribution p: every token i gets
E_i ~ Exp(1), independently, and the token is argmin_i E_i / p_i among the tokens with p_i > 0.
That is the Gumbel-max trick written without logarithms of p (G_i = -log E_i is a standard Gumbel
and argmax_i log p_i + G_i is the same token), so the token follows p exactly. The E_i of position
n are drawn from a generator seeded by a hash of (seed, n), so which token a position commits
depends on its distribution and its noise only, never on how many random numbers were drawn
before it: not on k, the drafter, a tree or the batch (docs/DESIGN.md, "The losslessness
contract", condition 4, and "Coupled").

The noise is drawn on the host, in float64 and then stored in float32, so the same seed gives the
same values on every device. A position's vector is drawn once and kept while the generation may
still read it (the steps that draft or verify that position); `release_before` drops the ones
behind the committed text.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import numpy as np
import torch

SEED_BITS = 63  # SamplingParams.seed is in [0, 2**63)


def draw_seed() -> int:
    """A fresh seed from the operating system's entropy, for a request that gave none (reported back,
    so that its output can be repeated)."""
    return secrets.randbits(SEED_BITS)


class PositionNoise(torch.Generator):
    """A generation's randomness: Exp(1) noise per (position, token) keyed by (seed, position), and,
    being a CPU torch.Generator seeded with the same seed, sequential draws for whatever asks for
    those (a drafter that knows no positions draws from it as from any generator)."""

    def __new__(cls, seed: int) -> "PositionNoise":
        return super().__new__(cls, "cpu")  # torch.Generator's constructor takes the device only

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.manual_seed(seed)
        self.key = seed
        # The uniforms' words: the seed as two 32-bit halves, then the position (fixed width, so no two
        # (seed, position) pairs hash the same words).
        self._seed_words = (seed & 0xFFFFFFFF, seed >> 32)
        self._cache: dict[int, torch.Tensor] = {}

    def exponentials(self, position: int, vocab: int) -> torch.Tensor:
        """E[position, :vocab]: [vocab] float32 on the host, each > 0 (+inf where the uniform was 0).

        The values are a prefix of one stream per position, so asking for fewer tokens gives the
        first ones of the same vector."""
        row = self._cache.get(position)
        if row is None or row.numel() < vocab:
            row = self._draw(position, vocab)
            self._cache[position] = row
        return row[:vocab]

    def _draw(self, position: int, vocab: int) -> torch.Tensor:
        if position < 0:
            raise ValueError(f"a position is >= 0; got {position}")
        bits = np.random.SFC64(np.random.SeedSequence([*self._seed_words, position]))
        uniforms = np.random.Generator(bits).random(vocab)  # [0, 1), 53 bits each
        with np.errstate(divide="ignore"):  # u = 0 gives E = inf: that token never wins
            exponentials = -np.log(uniforms)
        return torch.from_numpy(exponentials.astype(np.float32))

    def rows(self, positions: Sequence[int], vocab: int) -> torch.Tensor:
        """E at each of `positions`: [len(positions), vocab] float32 on the host."""
        if not positions:
            return torch.empty(0, vocab, dtype=torch.float32)
        return torch.stack([self.exponentials(p, vocab) for p in positions])

    def at(self, start: int) -> "StepNoise":
        """This noise for one step whose first row predicts the token at position `start`."""
        return StepNoise(self, start)

    def release_before(self, position: int) -> None:
        """Forget the vectors of positions before `position` (committed: no step reads them again)."""
        for old in [p for p in self._cache if p < position]:
            del self._cache[old]

    @property
    def cached_positions(self) -> list[int]:
        return sorted(self._cache)


class StepNoise:
    """The noise of one verification step: row offset r predicts the token at position start + r."""

    def __init__(self, noise: PositionNoise, start: int) -> None:
        self.noise, self.start = noise, start

    def rows(self, offsets: Sequence[int], vocab: int) -> torch.Tensor:
        """E for each row's position (start + offset): [len(offsets), vocab] float32 on the host."""
        return self.noise.rows([self.start + r for r in offsets], vocab)


def race(weights: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """The winner of the exponential race in each row: argmin_i E_i / w_i over w_i > 0, the first
    index on ties; a sample from the row's distribution (w may be unnormalized).

    weights: [..., V] non-negative; exponentials: [..., V] on the host (sent to the weights'
    device). Returns [...] long on the weights' device. A token of weight 0 never wins: E / 0 is
    +inf, and a row whose kept tokens all drew E = inf (probability ~2**-53 per token) falls back
    to its likeliest token."""
    e = exponentials.to(device=weights.device, dtype=weights.dtype, non_blocking=True)
    winner = (e / weights).argmin(dim=-1)
    won = weights.gather(-1, winner.unsqueeze(-1)).squeeze(-1) > 0
    return torch.where(won, winner, weights.argmax(dim=-1))


def race_order(weights: torch.Tensor, exponentials: torch.Tensor, m: int) -> torch.Tensor:
    """The first min(m, support) finishers of a [V] row's race, in order: an ordered sample without
    replacement from the row (the Gumbel-top-m trick). Returns [count] long on the host."""
    e = exponentials.to(device=weights.device, dtype=weights.dtype, non_blocking=True)
    arrival = torch.where(weights > 0, e / weights, torch.inf)
    count = min(m, int((weights > 0).sum()))
    if count <= 0:
        return torch.empty(0, dtype=torch.long)
    return torch.topk(arrival, count, largest=False, sorted=True).indices.cpu()
