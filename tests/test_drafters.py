import pytest
import torch

from specwise import SamplingParams, SpecConfig
from specwise.drafters import (DraftModelDrafter, DrafterContext, NgramDrafter, VocabularyMismatchError,
                               available_drafters, create_drafter, register_drafter)
from specwise.drafters.cross_vocab_drafter import CrossVocabDrafter
from specwise.drafters.pairing import check_same_vocabulary
from specwise.drafters.ngram import NgramIndex
from specwise.runners.hf import HFRunner
from specwise.testing import tiny_loaded, tiny_model, tiny_tokenizer


def lookup(context, k=4, lo=1, hi=3):
    """The drafter's proposal (from its index)."""
    return NgramDrafter(lo, hi).propose(context, k).tokens.tolist()


def scan(context, k, lo, hi):
    """The same rule by a scan of the whole context: what followed the most recent earlier
    occurrence of the longest suffix that occurred before."""
    size = len(context)
    for n in range(min(hi, size - 1), lo - 1, -1):
        for start in range(size - n - 1, -1, -1):  # latest first; the suffix itself is not earlier
            if context[start:start + n] == context[size - n:]:
                return context[start + n:start + n + k]
    return []


def test_ngram_longest_suffix_most_recent_occurrence():
    # suffix [1, 2] occurs at 0 (followed by 3, 4) and at 4 (followed by 9, 9): the later one wins
    assert lookup([1, 2, 3, 4, 1, 2, 9, 9, 7, 1, 2]) == [9, 9, 7, 1]
    # the longer suffix [5, 1, 2] beats a more recent [1, 2]
    assert lookup([5, 1, 2, 8, 8, 1, 2, 6, 6, 5, 1, 2]) == [8, 8, 1, 2]
    assert lookup([1, 2, 3], k=4) == []  # no earlier occurrence
    assert lookup([7, 7, 7], k=2) == [7]  # overlapping occurrence continues up to the end
    assert lookup([4, 5, 6, 4, 5], k=2, lo=3, hi=3) == []  # below ngram_min nothing is tried


def test_ngram_index_finds_what_the_scan_finds_as_a_context_grows_or_changes():
    # Small vocabularies repeat n-grams often; contexts grow a few tokens a call (a generation's steps)
    # and sometimes change under the index (another generation), which must index them afresh.
    generator = torch.Generator().manual_seed(0)
    for lo, hi, vocab in ((1, 3, 4), (1, 4, 9), (2, 2, 3)):
        drafter, context = NgramDrafter(lo, hi), []
        for step in range(300):
            if step % 97 == 96:
                context = context[:len(context) // 2] + [vocab]  # not an extension of the indexed context
            context += torch.randint(vocab, (int(torch.randint(1, 4, (1,), generator=generator)),),
                                     generator=generator).tolist()
            k = 1 + step % 5
            expected = scan(context, k, lo, hi)
            assert drafter.propose(context, k).tokens.tolist() == expected, (lo, hi, step)
            assert drafter.propose(torch.tensor(context), k).tokens.tolist() == expected
            assert drafter.match_length(context) == next((n for n in range(min(hi, len(context) - 1), lo - 1, -1)
                                                          if scan(context, 1, n, n)), 0)


def test_ngram_index_rolls_back_and_extends_again_as_if_built_afresh():
    # "1 2" last occurred at 3, followed by 4 4; rolled back to before that, only the one at 0 is left.
    drafter = NgramDrafter(1, 3)
    assert drafter.propose([1, 2, 3, 1, 2, 4, 4, 1, 2], 3).tokens.tolist() == [4, 4, 1]
    assert drafter.propose([1, 2, 3, 1, 2], 3).tokens.tolist() == [3, 1, 2]
    assert drafter.propose([1, 2, 3, 1, 2, 5, 1, 2], 3).tokens.tolist() == [5, 1, 2]
    tree = drafter.propose_tree([1, 2, 3, 1, 2, 5, 1, 2], 8, 2, 3)
    assert tree.tokens.tolist() == [5, 1, 3, 1] and tree.parents.tolist() == [-1, 0, -1, 2]  # no 4 is left
    # Rolled back by a few tokens (its starts dropped) or to a short prefix (indexed afresh), or one
    # token changed (as long, but not an extension), then extended another way: the index holds what
    # one built from the context alone holds.
    generator = torch.Generator().manual_seed(1)
    for lo, hi, vocab in ((1, 3, 3), (1, 4, 6), (2, 5, 2)):
        index, context = NgramIndex(lo, hi), []
        for step in range(200):
            if step % 7 == 6:
                keep = len(context) - int(torch.randint(1, 6, (1,), generator=generator))
                context = context[:max(0, keep)] if step % 35 != 34 else context[:len(context) // 4]
            elif step % 11 == 10:
                context[int(torch.randint(len(context), (1,), generator=generator))] = vocab
            if step % 7 == 6 or step % 11 == 10:
                assert index.update(context) == context
                fresh = NgramIndex(lo, hi)
                fresh.update(context)
                assert index._starts == fresh._starts, (lo, hi, step)
            context += torch.randint(vocab, (int(torch.randint(1, 4, (1,), generator=generator)),),
                                     generator=generator).tolist()
            for k in (1, 4):
                assert index.continuation(context, k) == scan(context, k, lo, hi), (lo, hi, step)
            fresh = NgramIndex(lo, hi)
            fresh.update(context)
            assert index._starts == fresh._starts, (lo, hi, step)


def test_ngram_drafter_proposes_point_masses():
    drafter = NgramDrafter(1, 3)
    proposal = drafter.propose([1, 2, 3, 1, 2], 2)
    assert proposal.tokens.tolist() == [3, 1] and proposal.probs is None


def test_registry_lists_builtins_and_accepts_new_drafters():
    assert {"draft-model", "ngram", "none"} <= set(available_drafters())
    with pytest.raises(ValueError, match="unknown drafter 'nope'; available: "):
        create_drafter("nope", DrafterContext(tiny_loaded(0), SpecConfig(), 80, {}))

    class Echo:
        name = "echo"

        def start(self, prompt_ids, sampling, generator): pass

        def propose(self, context, k): return NgramDrafter().propose(context, k)

        def observe(self, result): pass

    register_drafter("echo-test", lambda ctx: Echo())
    assert isinstance(create_drafter("echo-test", DrafterContext(tiny_loaded(0), SpecConfig(), 80, {})), Echo)
    with pytest.raises(ValueError, match="already registered"):
        register_drafter("echo-test", lambda ctx: Echo())


def test_another_vocabulary_drafts_across_and_a_width_without_tokenizers_is_refused():
    other = tiny_tokenizer()
    other.add_tokens(["<extra>"])
    with pytest.raises(VocabularyMismatchError, match="different vocabulary.*share the target's tokenizer"):
        check_same_vocabulary(tiny_tokenizer(), other, "target", "drafter")
    target = tiny_loaded(0)
    wrong = tiny_loaded(1, tokenizer=False, vocab_size=50)
    target_without_tokenizer = tiny_loaded(0, tokenizer=False)
    context = DrafterContext(target_without_tokenizer, SpecConfig(), 80, {"model": wrong})
    with pytest.raises(VocabularyMismatchError, match="50 output tokens but target 'tiny-0' has 80.*give both "
                                                      "models their tokenizers"):
        create_drafter("draft-model", context)
    drafter = create_drafter("draft-model", DrafterContext(target, SpecConfig(), 80,
                                                           {"model": _with_tokenizer(tiny_loaded(1), other)}))
    assert isinstance(drafter, CrossVocabDrafter)


def _with_tokenizer(loaded, tokenizer):
    loaded.tokenizer = tokenizer
    return loaded


class CountingRunner(HFRunner):
    def __init__(self, model):
        super().__init__(model)
        self.fed = 0

    def forward(self, ids, **kwargs):
        self.fed += len(ids)
        return super().forward(ids, **kwargs)


def test_draft_model_does_not_reread_the_context():
    runner = CountingRunner(tiny_model(seed=1))
    drafter = DraftModelDrafter(runner, runner.vocab_size)
    drafter.start([], SamplingParams(), torch.Generator())
    context = list(range(10, 60))
    drafter.propose(context, 4)
    assert runner.fed == 50 + 3  # the context once, then k - 1 draft tokens
    runner.fed = 0
    drafter.propose(context + [5, 6], 4)  # two tokens committed since: nothing else re-read
    assert runner.fed == 2 + 3
    assert runner.length == len(context) + 2 + 3


def test_draft_model_reports_the_distribution_it_sampled_from():
    model = tiny_model(seed=1)
    runner = HFRunner(model)
    drafter = DraftModelDrafter(runner, runner.vocab_size)
    sampling = SamplingParams(temperature=0.8, top_k=5, seed=0)
    drafter.start([], sampling, torch.Generator().manual_seed(0))
    context = [3, 4, 5]
    proposal = drafter.propose(context, 3)
    assert proposal.probs.shape == (3, runner.vocab_size)
    torch.testing.assert_close(proposal.probs.sum(-1), torch.ones(3))
    from specwise.sampling import logits_to_probs
    full = model(torch.tensor([context + proposal.tokens.tolist()])).logits[0].float()
    expected = logits_to_probs(full[len(context) - 1:len(context) + 2], sampling)
    torch.testing.assert_close(proposal.probs, expected, atol=1e-5, rtol=0)
    assert all(proposal.probs[i, t] > 0 for i, t in enumerate(proposal.tokens.tolist()))


def test_draft_model_reads_the_prompt_at_start_so_proposals_time_drafting_only():
    """Adaptive k divides draft seconds by draft tokens: a prompt's prefill must not land there."""
    from specwise.drafters import DraftModelDrafter
    from specwise.runners.lean import LeanRunner
    from specwise.testing import tiny_model

    runner = LeanRunner(tiny_model(seed=1))
    drafter = DraftModelDrafter(runner, runner.vocab_size)
    prompt = [5, 9, 14, 20, 33, 7, 8]
    drafter.start(prompt, SamplingParams(), torch.Generator().manual_seed(0))
    assert runner.length == len(prompt) - 1  # prefilled, all but the token the first proposal feeds
    fed = []
    forward = runner.forward
    runner.forward = lambda ids, **kw: fed.append(list(ids)) or forward(ids, **kw)
    drafter.propose(prompt, 3)
    assert fed[0] == [prompt[-1]] and all(len(ids) == 1 for ids in fed)
    drafter.start(prompt, SamplingParams(), torch.Generator().manual_seed(0))  # the same prompt again: no work
    assert runner.length == len(prompt) - 1
