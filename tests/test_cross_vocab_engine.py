"""The whole engine with a draft model of another tokenizer (specwise.drafters.cross_vocab_drafter).

Tiny random models (no download) with two tokenizers built in process: the target's character
tokenizer and tiny_other_tokenizer (other ids, merged tokens, characters missing). Two drafters:
`twin`, the target's own weights under other ids (the same characters, no merges: it computes the
target's logits, so its drafts are accepted), and `other`, an unrelated model over the tokenizer
with merges and missing characters (most drafts rejected).

- Greedy identity: the engine's output equals the target's own greedy decoding (Hugging Face
  generate) token for token, also for a target whose tokenizer has merges (drafts converted
  through text must be stable target tokens) with the character-level drafter.
- Statistical: at temperature 1 with top-k and top-p, the distribution of 3-token continuations
  drawn with TLI drafts and token or block verification matches the target's exact one by
  Pearson's chi-square (tests/helpers.py: 1500 seeded draws, fails when p < 1e-3, so a correct
  engine raises a false alarm once in a thousand configurations; the seeds are fixed).
"""

import pytest
import torch

from specwise import SamplingParams, SpecConfig, SpeculativeEngine
from specwise.drafters import DrafterContext, create_drafter
from specwise.drafters.cross_vocab_drafter import CrossVocabDrafter
from specwise.store.loading import LoadedModel
from specwise.runners.hf import HFRunner
from specwise.testing import reordered_copy, tiny_model, tiny_other_tokenizer, tiny_tokenizer

from helpers import ALPHA, LENGTH, PROMPT, SAMPLES, SAMPLING, hf_greedy, p_value

PROMPTS = [[5, 9, 14, 20, 33], [40, 41, 42, 40, 41, 42, 40, 41], [7]]


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0)


def drafter_model(kind: str, target) -> LoadedModel:
    if kind == "twin":
        tokenizer = tiny_other_tokenizer(merges=(), missing="")
        return LoadedModel("twin", None, reordered_copy(target, tiny_tokenizer(), tokenizer), tokenizer)
    tokenizer = tiny_other_tokenizer()
    return LoadedModel("other", None, tiny_model(seed=1, vocab_size=len(tokenizer)), tokenizer)


def cross_drafter(target: LoadedModel, draft: LoadedModel) -> CrossVocabDrafter:
    """The drafter the draft-model factory makes for this pair (it must choose the cross-vocabulary one)."""
    width = target.model.config.vocab_size
    drafter = create_drafter("draft-model", DrafterContext(target, SpecConfig(runner="hf"), width, {"model": draft}))
    assert isinstance(drafter, CrossVocabDrafter)
    return drafter


def engine(target_model, target_tokenizer, draft: LoadedModel, k: int, verifier: str = "token") -> SpeculativeEngine:
    target = LoadedModel("target", None, target_model, target_tokenizer)
    return SpeculativeEngine(HFRunner(target_model), cross_drafter(target, draft),
                              SpecConfig(k=k, verifier=verifier, adaptive=False))


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("kind", ["twin", "other"])
def test_greedy_output_is_the_targets_own(target, kind, k):
    draft = drafter_model(kind, target)
    spec = engine(target, tiny_tokenizer(), draft, k)
    proposed = accepted = 0
    for prompt in PROMPTS:
        result = spec.generate(prompt, SamplingParams(max_new_tokens=40))
        assert result.token_ids == hf_greedy(target, prompt, 40, eos=False), (kind, k, prompt)
        proposed, accepted = proposed + result.stats.proposed, accepted + result.stats.accepted
    assert proposed > 0
    if kind == "twin":
        assert accepted / proposed > 0.95, f"the twin drafter agrees with its target, yet alpha = {accepted / proposed:.2f}"


def test_greedy_output_is_the_targets_own_for_a_target_with_merged_tokens():
    """The target's tokenizer merges character pairs: a draft's text becomes target tokens only where
    re-encoding keeps the committed tokens, and the character-level drafter's drafts still land."""
    tokenizer = tiny_other_tokenizer()
    target = tiny_model(seed=2, vocab_size=len(tokenizer))
    draft = LoadedModel("chars", None, tiny_model(seed=0), tiny_tokenizer())
    spec = engine(target, tokenizer, draft, 4)
    proposed = 0
    for prompt in ([5, 9, 14, 20, 33], [80, 72, 16, 78, 16, 2]):
        result = spec.generate(prompt, SamplingParams(max_new_tokens=40))
        assert result.token_ids == hf_greedy(target, prompt, 40, eos=False), prompt
        proposed += result.stats.proposed
    assert proposed > 0


def test_the_drafter_keeps_its_cache_and_reencodes_only_a_tail(target):
    """Across steps the drafter's cache is rolled back only to where its tokens of the new text differ,
    and the text is re-encoded from an anchor near the end, never from the start."""
    draft = drafter_model("other", target)
    spec = engine(target, tiny_tokenizer(), draft, 3)
    drafter = spec.drafter
    encoded: list[int] = []
    encode = drafter.draft_codec.encode
    drafter.draft_codec.encode = lambda text: encoded.append(len(text)) or encode(text)
    fed: list[int] = []
    forward = drafter.runner.forward
    drafter.runner.forward = lambda ids, **kw: fed.append(len(ids)) or forward(ids, **kw)
    prompt = list(range(5, 65))  # 60 characters
    spec.generate(prompt, SamplingParams(max_new_tokens=60))
    assert encoded[0] == 60 and max(encoded[1:]) < 30, encoded  # the prompt once, then tails only
    assert max(fed[1:]) < 20, fed  # after its prefill the drafter is fed only new tokens
    assert drafter.runner.length == len(drafter._cached)


@pytest.mark.slow
@pytest.mark.parametrize("verifier", ["token", "block"])
@pytest.mark.parametrize("kind", ["twin", "other"])
def test_sampled_output_has_the_targets_distribution(target, exact, kind, verifier):
    spec = engine(target, tiny_tokenizer(), drafter_model(kind, target), LENGTH - 1, verifier)
    counts: dict = {}
    proposed = accepted = 0
    for seed in range(SAMPLES):
        result = spec.generate(PROMPT, SamplingParams(**{**SAMPLING.__dict__, "seed": seed}))
        counts[tuple(result.token_ids)] = counts.get(tuple(result.token_ids), 0) + 1
        proposed, accepted = proposed + result.stats.proposed, accepted + result.stats.accepted
    p = p_value(counts, exact)
    assert p > ALPHA, f"{kind}/{verifier}: chi-square p = {p:.2e}"
    assert proposed > 0 and accepted > 0
    if kind == "twin":
        assert accepted / proposed > 0.5, f"the twin drafter agrees with its target, yet alpha = {accepted / proposed:.2f}"


def test_sampled_drafts_report_rows_in_the_targets_vocabulary_that_are_zero_outside_the_intersection(target):
    draft = drafter_model("other", target)
    spec = engine(target, tiny_tokenizer(), draft, 3)
    drafter = spec.drafter
    drafter.start(PROMPT, SAMPLING, torch.Generator().manual_seed(0))
    proposal = drafter.propose(PROMPT, 3)
    assert proposal.probs is not None and proposal.probs.shape == (len(proposal), target.config.vocab_size)
    outside = torch.ones(target.config.vocab_size, dtype=torch.bool)
    outside[drafter.vocabulary.target_ids] = False
    assert float(proposal.probs[:, outside].abs().sum()) == 0.0
    assert torch.allclose(proposal.probs.sum(dim=1), torch.ones(len(proposal)))
    assert all(float(proposal.probs[i, t]) > 0 for i, t in enumerate(proposal.tokens.tolist()))


def test_a_draft_is_proposed_only_as_stable_target_tokens():
    """Text becomes target tokens only where re-encoding keeps the committed ones, and never its last."""
    from specwise.drafters.cross_vocab import TokenizerCodec, stable_target_tokens

    codec = TokenizerCodec(tiny_other_tokenizer())  # merges "ab", "th", "he", "the", ...
    committed = codec.encode("xyz a")
    assert stable_target_tokens(codec, committed, "bcd", 5) == []  # "a" + "b" would merge into "ab"
    assert stable_target_tokens(codec, committed, "cdthe", 5) == codec.encode("cd")  # "the" may grow yet
    assert stable_target_tokens(codec, committed, "cdefgh", 2) == codec.encode("cd")  # at most k
