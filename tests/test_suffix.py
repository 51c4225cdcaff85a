"""The suffix drafter: its trie against brute force, the store's bound and scopes, the drafts,
and the engine with it (greedy identity; slow: the chi-square test at temperature 1)."""

import random

import pytest
import torch

from specwise import SamplingParams, SpecConfig, SpeculativeEngine, sharing_scope
from specwise.drafters import DrafterContext, SuffixDrafter, create_drafter
from specwise.drafters.scope import current_scope, in_scope
from specwise.drafters.suffix_store import SuffixStore
from specwise.drafters.suffix_trie import SuffixTrie
from specwise.stats import SpecStats
from specwise.runners.hf import HFRunner
from specwise.testing import tiny_loaded, tiny_model
from specwise.verify.result import VerifyResult

from helpers import (ALPHA, GREEDY_PROMPTS, LENGTH, PROMPT, SAMPLES, SAMPLING, SMALL_TREE, hf_greedy, p_value,
                     run_engine)

GENERATOR = torch.Generator()


def brute_counts(sequences, depth):
    """Every substring of up to `depth` tokens and its number of occurrences."""
    out = {}
    for seq in sequences:
        for start in range(len(seq)):
            for length in range(1, min(depth, len(seq) - start) + 1):
                path = tuple(seq[start:start + length])
                out[path] = out.get(path, 0) + 1
    return out


def random_stream(rng, length, vocab):
    tokens = []
    while len(tokens) < length:  # copies of earlier spans make the paths shared and the leaves burst
        if tokens and rng.random() < 0.5:
            start = rng.randrange(len(tokens))
            tokens += tokens[start:start + rng.randint(1, 8)]
        else:
            tokens.append(rng.randrange(vocab))
    return tokens[:length]


# ----------------------------------------------------------------------------- the trie

@pytest.mark.parametrize("seed", range(6))
def test_incremental_updates_equal_a_rebuild_from_scratch(seed):
    rng = random.Random(seed)
    depth = rng.randint(2, 8)
    incremental, kept = SuffixTrie(depth), {}
    for _ in range(6):
        sid = incremental.open()
        tokens = random_stream(rng, rng.randint(0, 60), rng.randint(2, 6))
        position = 0
        while position < len(tokens):  # committed a few tokens at a time, as the engine does
            step = rng.randint(1, 5)
            incremental.extend(sid, tokens[position:position + step])
            position += step
        incremental.close(sid)
        kept[sid] = tokens
        if rng.random() < 0.3:
            victim = rng.choice(list(kept))
            incremental.remove(victim)
            del kept[victim]
        rebuilt = SuffixTrie(depth)
        for seq in kept.values():
            rebuilt.add(seq)
        assert incremental.counts() == rebuilt.counts() == brute_counts(kept.values(), depth)
        assert incremental.tokens == sum(map(len, kept.values()))
    for sid in list(kept):
        incremental.remove(sid)
    assert incremental.counts() == {} and incremental.nodes == 1  # every node but the root freed


def test_leaves_keep_unrepeated_text_small():
    rng = random.Random(0)
    trie = SuffixTrie(24)
    trie.add([rng.randrange(1000) for _ in range(2000)])  # little repetition: mostly leaves
    assert trie.nodes < 4 * 2000  # a plain trie of depth 24 would have ~24 nodes a token


@pytest.mark.parametrize("seed", range(4))
def test_lookups_return_the_true_continuation_counts(seed):
    rng = random.Random(seed)
    depth = 6
    corpus = [random_stream(rng, 40, 4) for _ in range(5)]
    trie = SuffixTrie(depth)
    for seq in corpus:
        trie.add(seq)
    truth = brute_counts(corpus, depth)
    for _ in range(200):
        path = tuple(rng.randrange(4) for _ in range(rng.randint(0, depth - 1)))
        cursor = trie.find(path)
        if path and path not in truth:
            assert cursor is None
            continue
        expected = {t: n for t in range(4) if (n := truth.get(path + (t,), 0))}
        assert trie.children(cursor) == expected
        if path:
            assert trie.count(cursor) == truth[path]


# ----------------------------------------------------------------------------- the store

def test_eviction_keeps_the_bound_oldest_first():
    store = SuffixStore(depth=8, limit=100)
    rng = random.Random(0)
    added = []
    for i in range(30):
        tokens = [rng.randrange(50) for _ in range(rng.randint(5, 30))]
        store.add(("a",) if i % 2 else ("b",), tokens)
        added.append(tokens)
        usage = store.usage()
        assert usage.tokens <= 100 and usage.limit == 100
    # What is left is the newest requests, as a rebuild of them would hold.
    kept, total = [], 0
    for tokens in reversed(added):
        if total + len(tokens) > 100:
            break
        kept.append(tokens)
        total += len(tokens)
    assert store.usage().tokens == total and store.usage().requests == len(kept)
    long = list(range(500))
    store.add(("c",), long)  # longer than the bound: its end is kept, alone
    assert store.usage().tokens == 100 and store.trie(("c",)).counts() == brute_counts([long[-100:]], 8)
    assert store.trie(("a",)) is None and store.usage().scopes == 1


def test_store_never_mixes_scopes_and_none_shares_nothing():
    store = SuffixStore(depth=6, limit=1000)
    store.add(("x",), [1, 2, 3, 4])
    store.add(("y",), [1, 2, 9, 9])
    store.add(None, [1, 2, 7, 7])
    assert brute_counts([[1, 2, 3, 4]], 6) == store.trie(("x",)).counts()
    assert store.trie(None) is None and store.usage().requests == 2
    assert SuffixStore(depth=6, limit=0).trie(("x",)) is None


def test_sharing_scopes_nest_and_isolate():
    assert current_scope() == ()
    with sharing_scope("bench"):
        with sharing_scope("m1") as scope:
            assert scope == current_scope() == ("bench", "m1")
        with sharing_scope(None):
            assert current_scope() is None
            with sharing_scope("inner"):
                assert current_scope() is None  # nothing nested in "share nothing" shares
    assert current_scope() == ()
    with pytest.raises(TypeError, match="tuple of strings or None"):
        with in_scope("tenant"):
            pass


# ----------------------------------------------------------------------------- drafts

def brute_children(counts, path):
    return {p[-1]: n for p, n in counts.items() if len(p) == len(path) + 1 and p[:-1] == path}


def check_chain(sequences, context, chain, depth, factor, min_prob, k):
    """A suffix drafter's chain, checked against the definition by brute force: the longest suffix
    (up to depth // 2) some occurrence continues, then at each step a most frequent continuation
    (ties either way) while the path's frequency clears min_prob, at most min(k, factor x match)."""
    counts = brute_counts(sequences, depth)
    matched = next((m for m in range(min(len(context), depth // 2), 0, -1)
                    if brute_children(counts, tuple(context[len(context) - m:]))), 0)
    limit = min(k, factor * matched, depth - matched)
    path, frequency = tuple(context[len(context) - matched:]), 1.0
    for level in range(limit + 1):
        kids = brute_children(counts, path)
        best = max(kids.values(), default=0)
        if level == len(chain):  # it stopped: the limit, or nothing frequent enough to add
            assert level == limit or not kids or frequency * best / sum(kids.values()) < min_prob
            return matched
        token = chain[level]
        assert kids.get(token) == best and frequency * best / sum(kids.values()) >= min_prob
        frequency *= best / sum(kids.values())
        path += (token,)
    raise AssertionError(f"chain {chain} longer than its limit {limit}")


@pytest.mark.parametrize("seed", range(8))
def test_chain_is_the_most_frequent_continuation(seed):
    rng = random.Random(seed)
    depth, factor, k = 8, 2, 6
    drafter = SuffixDrafter(depth=depth, factor=factor, min_percent=20)
    earlier = [random_stream(rng, 30, 3) for _ in range(3)]
    for tokens in earlier:  # each becomes an earlier request of the same scope at the next start
        drafter.start(tokens, SamplingParams(), GENERATOR)
    context = random_stream(rng, 12, 3)
    drafter.start(context, SamplingParams(), GENERATOR)
    chain = drafter.propose(context, k).tokens.tolist()
    matched = check_chain(earlier + [context], context, chain, depth, factor, 0.2, k)
    assert drafter.match(context)[0] == matched


def test_drafts_grow_with_the_match_and_trees_branch():
    drafter = SuffixDrafter(depth=24, factor=1, min_percent=10)
    drafter.start([1, 2, 3, 4, 5, 6, 7, 8, 9], SamplingParams(), GENERATOR)
    assert drafter.propose([1, 2, 3, 4, 5, 6, 7, 8, 9], 16).tokens.tolist() == []  # nothing repeats yet
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    drafter.observe(VerifyResult([1, 2, 3], 2, 2))
    assert drafter.propose(context, 16).tokens.tolist() == [4, 5, 6]  # a 3-token match drafts 3
    prompt = [1, 2, 3, 4, 20, 21, 22, 23, 10, 11, 12, 1, 2, 3, 4]
    drafter.start(prompt, SamplingParams(), GENERATOR)
    tree = drafter.propose_tree(prompt, 8, 4, 3)
    # [1, 2, 3, 4] continues with 5 (earlier request) and 20 (this one): two branches, each a path
    assert tree.probs is None and sorted(tree.tokens[tree.parents == -1].tolist()) == [5, 20]
    assert max(tree.depths()) == 4 and len(tree) == 8


def test_private_scope_drafts_from_its_own_request_only():
    drafter = SuffixDrafter()
    drafter.start([1, 2, 3, 4, 5], SamplingParams(), GENERATOR)
    with sharing_scope("tenant-a"):
        drafter.start([7, 8, 9], SamplingParams(), GENERATOR)  # stores [1..5] in the default scope
        assert drafter.propose([7, 8, 9, 1, 2], 4).tokens.tolist() == []
    drafter.start([1, 2], SamplingParams(), GENERATOR)  # stores [7, 8, 9] under tenant-a
    assert drafter.propose([1, 2], 4).tokens.tolist() == [3, 4]
    with sharing_scope(None):
        drafter.start([1, 2], SamplingParams(), GENERATOR)
        assert drafter.propose([1, 2], 4).tokens.tolist() == []
    assert drafter.usage().scopes == 2


def test_registry_and_settings():
    spec = SpecConfig(drafter="suffix", suffix_depth=16, suffix_factor=2, suffix_min_percent=5,
                      suffix_cache_tokens=1000)
    drafter = create_drafter("suffix", DrafterContext(tiny_loaded(0), spec, 80, {}))
    assert (drafter.depth, drafter.factor, drafter.min_prob, drafter.store.limit) == (16, 2, 0.05, 1000)
    assert SpecDecoderLabel(spec) == "specwise-suffix-k4-auto1-12-d16-f2-p5-cache1000"
    with pytest.raises(ValueError, match="suffix_min_percent must be an integer in \\[0, 100\\]"):
        SpecConfig(drafter="suffix", suffix_min_percent=101)


def SpecDecoderLabel(spec):
    from specwise.bench.methods import spec_label
    return spec_label(spec)


# ----------------------------------------------------------------------------- the engine

@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0)


PROMPTS, TREE = GREEDY_PROMPTS, SMALL_TREE


def run(target, drafter, prompt, **options):
    return run_engine(target, drafter, prompt, **{"k": 8, **options})


@pytest.mark.parametrize("tree", [{}, TREE], ids=["chain", "tree"])
def test_suffix_drafter_is_greedy_identical(target, tree):
    drafter = SuffixDrafter(depth=12, min_percent=0)
    for prompt in PROMPTS:
        assert run(target, drafter, prompt, **tree).token_ids == hf_greedy(target, prompt, 40)
    prompt = PROMPTS[1]
    first = run(target, drafter, prompt, max_new=80, eos=(), **tree)
    assert first.token_ids == hf_greedy(target, prompt, 80, eos=False)
    assert first.stats.accepted > 0
    # The same request again: its earlier answer is in the shared store, so more is accepted.
    second = run(target, drafter, prompt, max_new=80, eos=(), **tree)
    assert second.token_ids == first.token_ids
    assert second.stats.acceptance_length > first.stats.acceptance_length
    assert second.stats.draft_seconds > 0


@pytest.mark.slow
@pytest.mark.parametrize("tree", [{}, dict(tree_nodes=6, tree_depth=LENGTH - 1, tree_branching=3)],
                         ids=["chain", "tree"])
def test_sampled_suffix_drafts_keep_the_target_distribution(target, exact, tree):
    # Each generation is stored for the next, so the drafts follow earlier samples: many
    # proposals, often accepted, all point masses the verifier must correct exactly.
    drafter = SuffixDrafter(depth=8, min_percent=0)
    spec = SpecConfig(drafter="suffix", k=LENGTH - 1, adaptive=False, **tree)
    engine = SpeculativeEngine(HFRunner(target), drafter, spec)
    counts, stats = {}, SpecStats()
    for seed in range(SAMPLES):
        result = engine.generate(PROMPT, SamplingParams(**{**SAMPLING.__dict__, "seed": seed}))
        counts[tuple(result.token_ids)] = counts.get(tuple(result.token_ids), 0) + 1
        stats = stats.merge(result.stats)
    assert stats.proposed > SAMPLES and stats.accepted > 0.2 * stats.proposed
    p = p_value(counts, exact)
    assert p > ALPHA, f"chi-square p = {p:.2e}"
