"""The prefix cache (specwise/prefix_cache.py) and the library's use of it: reuse never changes a token.

- the cache: a restored prefix is bitwise the entries it stored, the longest one to the token (whole
  blocks, then the leading tokens of a partial or a left block); a partial block gives way to the
  whole block that starts with it; scopes never meet (and scope None shares nothing); the byte bound holds, eviction is least
  recently used and takes children before their parents; a runner whose prefill is not exact (dense)
  is never given cached entries;
- SpecDecoder: greedy output with a cached prefix equals the cold output, alone and batched; the
  prompt tokens taken from the cache are counted (stats.cached_tokens);
- Conversation: turn n reads only what turn n - 1 did not leave in the cache, and its answers are
  the cold answers;
- (slow) sampled output at temperature 1 with a cached prefix keeps the target's distribution.
"""

from __future__ import annotations

import threading

import pytest
import torch

from helpers import (ALPHA, PROMPT, SAMPLES, SAMPLING, assert_same_entries, entries, exact_distribution, long_prompt,
                     p_value, run_together)
from specwise import Conversation, SamplingParams, SpecConfig, SpecDecoder
from specwise.drafters.scope import in_scope
from specwise.runners.lean import LeanRunner
from specwise.prefix_cache import BLOCK_TOKENS, PrefixCache, cache_runner
from specwise.testing import tiny_gguf_loaded, tiny_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

GREEDY = SamplingParams(max_new_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_gguf_loaded(tmp_path_factory.mktemp("target"), seed=0)


def read(target, ids: list[int]) -> LeanRunner:
    runner = LeanRunner(target.model)
    runner.forward(ids, logits=False)
    return runner


# --------------------------------------------------------------------------- the cache

def test_a_restored_prefix_is_the_stored_entries_to_the_token(target):
    cache = PrefixCache(1 << 30)
    prompt = long_prompt(100)
    assert cache.store(read(target, prompt), prompt) == 100  # 6 whole blocks of 16 and a partial one of 4
    assert cache.tokens == 100 and cache.blocks == 7 and cache.stats.stored_tokens == 100
    runner = LeanRunner(target.model)
    runner.forward([1, 2, 3], logits=False)
    # A prompt that leaves the stored one after 70 tokens: 4 whole blocks and 6 tokens of the fifth.
    other = prompt[:70] + [(prompt[70] % 78) + 1] * 30
    assert cache.restore(runner, other) == 70
    assert runner.length == 70
    assert_same_entries(entries(runner), entries(read(target, prompt[:70])))
    assert cache.restore(runner, [prompt[0] % 78 + 1] + prompt[1:]) == 0 and runner.length == 0  # first differs
    assert cache.restore(runner, prompt[:15]) == 15  # inside the first block
    assert_same_entries(entries(runner), entries(read(target, prompt[:15])))
    assert cache.restore(runner, prompt[:98]) == 98  # inside the partial block
    assert_same_entries(entries(runner), entries(read(target, prompt[:98])))
    assert cache.restore(runner, prompt + [5, 6]) == 100
    assert (cache.stats.lookups, cache.stats.hits, cache.stats.hit_tokens) == (5, 4, 283)
    assert cache.store(read(target, prompt), prompt) == 0  # held already: nothing new
    assert cache.store(read(target, prompt[:90]), prompt[:90]) == 0  # a whole block starts with its tail


def test_a_partial_block_gives_way_to_the_whole_block_that_starts_with_it(target):
    cache = PrefixCache(1 << 30)
    prompt = long_prompt(64, seed=3)
    assert cache.store(read(target, prompt[:37]), prompt[:37]) == 37  # 2 whole blocks and 5 tokens
    assert cache.store(read(target, prompt[:41]), prompt[:41]) == 9  # a longer partial block replaces it
    assert cache.blocks == 3 and cache.tokens == 41
    assert cache.store(read(target, prompt[:48]), prompt[:48]) == 16  # the whole third block replaces that
    assert cache.blocks == 3 and cache.tokens == 48
    assert cache.bytes == 3 * cache.bytes_per_token() * 16
    assert cache.stats.evictions == 0 and cache.stats.evicted_tokens == 0  # replaced, not evicted
    runner = LeanRunner(target.model)
    assert cache.restore(runner, prompt[:45]) == 45
    assert_same_entries(entries(runner), entries(read(target, prompt[:45])))
    # Two partial blocks that differ after their second token: a prompt takes the one it agrees with.
    fork = prompt[:50] + [prompt[50] % 78 + 1] + prompt[51:]
    cache.store(read(target, prompt[:56]), prompt[:56])
    cache.store(read(target, fork[:58]), fork[:58])
    assert cache.restore(runner, fork[:57]) == 57
    assert_same_entries(entries(runner), entries(read(target, fork[:57])))
    assert cache.restore(runner, prompt[:54]) == 54
    assert_same_entries(entries(runner), entries(read(target, prompt[:54])))


def test_scopes_never_meet(target):
    cache = PrefixCache(1 << 30)
    prompt = long_prompt(40)
    runner = read(target, prompt)
    with in_scope(("tenant", "a")):
        cache.store(runner, prompt)
    for scope in (("tenant", "b"), (), None):
        with in_scope(scope):
            assert cache.restore(LeanRunner(target.model), prompt) == 0, scope
    with in_scope(None):
        assert cache.store(runner, prompt) == 0  # isolated: adds nothing either
    with in_scope(("tenant", "a")):
        assert cache.restore(LeanRunner(target.model), prompt) == 40
    assert cache.restore(LeanRunner(target.model), prompt, ("tenant", "b")) == 0


def test_the_byte_bound_holds_and_eviction_takes_the_least_recently_used_leaves_first(target):
    one = read(target, long_prompt(16))
    block = sum(t[:, :, :16].numel() * 4 for t in one.cache)  # float32 keys and values of 16 tokens
    cache = PrefixCache(5 * block)
    first, second = long_prompt(48, seed=1), long_prompt(48, seed=2)  # 3 blocks each
    cache.store(read(target, first), first)
    cache.store(read(target, second), second)
    assert cache.bytes <= 5 * block and cache.blocks == 5 and cache.stats.evictions == 1
    # first's last block went (its least recently used leaf); its first two still restore.
    assert cache.restore(LeanRunner(target.model), first) == 32
    # Now first's two blocks are the most recent; storing a third prompt evicts second's, deepest first.
    third = long_prompt(32, seed=3)
    cache.store(read(target, third), third)
    assert cache.bytes <= 5 * block
    assert cache.restore(LeanRunner(target.model), second) == 16
    assert cache.restore(LeanRunner(target.model), first) == 32
    assert cache.restore(LeanRunner(target.model), third) == 32
    assert cache.evict_tokens(20) == 32 and cache.blocks == 3
    cache.clear()
    assert cache.bytes == 0 and cache.tokens == 0
    with pytest.raises(ValueError, match="max_bytes must be an integer >= 0"):
        PrefixCache(-1)


def test_partial_blocks_keep_the_byte_bound_and_the_index_whole_under_eviction(target):
    one = read(target, long_prompt(16))
    block = sum(t[:, :, :16].numel() * 4 for t in one.cache)
    cache = PrefixCache(4 * block)
    prompts = [long_prompt(length, seed=50 + i) for i, length in enumerate((21, 37, 9, 50, 33, 18, 44))]
    for prompt in prompts:
        cache.store(read(target, prompt), prompt)
        held = set(cache._blocks)
        assert {key for keys in cache._children.values() for key in keys} == held  # no stale child
        assert cache.bytes <= 4 * block
        assert cache.tokens == sum(b.tokens for b in cache._blocks.values())
        assert cache.bytes == sum(b.bytes for b in cache._blocks.values())
        runner = LeanRunner(target.model)
        got = cache.restore(runner, prompt)
        assert got == len(prompt)  # the prompt just stored is the most recent: it was not evicted
        assert_same_entries(entries(runner), entries(read(target, prompt)))
    assert cache.stats.evictions > 0
    assert cache.stats.evicted_tokens + cache.tokens == cache.stats.stored_tokens


def test_a_runner_whose_prefill_is_not_exact_gets_no_cached_entries(target):
    dense = LeanRunner(tiny_model(seed=0))
    assert cache_runner(dense) is None and cache_runner(LeanRunner(target.model)) is not None
    cache = PrefixCache(1 << 30)
    prompt = long_prompt(40)
    dense.forward(prompt, logits=False)
    assert cache.store(dense, prompt) == 0
    assert cache.restore(dense, prompt) == 0 and dense.length == 0


# --------------------------------------------------------------------------- the decoder

def test_greedy_output_with_a_cached_prefix_is_the_cold_output(target, kernel_path):
    cold = SpecDecoder(target, SpecConfig(drafter="ngram", k=3), prefix_cache_bytes=0)
    warm = SpecDecoder(target, SpecConfig(drafter="ngram", k=3))
    shared = long_prompt(120, seed=4)
    prompts = [shared + long_prompt(9 + 13 * i, seed=20 + i) for i in range(4)]
    want = [cold.generate(prompt, GREEDY) for prompt in prompts]
    assert all(result.stats.cached_tokens == 0 for result in want)
    got = [warm.generate(prompt, GREEDY) for prompt in prompts]
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert got[0].stats.cached_tokens == 0
    assert all(r.stats.cached_tokens == 120 for r in got[1:])  # the shared 120 tokens (the next ones differ)
    assert all(r.stats.prompt_tokens == len(p) for r, p in zip(got, prompts))
    again = warm.generate(prompts[2], GREEDY)  # its own prompt and answer are cached now
    assert again.token_ids == want[2].token_ids
    assert again.stats.cached_tokens == len(prompts[2]) - 1  # all but the last, which the first step reads


def test_the_decoder_tells_how_much_of_a_prompt_is_cached_without_touching_the_cache(target):
    decoder = SpecDecoder(target, SpecConfig(drafter="ngram", k=3))
    shared = long_prompt(120, seed=6)
    prompt = shared + long_prompt(20, seed=7)
    assert decoder.cached_prefix_tokens(prompt) == 0
    decoder.generate(shared + [3, 4, 5], GREEDY)
    before = (decoder.prefix_cache.stats.lookups, decoder.prefix_cache.stats.hits, list(decoder.prefix_cache._blocks))
    assert decoder.cached_prefix_tokens(prompt) == 120  # the shared 120 tokens
    after = (decoder.prefix_cache.stats.lookups, decoder.prefix_cache.stats.hits, list(decoder.prefix_cache._blocks))
    assert after == before  # neither the counters nor the recency order moved
    assert decoder.cached_prefix_tokens(prompt, scope=("tenant", "x")) == 0  # another tenant's view
    assert decoder.cached_prefix_tokens(prompt, scope=None) == 0
    assert decoder.cached_prefix_tokens(prompt, SpecConfig(runner="hf")) == 0  # a runner not made: nothing loads
    assert decoder.generate(prompt, GREEDY).stats.cached_tokens == 120


def test_batched_generations_with_cached_prefixes_are_the_cold_outputs(target):
    cold = SpecDecoder(target, SpecConfig(drafter="ngram", k=3), prefix_cache_bytes=0)
    warm = SpecDecoder(target, SpecConfig(drafter="ngram", k=3), max_batch=4, prefill_chunk=32)
    shared = long_prompt(200, seed=5)
    prompts = [shared + long_prompt(5 + 7 * i, seed=30 + i) for i in range(4)]
    want = [cold.generate(prompt, GREEDY).token_ids for prompt in prompts]
    warm.generate(shared + [3, 4, 5], GREEDY)  # leaves the shared prefix in the cache
    assert run_together(warm, [(prompt, GREEDY, None) for prompt in prompts]) == want
    assert warm.prefix_cache.stats.hit_tokens >= 4 * 192


def test_a_conversation_reads_only_what_the_last_turn_did_not_leave(target):
    cold = SpecDecoder(target, SpecConfig(drafter="ngram", k=3), prefix_cache_bytes=0)
    chat = SpecDecoder(target, SpecConfig(drafter="ngram", k=3)).conversation()
    assert isinstance(chat, Conversation)
    history: list[int] = []
    for turn in range(3):
        new = long_prompt(40 + 11 * turn, seed=40 + turn)
        result = chat.send(new, GREEDY)
        assert result.token_ids == cold.generate(history + new, GREEDY).token_ids
        # The last turn's prompt and answer were cached, all but its last token (no pass has read it).
        if history:
            assert result.stats.cached_tokens == len(history) - 1
        assert result.prompt_ids == history + new
        history = history + new + result.token_ids
    assert chat.ids == history
    with pytest.raises(ValueError, match="continues token ids"):
        chat.send("hello")


def test_a_text_conversation_keeps_its_messages(target):
    decoder = SpecDecoder(target, SpecConfig(drafter="none"))
    chat = decoder.conversation(system="be brief")
    with pytest.raises(ValueError, match="holds chat messages"):
        chat.send([1, 2, 3])
    if not getattr(decoder.tokenizer, "chat_template", None):
        with pytest.raises(ValueError, match="chat template"):
            chat.send("hello", GREEDY)
        return
    result = chat.send("hello", GREEDY)
    assert chat.messages[-1] == {"role": "assistant", "content": result.text}


@pytest.mark.slow
def test_sampled_output_with_a_cached_prefix_keeps_the_targets_distribution(target):
    """Blocks of 2 tokens, so that the 4 tokens the target's cache takes of PROMPT come from the cache
    in every sample but the first."""
    exact = exact_distribution(target.model)
    decoder = SpecDecoder(target, SpecConfig(drafter="ngram", k=2), max_batch=2)
    decoder.prefix_cache = PrefixCache(1 << 30, block_tokens=2)
    counts: dict = {}
    lock = threading.Lock()

    def sample(seeds: range) -> None:
        for seed in seeds:
            result = decoder.generate(PROMPT, SamplingParams(**{**SAMPLING.__dict__, "seed": seed}))
            with lock:
                counts[tuple(result.token_ids)] = counts.get(tuple(result.token_ids), 0) + 1

    half = SAMPLES // 2
    threads = [threading.Thread(target=sample, args=(range(i * half, (i + 1) * half),)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(900)
    assert sum(counts.values()) == 2 * half
    assert decoder.prefix_cache.stats.hit_tokens >= 4 * (2 * half - 2)
    p = p_value(counts, exact)
    assert p > ALPHA, f"chi-square p = {p:.2e}"
