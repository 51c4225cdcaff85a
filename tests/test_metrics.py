from specwise.stats import SpecStats


def test_tau_alpha_and_per_position():
    stats = SpecStats()
    stats.record_step(4, 4)
    stats.record_step(4, 1)
    stats.record_step(2, 0)
    stats.record_step(0, 0)
    assert stats.steps == 4 and stats.proposed == 10 and stats.accepted == 5
    assert stats.acceptance_rate == 0.5
    assert stats.acceptance_length == (5 + 4) / 4
    assert stats.per_position_acceptance == [2 / 3, 1 / 3, 1 / 2, 1 / 2]
    assert stats.steps_without_draft == 1


def test_merge_adds_counts_and_times():
    a, b = SpecStats(), SpecStats()
    a.record_step(2, 2)
    a.total_seconds, a.new_tokens = 1.0, 3
    b.record_step(3, 0)
    b.total_seconds, b.new_tokens = 1.0, 1
    total = SpecStats.combine([a, b])
    assert total.steps == 2 and total.proposed_at == [2, 2, 1] and total.accepted_at == [1, 1, 0]
    assert total.tokens_per_second == 2.0
    assert a.steps == 1  # inputs unchanged
    assert total.to_dict()["acceptance_length"] == 2.0  # (2 accepted + 2 steps) / 2 steps
