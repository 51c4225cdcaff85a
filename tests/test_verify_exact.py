"""Losslessness of the sampling verifiers, proven by exact enumeration on toy models.

A toy model maps a prefix (tuple of token ids) to a distribution over a vocabulary of
3-5 tokens, different for every prefix. Speculative decoding with a drafter and a
verifier is enumerated exactly: every draft block with its probability, every number
of accepted tokens and every recovered or bonus token, with the probabilities taken
from the verifiers' own plans: `token_verification_plan` and `block_verification_plan`
run the arithmetic of `verify_tokens` and `verify_block`, the functions the engine calls.
The distribution of the first L committed tokens must equal the target's own to 1e-9.
Two deliberately wrong verifiers fail the same check, so the check can fail. A Monte
Carlo test then shows the sampling functions draw from their plans.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from functools import lru_cache

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specwise.verify import (
    VerificationPlan,
    block_verification_plan,
    get_verifier,
    token_verification_plan,
    verify_block,
    verify_tokens,
)

TOLERANCE = 1e-9


class ToyModel:
    """A context-dependent distribution: a seeded Dirichlet draw for every prefix.

    zero_frac: chance that an entry is forced to zero (at least one entry stays positive).
    mix_with: another ToyModel to mix with (weight 1 - mix_weight), to build a drafter
        that is close to, but not equal to, the target.
    """

    def __init__(self, vocab: int, seed: int, alpha: float = 1.0, zero_frac: float = 0.0,
                 mix_with: ToyModel | None = None, mix_weight: float = 1.0) -> None:
        self.vocab, self.seed, self.alpha, self.zero_frac = vocab, seed, alpha, zero_frac
        self.mix_with, self.mix_weight = mix_with, mix_weight
        self.dist = lru_cache(maxsize=None)(self._dist)
        self.rows = lru_cache(maxsize=None)(self._rows)  # shared by every verifier's enumeration

    def _dist(self, prefix: tuple[int, ...]) -> tuple[float, ...]:
        rng = np.random.default_rng([self.seed, len(prefix), *prefix])
        p = rng.dirichlet([self.alpha] * self.vocab)
        if self.zero_frac:
            zero = rng.random(self.vocab) < self.zero_frac
            zero[rng.integers(self.vocab)] = False
            p = np.where(zero, 0.0, p)
            p /= p.sum()
        if self.mix_with is not None:
            p = self.mix_weight * p + (1 - self.mix_weight) * np.asarray(self.mix_with.dist(prefix))
        return tuple(float(v) for v in p)

    def _rows(self, prefix: tuple[int, ...], block: tuple[int, ...], n: int) -> torch.Tensor:
        """Distributions at prefix + block[:i] for i = 0..n-1."""
        return torch.tensor([self.dist(prefix + block[:i]) for i in range(n)], dtype=torch.float64)  # [n, V]


def _pairs() -> dict[str, tuple[ToyModel, ToyModel]]:
    t3 = ToyModel(3, seed=1)
    t3z = ToyModel(3, seed=3, zero_frac=0.3)
    t4 = ToyModel(4, seed=5, alpha=0.5)
    return {
        "V3-independent": (t3, ToyModel(3, seed=2)),
        "V3-zeros-both": (t3z, ToyModel(3, seed=4, zero_frac=0.3)),
        "V4-close-drafter-with-zeros": (t4, ToyModel(4, seed=6, zero_frac=0.4, mix_with=t4, mix_weight=0.4)),
        "V3-drafter-equals-target": (t3, t3),
        "V5-peaked": (ToyModel(5, seed=7, alpha=0.3), ToyModel(5, seed=8, alpha=0.3)),
    }


PAIRS = _pairs()
# (pair, k, L): L = k + 2 always takes at least two steps; L = k + 1 keeps the larger cases fast.
CASES = [
    ("V3-independent", 2, 4), ("V3-independent", 3, 4),
    ("V3-zeros-both", 2, 4), ("V3-zeros-both", 3, 4),
    ("V3-drafter-equals-target", 2, 4), ("V3-drafter-equals-target", 3, 4),
    ("V4-close-drafter-with-zeros", 2, 4),
    ("V5-peaked", 2, 3),
]


def _draft_blocks(drafter: ToyModel, prefix: tuple[int, ...], k: int, point_mass: bool):
    """(block, probability) for every draft block with positive probability.

    point_mass: the drafter proposes its argmax deterministically (first index on ties).
    """
    if point_mass:
        block: tuple[int, ...] = ()
        for _ in range(k):
            block += (int(np.argmax(drafter.dist(prefix + block))),)
        yield block, 1.0
        return
    for block in itertools.product(range(drafter.vocab), repeat=k):
        p = 1.0
        for i, x in enumerate(block):
            p *= drafter.dist(prefix + block[:i])[x]
            if p == 0.0:
                break
        if p > 0.0:
            yield block, p


def speculative_distribution(plan_fn, target: ToyModel, drafter: ToyModel, k: int, length: int,
                             point_mass: bool = False):
    """Exact distribution of the first `length` committed tokens, and E[tokens per step]
    (over the drafter's blocks) at every prefix that decoding reaches."""
    out: dict[tuple[int, ...], float] = defaultdict(float)
    expected_tokens: dict[tuple[int, ...], float] = {}
    pending = [defaultdict(float) for _ in range(length)]  # by prefix length
    pending[0][()] = 1.0
    for n in range(length):  # every step commits >= 1 token: lengths only grow
        for prefix, mass in pending[n].items():
            expected_tokens[prefix] = 0.0
            for block, p_block in _draft_blocks(drafter, prefix, k, point_mass):
                draft_probs = None if point_mass else drafter.rows(prefix, block, k)  # [k, V]
                plan = plan_fn(torch.tensor(block, dtype=torch.long), draft_probs,
                               target.rows(prefix, block, k + 1))  # target rows: [k + 1, V]
                expected_tokens[prefix] += p_block * plan.expected_tokens
                dists = plan.next_token_dists.tolist()
                for j, p_j in enumerate(plan.num_accepted_probs.tolist()):
                    if p_j == 0.0:
                        continue
                    for y, p_y in enumerate(dists[j]):
                        if p_y == 0.0:
                            continue
                        seq = prefix + block[:j] + (y,)
                        p = mass * p_block * p_j * p_y
                        if len(seq) >= length:
                            out[seq[:length]] += p
                        else:
                            pending[len(seq)][seq] += p
    return out, expected_tokens


def target_distribution(target: ToyModel, length: int) -> dict[tuple[int, ...], float]:
    out = {}
    for seq in itertools.product(range(target.vocab), repeat=length):
        p = 1.0
        for i, y in enumerate(seq):
            p *= target.dist(seq[:i])[y]
        out[seq] = p
    return out


def max_error(got: dict, want: dict) -> float:
    assert set(got) <= set(want), "committed a sequence outside the vocabulary"
    return max(abs(got.get(seq, 0.0) - p) for seq, p in want.items())


# --- deliberately wrong verifiers: the exact check must reject them -------------------


def accept_always_plan(draft_tokens, draft_probs, target_probs) -> VerificationPlan:
    k = draft_tokens.numel()
    accepted = torch.zeros(k + 1, dtype=torch.float64)
    accepted[k] = 1.0
    return VerificationPlan(torch.ones(k, dtype=torch.float64), accepted, target_probs.to(torch.float64))


def resample_from_target_plan(draft_tokens, draft_probs, target_probs) -> VerificationPlan:
    """Token-level acceptance, but the recovered token comes from t_i, not the residual."""
    plan = token_verification_plan(draft_tokens, draft_probs, target_probs)
    return VerificationPlan(plan.position_probs, plan.num_accepted_probs, target_probs.to(torch.float64))


# --- exact enumeration ----------------------------------------------------------------

PLANS = {"token": token_verification_plan, "block": block_verification_plan}


def test_the_enumerated_rules_are_the_ones_the_engine_runs():
    """The engine looks its verifier up by name; those are the functions sampled below, and
    each plan comes from the same module as its sampler (one implementation per rule)."""
    for name, verify in (("token", verify_tokens), ("block", verify_block)):
        assert get_verifier(name) is verify
        assert PLANS[name].__module__ == verify.__module__


@lru_cache(maxsize=None)
def enumerate_case(name: str, k: int, length: int, verifier: str, point_mass: bool):
    target, drafter = PAIRS[name]
    return speculative_distribution(PLANS[verifier], target, drafter, k, length, point_mass)


def marginal(dist: dict[tuple[int, ...], float], length: int) -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = defaultdict(float)
    for seq, p in dist.items():
        out[seq[:length]] += p
    return out


@pytest.mark.parametrize("point_mass", [False, True], ids=["sampled-drafts", "argmax-drafts"])
@pytest.mark.parametrize("verifier", list(PLANS))
@pytest.mark.parametrize("name,k,length", CASES)
def test_committed_tokens_follow_target_exactly(name, k, length, verifier, point_mass):
    dist, _ = enumerate_case(name, k, length, verifier, point_mass)
    target = PAIRS[name][0]
    for n in range(2, length + 1):
        err = max_error(marginal(dist, n), target_distribution(target, n))
        assert err <= TOLERANCE, f"{verifier} on {name}, k={k}, first {n} tokens: max abs error {err:.3e}"
    assert abs(sum(dist.values()) - 1.0) <= TOLERANCE


@pytest.mark.parametrize("wrong_plan", [accept_always_plan, resample_from_target_plan],
                         ids=["accept-always", "resample-from-target"])
@pytest.mark.parametrize("name", ["V3-independent", "V4-close-drafter-with-zeros"])
def test_wrong_verifiers_fail_the_same_check(name, wrong_plan):
    target, drafter = PAIRS[name]
    k, length = 2, 4
    got, _ = speculative_distribution(wrong_plan, target, drafter, k, length)
    err = max_error(got, target_distribution(target, length))
    assert err > 1e-3, f"{wrong_plan.__name__} on {name}: error only {err:.3e}; the check has no power"


def test_block_never_yields_fewer_tokens_per_step_than_token_level():
    """E[tokens per step] (over the drafter's blocks), at every prefix decoding reaches:
    block >= token-level (Sun et al. 2025 prove it always holds), and strictly greater
    somewhere. With argmax drafts the two rules coincide (one possible block)."""
    report, worst, strictly_better = [], math.inf, 0
    for name, k, length in CASES:
        for point_mass in (False, True):
            _, e_token = enumerate_case(name, k, length, "token", point_mass)
            _, e_block = enumerate_case(name, k, length, "block", point_mass)
            common = e_token.keys() & e_block.keys()
            worst = min(worst, min(e_block[p] - e_token[p] for p in common))
            strictly_better += e_block[()] > e_token[()] + 1e-6
            mode = "argmax" if point_mass else "sampled"
            report.append(f"{name} k={k} {mode} drafts: token {e_token[()]:.4f}, block {e_block[()]:.4f}")
    summary = "E[tokens per step] at the first step:\n" + "\n".join(report)
    assert worst >= -1e-12, f"block below token-level by {-worst:.3e} somewhere\n{summary}"
    assert strictly_better, f"block verification never strictly better\n{summary}"
    print("\n" + summary)


# --- the sampling functions draw from their plans -------------------------------------

SAMPLES = 2_000
FALSE_ALARM = 1e-4  # chance that a correct sampler fails one chi-square test (fixed seed: deterministic)


def _sampler_case(point_mass: bool):
    """A k = 3, V = 5 step in which every number of accepted tokens is likely enough to test."""
    target = torch.tensor([[0.30, 0.25, 0.20, 0.15, 0.10],
                           [0.10, 0.40, 0.10, 0.30, 0.10],
                           [0.25, 0.05, 0.40, 0.00, 0.30],
                           [0.20, 0.20, 0.20, 0.20, 0.20]], dtype=torch.float32)  # [k + 1, V]
    draft = torch.tensor([[0.50, 0.10, 0.20, 0.10, 0.10],
                          [0.05, 0.60, 0.05, 0.25, 0.05],
                          [0.10, 0.10, 0.60, 0.10, 0.10]], dtype=torch.float32)  # [k, V]
    return torch.tensor([0, 1, 2]), None if point_mass else draft, target


def _joint(plan: VerificationPlan) -> np.ndarray:
    """P(j accepted, next token y): [k + 1, V]."""
    return (plan.num_accepted_probs[:, None] * plan.next_token_dists).numpy()


def _chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit over the cells with positive probability; cells expected
    fewer than 5 times are pooled so the test's approximation holds."""
    expected = probs.ravel() * counts.sum()
    observed = counts.ravel().astype(float)
    positive = expected > 0
    small = positive & (expected < 5)
    big = positive & ~small
    obs = np.append(observed[big], observed[small].sum())
    exp = np.append(expected[big], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    exp *= obs.sum() / exp.sum()
    return float(chisquare(obs, exp).pvalue)


@pytest.mark.parametrize("point_mass", [False, True], ids=["dense-drafts", "point-masses"])
@pytest.mark.parametrize("verify,plan_fn", [
    (verify_tokens, token_verification_plan),
    (verify_block, block_verification_plan),
], ids=["token", "block"])
def test_sampler_draws_from_its_plan(verify, plan_fn, point_mass):
    tokens, draft, target = _sampler_case(point_mass)
    k, vocab = tokens.numel(), target.shape[1]
    plan = plan_fn(tokens, draft, target)
    generator = torch.Generator().manual_seed(1234)
    counts = np.zeros((k + 1, vocab), dtype=np.int64)
    for _ in range(SAMPLES):
        result = verify(tokens, draft, target, generator)
        j = result.num_accepted
        assert result.tokens[:j] == tokens[:j].tolist() and len(result.tokens) == j + 1
        assert result.num_proposed == k
        counts[j, result.tokens[-1]] += 1

    probs = _joint(plan)
    assert counts[probs == 0].sum() == 0, "sampled an outcome the plan gives probability 0"
    assert (counts[probs * SAMPLES >= 30] > 0).all(), "never sampled an outcome the plan makes likely"
    p_value = _chi_square_p(counts, probs)
    assert p_value > FALSE_ALARM, f"samples do not follow the plan: chi-square p = {p_value:.2e}"

    # Power: the same samples reject a plan that differs from this one (the other verifier
    # where the two differ, else a wrong rule), so passing above is not for lack of samples.
    other_plan_fn = token_verification_plan if plan_fn is block_verification_plan and not point_mass \
        else resample_from_target_plan
    other = _joint(other_plan_fn(tokens, draft, target))
    assert np.abs(other - probs).max() > 0.02, "the toy case cannot tell the two plans apart"
    if (counts[other == 0] > 0).any():
        return  # support alone already tells them apart
    p_other = _chi_square_p(counts, other)
    assert p_other < FALSE_ALARM, (
        f"the test cannot tell {plan_fn.__name__} from {other_plan_fn.__name__}: p = {p_other:.2e}"
    )
