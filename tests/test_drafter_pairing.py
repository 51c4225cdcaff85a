"""A draft model drafts in the target's ids only if every token id means the same token to both; padding
rows past the tokenizer may differ in number (specwise.drafters.pairing). A draft model with another
vocabulary drafts through text and the shared tokens instead (specwise.drafters.cross_vocab); what it
cannot do, and a width that no tokenizer explains, is refused naming the fix."""

from __future__ import annotations

import pytest

from specwise import SamplingParams, SpecConfig, SpecDecoder
from specwise.drafters import DrafterContext, VocabularyMismatchError, create_drafter
from specwise.config import ConfigError
from specwise.drafters.cross_vocab_drafter import CrossVocabDrafter
from specwise.drafters.pairing import check_pairing, real_tokens
from specwise.store.loading import LoadedModel
from specwise.testing import tiny_loaded, tiny_model, tiny_other_tokenizer, tiny_tokenizer

VOCAB = len(tiny_tokenizer())


def _padded(count: int):
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens([f"[PAD{VOCAB + i}]" for i in range(count)])
    return tokenizer


def _swapped():
    """The same tokens, two of them under each other's ids."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = tiny_tokenizer().get_vocab()
    a, b = "x", "y"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", unk_token="<unk>")


def _with_extra():
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(["<extra>"])  # a real token past the target's, not padding
    return tokenizer


def test_the_same_tokens_pair_whatever_the_padding():
    check_pairing(tiny_tokenizer(), VOCAB, tiny_tokenizer(), VOCAB, "target", "drafter")
    check_pairing(tiny_tokenizer(), VOCAB + 16, tiny_tokenizer(), VOCAB, "target", "drafter")  # 152064 vs 151936
    check_pairing(_padded(16), VOCAB + 16, tiny_tokenizer(), VOCAB + 3, "target", "drafter")  # GGUF placeholders
    assert real_tokens(_padded(16)) == real_tokens(tiny_tokenizer())


@pytest.mark.parametrize("draft, match", [
    (_swapped, r"different vocabulary .* first difference is id \d+: 'y' vs 'x'"),
    (_with_extra, r"first difference is id %d: '<extra>' vs '\(none\)'" % VOCAB),
])
def test_another_vocabulary_is_refused_naming_what_works(draft, match):
    with pytest.raises(VocabularyMismatchError, match=match) as raised:
        check_pairing(tiny_tokenizer(), VOCAB, draft(), VOCAB + 1, "target", "drafter")
    assert "ngram, suffix" in str(raised.value) and "same model family" in str(raised.value)


def test_an_embedding_narrower_than_the_tokens_the_target_reads_is_refused():
    with pytest.raises(VocabularyMismatchError, match=f"drafter 'small' has {VOCAB - 1} embedding rows, fewer "
                                                      f"than the {VOCAB} tokens target 'target' reads"):
        check_pairing(tiny_tokenizer(), VOCAB, tiny_tokenizer(), VOCAB - 1, "target", "small")
    # A tokenizer holding a token past its model's rows (a class that adds one on load): the drafter
    # needs rows only for the tokens the target itself can read.
    extra = _with_extra()
    check_pairing(extra, VOCAB, _with_extra(), VOCAB, "target", "same-model")


def test_a_padded_draft_model_drafts_and_output_stays_the_targets():
    """A drafter 16 rows wider than its target (same tokenizer): accepted, drafts accepted, and greedy
    output equal to the target's plain decoding."""
    target = tiny_loaded(0)
    drafter = tiny_loaded(0, vocab_size=VOCAB + 16, name="padded")  # another embedding, same tokens
    context = DrafterContext(target, SpecConfig(), VOCAB, {"model": drafter})
    assert create_drafter("draft-model", context) is not None
    decoder = SpecDecoder(target, SpecConfig(drafter="none"), drafter_model=drafter)
    sampling = SamplingParams(max_new_tokens=24)
    plain = decoder.generate("abcabc", sampling, chat=False).token_ids
    fast = decoder.generate("abcabc", sampling, spec=SpecConfig(drafter="draft-model", k=3, adaptive=False), chat=False)
    assert fast.token_ids == plain and fast.stats.proposed > 0


@pytest.mark.parametrize("draft", [_swapped, _with_extra, tiny_other_tokenizer])
def test_a_draft_model_with_another_vocabulary_drafts_and_output_stays_the_targets(draft):
    """What pairing refuses for drafting in the target's ids, the draft-model factory takes as a drafter
    of another vocabulary: it proposes, and greedy output equals the target's plain decoding."""
    tokenizer = draft()
    drafter = LoadedModel("other", None, tiny_model(1, vocab_size=len(tokenizer)), tokenizer)
    target = tiny_loaded(0)
    assert isinstance(create_drafter("draft-model", DrafterContext(target, SpecConfig(), VOCAB, {"model": drafter})),
                      CrossVocabDrafter)
    decoder = SpecDecoder(target, SpecConfig(drafter="none"), drafter_model=drafter)
    sampling = SamplingParams(max_new_tokens=24)
    plain = decoder.generate("abcabc", sampling, chat=False).token_ids
    fast = decoder.generate("abcabc", sampling, spec=SpecConfig(drafter="draft-model", k=3, adaptive=False), chat=False)
    assert fast.token_ids == plain and fast.stats.proposed > 0


def test_a_draft_model_without_a_tokenizer_and_another_width_is_refused():
    drafter = tiny_loaded(1, tokenizer=False, vocab_size=VOCAB + 5)
    context = DrafterContext(tiny_loaded(0), SpecConfig(), VOCAB, {"model": drafter})
    with pytest.raises(VocabularyMismatchError, match=f"{VOCAB + 5} output tokens but target 'tiny-0' has {VOCAB}, "
                                                      r"and without a tokenizer \(the drafter\).*give both models "
                                                      "their tokenizers"):
        create_drafter("draft-model", context)


@pytest.mark.parametrize("spec, options, match", [
    (SpecConfig(), {"vocab": 100}, "draft_vocab needs a draft model sharing the target's tokenizer.*drop draft_vocab"),
])
def test_a_draft_model_with_another_vocabulary_is_refused_a_draft_vocab_before_its_weights_load(
        tmp_path, monkeypatch, spec, options, match):
    from specwise.store import loading

    _with_extra().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr(loading, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    context = DrafterContext(tiny_loaded(0), spec, VOCAB, {"model": str(tmp_path), **options})
    with pytest.raises(ConfigError, match=match):
        create_drafter("draft-model", context)
