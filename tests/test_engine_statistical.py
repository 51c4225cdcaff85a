"""The whole engine, sampling at temperature 1 with top-k and top-p, has the target's distribution.

For each drafter and verifier we draw N continuations of L tokens with the engine
(each with its own seed) and compare their histogram with the target's exact
distribution over L-token continuations, computed by enumerating every prefix
with full (cache-free) forward passes. Pearson's chi-square test with cells of
expected count < 5 pooled; the test fails when p < 1e-3, so a correct engine
raises a false alarm once in a thousand configurations (and the seeds are fixed,
so a run is reproducible). A deliberately wrong verifier (accept every draft)
is run through the same check to show that it can fail.
"""

import pytest
import torch

from specwise import SamplingParams, SpecConfig, SpeculativeEngine
from specwise.drafters import DraftModelDrafter, NgramDrafter
from specwise.runners.lean import LeanRunner
from specwise.runners.int8 import quantize_int8
from specwise.runners.hf import HFRunner
from specwise.testing import tiny_model
from specwise.verify import VERIFIERS, VerifyResult

from helpers import ALPHA, LENGTH, PROMPT, SAMPLES, SAMPLING, p_value


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0)


def draw(target, drafter, verifier):
    engine = SpeculativeEngine(HFRunner(target), drafter, SpecConfig(k=LENGTH - 1, verifier=verifier))
    counts = {}
    for seed in range(SAMPLES):
        tokens = tuple(engine.generate(PROMPT, SamplingParams(**{**SAMPLING.__dict__, "seed": seed})).token_ids)
        counts[tokens] = counts.get(tokens, 0) + 1
    return counts


def make_drafter(kind, target):
    if kind == "draft-model":
        return DraftModelDrafter(HFRunner(tiny_model(seed=1)), target.config.vocab_size)
    if kind == "draft-model-int8":
        return DraftModelDrafter(HFRunner(quantize_int8(tiny_model(seed=1))), target.config.vocab_size)
    if kind == "draft-model-vocab":  # proposes only every third token (and the prompt's): many misses
        vocab = target.config.vocab_size
        return DraftModelDrafter(LeanRunner(tiny_model(seed=1)), vocab, kept=range(0, vocab, 3))
    return NgramDrafter(1, 2)


@pytest.mark.slow
@pytest.mark.parametrize("drafter, verifier", [
    ("draft-model", "token"), ("draft-model", "block"), ("ngram", "token"), ("ngram", "block"),
    ("draft-model-int8", "block"), ("draft-model-vocab", "token"), ("draft-model-vocab", "block"),
])
def test_engine_output_has_target_distribution(target, exact, drafter, verifier):
    counts = draw(target, make_drafter(drafter, target), verifier)
    p = p_value(counts, exact)
    assert p > ALPHA, f"{drafter}/{verifier}: chi-square p = {p:.2e}"


def accept_everything(draft_tokens, draft_probs, target_probs, generator=None):
    k = len(draft_tokens)
    bonus = int(torch.multinomial(target_probs[k], 1, generator=generator))
    return VerifyResult(draft_tokens.tolist() + [bonus], k, k)


@pytest.mark.slow
def test_a_wrong_verifier_fails_the_same_check(target, exact, monkeypatch):
    monkeypatch.setitem(VERIFIERS, "token", accept_everything)  # the registry the engine reads
    counts = draw(target, make_drafter("draft-model", target), "token")
    assert p_value(counts, exact) < ALPHA
