"""Position-keyed randomness and coupled verification, on toy distributions (no model).

- The noise: a function of (seed, position) alone, Exp(1), independent across positions and
  tokens; a PositionNoise is also a generator seeded with its seed.
- Plain position-keyed sampling (the race over a position's noise) follows the distribution
  (chi-square), never draws a token of probability zero, and the race's order is the law of
  sampling without replacement.
- The identity: for context-dependent toy targets and every kind of draft (point masses, random
  tokens, a drafter sampling from its own q with the shared noise or with noise of its own, trees of
  point masses and trees sampled without replacement with the shared noise), speculative decoding
  with the coupled verifier commits exactly the tokens plain position-keyed sampling draws, for many
  seeds and any k, fixed or changing step by step. Negative controls: noise keyed by the step
  instead of the position breaks the identity (and makes the output depend on k), and rejection
  sampling with a sequential generator gives other tokens for another k.
- Acceptance: a point mass x is kept with probability t(x) (estimated over seeds, every x of the
  vocabulary), the token after a mismatch follows t without x, and the exact-enumeration harness of
  tests/test_verify_exact.py proves the coupled plan keeps the target's distribution; a drafter
  drawing with the shared noise is accepted far more often than one drawing with its own.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chisquare, kstest

from specwise.config import SamplingParams
from specwise.noise import PositionNoise, StepNoise, draw_seed, race, race_order
from specwise.sampling import logits_to_probs, sample, sample_without_replacement
from specwise.verify import (coupled_verification_plan, get_tree_verifier, get_verifier, tree_coupled_verification_plan,
                             verify_coupled, verify_tokens, verify_tree_coupled)

from test_verify_exact import CASES, PAIRS, marginal, max_error, speculative_distribution, target_distribution

FALSE_ALARM = 1e-4  # chance that a correct sampler fails one chi-square test (fixed seeds: deterministic)


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's chi-square over the cells with positive probability (expected < 5 pooled)."""
    expected = probs * counts.sum()
    positive = expected > 0
    small = positive & (expected < 5)
    obs = np.append(counts[positive & ~small], counts[small].sum()).astype(float)
    exp = np.append(expected[positive & ~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


# ----------------------------------------------------------------------------- the noise


def test_noise_is_a_function_of_seed_and_position_alone():
    first, second = PositionNoise(7), PositionNoise(7)
    order = [5, 0, 3]
    drawn = {p: first.exponentials(p, 50).clone() for p in order}
    for p in reversed(order):  # another order of asking, from another object: the same values
        assert torch.equal(second.exponentials(p, 50), drawn[p])
    assert not torch.equal(drawn[0], drawn[3])  # positions differ
    assert not torch.equal(PositionNoise(8).exponentials(3, 50), drawn[3])  # seeds differ
    assert torch.equal(PositionNoise(7).exponentials(3, 20), drawn[3][:20])  # a prefix of one stream per position
    assert torch.equal(PositionNoise(7).exponentials(3, 80)[:50], drawn[3])
    # Seeds above 2**32 keep their high bits: no two seeds share a stream.
    assert not torch.equal(PositionNoise(2**40 + 7).exponentials(3, 50), drawn[3])


def test_noise_is_unit_exponential_and_independent_across_positions():
    noise = PositionNoise(123)
    rows = noise.rows(list(range(200)), 500).double()  # [positions, tokens]
    assert (rows > 0).all()
    assert kstest(rows.flatten().numpy(), "expon").pvalue > FALSE_ALARM
    correlation = np.corrcoef(rows[:-1].flatten().numpy(), rows[1:].flatten().numpy())[0, 1]
    assert abs(correlation) < 5 / math.sqrt(rows[1:].numel())  # neighbouring positions uncorrelated


def test_a_position_noise_is_a_generator_seeded_with_its_seed():
    noise = PositionNoise(99)
    assert isinstance(noise, torch.Generator)
    assert torch.equal(torch.rand(4, generator=noise), torch.rand(4, generator=torch.Generator().manual_seed(99)))
    assert noise.key == 99


def test_released_positions_are_forgotten_and_drawn_again_the_same():
    noise = PositionNoise(3)
    kept = noise.exponentials(4, 10).clone()
    noise.exponentials(2, 10)
    noise.release_before(3)
    assert noise.cached_positions == [4]
    noise.release_before(10)
    assert noise.cached_positions == []
    assert torch.equal(noise.exponentials(4, 10), kept)


def test_drawn_seeds_are_valid_and_differ():
    seeds = {draw_seed() for _ in range(20)}
    assert len(seeds) == 20 and all(0 <= s < 2**63 for s in seeds)


def test_step_noise_reads_rows_from_its_start():
    noise = PositionNoise(5)
    step = noise.at(10)
    assert isinstance(step, StepNoise)
    assert torch.equal(step.rows([0, 2, 2], 30), noise.rows([10, 12, 12], 30))


# ----------------------------------------------------------------------------- plain position-keyed sampling

DIST = torch.tensor([0.30, 0.0, 0.05, 0.25, 0.0, 0.15, 0.20, 0.05])  # zeros where processors cut


def test_plain_sampling_follows_the_distribution_and_never_draws_a_cut_token():
    draws = 6000
    noise = PositionNoise(2024)
    counts = np.bincount([sample(DIST, noise, position) for position in range(draws)], minlength=len(DIST))
    assert counts[DIST.numpy() == 0].sum() == 0
    assert chi_square_p(counts, DIST.numpy()) > FALSE_ALARM
    # Power: the same draws reject a distribution 0.05 away in two cells.
    other = DIST.clone()
    other[0], other[3] = 0.25, 0.30
    assert chi_square_p(counts, other.numpy()) < FALSE_ALARM


def test_plain_sampling_follows_the_processed_distribution_of_logits():
    """Logits through the processors (temperature, top-k, top-p) and then the race at successive
    positions: the frequencies are the processed distribution's, and nothing the processors cut is drawn."""
    logits = torch.tensor([2.0, 1.5, 1.4, 0.3, -0.2, 0.9, -1.0, 1.1, 0.0, -2.0])
    params = SamplingParams(temperature=0.8, top_k=6, top_p=0.9)
    probs = logits_to_probs(logits[None], params)[0]
    assert (probs == 0).sum() >= 4  # top-k and top-p cut
    draws = 6000
    noise = PositionNoise(31)
    counts = np.bincount([sample(probs, noise, position) for position in range(draws)], minlength=len(logits))
    assert counts[probs.numpy() == 0].sum() == 0
    assert chi_square_p(counts, probs.double().numpy()) > FALSE_ALARM
    flat = logits_to_probs(logits[None], SamplingParams(temperature=1.0, top_k=6, top_p=0.9))[0]  # power
    assert chi_square_p(counts, flat.double().numpy()) < FALSE_ALARM


def test_plain_sampling_is_the_race_and_depends_on_nothing_drawn_before():
    noise = PositionNoise(11)
    alone = sample(DIST, PositionNoise(11), 7)
    for position in range(7):  # draws at other positions first
        sample(DIST, noise, position)
    assert sample(DIST, noise, 7) == alone == int(race(DIST, noise.exponentials(7, len(DIST))))
    # Without a position the generator draws sequentially, as any generator does.
    assert sample(DIST, PositionNoise(11)) == sample(DIST, torch.Generator().manual_seed(11))


def test_race_order_is_sampling_without_replacement():
    """The first two finishers of a race follow the sequential law p(a) * p(b) / (1 - p(a))."""
    draws = 8000
    noise = PositionNoise(77)
    pairs = Counter(tuple(sample_without_replacement(DIST, 2, noise, position).tolist()) for position in range(draws))
    probs = DIST.double().numpy()
    support = np.flatnonzero(probs)
    cells = [(a, b) for a in support for b in support if a != b]
    law = np.array([probs[a] * probs[b] / (1 - probs[a]) for a, b in cells])
    counts = np.array([pairs.get((int(a), int(b)), 0) for a, b in cells])
    assert counts.sum() == draws  # every pair drawn is two distinct tokens of positive probability
    assert chi_square_p(counts, law) > FALSE_ALARM
    # Its first finisher is plain sampling's draw there.
    assert all(int(race_order(DIST, noise.exponentials(p, len(DIST)), 3)[0]) == sample(DIST, noise, p)
               for p in range(50))


def test_a_race_with_every_kept_token_at_infinity_falls_back_to_a_kept_token():
    weights = torch.tensor([0.0, 0.6, 0.4, 0.0])
    assert int(race(weights, torch.tensor([1.0, float("inf"), float("inf"), 0.5]))) == 1


# ----------------------------------------------------------------------------- the identity


class ToyTarget:
    """A context-dependent distribution over a small vocabulary, with zeros (what top-k/top-p cut)."""

    def __init__(self, vocab: int, seed: int, alpha: float = 0.6, zero_frac: float = 0.3,
                 close_to: "ToyTarget | None" = None, weight: float = 1.0) -> None:
        self.vocab, self.seed, self.alpha, self.zero_frac = vocab, seed, alpha, zero_frac
        self.close_to, self.weight = close_to, weight
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in self._cache:
            rng = np.random.default_rng([self.seed, len(prefix), *prefix])
            p = rng.dirichlet([self.alpha] * self.vocab)
            zero = rng.random(self.vocab) < self.zero_frac
            zero[rng.integers(self.vocab)] = False
            p = np.where(zero, 0.0, p)
            p /= p.sum()
            if self.close_to is not None:
                p = self.weight * p + (1 - self.weight) * self.close_to(prefix).double().numpy()
            self._cache[prefix] = torch.tensor(p, dtype=torch.float32)
        return self._cache[prefix]

    def rows(self, prefix: tuple[int, ...], tokens: list[int], parents: list[int] | None = None) -> torch.Tensor:
        """Target rows of a chain (parents None) or tree: row 0 after prefix, row i + 1 after node i."""
        if parents is None:
            parents = list(range(-1, len(tokens) - 1))
        paths: list[tuple[int, ...]] = []
        for token, parent in zip(tokens, parents):
            paths.append((paths[parent] if parent >= 0 else ()) + (token,))
        return torch.stack([self(prefix)] + [self(prefix + path) for path in paths])


TARGET = ToyTarget(8, seed=1)
CLOSE = ToyTarget(8, seed=2, close_to=TARGET, weight=0.3)  # q near t, different where it matters
LENGTH = 12


def plain(target: ToyTarget, noise: PositionNoise, prompt: tuple[int, ...]) -> list[int]:
    """Plain position-keyed sampling: the race at every position, one after another."""
    out = list(prompt)
    while len(out) < len(prompt) + LENGTH:
        out.append(sample(target(tuple(out)), noise, len(out)))
    return out[len(prompt):]


def chain_draft(kind: str, context: tuple[int, ...], k: int, noise: PositionNoise, own: torch.Generator) -> list[int]:
    draft: list[int] = []
    for i in range(k):
        prefix, position = context + tuple(draft), len(context) + i
        if kind == "argmax":  # a deterministic drafter: point masses
            draft.append(int(CLOSE(prefix).argmax()))
        elif kind == "random":  # tokens the target may give probability zero
            draft.append(int(torch.randint(TARGET.vocab, (), generator=own)))
        elif kind == "shared":  # sampled from q with the position's noise (the coupled drafter)
            draft.append(sample(CLOSE(prefix), noise, position))
        else:  # "own": sampled from q with a generator of its own
            draft.append(sample(CLOSE(prefix), own))
    return draft


def speculate(kind: str, ks: list[int], noise: PositionNoise, prompt: tuple[int, ...], verify=verify_coupled,
              step_noise=None) -> tuple[list[int], int, int]:
    """Speculative decoding of TARGET with the coupled verifier; k cycles through `ks`. Returns the
    committed tokens, the draft tokens proposed and those accepted."""
    context, own = prompt, torch.Generator().manual_seed(noise.key)
    proposed = accepted = step = 0
    while len(context) < len(prompt) + LENGTH:
        k = min(ks[step % len(ks)], len(prompt) + LENGTH - len(context) - 1)
        draft = chain_draft(kind, context, k, noise, own)
        rows = TARGET.rows(context, draft)
        randomness = step_noise(step) if step_noise else noise.at(len(context)) if verify is verify_coupled else own
        result = verify(torch.tensor(draft, dtype=torch.long), None, rows, randomness)
        context += tuple(result.tokens)
        proposed, accepted, step = proposed + k, accepted + result.num_accepted, step + 1
    return list(context[len(prompt):]), proposed, accepted


SEEDS = range(150)
PROMPT = (3, 1, 4)


@pytest.mark.parametrize("kind", ["argmax", "random", "shared", "own"])
@pytest.mark.parametrize("ks", [[1], [3], [5], [2, 6, 1, 4]], ids=["k1", "k3", "k5", "k-changing"])
def test_coupled_chains_commit_plain_samplings_tokens(kind, ks):
    accepted = 0
    for seed in SEEDS:
        expected = plain(TARGET, PositionNoise(seed), PROMPT)
        got, _, kept = speculate(kind, ks, PositionNoise(seed), PROMPT)
        assert got == expected, (seed, kind, ks)
        accepted += kept
    if kind != "random":
        assert accepted > 0  # drafts were accepted, so the identity is not plain decoding in disguise


def test_the_outputs_of_different_seeds_differ():
    outputs = {tuple(plain(TARGET, PositionNoise(seed), PROMPT)) for seed in SEEDS}
    assert len(outputs) > 0.9 * len(SEEDS)


def test_negative_control_noise_keyed_by_step_breaks_the_identity():
    """Noise keyed by (seed, step) instead of the position: still a sample from the target at every
    step, but which noise decides a position depends on the block lengths."""
    broken = 0
    for seed in range(40):
        noise = PositionNoise(seed)
        by_step = PositionNoise(seed + 10_000)
        expected = plain(TARGET, noise, PROMPT)
        got, _, _ = speculate("shared", [3], noise, PROMPT, step_noise=lambda step: by_step.at(step * 16))
        other_k, _, _ = speculate("shared", [5], noise, PROMPT, step_noise=lambda step: by_step.at(step * 16))
        broken += got != expected or got != other_k
    assert broken > 30


def test_negative_control_rejection_sampling_with_a_sequential_generator_depends_on_k():
    changed = 0
    for seed in range(40):
        noise = PositionNoise(seed)
        k3, _, _ = speculate("argmax", [3], noise, PROMPT, verify=verify_tokens)
        k5, _, _ = speculate("argmax", [5], noise, PROMPT, verify=verify_tokens)
        changed += k3 != k5
    assert changed > 20


def test_drafting_with_the_shared_noise_is_accepted_far_more_often_than_with_its_own():
    """The point of coupling the drafter (Daliri et al.): both commit plain sampling's tokens, but
    with the shared noise the drafter's sample is the target's draw whenever the two races agree."""
    rates = {}
    for kind in ("shared", "own"):
        proposed = accepted = 0
        for seed in SEEDS:
            _, p, a = speculate(kind, [4], PositionNoise(seed), PROMPT)
            proposed, accepted = proposed + p, accepted + a
        rates[kind] = accepted / proposed
    assert rates["shared"] > rates["own"] + 0.1, rates


# ----------------------------------------------------------------------------- trees


def tree_draft(kind: str, context: tuple[int, ...], shape: tuple[int, ...],
               noise: PositionNoise) -> tuple[list[int], list[int]]:
    """A fixed-shape tree: `shape[level]` children under every node of a level; point masses (the
    drafter's likeliest tokens) or a sample without replacement with the position's noise."""
    tokens: list[int] = []
    parents: list[int] = []
    paths = {-1: ()}
    frontier = [-1]
    for level, width in enumerate(shape):
        added = []
        for parent in frontier:
            q = CLOSE(context + paths[parent])
            if kind == "argmax":
                children = torch.topk(q, width).indices.tolist()
            else:
                children = sample_without_replacement(q, width, noise, len(context) + level).tolist()
            for child in children:
                paths[len(tokens)] = paths[parent] + (child,)
                added.append(len(tokens))
                tokens.append(child)
                parents.append(parent)
        frontier = added
    return tokens, parents


@pytest.mark.parametrize("kind", ["argmax", "shared"])
@pytest.mark.parametrize("shape", [(2,), (3, 2), (2, 2, 1)], ids=["2", "3x2", "2x2x1"])
def test_coupled_trees_commit_plain_samplings_tokens(kind, shape):
    accepted = 0
    for seed in SEEDS:
        noise = PositionNoise(seed)
        expected = plain(TARGET, PositionNoise(seed), PROMPT)
        context = PROMPT
        while len(context) < len(PROMPT) + LENGTH:
            depth = len(PROMPT) + LENGTH - len(context) - 1
            tokens, parents = tree_draft(kind, context, shape[:depth], noise)
            rows = TARGET.rows(context, tokens, parents)
            result = verify_tree_coupled(torch.tensor(tokens, dtype=torch.long), parents, None, rows,
                                         noise.at(len(context)))
            assert result.tokens[:-1] == [tokens[i] for i in result.accepted_nodes]
            context += tuple(result.tokens)
            accepted += result.num_accepted
        assert list(context[len(PROMPT):]) == expected, (seed, kind, shape)
    assert accepted > 0


# ----------------------------------------------------------------------------- acceptance


def test_a_point_mass_is_kept_with_the_targets_probability_of_it():
    """For every token x: over many seeds, P(keep x) = t(x) within five standard errors (exactly 0
    where t(x) = 0), and after a mismatch the committed token follows t without x (chi-square)."""
    draws = 3000
    target = torch.stack([DIST, torch.full((len(DIST),), 1 / len(DIST))])  # [2, V]: a k = 1 step
    for x in range(len(DIST)):
        kept = 0
        after = np.zeros(len(DIST))
        for seed in range(draws):
            result = verify_coupled(torch.tensor([x]), None, target, PositionNoise(seed).at(0))
            kept += result.num_accepted
            if not result.num_accepted:
                after[result.tokens[0]] += 1
        p = float(DIST[x])
        if p == 0:
            assert kept == 0
        else:
            assert abs(kept / draws - p) <= 5 * math.sqrt(p * (1 - p) / draws), (x, kept / draws, p)
        residual = DIST.double().numpy().copy()
        residual[x] = 0
        assert after[x] == 0 and chi_square_p(after, residual / residual.sum()) > FALSE_ALARM


@pytest.mark.parametrize("name,k,length", CASES)
def test_exact_enumeration_of_the_coupled_plan_gives_the_targets_distribution(name, k, length):
    """tests/test_verify_exact.py's harness, drafts enumerated with their probabilities under the
    drafter and drawn without the noise, where coupled_verification_plan is the law of the decisions."""
    target, drafter = PAIRS[name]
    for point_mass in (False, True):
        dist, _ = speculative_distribution(coupled_verification_plan, target, drafter, k, length, point_mass)
        for n in range(2, length + 1):
            err = max_error(marginal(dist, n), target_distribution(target, n))
            assert err <= 1e-9, f"coupled on {name}, k={k}, first {n} tokens: max abs error {err:.3e}"


def test_the_verifier_draws_from_its_plan():
    """A k = 3 step of point masses: over seeds, (number kept, committed token) follows the plan."""
    tokens = torch.tensor([0, 3, 6])
    target = torch.stack([DIST, DIST.roll(3), DIST.roll(6), DIST.roll(1)])
    plan = coupled_verification_plan(tokens, None, target)
    joint = (plan.num_accepted_probs[:, None] * plan.next_token_dists).numpy()
    counts = np.zeros_like(joint)
    for seed in range(4000):
        result = verify_coupled(tokens, None, target, PositionNoise(seed).at(0))
        counts[result.num_accepted, result.tokens[-1]] += 1
    assert counts[joint == 0].sum() == 0
    assert chi_square_p(counts.ravel(), joint.ravel()) > FALSE_ALARM


def test_the_tree_verifier_draws_from_its_plan():
    tokens, parents = torch.tensor([0, 3, 5, 6]), [-1, -1, 0, 1]
    target = torch.stack([DIST, DIST.roll(2), DIST.roll(5), DIST.roll(1), DIST.roll(3)])
    plan = tree_coupled_verification_plan(tokens, parents, None, target)
    ends = np.zeros(len(parents) + 1)
    for seed in range(4000):
        result = verify_tree_coupled(tokens, parents, None, target, PositionNoise(seed).at(0))
        ends[result.accepted_nodes[-1] + 1 if result.accepted_nodes else 0] += 1
    assert chi_square_p(ends, plan.path_end_probs.numpy()) > FALSE_ALARM


# ----------------------------------------------------------------------------- the rule's interface


def test_the_engine_finds_the_coupled_rules_by_name():
    assert get_verifier("coupled") is verify_coupled
    assert get_tree_verifier("coupled") is verify_tree_coupled


def test_bad_inputs_are_refused_in_one_line():
    target = DIST[None].repeat(2, 1)
    with pytest.raises(ValueError, match=r"position-keyed noise.*got Generator"):
        verify_coupled(torch.tensor([1]), None, target, torch.Generator())
    with pytest.raises(ValueError, match="target_probs must have k \\+ 1 = 3 rows"):
        verify_coupled(torch.tensor([1, 2]), None, target, PositionNoise(0).at(0))
    with pytest.raises(ValueError, match="target_probs must hold probabilities"):
        verify_coupled(torch.tensor([1]), None, target * torch.tensor([1.0, float("nan")])[:, None],
                       PositionNoise(0).at(0))
    with pytest.raises(ValueError, match="draft_probs must have shape"):
        verify_coupled(torch.tensor([1]), torch.ones(2, 8), target, PositionNoise(0).at(0))
    with pytest.raises(ValueError, match="parents"):
        verify_tree_coupled(torch.tensor([1]), [3], None, target, PositionNoise(0).at(0))
