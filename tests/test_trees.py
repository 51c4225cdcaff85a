"""Tree drafting and tree verification in the engine.

- Tree attention: every node's logits equal a separate pass over its own path, and after
  keep() the cache continues exactly like one built from the accepted path alone.
- Greedy identity with trees (draft model on both runners, n-gram, random trees) against
  Hugging Face generate(), float32 tiny models (docs/DESIGN.md, "Numerics").
- sample_without_replacement follows the sequential without-replacement law (chi-square).
- Shapes of the drafters' trees; configuration errors; metrics by depth; CLI and bench keys.
- Slow: the engine at temperature 1 with sampled draft-model trees has the target's
  distribution (the chi-square check of test_engine_statistical.py), and deterministic top-b
  children passed off as samples fail that same check.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools

import pytest
import torch
from scipy.stats import chisquare
from transformers import Qwen2ForCausalLM

from specwise import SamplingParams, SpecConfig, SpeculativeEngine
from specwise.bench.methods import parse_specwise_method, spec_label
from specwise.cli_options import add_model_options, add_sampling_options, spec_from_args
from specwise.config import ConfigError, parse_tree_shape, tree_shape_nodes
from specwise.drafters import DraftModelDrafter, NgramDrafter, NoDrafter, TreeProposal
from specwise.drafters import tree_growth as tree_growth_module
from specwise.stats import SpecStats
from specwise.runners.lean import LeanRunner
from specwise.runners.protocols import RollbackError, TreeRunner
from specwise.runners.hf import HFRunner
from specwise.sampling import (logits_to_probs, sample_without_replacement, seen_token_mask,
                               tree_seen_mask)
from specwise.testing import tiny_config, tiny_model

from helpers import ALPHA, LENGTH, PROMPT, SAMPLES, SAMPLING, RandomDrafter, hf_greedy, p_value

RUNNERS = {"hf": HFRunner, "lean": LeanRunner}
PROMPTS = [[5, 9, 14, 20, 33], [40, 41, 42, 40, 41, 42, 40, 41], [7]]
CONTEXT = [5, 9, 14, 20]
TREE_TOKENS = [3, 7, 8, 11, 12, 13, 3]
TREE_PARENTS = [-1, 0, 0, -1, 1, 3, 4]


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def other():
    return tiny_model(seed=1)


def path_to(node: int, tokens=TREE_TOKENS, parents=TREE_PARENTS) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


class RandomTreeDrafter:
    """Random trees of point masses (distinct siblings): rejections almost everywhere."""

    name = "random-tree"

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)
        self.chain = RandomDrafter(vocab_size, seed)

    def start(self, prompt_ids, sampling, generator) -> None:
        pass

    def propose(self, context, k):
        return self.chain.propose(context, k)

    def propose_tree(self, context, nodes, depth, branching, shape=None) -> TreeProposal:
        tokens, parents, depths = [], [], []
        for _ in range(nodes):
            options = [i for i in range(-1, len(tokens)) if (i < 0 or depths[i] < depth)
                       and sum(p == i for p in parents) < branching]
            parent = options[int(torch.randint(len(options), (), generator=self.generator))]
            taken = {t for t, p in zip(tokens, parents) if p == parent}
            token = int(torch.randint(self.vocab_size, (), generator=self.generator))
            while token in taken:
                token = (token + 1) % self.vocab_size
            tokens.append(token)
            parents.append(parent)
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return TreeProposal(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))

    def observe(self, result) -> None:
        pass


# ----------------------------------------------------------------------------- tree attention

@pytest.mark.parametrize("kind", ["hf", "lean"])
@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_tree_logits_equal_a_pass_over_each_path(kind, dtype, tolerance):
    model = tiny_model(seed=0, dtype=dtype)
    runner = RUNNERS[kind](model)
    assert isinstance(runner, TreeRunner)
    runner.reset()
    runner.forward(CONTEXT, logits=False)
    logits = runner.forward_tree(TREE_TOKENS, TREE_PARENTS)  # [n, V]
    assert runner.length == len(CONTEXT) + len(TREE_TOKENS)
    for node in range(len(TREE_TOKENS)):
        ids = CONTEXT + [TREE_TOKENS[i] for i in path_to(node)]
        with torch.no_grad():
            expected = model(torch.tensor([ids])).logits[0, -1].float()
        torch.testing.assert_close(logits[node], expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("kind", ["hf", "lean"])
@pytest.mark.parametrize("accepted", [[], [0], [0, 1, 4, 6], [3, 5]])
def test_cache_after_keep_continues_like_the_path_alone(kind, accepted):
    model = tiny_model(seed=0, dtype=torch.float64)
    runner = RUNNERS[kind](model)
    runner.reset()
    runner.forward(CONTEXT, logits=False)
    runner.forward_tree(TREE_TOKENS, TREE_PARENTS)
    runner.keep(len(CONTEXT), accepted)
    path = [TREE_TOKENS[i] for i in accepted]
    assert runner.length == len(CONTEXT) + len(path)
    reference = RUNNERS[kind](model)
    reference.reset()
    reference.forward(CONTEXT + path, logits=False)
    for step in ([30, 31, 32], [33]):
        torch.testing.assert_close(runner.forward(step), reference.forward(step), rtol=1e-10, atol=1e-10)
    runner.rollback(2)  # still an ordinary cache
    reference.rollback(2)
    torch.testing.assert_close(runner.forward([34]), reference.forward([34]), rtol=1e-10, atol=1e-10)


def test_hf_tree_refuses_sliding_window_layers():
    config = tiny_config()
    config.layer_types = ["sliding_attention", "full_attention"]
    config.sliding_window, config.use_sliding_window = 4, True
    runner = HFRunner(Qwen2ForCausalLM(config).eval())
    runner.reset()
    runner.forward([1, 2, 3], logits=False)
    with pytest.raises(RollbackError, match="sliding-window"):
        runner.forward_tree([4, 5], [-1, -1])
    with pytest.raises(RollbackError, match="sliding-window"):
        runner.keep(3, [0])


def test_tree_input_errors(target):
    runner = HFRunner(target)
    runner.reset()
    runner.forward(CONTEXT, logits=False)
    with pytest.raises(ValueError, match="parent"):
        runner.forward_tree([1, 2], [-1, 1])
    with pytest.raises(ValueError, match="parents"):
        runner.forward_tree([1, 2], [-1])
    runner.forward_tree([1, 2], [-1, 0])
    with pytest.raises(ValueError, match="outside"):
        runner.keep(len(CONTEXT), [2])


# ----------------------------------------------------------------------------- greedy identity

def run(target, drafter, prompt, runner="hf", max_new=40, sampling=None, eos=(0,), **tree):
    spec = SpecConfig(runner=runner, **({"tree_nodes": 10, "tree_depth": 4, "tree_branching": 3} | tree))
    engine = SpeculativeEngine(RUNNERS[runner](target), drafter, spec, eos_token_ids=eos)
    return engine.generate(prompt, sampling or SamplingParams(max_new_tokens=max_new))


@pytest.mark.parametrize("runner", ["hf", "lean"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_draft_model_trees_are_greedy_identical(target, other, runner, prompt):
    expected = hf_greedy(target, prompt, 40)
    same = run(target, DraftModelDrafter(RUNNERS[runner](target), target.config.vocab_size), prompt, runner)
    assert same.token_ids == expected
    assert same.stats.accepted > 0 and same.stats.tree_steps == same.stats.steps
    weak = run(target, DraftModelDrafter(RUNNERS[runner](other), target.config.vocab_size), prompt, runner,
               tree_nodes=16, tree_depth=3, tree_branching=4)
    assert weak.token_ids == expected


@pytest.mark.parametrize("prompt", PROMPTS)
def test_random_trees_are_greedy_identical(target, prompt):
    result = run(target, RandomTreeDrafter(target.config.vocab_size), prompt, tree_nodes=12)
    assert result.token_ids == hf_greedy(target, prompt, 40)
    assert result.stats.acceptance_rate < 0.1


def test_ngram_trees_are_greedy_identical_and_accepted(target):
    for prompt in PROMPTS:
        assert run(target, NgramDrafter(1, 3), prompt).token_ids == hf_greedy(target, prompt, 40)
    prompt = PROMPTS[1]
    result = run(target, NgramDrafter(1, 3), prompt, max_new=80, eos=())
    assert result.token_ids == hf_greedy(target, prompt, 80, eos=False)
    assert result.stats.accepted > 0, result.stats


def test_repetition_penalty_sees_each_path_only(target, other):
    sampling = SamplingParams(max_new_tokens=40, repetition_penalty=1.5)
    for prompt in PROMPTS:
        expected = hf_greedy(target, prompt, 40, repetition_penalty=1.5)
        for model in (target, other):
            drafter = DraftModelDrafter(HFRunner(model), target.config.vocab_size)
            assert run(target, drafter, prompt, sampling=sampling).token_ids == expected


def test_tree_seen_mask_follows_paths():
    mask = tree_seen_mask([1, 2], [3, 4, 5], [-1, -1, 0], 8)  # [4, 8]
    assert mask[0].nonzero().flatten().tolist() == [1, 2]
    assert mask[1].nonzero().flatten().tolist() == [1, 2, 3]
    assert mask[2].nonzero().flatten().tolist() == [1, 2, 4]  # not its sibling 3
    assert mask[3].nonzero().flatten().tolist() == [1, 2, 3, 5]
    chain = tree_seen_mask([1, 2], [3, 4], [-1, 0], 8)
    assert torch.equal(chain, seen_token_mask([1, 2], [3, 4], 8))


def test_trees_respect_max_new_tokens_and_stop_ids(target):
    prompt = PROMPTS[0]
    expected = hf_greedy(target, prompt, 40, eos=False)
    for limit in (1, 2, 3, 7):
        drafter = DraftModelDrafter(HFRunner(target), target.config.vocab_size)
        result = run(target, drafter, prompt, sampling=SamplingParams(max_new_tokens=limit))
        assert result.token_ids == expected[:limit]
        assert len(result.stats.proposed_at) <= max(limit - 1, 0)  # never deeper than the room left
    stop_id = expected[5]
    drafter = DraftModelDrafter(HFRunner(target), target.config.vocab_size)
    result = run(target, drafter, prompt, sampling=SamplingParams(max_new_tokens=40, stop_token_ids=[stop_id]))
    assert result.token_ids == expected[:expected.index(stop_id) + 1] and result.finish_reason == "stop"


def test_target_runs_one_tree_pass_per_step(target, other):
    runner = HFRunner(target)
    calls = []
    forward_tree = runner.forward_tree

    def counting(ids, parents):
        calls.append((len(ids), parents[0]))
        return forward_tree(ids, parents)

    runner.forward_tree = counting
    drafter = DraftModelDrafter(HFRunner(other), target.config.vocab_size)
    spec = SpecConfig(tree_nodes=8, tree_depth=3, tree_branching=2)
    result = SpeculativeEngine(runner, drafter, spec, eos_token_ids=(0,)).generate(
        PROMPTS[0], SamplingParams(max_new_tokens=30))
    assert len(calls) == result.stats.steps
    assert all(n <= 9 and root == -1 for n, root in calls)
    assert result.stats.proposed == sum(n - 1 for n, _ in calls)


def test_a_node_s_depth_counts_the_draft_tokens_on_its_path():
    """One convention: depth 1 for a child of the context; a tree's depth is its deepest node's, and a
    node's position offset in the tree pass is its depth - 1."""
    from specwise.runners.tree_layout import tree_layout

    tree = TreeProposal(torch.tensor(TREE_TOKENS), torch.tensor(TREE_PARENTS))
    _, offsets = tree_layout(TREE_PARENTS)
    assert tree.depths() == [1, 2, 2, 1, 3, 2, 4] == [offset + 1 for offset in offsets]
    assert tree.depth == 4 and TreeProposal.empty().depth == 0
    assert SpecConfig(tree_shape=(3, 2, 1)).tree_depth == 3  # a fixed shape's levels


class FixedTreeDrafter(RandomTreeDrafter):
    """Proposes the same tree whatever it is asked for, or (honest) nothing where that tree is too large."""

    name = "fixed-tree"

    def __init__(self, vocab_size: int, tokens: list[int], parents: list[int], honest: bool = False) -> None:
        super().__init__(vocab_size)
        self.tree = TreeProposal(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))
        self.honest = honest

    def propose_tree(self, context, nodes, depth, branching, shape=None) -> TreeProposal:
        if self.honest and (len(self.tree) > nodes or self.tree.depth > depth):
            return TreeProposal.empty()
        return self.tree


def test_engine_refuses_a_tree_larger_deeper_or_outside_the_vocabulary(target):
    vocab = target.config.vocab_size
    spec = SpecConfig(tree_nodes=4, tree_depth=2, tree_branching=3)

    def run_tree(tokens, parents, honest=False):
        drafter = FixedTreeDrafter(vocab, tokens, parents, honest)
        engine = SpeculativeEngine(HFRunner(target), drafter, spec, eos_token_ids=())
        return engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=12))

    with pytest.raises(ValueError, match=r"drafter 'fixed-tree' proposed 5 nodes of depth up to 1; asked for at "
                                         r"most 4 nodes and depth 2"):
        run_tree([1, 2, 3, 4, 5], [-1] * 5)
    with pytest.raises(ValueError, match=r"proposed 3 nodes of depth up to 3; asked for at most 4 nodes and depth 2"):
        run_tree([1, 2, 3], [-1, 0, 1])
    with pytest.raises(ValueError, match=rf"drafter 'fixed-tree' proposed token ids outside the target's vocabulary "
                                         rf"\[0, {vocab}\): \[{vocab}\]"):
        run_tree([1, vocab], [-1, 0])
    # Near max_new_tokens the room shrinks below the tree's depth: refused rather than scored past the end.
    with pytest.raises(ValueError, match=r"proposed 2 nodes of depth up to 2; asked for at most [04] nodes and "
                                         r"depth [01]$"):
        run_tree([1, 2], [-1, 0])
    # The same tree from a drafter that keeps within what it is asked decodes greedily.
    result = run_tree([1, 2], [-1, 0], honest=True)
    assert result.token_ids == hf_greedy(target, PROMPTS[0], 12, eos=False) and result.stats.proposed > 0


def test_engine_refuses_a_drafter_without_trees(target):
    with pytest.raises(ValueError, match="cannot propose trees"):
        SpeculativeEngine(HFRunner(target), RandomDrafter(target.config.vocab_size), SpecConfig(tree_nodes=4))
    SpeculativeEngine(HFRunner(target), NoDrafter(), SpecConfig(tree_nodes=4))  # proposes empty trees


# ----------------------------------------------------------------------------- drafters' trees

def check_shape(tree: TreeProposal, nodes: int, depth: int, branching: int) -> None:
    parents = tree.parents.tolist()
    tokens = tree.tokens.tolist()
    assert len(tokens) <= nodes and tree.depth <= depth
    assert all(-1 <= p < i for i, p in enumerate(parents))
    for parent in set(parents):
        siblings = [t for t, p in zip(tokens, parents) if p == parent]
        assert len(siblings) <= branching and len(set(siblings)) == len(siblings)


def test_ngram_tree_shape():
    context = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2, 3, 7, 9, 1, 2]
    drafter = NgramDrafter(1, 3)
    tree = drafter.propose_tree(context, 8, 3, 2)
    check_shape(tree, 8, 3, 2)
    assert tree.probs is None
    # The chain proposal is the first path; the other continuations of "1 2" branch off it.
    chain = drafter.propose(context, 3).tokens.tolist()
    assert tree.tokens[:3].tolist() == chain == [3, 7, 9] and tree.parents[:3].tolist() == [-1, 0, 1]
    root_children = [t for t, p in zip(tree.tokens.tolist(), tree.parents.tolist()) if p == -1]
    assert root_children == [3, 5]  # branching 2 keeps the two most recent distinct continuations
    assert tree.tokens.tolist() == [3, 7, 9, 5, 6, 1, 4, 1] and tree.parents.tolist() == [-1, 0, 1, -1, 3, 4, 0, 6]
    # (nodes, depth, branching) -> (tokens, parents): "1 2" continues with 3 (most recently) or 5, and the
    # most recent continuation runs 3 7 9 1 2 to the end of the context.
    expected = {(1, 4, 3): ([3], [-1]),
                (3, 1, 3): ([3, 5], [-1, -1]),  # only two distinct next tokens: fewer nodes than allowed
                (20, 5, 1): ([3, 7, 9, 1, 2], [-1, 0, 1, 2, 3]),  # one branch: the chain, cut by the context
                (5, 5, 5): ([3, 7, 9, 1, 2], [-1, 0, 1, 2, 3])}  # the budget goes to the first path first
    for (nodes, depth, branching), (tokens, parents) in expected.items():
        tree = drafter.propose_tree(context, nodes, depth, branching)
        check_shape(tree, nodes, depth, branching)
        assert (tree.tokens.tolist(), tree.parents.tolist()) == (tokens, parents), (nodes, depth, branching)
    assert len(drafter.propose_tree([1, 2, 3], 8, 3, 2)) == 0  # nothing earlier to follow


NGRAM_TREES = [(8, 3, 2, None), (1, 4, 3, None), (20, 5, 1, None), (16, 4, 4, None), (40, 6, 3, None),
               (5, 2, 2, (2, 1)), (15, 3, 3, (3, 2, 1)), (4, 4, 3, (1, 1, 1, 1)), (0, 3, 2, None)]


def ngram_contexts(seed: int, steps: int = 120):
    """Contexts as a generation's steps see them (a few tokens more each time), now and then rolled
    back or replaced: random tokens over a small vocabulary, or a repeating pattern with a few changes,
    or long runs of one token (where more than 8 x nodes continuations are the same)."""
    generator = torch.Generator().manual_seed(seed)
    kind = seed % 3
    vocab = (3, 5, 9)[seed % 3]
    pattern = torch.randint(vocab, (int(torch.randint(2, 7, (1,), generator=generator)),), generator=generator)
    context: list[int] = []
    for step in range(steps):
        if step % 41 == 40:
            context = context[:len(context) // 3] + [vocab]  # another generation: shares a prefix only
        elif step % 13 == 12:
            context = context[:max(1, len(context) - 5)]  # rolled back
        grow = int(torch.randint(1, 4, (1,), generator=generator))
        for _ in range(grow):
            if kind == 0 or torch.rand(1, generator=generator) < 0.05:
                context.append(int(torch.randint(vocab, (1,), generator=generator)))
            elif kind == 1:
                context.append(int(pattern[len(context) % len(pattern)]))
            else:
                context.append(context[-1] if context and torch.rand(1, generator=generator) < 0.9 else 1)
        yield context


def reference_ngram_tree(context, nodes, depth, branching, shape, lo, hi, newest_first=True, walked=8):
    """The n-gram tree by its definition, by brute force: what followed every earlier occurrence of each
    suffix of lo..hi tokens (longest suffix first, then most recent; oldest first with newest_first off),
    the first `walked` x nodes of those walked in order and merged where they agree, a node taking at
    most shape[level] (else branching) distinct children and the tree at most `nodes` nodes."""
    if nodes <= 0 or depth <= 0 or branching <= 0:
        return [], []
    limits = list(shape) if shape is not None else [branching] * depth
    size = len(context)
    continuations = []
    for n in range(min(hi, size - 1), lo - 1, -1):
        starts = [s for s in range(size - n) if context[s:s + n] == context[size - n:]]
        for start in (reversed(starts) if newest_first else starts):
            continuations.append(context[start + n:start + n + depth])
    tokens, parents = [], []
    for continuation in continuations[:walked * nodes]:
        node = -1
        for level, token in enumerate(continuation[:len(limits)]):
            siblings = [i for i, p in enumerate(parents) if p == node]
            same = [i for i in siblings if tokens[i] == token]
            if same:
                node = same[0]
                continue
            if len(tokens) >= nodes or len(siblings) >= limits[level]:
                break
            tokens.append(token)
            parents.append(node)
            node = len(tokens) - 1
    return tokens, parents


def test_ngram_tree_equals_a_brute_force_reference():
    # Contexts grow, roll back and change under one drafter, so its index is updated every way it can be.
    oldest_first_differs = uncapped_differs = 0
    for seed, (lo, hi) in itertools.product(range(6), ((1, 3), (1, 4), (2, 2), (3, 5))):
        drafter = NgramDrafter(lo, hi)
        for step, context in enumerate(ngram_contexts(seed)):
            nodes, depth, branching, shape = NGRAM_TREES[step % len(NGRAM_TREES)]
            tree = drafter.propose_tree(context, nodes, depth, branching, shape=shape)
            got = (tree.tokens.tolist(), tree.parents.tolist())
            assert got == reference_ngram_tree(context, nodes, depth, branching, shape, lo, hi), (seed, lo, hi, step)
            assert tree.probs is None
            chain = drafter.propose(context, min(nodes, depth if shape is None else len(shape))).tokens.tolist()
            assert got[0][:len(chain)] == chain and got[1][:len(chain)] == list(range(-1, len(chain) - 1))
            # Negative controls: the contexts tell the ranking and the cap on walked continuations apart.
            args = (context, nodes, depth, branching, shape, lo, hi)
            oldest_first_differs += got != reference_ngram_tree(*args, newest_first=False)
            uncapped_differs += got != reference_ngram_tree(*args, walked=10 ** 6)
    assert oldest_first_differs > 100 and uncapped_differs > 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_model_tree_shape_probs_and_cache(target, other, temperature):
    sampling = SamplingParams(temperature=temperature, top_k=6, max_new_tokens=10)
    runner = HFRunner(other)
    drafter = DraftModelDrafter(runner, target.config.vocab_size)
    drafter.start(CONTEXT, sampling, torch.Generator().manual_seed(0))
    tree = drafter.propose_tree(CONTEXT, 12, 4, 3)
    check_shape(tree, 12, 4, 3)
    assert len(tree) == 12 and max(tree.depths()) == 4
    assert runner.length == len(CONTEXT)  # the tree nodes were rolled back
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    if temperature == 0:
        assert tree.probs is None
    else:
        assert tree.probs.shape == (12, target.config.vocab_size)
        for node in range(len(tokens)):  # row = the processed distribution at the node's parent
            ids = CONTEXT + [tokens[i] for i in path_to(parents[node], tokens, parents)]
            with torch.no_grad():
                logits = other(torch.tensor([ids])).logits[0, -1:]
            torch.testing.assert_close(tree.probs[node], logits_to_probs(logits, sampling)[0],
                                       rtol=1e-4, atol=1e-5)
            assert tree.probs[node, tokens[node]] > 0
    # The lazy prefix sync still works: a chain proposal afterwards equals a fresh drafter's.
    fresh = DraftModelDrafter(HFRunner(other), target.config.vocab_size)
    greedy = SamplingParams(max_new_tokens=10)
    drafter.start(CONTEXT, greedy, torch.Generator())
    fresh.start(CONTEXT, greedy, torch.Generator())
    longer = CONTEXT + [tokens[0], 17]
    assert drafter.propose(longer, 4).tokens.tolist() == fresh.propose(longer, 4).tokens.tolist()


def test_greedy_draft_tree_children_are_the_top_tokens(other):
    drafter = DraftModelDrafter(HFRunner(other), other.config.vocab_size)
    drafter.start(CONTEXT, SamplingParams(), torch.Generator())
    tree = drafter.propose_tree(CONTEXT, 3, 1, 3)
    with torch.no_grad():
        logits = other(torch.tensor([CONTEXT])).logits[0, -1]
    assert tree.tokens.tolist() == torch.topk(logits, 3).indices.tolist()


# ----------------------------------------------------------------------------- fixed tree shapes

def children_by_level(tree: TreeProposal) -> list[list[int]]:
    """For each level, the number of children of each node of the level above (the context first)."""
    parents, depths = tree.parents.tolist(), tree.depths()
    levels: list[list[int]] = []
    above = [-1]
    for level in range(max(depths, default=0)):
        levels.append([parents.count(p) for p in above])
        above = [i for i, d in enumerate(depths) if d == level + 1]
    return levels


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_model_fixed_shape_gives_every_node_its_children(target, other, temperature):
    sampling = SamplingParams(temperature=temperature, max_new_tokens=10)
    drafter = DraftModelDrafter(HFRunner(other), target.config.vocab_size)
    drafter.start(CONTEXT, sampling, torch.Generator().manual_seed(0))
    shape = (3, 2, 1)
    tree = drafter.propose_tree(CONTEXT, tree_shape_nodes(shape), 3, 3, shape=shape)
    assert children_by_level(tree) == [[3], [2, 2, 2], [1] * 6] and len(tree) == 15
    for node, token in enumerate(tree.tokens.tolist()):  # siblings are distinct tokens
        siblings = [t for t, p in zip(tree.tokens.tolist(), tree.parents.tolist()) if p == tree.parents[node]]
        assert siblings.count(token) == 1
    if temperature:
        assert tree.probs.shape == (15, target.config.vocab_size)
    # A dynamic tree with the same budget gives its nodes to the likeliest paths instead.
    dynamic = drafter.propose_tree(CONTEXT, 15, 3, 3)
    assert len(dynamic) == 15 and children_by_level(dynamic) != children_by_level(tree)
    # Where the drafter may offer fewer tokens (top_k = 2), a node gets only those.
    narrow = SamplingParams(temperature=1.0, top_k=2, max_new_tokens=10)
    drafter.start(CONTEXT, narrow, torch.Generator().manual_seed(0))
    assert children_by_level(drafter.propose_tree(CONTEXT, 15, 3, 3, shape=shape)) == [[2], [2, 2], [1] * 4]


def test_ngram_fixed_shape_caps_children_level_by_level():
    context = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2, 3, 7, 9, 1, 2]
    drafter = NgramDrafter(1, 3)
    tree = drafter.propose_tree(context, 5, 2, 2, shape=(2, 1))
    # After "1 2": 3 7 (latest), 5 6, then 3 4, whose 4 finds node 3's one child slot taken.
    assert tree.tokens.tolist() == [3, 7, 5, 6] and tree.parents.tolist() == [-1, 0, -1, 2]
    assert children_by_level(drafter.propose_tree(context, 5, 2, 2)) == [[2], [2, 1]]  # dynamic: 4 joins 7


@pytest.mark.parametrize("runner", ["hf", "lean"])
def test_fixed_shape_trees_are_greedy_identical(target, other, runner):
    for prompt in PROMPTS:
        expected = hf_greedy(target, prompt, 40)
        drafter = DraftModelDrafter(RUNNERS[runner](other), target.config.vocab_size)
        result = run(target, drafter, prompt, runner, tree_nodes=0, tree_shape=(3, 2, 1, 1))
        assert result.token_ids == expected
        assert result.stats.tree_steps == result.stats.steps and result.stats.proposed > 0
    # Near max_new_tokens the shape is cut to the room left: 7 new tokens, depth 4 shape.
    prompt = PROMPTS[0]
    drafter = DraftModelDrafter(RUNNERS[runner](target), target.config.vocab_size)
    short = run(target, drafter, prompt, runner, max_new=7, tree_nodes=0, tree_shape=(2, 2, 2, 2))
    assert short.token_ids == hf_greedy(target, prompt, 7)


def test_fixed_shape_configuration():
    spec = SpecConfig(tree_shape=[3, 2, 1])
    assert spec.tree and spec.tree_shape == (3, 2, 1)
    assert (spec.tree_nodes, spec.tree_depth, spec.tree_branching) == (15, 3, 3)
    replaced = dataclasses.replace(spec, k=3)  # replace passes the derived fields back in: still consistent
    assert replaced.k == 3 and replaced.tree_shape == (3, 2, 1)
    assert (replaced.tree_nodes, replaced.tree_depth, replaced.tree_branching) == (15, 3, 3)
    assert parse_tree_shape("3x2x1") == parse_tree_shape(" 3, 2,1 ") == (3, 2, 1) and parse_tree_shape("") == ()
    for kwargs, field, words in [
        ({"tree_shape": (0, 2)}, "tree_shape", "integers in [1, 64]"),
        ({"tree_shape": (8, 8, 8)}, "tree_shape", "at most 256 nodes (this one has 584)"),
        ({"tree_shape": (2, 2), "tree_nodes": 8}, "tree_nodes", "contradicts tree_shape=[2, 2] (6 nodes)"),
        ({"tree_shape": (2, 2), "adaptive": True}, "adaptive", "does not cover trees"),
    ]:
        with pytest.raises(ConfigError) as error:
            SpecConfig(**kwargs)
        assert error.value.field == field and words in str(error.value), str(error.value)
    with pytest.raises(ConfigError, match="such as 3,2,1"):
        parse_tree_shape("3,two")


# ----------------------------------------------------------------------------- sampling without replacement

def test_sample_without_replacement_follows_the_sequential_law():
    probs = torch.tensor([0.05, 0.4, 0.0, 0.25, 0.3])
    m, draws = 3, 20000
    generator = torch.Generator().manual_seed(1)
    counts: dict[tuple, int] = {}
    for _ in range(draws):
        sample = tuple(sample_without_replacement(probs, m, generator).tolist())
        counts[sample] = counts.get(sample, 0) + 1
    exact_law = {}
    support = [i for i in range(5) if probs[i] > 0]
    for order in itertools.permutations(support, m):
        p, left = 1.0, 1.0
        for token in order:
            p *= float(probs[token]) / left
            left -= float(probs[token])
        exact_law[order] = p
    assert set(counts) <= set(exact_law)
    observed = [counts.get(order, 0) for order in exact_law]
    total = sum(exact_law.values())  # 1 up to rounding, which chisquare would refuse
    expected = [p / total * draws for p in exact_law.values()]
    assert chisquare(observed, expected).pvalue > 1e-3
    # With replacement or a fixed order would be far off: e.g. the top-3 in order of probability.
    assert counts.get((1, 4, 3), 0) < 0.2 * draws


def test_sample_without_replacement_stays_in_the_support():
    probs = torch.tensor([0.0, 0.7, 0.0, 0.3])
    for seed in range(20):
        sample = sample_without_replacement(probs, 3, torch.Generator().manual_seed(seed)).tolist()
        assert sorted(sample) == [1, 3]
    assert sample_without_replacement(probs, 0).numel() == 0
    assert sample_without_replacement(torch.zeros(4), 2).numel() == 0


# ----------------------------------------------------------------------------- configuration, metrics, CLI

@pytest.mark.parametrize("kwargs, field, words", [
    ({"tree_nodes": -1}, "tree_nodes", "tree_nodes must be an integer in [0, 256]"),
    ({"tree_nodes": 1000}, "tree_nodes", "[0, 256]"),
    ({"tree_depth": 0}, "tree_depth", "tree_depth must be an integer in [1, 64]"),
    ({"tree_branching": 0}, "tree_branching", "tree_branching must be an integer in [1, 64]"),
    ({"tree_nodes": 8, "adaptive": True}, "adaptive", "does not cover trees"),
    ({"tree_nodes": 8, "verifier": "block"}, "verifier", "no tree form"),
])
def test_tree_config_errors(kwargs, field, words):
    with pytest.raises(ConfigError) as error:
        SpecConfig(**kwargs)
    assert error.value.field == field and words in str(error.value)


def test_tree_verifier_resolution():
    tree = SpecConfig(tree_nodes=8)
    assert tree.tree and not SpecConfig().tree
    assert tree.resolve_verifier(SamplingParams(temperature=1)) == "coupled"
    assert SpecConfig(tree_nodes=8, verifier="token").resolve_verifier(SamplingParams(temperature=1)) == "token"
    assert tree.resolve_verifier(SamplingParams()) == "greedy"


def test_metrics_count_nodes_and_depths():
    stats = SpecStats()
    stats.record_step(10, 3, depth=4)
    stats.record_step(6, 0, depth=2)
    stats.record_step(3, 2)  # a chain
    assert stats.proposed == 19 and stats.accepted == 5 and stats.tree_steps == 2
    assert stats.proposed_at == [3, 3, 2, 1] and stats.accepted_at == [2, 2, 1, 0]
    assert stats.acceptance_length == (5 + 3) / 3
    assert stats.to_dict()["tree_steps"] == 2 and stats.merge(stats).tree_steps == 4


def test_cli_and_bench_tree_settings():
    parser = argparse.ArgumentParser()
    add_model_options(parser)
    add_sampling_options(parser)
    spec = spec_from_args(parser.parse_args(["--tree-nodes", "16", "--tree-depth", "5", "--tree-branching", "2"]))
    assert (spec.tree_nodes, spec.tree_depth, spec.tree_branching) == (16, 5, 2)
    assert spec_from_args(parser.parse_args([])).tree_nodes == 0
    spec, _, _ = parse_specwise_method("specwise:drafter=draft-model,tree_nodes=16,tree_depth=4,tree-branching=3",
                                       SpecConfig())
    assert (spec.tree_nodes, spec.tree_depth, spec.tree_branching) == (16, 4, 3)
    assert spec_label(spec) == "specwise-draft-model-tree16d4b3"
    with pytest.raises(ValueError, match="tree_nodes must be an integer"):
        parse_specwise_method("specwise:tree_nodes=many", SpecConfig())
    spec = spec_from_args(parser.parse_args(["--tree-shape", "4,2,1"]))
    assert (spec.tree_shape, spec.tree_nodes, spec.tree_depth) == ((4, 2, 1), 20, 3)
    spec, _, _ = parse_specwise_method("specwise:drafter=draft-model,tree_shape=4x2x1", SpecConfig())
    assert spec.tree_shape == (4, 2, 1) and spec_label(spec) == "specwise-draft-model-tree4x2x1"


# ----------------------------------------------------------------------------- distribution (slow)

TREE_SPEC = SpecConfig(tree_nodes=6, tree_depth=LENGTH - 1, tree_branching=3)


@pytest.fixture(scope="module")
def near(target):
    """The target with noise on its output layer: a drafter accepted at depth 1 and 2 about
    half the time and often rejected at a first child (the model of seed 1 never reaches depth 2)."""
    model = copy.deepcopy(target)
    with torch.no_grad():
        weight = model.lm_head.weight
        weight.add_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(3)) * weight.std())
    return model


def draw_trees(target, drafter_model, spec=TREE_SPEC):
    drafter = DraftModelDrafter(HFRunner(drafter_model), target.config.vocab_size)
    engine = SpeculativeEngine(HFRunner(target), drafter, spec)
    counts: dict[tuple, int] = {}
    stats = SpecStats()
    for seed in range(SAMPLES):
        result = engine.generate(PROMPT, SamplingParams(**{**SAMPLING.__dict__, "seed": seed}))
        counts[tuple(result.token_ids)] = counts.get(tuple(result.token_ids), 0) + 1
        stats = stats.merge(result.stats)
    return counts, stats


@pytest.mark.slow
@pytest.mark.parametrize("spec", [TREE_SPEC, SpecConfig(tree_shape=(2,) * (LENGTH - 1))],
                         ids=["dynamic", "fixed-shape"])
def test_sampled_draft_model_trees_keep_the_target_distribution(target, near, exact, spec):
    counts, stats = draw_trees(target, near, spec)
    assert stats.tree_steps == stats.steps and all(a > 0.2 * p for a, p in zip(stats.accepted_at, stats.proposed_at))
    assert stats.proposed > stats.steps * (LENGTH - 1)  # real trees: more nodes than a chain
    p = p_value(counts, exact)
    assert p > ALPHA, f"chi-square p = {p:.2e}"


def top_children(probs, m, generator=None, position=None):
    """Deterministic top-m children passed off as samples: the contract broken on purpose."""
    return torch.topk(probs, min(m, int((probs > 0).sum()))).indices


@pytest.mark.slow
def test_deterministic_top_children_as_samples_fail_the_same_check(target, near, exact, monkeypatch):
    monkeypatch.setattr(tree_growth_module, "sample_without_replacement", top_children)
    # Recursive rejection sampling needs samples; coupled verification (the default's) is exact for any tree.
    counts, _ = draw_trees(target, near, dataclasses.replace(TREE_SPEC, verifier="token"))
    assert p_value(counts, exact) < ALPHA
