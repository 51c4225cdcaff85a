"""The estimates k is chosen from (specwise.estimators), and the k choices they lead to.

The pinning tests feed a recorded sequence of step observations to adaptive k and to the
goodput planner and compare every choice with the one the documented formulas give
(docs/DESIGN.md, "Cost model" and "Continuous batching"), computed here from the whole
history with numpy's weighted least squares rather than from running sums.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from specwise.adaptive import AdaptiveBlockSize
from specwise.estimators import (AcceptanceRate, DecayedRate, LinearCost, MeasuredCost,
                                 expected_acceptance_length)
from specwise.goodput import GoodputPlanner

DECAY = 0.9


def test_expected_acceptance_length():
    assert expected_acceptance_length(0.0, 5) == 1.0
    assert expected_acceptance_length(1.0, 5) == 6.0
    assert expected_acceptance_length(0.5, 0) == 1.0
    assert expected_acceptance_length(0.5, 2) == pytest.approx(1.75)
    assert expected_acceptance_length(0.8, 3) == pytest.approx(1 + 0.8 + 0.64 + 0.512)


def test_acceptance_counts_stop_at_the_first_rejection_and_keep_the_weak_prior():
    rate = AcceptanceRate()
    assert rate.value == 0.5  # the weak prior alone: one success in two trials
    rate.observe(proposed=4, accepted=2)  # 2 successes, then the rejected third: 3 trials
    assert (rate.numerator, rate.denominator) == (2, 3) and rate.value == pytest.approx(3 / 5)
    rate.observe(proposed=3, accepted=3)  # all accepted: no rejected trial
    assert rate.value == pytest.approx((0.9 * 2 + 3 + 1) / (0.9 * 3 + 3 + 2))
    rate.observe(proposed=0, accepted=0)  # nothing proposed: nothing learned, nothing decayed
    assert rate.value == pytest.approx((0.9 * 2 + 3 + 1) / (0.9 * 3 + 3 + 2))
    for _ in range(200):
        rate.observe(proposed=4, accepted=4)
    assert 0.97 < rate.value < 1.0  # the lasting prior keeps it off 1
    fading = AcceptanceRate(start=(1.0, 2.0), prior=(0.0, 0.0), ceiling=0.999)
    for _ in range(200):
        fading.observe(proposed=4, accepted=4)
    assert fading.value == 0.999  # a fading prior: only the ceiling keeps it off 1


def test_a_decayed_mean_is_the_exponential_moving_mean():
    mean, expected = DecayedRate.mean(1.0), 1.0
    for x in [0.0, 1.0, 0.0, 0.0, 1.0, 0.3]:
        mean.add(x)
        expected = DECAY * expected + (1 - DECAY) * x
        assert mean.value == pytest.approx(expected, abs=1e-12)
    assert DecayedRate().value == 0.0 and DecayedRate(empty=2.5).value == 2.5


def _weighted_line(points, weights):
    """(base, slope) of weighted least squares, from numpy."""
    n, t = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    slope, base = np.polyfit(n, t, 1, w=np.sqrt(np.array(weights, float)))
    return base, slope


def test_linear_cost_is_weighted_least_squares_decayed_or_windowed():
    rng = random.Random(0)
    points = [(rng.randint(1, 13), rng.uniform(0.1, 0.5)) for _ in range(80)]
    decayed, windowed = LinearCost(decay=DECAY, min_slope=-1.0), LinearCost(window=16, min_slope=-1.0)
    for i, (n, t) in enumerate(points, start=1):
        decayed.add(n, t)
        windowed.add(n, t)
        if i >= 3:
            weights = [DECAY ** (i - 1 - j) for j in range(i)]
            assert decayed.line() == pytest.approx(_weighted_line(points[:i], weights), abs=1e-9)
            recent = points[max(0, i - 16):i]
            assert windowed.line() == pytest.approx(_weighted_line(recent, [1] * len(recent)), abs=1e-9)
    exact = LinearCost(decay=DECAY)
    for n in (1, 5, 1, 9, 3):
        exact.add(n, 0.3 + 0.02 * n)
    assert exact(8) == pytest.approx(0.46) and exact.sizes_seen == 2


def test_linear_cost_floors_and_its_start():
    assert LinearCost()(4) == 1.0 and LinearCost().sizes_seen == 0  # nothing seen: a unit that ranks nothing
    one_size = LinearCost.through([(5, 0.2), (5, 0.4)])
    assert one_size.sizes_seen == 1 and one_size(1) == pytest.approx(0.3)  # flat at the mean
    falling = LinearCost.through([(1, 0.5), (9, 0.1)])  # noise: more rows, less time
    assert falling.line() == (pytest.approx(0.3), 0.0) and falling(9) == pytest.approx(0.3)
    planner_like = LinearCost.through([(1, 0.5), (9, 0.1)], min_slope=1e-6, min_base=0.0)
    assert planner_like.line()[1] == 1e-6
    steep = LinearCost.through([(2, 0.1), (4, 0.5)], min_base=0.0)  # the line would cross below 0
    assert steep.line() == (0.0, pytest.approx(0.2))
    assert LinearCost.through([(2, 0.1), (4, 0.5)])(1) == 1e-6  # no pass is free
    with pytest.raises(ValueError, match="decay or window"):
        LinearCost(decay=0.9, window=8)


def test_measured_cost_interpolates_and_extrapolates():
    cost = MeasuredCost([(8, 0.5), (1, 0.1), (4, 0.2)])
    assert cost(1) == 0.1 and cost(4) == 0.2 and cost(8) == 0.5
    assert cost(0) == 0.1  # below the first measured n: the first
    assert cost(2) == pytest.approx(0.1 + 0.1 / 3) and cost(6) == pytest.approx(0.35)
    assert cost(12) == pytest.approx(0.8)  # along the last two points
    assert MeasuredCost([(4, 0.3)])(9) == 0.3
    with pytest.raises(ValueError, match="at least one"):
        MeasuredCost([])


# --------------------------------------------------------------------------- pinned k choices

def _recorded_steps(seed: int, steps: int, k_max: int):
    """A recorded run: (proposed, accepted, draft seconds, score seconds, shadow hit or None) per step,
    on a target whose T(n) is a noisy line, with acceptance that changes with the text."""
    rng = random.Random(seed)
    alpha, recorded = 0.7, []
    for step in range(steps):
        if step % 25 == 0:
            alpha = rng.random()
        proposed = rng.choice([0, 0, rng.randint(1, k_max)])
        accepted = 0
        while accepted < proposed and rng.random() < alpha:
            accepted += 1
        score = (0.05 + 0.012 * (proposed + 1)) * rng.uniform(0.9, 1.1)
        shadow = (rng.random() < alpha) if proposed == 0 else None
        recorded.append((proposed, accepted, 0.004 * proposed * rng.uniform(0.5, 1.5), score, shadow))
    return recorded


def _reference_k(history, prior_points, k_min: int, k_max: int) -> int:
    """The k the documented rule chooses after these observations, from the whole history, for a rule
    with shadow drafts: α = (decayed successes + 0.5) / (decayed trials + 2 · decay^observations + 1), the
    drafter's decayed seconds per decayed draft token, T(n) by least squares weighted decay^age (slope >= 0,
    at least 1e-6 s; before two block sizes, the mean times 1 + 0.25 (n - 1)), then
    k = argmax over {0} ∪ [k_min, k_max] of E[τ] / (k · draft cost + T(k + 1))."""
    trials, passes, drafts = [], list(prior_points), []  # (age-ordered) observations of each estimate
    for kind, *values in history:
        if kind == "step":
            proposed, accepted, draft_seconds, score_seconds = values
            passes.append((proposed + 1, score_seconds))
            if proposed:
                trials.append((accepted, accepted + (accepted < proposed)))
                drafts.append((draft_seconds, proposed))
        else:
            trials.append((values[0], 1))

    def decayed(pairs, index):
        return sum(p[index] * DECAY ** (len(pairs) - 1 - i) for i, p in enumerate(pairs))

    alpha = (decayed(trials, 0) + 0.5) / (decayed(trials, 1) + 2 * DECAY ** len(trials) + 1)
    draft_cost = decayed(drafts, 0) / decayed(drafts, 1) if drafts else 0.0
    steps = sum(kind == "step" for kind, *_ in history)
    # the prior's two points count one pass each, decayed by every step after them
    weights = ([DECAY ** steps] * len(prior_points)
               + [DECAY ** (steps - 1 - i) for i in range(len(passes) - len(prior_points))])
    if len({n for n, _ in passes}) >= 2:
        base, slope = _weighted_line(passes, weights)
        if slope < 0:
            slope, base = 0.0, np.average([t for _, t in passes], weights=weights)
    else:  # one block size seen: an extra row costs a quarter of the mean pass
        mean = np.average([t for _, t in passes], weights=weights)
        slope, base = 0.25 * mean, 0.75 * mean

    def rate(k: int) -> float:
        return expected_acceptance_length(alpha, k) / (k * draft_cost + max(1e-6, base + slope * (k + 1)))
    return max([0] + list(range(k_min, k_max + 1)), key=rate)


@pytest.mark.parametrize("seed, with_prior", [(0, False), (1, False), (2, True), (3, True)])
def test_adaptive_k_chooses_what_the_formulas_say(seed, with_prior):
    k_min, k_max = 1, 10
    prior = (lambda n: 0.06 + 0.01 * n) if with_prior else None
    prior_points = [(n, prior(n)) for n in (1, k_max + 1)] if with_prior else []
    rule = AdaptiveBlockSize(k=4, k_min=k_min, k_max=k_max, target_prior=prior, shadow_drafts=True)
    warmup = 1  # steps before k follows the estimates: a rule with shadow drafts starts with one plain step
    history, chosen, expected = [], [], []
    for step, (proposed, accepted, draft, score, shadow) in enumerate(_recorded_steps(seed, 120, k_max)):
        rule.observe(proposed, accepted, draft, score)
        history.append(("step", proposed, accepted, draft, score))
        if shadow is not None and rule.shadows:
            rule.observe_shadow(7, 7 if shadow else 8, 1e-7)
            history.append(("shadow", int(shadow)))
        if step + 1 >= warmup:
            chosen.append(rule.k)
            expected.append(_reference_k(history, prior_points, k_min, k_max))
    assert rule.shadows and rule.shadow_trials > 20
    assert chosen == expected
    assert len(set(chosen)) >= 3  # the recorded text moves k around: the check covers several choices


def _reference_plan(members, passes, prior):
    """The goodput plan from the recorded history of each member and of the passes: acceptance
    a = decayed accepted / decayed reached from a fading start of 1 in 2, at most 0.999; proposing
    share q (over the steps that could propose: not planned to draft nothing, or proposing anyway)
    and draft seconds per token d as moving means (from 1 and 0); T(rows) by least squares
    over the last 64 passes (slope >= 1e-6, base >= 0), else the prior; then draft tokens added one
    at a time where they raise sum tokens / (T(rows) + drafting) most (a member not planned yet
    counts one row and one token)."""
    recent = passes[-64:]
    if len({rows for rows, _ in recent}) >= 2:
        base, slope = _weighted_line(recent, [1] * len(recent))
        slope = max(slope, 1e-6)
        base = max(float(np.mean([t for _, t in recent])) - slope * float(np.mean([r for r, _ in recent])), 0.0)
        cost = lambda rows: base + slope * rows
    else:
        cost = prior
    state = {}
    for name, steps in members.items():
        accepted, reached, share, per_token, seen = 1.0, 2.0, 1.0, 0.0, 0
        for proposed, kept, seconds, could_propose in steps:
            if could_propose:
                share = DECAY * share + (1 - DECAY) * (proposed > 0)
            if proposed:
                accepted = DECAY * accepted + kept
                reached = DECAY * reached + kept + (kept < proposed)
                per_token = DECAY * per_token + (1 - DECAY) * seconds / proposed
                seen += 1
        state[name] = (min(accepted / reached, 0.999), share, per_token, seen)
    planned = {m: s for m, s in state.items() if s[3] >= 3}
    if not planned or len(members) < 2:
        return {}

    others = len(members) - len(planned)

    def goodput(ks):
        rows = others + sum(1 + planned[m][1] * k for m, k in ks.items())
        tokens = others + sum(1 + planned[m][1] * (expected_acceptance_length(planned[m][0], k) - 1)
                              for m, k in ks.items())
        return tokens / (cost(rows) + sum(planned[m][2] * k for m, k in ks.items()))

    ks = {m: 0 for m in planned}
    while True:
        options = [dict(ks, **{m: ks[m] + 1}) for m in ks if ks[m] < 6]
        best = max(options, key=goodput, default=None)
        if best is None or goodput(best) <= goodput(ks):
            return ks
        ks = best


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_goodput_plan_is_what_the_formulas_say(seed):
    rng = random.Random(seed)
    prior = lambda rows: 0.02 + 0.004 * rows
    planner = GoodputPlanner(prior)
    alphas = {"a": 0.9, "b": 0.5, "c": 0.1}
    members = {m: [] for m in alphas}
    passes = []
    for m in members:
        planner.join(m)
        planner.limit(m, 6)
    plans = []
    for step in range(60):
        rows = 0
        for m, alpha in alphas.items():
            k = planner.planned_k(m)  # plans afresh from every step seen so far
            expected = _reference_plan(members, passes, prior)
            assert planner.last_plan == expected
            plans.append(expected)
            k = 4 if k is None else k
            proposed = k if rng.random() < 0.85 else 0
            kept = 0
            while kept < proposed and rng.random() < alpha:
                kept += 1
            seconds = 0.001 * proposed * rng.uniform(0.5, 1.5)
            planner.observe(m, proposed, kept, seconds)
            members[m].append((proposed, kept, seconds, expected.get(m) != 0 or proposed > 0))
            rows += proposed + 1
        if step >= 30:  # first from the prior, then from the passes it measured
            passes.append((rows, (0.015 + 0.005 * rows) * rng.uniform(0.95, 1.05)))
            planner.observe_pass(*passes[-1])
    assert sum(bool(plan) for plan in plans) > 150  # planned in nearly every turn after the first steps
    full = [plan for plan in plans if len(plan) == 3]
    assert len({tuple(plan.values()) for plan in full}) >= 3  # the check covers several plans
    assert any(plan["a"] > plan["c"] for plan in full)  # which tell the members apart
