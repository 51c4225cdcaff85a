"""Greedy identity: the engine's output equals the target's own greedy decoding, token for token.

float32 tiny models, where kernel differences between a block pass and one-token
passes do not flip an argmax (docs/DESIGN.md, "Numerics").
"""

import pytest
import torch

from specwise import SamplingParams, SpecConfig, SpeculativeEngine
from specwise.drafters import DraftModelDrafter, DraftProposal, NgramDrafter, NoDrafter
from specwise.runners.hf import HFRunner
from specwise.testing import tiny_model

from helpers import CorruptingDrafter, RandomDrafter, hf_greedy

PROMPTS = [[5, 9, 14, 20, 33], [40, 41, 42, 40, 41, 42, 40, 41], [7]]


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0)


def run(target, drafter, prompt, k=4, max_new=40, sampling=None, adaptive=False, eos=(0,)):
    engine = SpeculativeEngine(HFRunner(target), drafter, SpecConfig(k=k, adaptive=adaptive, k_max=8),
                               eos_token_ids=eos)
    return engine.generate(prompt, sampling or SamplingParams(max_new_tokens=max_new))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_identical_drafter_accepts_everything(target, prompt):
    drafter = DraftModelDrafter(HFRunner(target), target.config.vocab_size)
    result = run(target, drafter, prompt)
    assert result.token_ids == hf_greedy(target, prompt, 40)
    assert result.stats.acceptance_rate == 1.0
    assert result.stats.proposed > 0


@pytest.mark.parametrize("prompt", PROMPTS)
def test_random_drafter_almost_never_accepted(target, prompt):
    result = run(target, RandomDrafter(target.config.vocab_size), prompt)
    assert result.token_ids == hf_greedy(target, prompt, 40)
    assert result.stats.acceptance_rate < 0.2


@pytest.mark.parametrize("position", [0, 1, 3])
def test_corrupted_position_gives_partial_acceptance(target, position):
    prompt = PROMPTS[0]
    drafter = CorruptingDrafter(DraftModelDrafter(HFRunner(target), target.config.vocab_size),
                                position, target.config.vocab_size)
    result = run(target, drafter, prompt, k=4, max_new=60)
    assert result.token_ids == hf_greedy(target, prompt, 60)
    stats = result.stats
    # Blocks reached the corrupted position, and every one that did stopped exactly there.
    assert len(stats.proposed_at) > position and stats.proposed_at[position] > 0
    assert stats.accepted_at[position] == 0
    assert stats.accepted_at[:position] == stats.proposed_at[:position]


def test_different_drafter_and_ngram_drafter(target):
    other = tiny_model(seed=1)
    for prompt in PROMPTS:
        expected = hf_greedy(target, prompt, 40)
        drafter = DraftModelDrafter(HFRunner(other), target.config.vocab_size)
        assert run(target, drafter, prompt).token_ids == expected
        assert run(target, NgramDrafter(1, 3), prompt).token_ids == expected
        assert run(target, NgramDrafter(1, 3), prompt, adaptive=True).token_ids == expected


def test_no_drafter_is_plain_decoding(target):
    for prompt in PROMPTS:
        result = run(target, NoDrafter(), prompt)
        assert result.token_ids == hf_greedy(target, prompt, 40)
        assert result.stats.proposed == 0 and result.stats.steps == len(result.token_ids)


def test_ngram_is_accepted_on_repetitive_text():
    # A target that repeats itself: the greedy continuation of the tiny model loops,
    # so the lookup finds it and gets accepted.
    target = tiny_model(seed=0)
    prompt = PROMPTS[1]
    result = run(target, NgramDrafter(1, 3), prompt, max_new=80, eos=())
    assert result.token_ids == hf_greedy(target, prompt, 80, eos=False)
    assert result.stats.accepted > 0, result.stats


def test_repetition_penalty_matches_hugging_face(target):
    drafter = DraftModelDrafter(HFRunner(tiny_model(seed=1)), target.config.vocab_size)
    sampling = SamplingParams(max_new_tokens=40, repetition_penalty=1.5)
    for prompt in PROMPTS:
        result = run(target, drafter, prompt, sampling=sampling)
        assert result.token_ids == hf_greedy(target, prompt, 40, repetition_penalty=1.5)


def test_max_new_tokens_and_stop_ids_are_not_exceeded(target):
    drafter = DraftModelDrafter(HFRunner(target), target.config.vocab_size)
    prompt = PROMPTS[0]
    expected = hf_greedy(target, prompt, 40, eos=False)
    for limit in (1, 2, 3, 7):
        result = run(target, drafter, prompt, sampling=SamplingParams(max_new_tokens=limit))
        assert result.token_ids == expected[:limit]
        assert result.finish_reason in ("length", "stop")
    stop_id = expected[5]
    first = expected.index(stop_id)
    result = run(target, drafter, prompt, sampling=SamplingParams(max_new_tokens=40, stop_token_ids=[stop_id]))
    assert result.token_ids == expected[:first + 1] and result.finish_reason == "stop"


def test_streaming_events_match_result_and_mark_draft_tokens(target):
    drafter = CorruptingDrafter(DraftModelDrafter(HFRunner(target), target.config.vocab_size),
                                2, target.config.vocab_size)
    engine = SpeculativeEngine(HFRunner(target), drafter, SpecConfig(k=4), eos_token_ids=(0,))
    stream = engine.stream(PROMPTS[0], SamplingParams(max_new_tokens=30))
    events = list(stream)
    result = stream.result
    assert [e.token_id for e in events] == result.token_ids
    assert result.from_draft == [e.from_draft for e in events]
    assert sum(result.from_draft) == result.stats.accepted
    assert not all(result.from_draft) and any(result.from_draft)


def test_target_called_once_per_step(target):
    runner = HFRunner(target)
    calls = []
    forward = runner.forward

    def counting(ids, **kwargs):
        calls.append(len(ids))
        return forward(ids, **kwargs)

    runner.forward = counting
    drafter = DraftModelDrafter(HFRunner(tiny_model(seed=1)), target.config.vocab_size)
    result = SpeculativeEngine(runner, drafter, SpecConfig(k=3), eos_token_ids=(0,)).generate(
        PROMPTS[0], SamplingParams(max_new_tokens=30))
    assert len(calls) == result.stats.steps + 1  # one prefill, then one pass per step


class MisbehavingDrafter:
    """Proposes `extra` tokens more than asked (and at least `at_least`), all equal to `token`."""

    name = "misbehaving"

    def __init__(self, extra: int = 0, token: int = 1, at_least: int = 0) -> None:
        self.extra, self.token, self.at_least = extra, token, at_least

    def start(self, prompt_ids, sampling, generator) -> None:
        pass

    def propose(self, context, k: int) -> DraftProposal:
        length = max(k + self.extra, self.at_least)
        return DraftProposal(torch.full((length,), self.token, dtype=torch.long), None)

    def observe(self, result) -> None:
        pass


def test_engine_refuses_a_chain_longer_than_asked_or_outside_the_vocabulary(target):
    vocab = target.config.vocab_size
    with pytest.raises(ValueError, match=r"drafter 'misbehaving' proposed 5 tokens, more than the k = 4 it was "
                                         r"asked for \(propose\(context, k\) returns at most k tokens\)"):
        run(target, MisbehavingDrafter(extra=1), PROMPTS[0])
    # adaptive k's second step is plain (k = 0): a token offered there is refused too
    with pytest.raises(ValueError, match=r"proposed 1 tokens, more than the k = 0 it was asked for"):
        run(target, MisbehavingDrafter(at_least=1), PROMPTS[0], k=4, adaptive=True)
    for token in (vocab, -1):
        with pytest.raises(ValueError, match=rf"drafter 'misbehaving' proposed token ids outside the target's "
                                             rf"vocabulary \[0, {vocab}\): \[{token}(, {token}){{3}}\]"):
            run(target, MisbehavingDrafter(token=token), PROMPTS[0])
    # The same drafter within its bounds decodes greedily (the checks refuse only what breaks them).
    result = run(target, MisbehavingDrafter(token=vocab - 1), PROMPTS[0], max_new=12, eos=())
    assert result.token_ids == hf_greedy(target, PROMPTS[0], 12, eos=False) and result.stats.proposed > 0
