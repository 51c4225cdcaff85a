"""A draft model restricted to frequent tokens (draft_vocab=N): smaller output layer, still lossless."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

from specwise import SamplingParams, SpecConfig, SpecDecoder, SpeculativeEngine
from specwise.drafters import DraftModelDrafter
from specwise.drafters.vocab import (TokenListError, count_tokens, find_token_list, kept_tokens, read_token_list,
                                     tokenizer_fingerprint, write_token_list)
from specwise.runners.lean import LeanRunner
from specwise.runners.int8 import quantize_int8
from specwise.runners.hf import HFRunner
from specwise.testing import tiny_config, tiny_loaded, tiny_model, tiny_tokenizer

from helpers import hf_greedy

VOCAB = tiny_config().vocab_size  # the tiny character tokenizer's size
KEPT = list(range(0, VOCAB, 4))  # every fourth token (EOS, id 0, included)


def test_token_list_round_trip_and_tokenizer_check(tmp_path):
    tokenizer = tiny_tokenizer()
    counts = count_tokens(tokenizer, ["aaa bb c", "ab"])
    assert counts[tokenizer.convert_tokens_to_ids("a")] == 4
    path = tmp_path / "list.txt"
    write_token_list(path, tokenizer, counts, "two strings")
    header, ids = read_token_list(path)
    assert header["tokenizer"] == tokenizer_fingerprint(tokenizer) and header["corpus_tokens"] == 10
    a, b, space, c = (tokenizer.convert_tokens_to_ids(t) for t in ("a", "b", " ", "c"))
    assert ids == [a, b, space, c]  # by falling count: 4, 3, 2, 1
    assert find_token_list(tokenizer, path) == ids

    other = copy.deepcopy(tokenizer)
    other.add_tokens(["<new>"])
    with pytest.raises(TokenListError, match="another tokenizer.*build_draft_vocab"):
        find_token_list(other, path)
    with pytest.raises(TokenListError, match="no shipped token list.*vocab_file"):
        find_token_list(other)
    (tmp_path / "bad.txt").write_text("12\n13\n")
    with pytest.raises(TokenListError, match="not a token list"):
        read_token_list(tmp_path / "bad.txt")


def test_kept_tokens_are_the_first_n_plus_the_special_ones_within_the_width():
    assert kept_tokens([7, 3, 9, 1], 2, always=[0, 500], width=100) == [0, 3, 7]
    with pytest.raises(ValueError, match="draft_vocab must be >= 1"):
        kept_tokens([1, 2], 0, [], 10)


@pytest.mark.parametrize("int8", [False, True])
def test_restricted_logits_equal_the_full_ones_on_the_kept_tokens(int8):
    model = tiny_model(seed=1)
    if int8:
        model = quantize_int8(model)
    full, restricted = LeanRunner(model), LeanRunner(model)
    restricted.restrict_output(KEPT)
    ids = [5, 9, 14, 20, 33, 7]
    for runner in (full, restricted):
        runner.reset()
    expected, got = full.forward(ids), restricted.forward(ids)
    # The same rows, fewer of them: equal up to the matmul library's blocking (exact in practice).
    torch.testing.assert_close(got[:, KEPT], expected[:, KEPT], rtol=1e-6, atol=1e-6)
    others = [t for t in range(VOCAB) if t not in KEPT]
    assert torch.isinf(got[:, others]).all() and (got[:, others] < 0).all()
    assert restricted.output_ids.tolist() == KEPT
    restricted.restrict_output(None)
    assert torch.equal(restricted.forward([3]), full.forward([3]))
    with pytest.raises(ValueError, match=rf"token ids in \[0, {VOCAB}\)"):
        restricted.restrict_output([1, VOCAB])


def drafter_pair(kept=KEPT):
    model = tiny_model(seed=1)
    return (DraftModelDrafter(LeanRunner(model), VOCAB, kept=kept),
            DraftModelDrafter(LeanRunner(model), VOCAB))


def test_sampled_drafts_come_from_the_renormalized_distribution_over_kept_and_prompt_tokens():
    restricted, full = drafter_pair()
    prompt = [5, 9, 14, 5, 9]
    allowed = sorted(set(KEPT) | set(prompt))
    sampling = SamplingParams(temperature=1.0)
    for drafter in (restricted, full):
        drafter.start(prompt, sampling, torch.Generator().manual_seed(0))
    proposal = restricted.propose(prompt, 1)
    reference = full.propose(prompt, 1)
    probs, whole = proposal.probs[0].double(), reference.probs[0].double()
    assert abs(float(probs.sum()) - 1) < 1e-6  # sums to one over what it can propose
    outside = [t for t in range(VOCAB) if t not in allowed]
    assert float(probs[outside].abs().sum()) == 0.0
    expected = whole[allowed] / whole[allowed].sum()
    assert torch.allclose(probs[allowed], expected, atol=1e-6)
    for seed in range(30):
        restricted.start(prompt, sampling, torch.Generator().manual_seed(seed))
        assert set(restricted.propose(prompt, 3).tokens.tolist()) <= set(allowed)


def test_greedy_identity_with_a_restricted_drafter():
    target = tiny_model(seed=0)
    drafter = DraftModelDrafter(LeanRunner(copy.deepcopy(target)), VOCAB, kept=KEPT)
    engine = SpeculativeEngine(LeanRunner(target), drafter, SpecConfig(k=4, adaptive=False))
    accepted = Counter()
    for prompt in ([5, 9, 14, 20, 33], [40, 41, 42, 40, 41], [8, 12, 16]):
        result = engine.generate(prompt, SamplingParams(max_new_tokens=40))
        assert result.token_ids == hf_greedy(target, prompt, 40, eos=False)
        accepted["accepted"] += result.stats.accepted
        accepted["proposed"] += result.stats.proposed
    # The drafter is the target itself: it is right exactly when the target's token is one it keeps.
    assert 0 < accepted["accepted"] < accepted["proposed"]


def test_a_restricted_drafter_needs_the_lean_runner():
    with pytest.raises(ValueError, match="draft_vocab needs the lean runner"):
        DraftModelDrafter(HFRunner(tiny_model(seed=1)), VOCAB, kept=KEPT)


def test_spec_decoder_option_and_clear_errors(tmp_path):
    target, drafter = tiny_loaded(0), tiny_loaded(1)
    tokenizer = target.tokenizer
    path = tmp_path / "list.txt"
    write_token_list(path, tokenizer, count_tokens(tokenizer, ["the quick brown fox jumps over the lazy dog"]),
                     "pangram")
    spec = SpecConfig(drafter="draft-model", k=3, draft_vocab=5, drafter_options={"vocab_file": str(path)})
    decoder = SpecDecoder(target, spec, drafter_model=drafter)
    result = decoder.generate("hello", SamplingParams(max_new_tokens=12))
    plain = SpecDecoder(target, SpecConfig(drafter="none"))
    assert result.token_ids == plain.generate("hello", SamplingParams(max_new_tokens=12)).token_ids
    runner = decoder.drafter_for(spec).runner
    ordered = read_token_list(path)[1]
    kept = set(runner.output_ids.tolist())
    assert set(ordered[:5]) | set(tokenizer.all_special_ids) <= kept
    assert not set(ordered[5:]) - set(decoder.encode("hello")) & kept  # the rest only if the prompt has it

    with pytest.raises(ValueError, match="draft_vocab must be an integer >= 0"):
        SpecConfig(draft_vocab=-1)
    with pytest.raises(TokenListError, match="no shipped token list"):
        SpecDecoder(target, SpecConfig(drafter="draft-model", draft_vocab=5), drafter_model=drafter)
    with pytest.raises(ValueError, match="needs the lean runner"):
        SpecDecoder(target, SpecConfig(drafter="draft-model", draft_vocab=5, runner="hf", drafter_options={"vocab_file": str(path)}),
                    drafter_model=drafter)
