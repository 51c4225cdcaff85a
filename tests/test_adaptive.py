import os

import pytest

from specwise.adaptive import AdaptiveBlockSize, best_block_size


def test_picks_the_k_the_cost_model_says():
    flat = lambda n: 0.25  # memory bound: any block costs one pass
    # alpha 0.8, draft 0.01 s/token: rate(k) = (1 - 0.8^(k+1)) / 0.2 / (0.01k + 0.25):
    # 4 at k = 0, 11.59 at k = 4, 12.71 at k = 8, 12.74 at k = 9, 12.70 at k = 10
    assert best_block_size(0.8, 1, 12, 0.01, flat) == 9
    # poor acceptance: rate(0) = 4, rate(1) = 1.3 / 0.3 = 4.33, rate(2) = 1.39 / 0.35 = 3.97
    assert best_block_size(0.3, 1, 12, 0.05, flat) == 1
    # the same with an expensive drafter: rate(1) = 1.3 / 0.45 = 2.89 < 4, plain decoding
    assert best_block_size(0.3, 1, 12, 0.2, flat) == 0
    # a target whose cost jumps past 8 tokens caps k at 7 (block of 8)
    stepped = lambda n: 0.25 if n <= 8 else 1.0
    assert best_block_size(0.9, 1, 12, 0.005, stepped) == 7


def test_online_estimate_follows_acceptance():
    rule = AdaptiveBlockSize(k=4, k_min=1, k_max=10, target_cost=lambda n: 0.25)
    ks = []
    for _ in range(30):  # every draft accepted
        ks.append(k := rule.next_k())
        rule.observe(proposed=k, accepted=k, draft_seconds=0.01 * k, score_seconds=0.25)
    assert ks[:2] == [4, 0]  # the warm-up: the configured k, then plain decoding
    assert rule.alpha > 0.9 and ks[2:] == [10] * 28 and rule.next_k() == 10
    ks = []
    for _ in range(40):  # every draft rejected: k falls step by step, down to plain decoding
        ks.append(k := rule.next_k())
        rule.observe(proposed=k, accepted=0, draft_seconds=0.05 * k, score_seconds=0.25)
    assert rule.alpha < 0.25 and rule.k == 0
    assert ks == sorted(ks, reverse=True) and ks[0] == 10 and ks[-1] == 1


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


def test_a_measured_cost_table_replaces_the_probing_warm_up():
    """With the target's T(n) from `specwise bench cost`, one step at the configured k suffices."""
    steep = lambda n: 0.3 + 0.18 * (n - 1)  # compute bound: drafting rarely pays
    flat = lambda n: 0.25  # memory bound: long blocks pay
    for prior, expected in ((steep, 0), (flat, 10)):
        rule = AdaptiveBlockSize(k=4, k_min=1, k_max=10, target_prior=prior)
        assert rule.prior_used and rule.next_k() == 4
        rule.observe(4, 4 if prior is flat else 1, draft_seconds=0.4 * (prior is steep) + 0.02,
                     score_seconds=prior(5))
        assert rule.next_k() == expected  # decided after the first step: no step at k = 0 to probe
    # Without a prior the second step probes plain decoding, whatever the first showed.
    rule = AdaptiveBlockSize(k=4, k_min=1, k_max=10)
    rule.observe(4, 4, draft_seconds=0.02, score_seconds=0.25)
    assert not rule.prior_used and rule.next_k() == 0
    # A wrong prior counts like two steps and is outweighed by what the steps measure (one plain
    # step in eight keeps two block sizes in the fit).
    rule = AdaptiveBlockSize(k=4, k_min=1, k_max=10, target_prior=steep)
    ks = []
    for _ in range(40):  # really flat, every draft accepted: long blocks pay
        ks.append(k := rule.next_k())
        rule.observe(k, k, draft_seconds=0.005 * k, score_seconds=0.25)
    assert ks[-5:] == [10] * 5 and abs(rule.target_cost(8) - 0.25) < 0.01
    rule = AdaptiveBlockSize(k=4, k_min=1, k_max=10, target_prior=flat)
    ks = []
    for _ in range(40):  # really steep, only first drafts accepted: drafting barely pays
        ks.append(k := rule.next_k())
        rule.observe(k, min(k, 1), draft_seconds=0.1 * k, score_seconds=steep(k + 1))
    assert ks[0] == 4 and max(ks[-10:]) <= 2 and 0 in ks[-10:]


def test_the_decoder_finds_the_saved_table_of_its_target(tmp_path, monkeypatch):
    import torch

    from specwise import SamplingParams, SpecConfig, SpecDecoder
    from specwise.bench import cost
    from specwise.cost_model import cached_cost_function
    from specwise.testing import tiny_loaded

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    target = tiny_loaded(0, name="tiny-cost")
    threads = torch.get_num_threads()
    assert cached_cost_function("tiny-cost", torch.float32, threads, "lean") is None
    table = {"seconds": {"128": {"1": 0.1, "8": 0.8}, "512": {"1": 0.2, "8": 1.6}}}
    cost.save(table, cost.cost_path("tiny-cost", torch.float32, threads, "lean"))
    t = cached_cost_function("tiny-cost", torch.float32, threads, "lean", context=400)
    assert t(1) == 0.2 and abs(t(8) - 1.6) < 1e-12
    assert cached_cost_function("tiny-cost", torch.float32, threads, "hf") is None  # another runner's
    decoder = SpecDecoder(target, SpecConfig(drafter="ngram", adaptive=True, runner="lean"))
    prior = decoder._cost_prior(decoder.runner_for("lean"))
    assert prior(100)(8) == 0.8 and prior(600)(8) == 1.6
    result = decoder.generate([5, 9, 14, 5, 9, 14], SamplingParams(max_new_tokens=10))
    assert len(result.token_ids) == 10


def test_a_saved_table_is_read_again_only_when_it_changes(tmp_path, monkeypatch):
    import os

    import torch

    from specwise import cost_model

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    path = cost_model.cost_path("tiny-cost", torch.float32, 2, "lean")
    path.parent.mkdir(parents=True)
    path.write_text('{"seconds": {"128": {"1": 0.1, "8": 0.8}}}')
    assert cost_model.cached_cost_function("tiny-cost", torch.float32, 2, "lean")(8) == 0.8
    reads = []
    monkeypatch.setattr(cost_model, "load", lambda p: reads.append(p) or {"seconds": {}})
    assert cost_model.cached_cost_function("tiny-cost", torch.float32, 2, "lean")(8) == 0.8
    assert reads == []  # unchanged file: no second parse
    monkeypatch.undo()
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    path.write_text('{"seconds": {"128": {"1": 0.1, "8": 0.4}}}')
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert cost_model.cached_cost_function("tiny-cost", torch.float32, 2, "lean")(8) == pytest.approx(0.4)
    path.write_text("{not json")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 2 * 10**9))
    assert cost_model.cached_cost_function("tiny-cost", torch.float32, 2, "lean") is None


def test_a_gguf_table_measured_under_another_weight_layout_is_no_prior(tmp_path, monkeypatch):
    """Interleaved and stored weights are different kernels: a table counts only for the layout it was
    measured with (recorded by `bench cost` in machine.kernels.gguf_interleaved; none recorded: stored)."""
    from specwise import cost_model
    from specwise.bench import cost
    from specwise.kernels import gguf as gk

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    monkeypatch.setattr(gk, "kernel_path", lambda: "avx512")
    path = cost_model.cost_path("tiny-cost", "gguf", 2, "lean")
    seconds = {"128": {"1": 0.1, "8": 0.8}}
    monkeypatch.setenv("SPECWISE_INTERLEAVE", "Q4_K")
    cost.save({"dtype": "gguf", "seconds": seconds, "machine": {"kernels": {"gguf": "avx512",
               "gguf_interleaved": ["Q4_K"]}}}, path)
    assert cost_model.cached_cost_function("tiny-cost", "gguf", 2, "lean")(8) == 0.8
    monkeypatch.setenv("SPECWISE_INTERLEAVE", "0")
    assert cost_model.cached_cost_function("tiny-cost", "gguf", 2, "lean") is None
    cost.save({"dtype": "gguf", "seconds": seconds}, path)  # an older table: measured as stored
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert cost_model.cached_cost_function("tiny-cost", "gguf", 2, "lean")(8) == 0.8
    monkeypatch.setenv("SPECWISE_INTERLEAVE", "auto")
    assert cost_model.cached_cost_function("tiny-cost", "gguf", 2, "lean") is None
    monkeypatch.setenv("SPECWISE_INTERLEAVE", "Q3_K")  # a wrong setting: no prior, no traceback
    assert cost_model.cached_cost_function("tiny-cost", "gguf", 2, "lean") is None


def steady_plain(rule, cost, steps, guess_right, seconds=1e-5, point_mass=True):
    """Run `steps` steps of the rule; plain steps report a shadow draft (right when guess_right(step))."""
    ks = []
    for step in range(steps):
        ks.append(k := rule.next_k())
        rule.observe(k, 0, draft_seconds=1e-5 * k, score_seconds=cost(k + 1))
        if k == 0 and rule.shadows:
            rule.observe_shadow(7, 7 if guess_right(step) else 8, seconds, point_mass=point_mass)
    return ks


def steady_predictable(rule, cost, steps):
    """Run `steps` steps of the rule on text it predicts: every draft token is accepted, every shadow draft right."""
    ks = []
    for _ in range(steps):
        ks.append(k := rule.next_k())
        rule.observe(k, k, draft_seconds=1e-5 * k, score_seconds=cost(k + 1))
        if k == 0:
            rule.observe_shadow(7, 7, 1e-5)
    return ks


def test_shadow_drafts_measure_acceptance_without_drafting_steps():
    cost = lambda n: 0.3 + 0.18 * (n - 1)  # compute bound: drafts pay only where nearly all are accepted
    rule = AdaptiveBlockSize(k=4, k_min=1, k_max=10, shadow_drafts=True)
    ks = steady_plain(rule, cost, 40, guess_right=lambda step: False)
    assert rule.k == 0 and rule.shadow_trials > 30
    assert ks[2:] == [0] * 38  # after the two warm-up steps no step drafts only to measure α
    # The text turns predictable: the shadow drafts see it, and drafting resumes by itself.
    ks = steady_predictable(rule, cost, 20)
    assert rule.alpha > 0.8 and ks[-1] >= 1 and ks[:3] == [0, 0, 0]


def test_a_free_drafter_never_drafts_until_its_shadows_agree_with_the_text():
    """A short answer the drafter cannot predict (a fact, a translation) costs nothing over plain decoding:
    the rule starts plain, with or without a measured T(n), and no step drafts while the shadows miss;
    once they hit, drafting starts within a few steps. A rule without shadow drafts still warms up at k."""
    cost = lambda n: 0.03 + 0.006 * (n - 1)  # an extra row costs a fifth of a pass
    for prior in (None, cost):
        rule = AdaptiveBlockSize(k=4, k_min=1, k_max=10, shadow_drafts=True, target_prior=prior)
        assert steady_plain(rule, cost, 30, guess_right=lambda step: False) == [0] * 30
        ks = steady_predictable(rule, cost, 6)
        assert ks[0] == 0 and max(ks) >= 1, ks
    rule = AdaptiveBlockSize(k=4, k_min=1, k_max=10)
    assert steady_plain(rule, cost, 2, guess_right=lambda step: False) == [4, 0]


def test_shadow_drafts_that_cost_or_sample_fall_back_to_probes():
    cost = lambda n: 0.3 + 0.18 * (n - 1)
    # A drafter whose one-token draft costs a third of a target pass (a draft model) is not free.
    rule = AdaptiveBlockSize(k=4, k_min=1, k_max=10, shadow_drafts=True)
    ks = steady_plain(rule, cost, 40, guess_right=lambda step: False, seconds=0.1)
    assert not rule.shadows and rule.shadow_trials <= 3
    assert 1 in ks[10:]  # probing steps again
    # Sampled drafts are accepted with probability min(1, t/d), not when they equal the committed token.
    rule = AdaptiveBlockSize(k=4, k_min=1, k_max=10, shadow_drafts=True)
    steady_plain(rule, cost, 10, guess_right=lambda step: True, point_mass=False)
    assert not rule.shadows and rule.shadow_trials == 0


def test_shadow_drafts_leave_greedy_output_alone_and_are_counted(monkeypatch):
    """Forced plain steps: every one asks the n-gram drafter for a shadow draft, and the output is greedy's."""
    from specwise import SamplingParams, SpecConfig, SpeculativeEngine, k_policy
    from specwise.drafters import NgramDrafter
    from specwise.runners.hf import HFRunner
    from specwise.testing import tiny_model

    from helpers import hf_greedy

    seen = []

    class AlwaysPlain(AdaptiveBlockSize):
        def next_k(self, match=None) -> int:
            return 0

        def observe_shadow(self, draft_token, committed_token, seconds, point_mass=True):
            seen.append((draft_token, committed_token))
            super().observe_shadow(draft_token, committed_token, 0.0, point_mass)

    monkeypatch.setattr(k_policy, "AdaptiveBlockSize", AlwaysPlain)
    target = tiny_model(seed=0)
    prompt = [40, 41, 42, 40, 41, 42, 40, 41]
    config = SpecConfig(k=4, adaptive=True, k_max=8)
    engine = SpeculativeEngine(HFRunner(target), NgramDrafter(1, 3), config, eos_token_ids=())
    result = engine.generate(prompt, SamplingParams(max_new_tokens=30))
    assert result.token_ids == hf_greedy(target, prompt, 30, eos=False)
    assert result.stats.proposed == 0 and len(seen) == 30
    assert [committed for _, committed in seen] == result.token_ids  # each step's committed token
    assert any(guess is not None for guess, _ in seen)  # the repeated prompt gives the lookup matches
    # A drafter that says its drafts are not free gets none asked of it.
    seen.clear()
    costly = NgramDrafter(1, 3)
    costly.free_drafts = False
    engine = SpeculativeEngine(HFRunner(target), costly, config, eos_token_ids=())
    assert engine.generate(prompt, SamplingParams(max_new_tokens=10)).token_ids == result.token_ids[:10]
    assert seen == []


# --------------------------------------------------------------------------- adaptive "auto" (the default)


def test_auto_is_adaptive_k_except_for_seeded_sampling_verified_by_rejection():
    from specwise import SamplingParams, SpecConfig

    greedy, sampled, seeded = SamplingParams(), SamplingParams(temperature=0.8), SamplingParams(temperature=0.8, seed=7)
    auto = SpecConfig(drafter="draft-model")  # block verification under sampling
    assert auto.adaptive == "auto"
    assert [auto.resolve_adaptive(s) for s in (greedy, sampled, seeded)] == [True, True, False]
    # The default drafter's point masses are verified coupled: k changes no token, so a seeded request adapts too.
    assert [SpecConfig().resolve_adaptive(s) for s in (greedy, sampled, seeded)] == [True, True, True]
    assert auto.resolve_adaptive(SamplingParams(seed=7)) is True  # greedy: the seed draws nothing
    # True and False are taken as given
    assert [SpecConfig(adaptive=True).resolve_adaptive(s) for s in (greedy, seeded)] == [True, True]
    assert [SpecConfig(adaptive=False).resolve_adaptive(s) for s in (greedy, sampled)] == [False, False]
    # A tree keeps its size under auto (adaptive sizing does not cover trees); True is refused with one.
    assert SpecConfig(tree_nodes=8).resolve_adaptive(greedy) is False
    assert SpecConfig(drafter="draft-model", tree_shape=(2, 2)).adaptive == "auto"
    with pytest.raises(ValueError, match="does not cover trees"):
        SpecConfig(tree_nodes=8, adaptive=True)
    assert SpecConfig(drafter="none").resolve_adaptive(greedy) is False  # plain decoding
    for bad in ("on", "Auto", 1, None):
        with pytest.raises(ValueError, match="adaptive must be true, false or 'auto'"):
            SpecConfig(adaptive=bad)


class _Batch:
    """A stand-in PlannedRunner: records the limit a generation's policy sets."""

    def __init__(self):
        self.limits = []

    def limit(self, k_max):
        self.limits.append(k_max)

    def planned_k(self):
        return None

    def observe(self, proposed, accepted, draft_seconds):
        pass

    # the rest of ModelRunner, never called here
    vocab_size = max_context = 0
    length = reset = forward = rollback = lambda self, *args, **kwargs: None


def test_each_generation_gets_the_policy_its_sampling_settles():
    from specwise import SamplingParams, SpecConfig
    from specwise.drafters import NgramDrafter
    from specwise.k_policy import AdaptiveK, FixedK, PlannedK, choose_k_policy
    from specwise.stats import PhaseClock, SpecStats
    from specwise.runners.protocols import PlannedRunner

    clock, drafter = PhaseClock(SpecStats()), NgramDrafter(1, 3)
    greedy, sampled, seeded = SamplingParams(), SamplingParams(temperature=0.8), SamplingParams(temperature=0.8, seed=7)
    asked = []

    def prior():
        asked.append(True)
        return None

    policy = lambda spec, sampling, target=None: choose_k_policy(spec, sampling, drafter, target, clock, prior)
    block = SpecConfig(verifier="block")  # rejection: which draws decide a token follows the block lengths
    assert isinstance(policy(block, greedy), AdaptiveK) and asked == [True]
    assert isinstance(policy(block, sampled), AdaptiveK)
    fixed = policy(block, seeded)
    assert isinstance(fixed, FixedK) and fixed.next_k([1, 2]) == 4 and len(asked) == 2  # no prior read for it
    assert isinstance(policy(SpecConfig(verifier="block", adaptive=True), seeded), AdaptiveK)
    assert isinstance(policy(SpecConfig(adaptive=False), greedy), FixedK)
    assert isinstance(policy(SpecConfig(), seeded), AdaptiveK)  # coupled (the default's): k changes no token
    # In a batch, the planner plans only where k changes no output: a seeded sampled request verified by
    # rejection keeps its k; one verified coupled is planned, even with a fixed k of its own.
    batch = _Batch()
    assert isinstance(batch, PlannedRunner)
    assert isinstance(policy(block, greedy, batch), PlannedK) and batch.limits[-1] == 12
    assert isinstance(policy(block, sampled, batch), PlannedK) and batch.limits[-1] == 12
    assert isinstance(policy(block, seeded, batch), FixedK) and batch.limits[-1] is None
    assert isinstance(policy(SpecConfig(adaptive=False), greedy, batch), PlannedK) and batch.limits[-1] == 4
    assert isinstance(policy(SpecConfig(adaptive=False), seeded, batch), PlannedK) and batch.limits[-1] == 4


def test_the_default_repeats_a_seeded_sampled_output_and_adapts_otherwise(monkeypatch):
    """Adaptive k forced to plain steps shows which generations get it: a seeded sampled one verified
    by rejection drafts a fixed k (and repeats adaptive=False's output exactly); under the default's
    coupled verification it adapts, and still repeats adaptive=False's output; a greedy one adapts."""
    from specwise import SamplingParams, SpecConfig, SpeculativeEngine, k_policy
    from specwise.drafters import NgramDrafter
    from specwise.runners.hf import HFRunner
    from specwise.testing import tiny_model

    class AlwaysPlain(AdaptiveBlockSize):
        def next_k(self, match=None) -> int:
            return 0

    monkeypatch.setattr(k_policy, "AdaptiveBlockSize", AlwaysPlain)
    target = HFRunner(tiny_model(seed=0))
    prompt = [40, 41, 42, 40, 41, 42, 40, 41]

    def run(spec, sampling):
        return SpeculativeEngine(target, NgramDrafter(1, 3), spec, eos_token_ids=()).generate(prompt, sampling)

    seeded = SamplingParams(temperature=0.9, seed=5, max_new_tokens=30)
    token = SpecConfig(verifier="token")
    first, again = run(token, seeded), run(token, seeded)
    fixed = run(SpecConfig(verifier="token", adaptive=False), seeded)
    assert first.token_ids == again.token_ids == fixed.token_ids
    assert first.stats.proposed == fixed.stats.proposed > 0 and first.stats.steps == fixed.stats.steps
    assert run(SpecConfig(verifier="token", adaptive=True), seeded).stats.proposed == 0
    coupled, coupled_fixed = run(SpecConfig(), seeded), run(SpecConfig(adaptive=False), seeded)
    assert coupled.stats.proposed == 0 < coupled_fixed.stats.proposed  # it adapted (to plain steps) ...
    assert coupled.token_ids == coupled_fixed.token_ids  # ... and its tokens are those of any k
    greedy = SamplingParams(max_new_tokens=30)
    assert run(SpecConfig(), greedy).stats.proposed == 0
    assert run(SpecConfig(), greedy).token_ids == run(SpecConfig(adaptive=False), greedy).token_ids
    assert run(SpecConfig(), SamplingParams(temperature=0.9, max_new_tokens=30)).stats.proposed == 0


def test_split_acceptance_length_is_the_one_rate_formula_when_the_rates_agree():
    from specwise.estimators import expected_acceptance_length, expected_acceptance_length_split

    for alpha in (0.0, 0.3, 0.85):
        for k in range(6):
            assert expected_acceptance_length_split(alpha, alpha, k) == pytest.approx(expected_acceptance_length(alpha, k))
    # first 0.2, later 0.9, k = 3: 1 + 0.2 * (1 + 0.9 + 0.81)
    assert expected_acceptance_length_split(0.2, 0.9, 3) == pytest.approx(1.542)
    assert expected_acceptance_length_split(0.5, 1.0, 4) == 3.0


def test_a_match_bucket_counts_its_first_and_later_tokens_apart():
    from specwise.adaptive import MatchAcceptance, match_bucket

    rates = MatchAcceptance(decay=1.0, shadows=False)  # weak prior: one success in two trials each
    rates.observe(4, 2)  # first kept; later: one kept, then a rejection
    rates.observe(3, 0)  # first rejected; nothing known of the later ones
    assert (rates.first.numerator, rates.first.denominator) == (1, 2)
    assert (rates.later.numerator, rates.later.denominator) == (1, 2)
    rates.observe(2, 2)  # both kept: the later one is a success, and no rejection
    assert (rates.later.numerator, rates.later.denominator) == (2, 3)
    assert [match_bucket(n) for n in (0, 1, 3, 4, 7, 8, 24)] == [0, 1, 3, 4, 4, 5, 5]


def test_by_match_a_weak_match_decodes_plainly_and_a_strong_one_drafts_far():
    # A retrieval drafter's one-token matches miss and its four-token matches hit: each step's k comes
    # from its own match's bucket, where one pooled rate would draft the same k after both.
    cost = lambda n: 0.03 * (1 + 0.25 * (n - 1))  # an extra row costs a quarter of a pass
    rule = AdaptiveBlockSize(4, 1, 12, target_cost=cost, shadow_drafts=True, by_match=True)
    pooled = AdaptiveBlockSize(4, 1, 12, target_cost=cost, shadow_drafts=True)
    for step in range(40):
        match = 1 if step % 2 else 4
        ks = (rule.next_k(match), pooled.next_k())
        if match == 1:  # plain steps: shadow drafts, all wrong
            for r in (rule, pooled):
                r.observe(0, 0, 0.0, 0.03)
                r.observe_shadow(5, 6, 0.0)
        else:  # four-token matches: every draft token kept
            for r, k in zip((rule, pooled), ks):
                r.observe(k, k, 0.0, cost(k + 1))
                if k == 0:
                    r.observe_shadow(5, 5, 0.0)
    assert rule.next_k(1) == 0 and rule.next_k(4) == 12
    assert 0.4 < pooled.alpha < 0.9 and pooled.next_k() not in (0, 12)  # pooled: neither
    assert rule.matches[1].first.value < 0.1 and rule.matches[4].first.value > 0.9


def test_a_retrieval_drafter_gets_the_rule_by_match_and_a_model_drafter_does_not():
    from specwise import SamplingParams, SpecConfig
    from specwise.drafters import NgramDrafter
    from specwise.drafters.suffix import SuffixDrafter
    from specwise.k_policy import choose_k_policy
    from specwise.stats import PhaseClock, SpecStats

    clock = PhaseClock(SpecStats())
    for drafter, by_match in ((NgramDrafter(1, 3), True), (SuffixDrafter(), True), (_ModelLike(), False)):
        policy = choose_k_policy(SpecConfig(adaptive=True), SamplingParams(), drafter, None, clock)
        assert policy.rule.by_match is by_match
    ngram = choose_k_policy(SpecConfig(adaptive=True), SamplingParams(), NgramDrafter(1, 3), None, clock)
    ngram.next_k([7, 8, 9, 7, 8, 9, 7, 8])  # its match, 3 tokens, was read under the draft clock
    assert ngram.rule.matches.keys() == {3}


class _ModelLike:
    name = "model-like"

    def start(self, prompt_ids, sampling, generator): pass

    def propose(self, context, k): raise AssertionError("not asked here")

    def observe(self, result): pass
