import pytest

from specwise.adaptive import AdaptiveBlockSize, best_block_size, expected_acceptance_length


def test_expected_acceptance_length():
    assert expected_acceptance_length(0.0, 5) == 1.0
    assert expected_acceptance_length(1.0, 5) == 6.0
    assert expected_acceptance_length(0.5, 2) == pytest.approx(1.75)


def test_picks_the_k_the_cost_model_says():
    flat = lambda n: 0.25  # memory bound: any block costs one pass
    # alpha 0.8, draft 0.01 s/token: rate(k) = (1 - 0.8^(k+1)) / 0.2 / (0.01k + 0.25):
    # 11.59 at k = 4, 12.71 at k = 8, 12.74 at k = 9, 12.70 at k = 10
    assert best_block_size(0.8, 1, 12, 0.01, flat) == 9
    # an expensive drafter with poor acceptance: draft one token
    assert best_block_size(0.3, 1, 12, 0.2, flat) == 1
    # a target whose cost jumps past 8 tokens caps k at 7 (block of 8)
    stepped = lambda n: 0.25 if n <= 8 else 1.0
    assert best_block_size(0.9, 1, 12, 0.005, stepped) == 7


def test_online_estimate_follows_acceptance():
    rule = AdaptiveBlockSize(k=4, k_min=1, k_max=10, target_cost=lambda n: 0.25, allow_zero=False)
    for _ in range(30):
        rule.observe(proposed=rule.next_k(), accepted=rule.next_k(), draft_seconds=0.01 * rule.next_k(),
                     score_seconds=0.25)
    assert rule.alpha > 0.9 and rule.next_k() == 10
    for _ in range(40):
        rule.observe(proposed=rule.next_k(), accepted=0, draft_seconds=0.05 * rule.next_k(), score_seconds=0.25)
    assert rule.alpha < 0.25 and rule.next_k() == 1


def test_learns_a_compute_bound_target_and_stops_drafting_when_it_does_not_pay():
    # T(n) = 0.3 + 0.18 (n - 1) s: scoring 8 tokens costs 5x one (as on a 2-core AVX2 CPU in bf16)
    cost = lambda n: 0.3 + 0.18 * (n - 1)
    rule = AdaptiveBlockSize(k=5, k_min=1, k_max=10)
    for _ in range(40):
        k = rule.next_k()
        accepted = min(k, 1)  # a drafter that gets only its first token right
        rule.observe(k, accepted, draft_seconds=0.1 * k, score_seconds=cost(k + 1))
    assert abs(rule.target_cost(8) - cost(8)) < 1e-6  # the line is recovered exactly
    # alpha ~0.5 with a 0.1 s/token drafter: rate(0) = 1/0.3 = 3.33 beats rate(1) = 1.5/0.58 = 2.59
    assert rule.k == 0 and rule.steps_without_drafting > 20
    probes = [rule.next_k() for _ in range(16)]
    assert probes.count(1) == 2 and probes.count(0) == 14  # one probe in eight keeps alpha measured


def test_memory_bound_target_gets_long_blocks():
    rule = AdaptiveBlockSize(k=3, k_min=1, k_max=10)
    for _ in range(30):
        k = rule.next_k()
        rule.observe(k, k, draft_seconds=0.005 * k, score_seconds=0.25)  # flat T(n), drafts all accepted
    assert rule.k == 10
