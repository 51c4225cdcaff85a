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

import itertools

import pytest
import torch
from scipy.stats import chisquare

from specwise import SamplingParams, SpecConfig, SpeculativeEngine
from specwise.drafters import DraftModelDrafter, NgramDrafter
from specwise.models.lean import LeanRunner
from specwise.models.quantize import quantize_int8
from specwise.models.runner import HFRunner
from specwise.sampling import logits_to_probs
from specwise.testing import tiny_model
from specwise.verify import VERIFIERS, VerifyResult

PROMPT = [5, 9, 14, 5, 9]
LENGTH = 3
SAMPLES = 1500
SAMPLING = SamplingParams(temperature=1.0, top_k=4, top_p=0.9, max_new_tokens=LENGTH)
ALPHA = 1e-3


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def exact(target):
    """P(continuation) for every L-token continuation with nonzero probability."""
    dist = {(): 1.0}
    for _ in range(LENGTH):
        grown = {}
        for prefix, p in dist.items():
            with torch.no_grad():
                logits = target(torch.tensor([PROMPT + list(prefix)])).logits[0, -1:]
            probs = logits_to_probs(logits.double(), SAMPLING)[0]
            for token in torch.nonzero(probs).flatten().tolist():
                grown[prefix + (token,)] = p * float(probs[token])
        dist = grown
    return dist


def draw(target, drafter, verifier):
    engine = SpeculativeEngine(HFRunner(target), drafter, SpecConfig(k=LENGTH - 1, verifier=verifier))
    counts = {}
    for seed in range(SAMPLES):
        tokens = tuple(engine.generate(PROMPT, SamplingParams(**{**SAMPLING.__dict__, "seed": seed})).token_ids)
        counts[tokens] = counts.get(tokens, 0) + 1
    return counts


def p_value(counts, exact):
    unexpected = sum(c for seq, c in counts.items() if seq not in exact)
    if unexpected:
        return 0.0
    seqs = sorted(exact, key=exact.get, reverse=True)
    observed, expected = [], []
    pooled_obs = pooled_exp = 0.0
    for seq in seqs:
        e = exact[seq] * SAMPLES
        if e >= 5:
            observed.append(counts.get(seq, 0))
            expected.append(e)
        else:
            pooled_obs += counts.get(seq, 0)
            pooled_exp += e
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    scale = sum(observed) / sum(expected)
    return float(chisquare(observed, [e * scale for e in expected]).pvalue)


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
    monkeypatch.setitem(VERIFIERS, "token", accept_everything)
    counts = draw(target, make_drafter("draft-model", target), "token")
    assert p_value(counts, exact) < ALPHA
