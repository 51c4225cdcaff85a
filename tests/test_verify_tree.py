"""Tree verification: losslessness by exact enumeration, the sampler against its plan, greedy
semantics, edge cases and input validation.

Exact enumeration: toy target and drafter models give a different distribution for every
prefix. From a context, the drafter builds a tree of a given shape, each node's children
being an ordered sample WITHOUT replacement from the drafter's distribution at that node
(or, for deterministic drafters, its most likely tokens as point masses). Every possible
tree, every accepted path and every recovered or bonus token is enumerated, with the
probabilities taken from `tree_verification_plan`, which runs the arithmetic of `verify_tree`
(the function the engine calls for sampled trees). The committed tokens are then continued
by the target itself to a fixed length, and that distribution must equal the target's own
to 1e-9. Deterministic top-k children passed off
as samples, and children drawn with replacement, fail the same check, so it can fail.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterator
from functools import lru_cache

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specwise.verify import (
    TREE_VERIFIERS,
    TreeVerificationPlan,
    TreeVerifyResult,
    VerifyResult,
    get_tree_verifier,
    token_verification_plan,
    tree_verification_plan,
    verify_tree,
    verify_tree_coupled,
    verify_tree_greedy,
)

TOLERANCE = 1e-9


class ToyModel:
    """A context-dependent distribution: a Dirichlet draw seeded by the whole prefix.

    zero_frac: chance that an entry is forced to zero (one entry always stays positive).
    mix_with / mix_weight: mix with another model, for a drafter close to the target.
    """

    def __init__(self, vocab: int, seed: int, alpha: float = 1.0, zero_frac: float = 0.0,
                 mix_with: ToyModel | None = None, mix_weight: float = 1.0) -> None:
        self.vocab, self.seed, self.alpha, self.zero_frac = vocab, seed, alpha, zero_frac
        self.mix_with, self.mix_weight = mix_with, mix_weight
        self.dist = lru_cache(maxsize=None)(self._dist)

    def _dist(self, prefix: tuple[int, ...]) -> tuple[float, ...]:
        rng = np.random.default_rng([self.seed, len(prefix), *prefix])
        p = rng.dirichlet([self.alpha] * self.vocab)
        if self.zero_frac:
            zero = rng.random(self.vocab) < self.zero_frac
            zero[rng.integers(self.vocab)] = False
            p = np.where(zero, 0.0, p)
            p /= p.sum()
        if self.mix_with is not None:
            p = self.mix_weight * p + (1 - self.mix_weight) * np.asarray(self.mix_with.dist(prefix))
        return tuple(float(v) for v in p)


def _pairs() -> dict[str, tuple[ToyModel, ToyModel]]:
    t3 = ToyModel(3, seed=11)
    t4 = ToyModel(4, seed=15, alpha=0.5)
    return {
        "V3-independent": (t3, ToyModel(3, seed=12)),
        "V3-zeros-both": (ToyModel(3, seed=13, zero_frac=0.3), ToyModel(3, seed=14, zero_frac=0.3)),
        "V3-drafter-equals-target": (t3, t3),
        "V4-close-drafter-with-zeros": (t4, ToyModel(4, seed=16, zero_frac=0.4, mix_with=t4, mix_weight=0.4)),
        "V5-peaked": (ToyModel(5, seed=17, alpha=0.3), ToyModel(5, seed=18, alpha=0.3)),
    }


PAIRS = _pairs()

# A shape is the tuple of its children's shapes; () is a leaf.
LEAF: tuple = ()
SHAPES: dict[str, tuple] = {
    "1": (LEAF,),
    "3": (LEAF, LEAF, LEAF),  # multi-draft at one position
    "chain-3": (((LEAF,),),),
    "2-1": ((LEAF,), (LEAF,)),
    "2x2": ((LEAF, LEAF), (LEAF, LEAF)),
    "3-1": ((LEAF,), (LEAF,), (LEAF,)),
    "2-1-1": (((LEAF,),), ((LEAF,),)),
    "irregular": ((LEAF, LEAF, LEAF), (LEAF,)),  # 3 children under the first, 1 under the second
}
CONTEXTS = [(), (2, 0)]  # the tree itself already spans many prefixes

# (pair, shape, node order). BFS and DFS orders both keep parents before children and
# siblings in drawn order; the verifier must not care which.
CASES = [
    ("V3-independent", "3", "dfs"), ("V3-independent", "chain-3", "dfs"),
    ("V3-independent", "2x2", "dfs"), ("V3-independent", "2x2", "bfs"),
    ("V3-independent", "3-1", "bfs"), ("V3-independent", "2-1-1", "dfs"),
    ("V3-independent", "irregular", "dfs"),
    ("V3-zeros-both", "2x2", "dfs"), ("V3-zeros-both", "3-1", "dfs"), ("V3-zeros-both", "2-1-1", "bfs"),
    ("V3-drafter-equals-target", "2x2", "dfs"), ("V3-drafter-equals-target", "irregular", "bfs"),
    ("V4-close-drafter-with-zeros", "3", "dfs"), ("V4-close-drafter-with-zeros", "2-1", "bfs"),
    ("V5-peaked", "3", "dfs"), ("V5-peaked", "2-1", "dfs"),
]


def _depth(shape: tuple) -> int:
    return 1 + max((_depth(s) for s in shape), default=-1) if shape else 0


# --- building trees ---------------------------------------------------------------------

Draw = tuple  # ((token, child draw), ...) for one node's children, in drawn order


def _ordered_samples(dist: tuple[float, ...], m: int, replace: bool) -> Iterator[tuple[tuple[int, ...], float]]:
    """(tokens, probability) for every ordered sample of up to m tokens, with or without
    replacement. Without replacement the drafter stops early when nothing with positive
    probability is left (a drafter with zeros)."""
    def rec(used: tuple[int, ...], p: float):
        left = 1.0 if replace else sum(q for y, q in enumerate(dist) if y not in used)
        if len(used) == m or left <= 0.0:
            yield used, p
            return
        for y, q in enumerate(dist):
            if (replace or y not in used) and q > 0.0:
                yield from rec(used + (y,), p * q / left)
    yield from rec((), 1.0)


def sampled_trees(drafter: ToyModel, prefix: tuple[int, ...], shape: tuple,
                  replace: bool = False) -> Iterator[tuple[Draw, float]]:
    """Every tree the drafter can sample from `prefix`, with its probability."""
    for tokens, p in _ordered_samples(drafter.dist(prefix), len(shape), replace):
        subtrees = [list(sampled_trees(drafter, prefix + (x,), shape[j], replace)) for j, x in enumerate(tokens)]
        for combo in itertools.product(*subtrees):
            yield tuple((x, sub) for x, (sub, _) in zip(tokens, combo)), p * math.prod(q for _, q in combo)


def top_k_tree(drafter: ToyModel, prefix: tuple[int, ...], shape: tuple) -> Draw:
    """The deterministic tree: each node's children are the drafter's most likely tokens."""
    order = np.argsort(-np.asarray(drafter.dist(prefix)), kind="stable")
    return tuple((int(x), top_k_tree(drafter, prefix + (int(x),), shape[j])) for j, x in enumerate(order[:len(shape)]))


def flatten(draw: Draw, order: str) -> tuple[list[int], list[int], list[tuple[int, ...]]]:
    """tokens, parents and each node's path (its tokens from the root), in pre-order DFS
    (siblings separated by their subtrees) or BFS (siblings adjacent)."""
    tokens: list[int] = []
    parents: list[int] = []
    paths: list[tuple[int, ...]] = []

    def add(x: int, parent: int, path: tuple[int, ...]) -> int:
        tokens.append(x)
        parents.append(parent)
        paths.append(path)
        return len(tokens) - 1

    def dfs(children: Draw, parent: int, path: tuple[int, ...]) -> None:
        for x, sub in children:
            dfs(sub, add(x, parent, path + (x,)), path + (x,))

    if order == "dfs":
        dfs(draw, -1, ())
    else:
        level = [(draw, -1, ())]
        while level:
            level = [(sub, add(x, parent, path + (x,)), path + (x,))
                     for children, parent, path in level for x, sub in children]
    return tokens, parents, paths


def tree_inputs(target: ToyModel, drafter: ToyModel | None, context: tuple[int, ...], draw: Draw, order: str):
    """verify_tree's arguments for a drawn tree (drafter None: point masses)."""
    tokens, parents, paths = flatten(draw, order)
    rows = [()] + paths
    target_probs = torch.tensor([target.dist(context + r) for r in rows], dtype=torch.float64)  # [n + 1, V]
    draft_probs = None if drafter is None else torch.tensor(
        [drafter.dist(context + p[:-1]) for p in paths], dtype=torch.float64).reshape(len(paths), -1)  # [n, V]
    return torch.tensor(tokens, dtype=torch.long), parents, draft_probs, target_probs, paths


# --- exact enumeration ----------------------------------------------------------------


def step_distribution(target: ToyModel, trees, context: tuple[int, ...], order: str,
                      drafter_for_probs: ToyModel | None) -> tuple[dict[tuple[int, ...], float], float]:
    """P(one step commits s) for every token sequence s, and E[tokens per step].

    trees: (draw, probability) pairs; drafter_for_probs: the model whose rows are passed as
    draft_probs (None: point masses)."""
    committed: dict[tuple[int, ...], float] = defaultdict(float)
    expected = 0.0
    for draw, p_tree in trees:
        tokens, parents, draft_probs, target_probs, paths = tree_inputs(target, drafter_for_probs, context, draw, order)
        plan = tree_verification_plan(tokens, parents, draft_probs, target_probs)
        _assert_proper(plan)
        expected += p_tree * plan.expected_tokens
        dists = plan.next_token_dists.tolist()
        for row, p_end in enumerate(plan.path_end_probs.tolist()):
            if p_end == 0.0:
                continue
            path = paths[row - 1] if row else ()
            for y, p_y in enumerate(dists[row]):
                if p_y:
                    committed[path + (y,)] += p_tree * p_end * p_y
    return committed, expected


def _assert_proper(plan: TreeVerificationPlan) -> None:
    assert abs(plan.path_end_probs.sum().item() - 1.0) <= 1e-12
    assert (plan.path_end_probs >= 0).all() and (plan.next_token_weights >= 0).all()


def continued(target: ToyModel, context: tuple[int, ...], committed: dict, length: int) -> dict:
    """The distribution of the first `length` tokens when the target continues each step."""
    out: dict[tuple[int, ...], float] = defaultdict(float)
    for seq, p in committed.items():
        assert len(seq) <= length
        for rest in itertools.product(range(target.vocab), repeat=length - len(seq)):
            q = p
            for i, y in enumerate(rest):
                q *= target.dist(context + seq + rest[:i])[y]
            out[seq + rest] += q
    return out


def target_distribution(target: ToyModel, context: tuple[int, ...], length: int) -> dict:
    return continued(target, context, {(): 1.0}, length)


def max_error(got: dict, want: dict) -> float:
    assert set(got) <= set(want), "committed a sequence outside the vocabulary"
    return max(abs(got.get(seq, 0.0) - p) for seq, p in want.items())


def enumeration_error(name: str, shape_name: str, order: str, mode: str) -> tuple[float, float]:
    """Max abs error over the contexts, and E[tokens per step] at the empty context.

    mode: "sampled" (without replacement, dense draft_probs), "point-mass" (top-k, None);
    broken contracts: "top-k-as-samples" (top-k children with the drafter's rows) and
    "with-replacement" (i.i.d. children, which the rule does not allow for)."""
    target, drafter = PAIRS[name]
    shape = SHAPES[shape_name]
    length = _depth(shape) + 1  # the longest possible step
    worst, expected_at_root = 0.0, 0.0
    for context in CONTEXTS:
        if mode in ("sampled", "with-replacement"):
            trees, probs_from = sampled_trees(drafter, context, shape, replace=mode == "with-replacement"), drafter
        else:
            trees = [(top_k_tree(drafter, context, shape), 1.0)]
            probs_from = drafter if mode == "top-k-as-samples" else None
        committed, expected = step_distribution(target, trees, context, order, probs_from)
        assert abs(sum(committed.values()) - 1.0) <= TOLERANCE
        got = continued(target, context, committed, length)
        worst = max(worst, max_error(got, target_distribution(target, context, length)))
        if context == ():
            expected_at_root = expected
    return worst, expected_at_root


@pytest.mark.parametrize("mode", ["sampled", "point-mass"])
@pytest.mark.parametrize("name,shape,order", CASES)
def test_committed_tokens_follow_target_exactly(name, shape, order, mode):
    err, expected = enumeration_error(name, shape, order, mode)
    print(f"\n{name} {shape} {order} {mode}: max abs error {err:.1e}, E[tokens/step] {expected:.4f}")
    assert err <= TOLERANCE, f"{mode} tree {shape} on {name}: max abs error {err:.3e}"


@pytest.mark.parametrize("name,shape,mode", [
    ("V3-independent", "2x2", "top-k-as-samples"), ("V3-independent", "3", "top-k-as-samples"),
    ("V4-close-drafter-with-zeros", "2-1", "top-k-as-samples"),
    ("V3-independent", "3", "with-replacement"), ("V4-close-drafter-with-zeros", "2-1", "with-replacement"),
    ("V5-peaked", "3", "with-replacement"),
])
def test_broken_contracts_fail_the_same_check(name, shape, mode):
    err, _ = enumeration_error(name, shape, "dfs", mode)
    print(f"\n{name} {shape} {mode}: max abs error {err:.3e}")
    assert err > 1e-3, f"{mode} on {name} {shape}: error only {err:.3e}; the check has no power"


def test_sampling_without_replacement_gains_over_one_candidate():
    """A wider tree must commit more tokens per step than its first branch alone."""
    _, one = enumeration_error("V3-independent", "1", "dfs", "sampled")
    _, three = enumeration_error("V3-independent", "3", "dfs", "sampled")
    assert three > one + 0.05, (one, three)


# --- chains and one-hot targets: agreement with the other rules --------------------------


def _random_tree(n: int, vocab: int, seed: int, distinct_siblings: bool = True):
    g = torch.Generator().manual_seed(seed)
    parents: list[int] = []
    tokens: list[int] = []
    for i in range(n):
        parent = int(torch.randint(-1, i, (), generator=g))
        taken = {tokens[j] for j in range(i) if parents[j] == parent} if distinct_siblings else set()
        free = [x for x in range(vocab) if x not in taken]
        parents.append(parent)
        tokens.append(free[int(torch.randint(len(free), (), generator=g))])
    logits = 2 * torch.randn(2 * n + 1, vocab, generator=g, dtype=torch.float64)
    target = torch.softmax(logits[: n + 1], -1)  # [n + 1, V]
    draft = torch.softmax(logits[n + 1:], -1)  # [n, V]
    return torch.tensor(tokens, dtype=torch.long), parents, draft, target


@pytest.mark.parametrize("dense", [True, False], ids=["dense-drafts", "point-masses"])
def test_a_chain_is_token_level_verification(dense):
    g = torch.Generator().manual_seed(1)
    k, vocab = 4, 7
    target = torch.softmax(torch.randn(k + 1, vocab, generator=g, dtype=torch.float64), -1)
    draft = torch.softmax(torch.randn(k, vocab, generator=g, dtype=torch.float64), -1) if dense else None
    tokens = torch.tensor([3, 0, 6, 2])
    tree = tree_verification_plan(tokens, [-1, 0, 1, 2], draft, target)
    chain = token_verification_plan(tokens, draft, target)
    torch.testing.assert_close(tree.accept_probs, chain.position_probs, atol=1e-12, rtol=0)
    torch.testing.assert_close(tree.path_end_probs, chain.num_accepted_probs, atol=1e-12, rtol=0)
    torch.testing.assert_close(tree.next_token_dists, chain.next_token_dists, atol=1e-12, rtol=0)
    assert tree.expected_tokens == pytest.approx(chain.expected_tokens, abs=1e-12)


def test_siblings_by_hand():
    # Root t = (0.5, 0.3, 0.2), drafter d = (0.2, 0.5, 0.3); children 1 then 2.
    # c_1 = 1: accept 0.3 / 0.5 = 0.6; residual max(t - d, 0) = (0.3, 0, 0) -> (1, 0, 0).
    # c_2 = 2: d_2 = (0.2, 0, 0.3) / 0.5 = (0.4, 0, 0.6); accept 0 / 0.6 = 0;
    # residual max((1, 0, 0) - d_2, 0) = (0.6, 0, 0): the recovered token is 0.
    target = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.2, 0.7, 0.1]], dtype=torch.float64)
    draft = torch.tensor([[0.2, 0.5, 0.3]] * 2, dtype=torch.float64)
    plan = tree_verification_plan(torch.tensor([1, 2]), [-1, -1], draft, target)
    torch.testing.assert_close(plan.accept_probs, torch.tensor([0.6, 0.0], dtype=torch.float64))
    torch.testing.assert_close(plan.path_end_probs, torch.tensor([0.4, 0.6, 0.0], dtype=torch.float64))
    torch.testing.assert_close(plan.next_token_dists[0], torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(plan.next_token_dists[1:], target[1:])  # leaves: the bonus rows
    # Removing earlier siblings is the verifier's job: a row that already excludes token 1
    # gives the same d_2, hence the same plan.
    excluded = torch.tensor([[0.2, 0.5, 0.3], [0.4, 0.0, 0.6]], dtype=torch.float64)
    torch.testing.assert_close(tree_verification_plan(torch.tensor([1, 2]), [-1, -1], excluded, target).path_end_probs,
                               plan.path_end_probs)


@pytest.mark.parametrize("dense", [True, False], ids=["dense-drafts", "point-masses"])
@pytest.mark.parametrize("seed", range(5))
def test_one_hot_target_rows_make_verify_tree_greedy(seed, dense):
    tokens, parents, draft, target = _random_tree(12, 4, seed, distinct_siblings=seed % 2 == 0)
    one_hot = torch.nn.functional.one_hot(target.argmax(-1), 4).to(torch.float64)  # [n + 1, V]
    expected = verify_tree_greedy(tokens, parents, None, one_hot)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(5):
        result = verify_tree(tokens, parents, draft if dense else None, one_hot, generator)
        assert result == expected


# --- the sampler draws from its plan ---------------------------------------------------

SAMPLES = 2_000
FALSE_ALARM = 1e-4  # chance that a correct sampler fails one chi-square test (fixed seed: deterministic)


def _sampler_case(dense: bool):
    """V = 5, an irregular tree of 6 nodes in which every path end is likely enough to test."""
    tokens = torch.tensor([0, 2, 1, 3, 4, 1])
    parents = [-1, -1, 0, 0, 1, 2]
    target = torch.tensor([[0.30, 0.10, 0.30, 0.20, 0.10],
                           [0.30, 0.30, 0.05, 0.25, 0.10],
                           [0.25, 0.05, 0.30, 0.10, 0.30],
                           [0.20, 0.30, 0.10, 0.20, 0.20],
                           [0.10, 0.20, 0.30, 0.30, 0.10],
                           [0.20, 0.20, 0.20, 0.20, 0.20],
                           [0.50, 0.10, 0.10, 0.20, 0.10]], dtype=torch.float64)  # [n + 1, V]
    root = [0.50, 0.05, 0.25, 0.10, 0.10]
    draft = torch.tensor([root, root,
                          [0.10, 0.50, 0.10, 0.20, 0.10], [0.10, 0.50, 0.10, 0.20, 0.10],
                          [0.10, 0.10, 0.20, 0.10, 0.50],
                          [0.10, 0.60, 0.10, 0.10, 0.10]], dtype=torch.float64)  # [n, V]
    return tokens, parents, draft if dense else None, target


def _joint(plan: TreeVerificationPlan) -> np.ndarray:
    """P(path ends at row r, next token y): [n + 1, V]."""
    return (plan.path_end_probs[:, None] * plan.next_token_dists).numpy()


def _chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit over cells with positive probability; cells expected fewer
    than 5 times are pooled so that the test's approximation holds."""
    expected = probs.ravel() * counts.sum()
    observed = counts.ravel().astype(float)
    positive = expected > 0
    small = positive & (expected < 5)
    big = positive & ~small
    obs = np.append(observed[big], observed[small].sum())
    exp = np.append(expected[big], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    exp *= obs.sum() / exp.sum()
    return float(chisquare(obs, exp).pvalue)


@pytest.mark.parametrize("dense", [True, False], ids=["dense-drafts", "point-masses"])
def test_sampler_draws_from_its_plan(dense):
    tokens, parents, draft, target = _sampler_case(dense)
    plan = tree_verification_plan(tokens, parents, draft, target)
    n, vocab = tokens.numel(), target.shape[1]
    generator = torch.Generator().manual_seed(1234)
    counts = np.zeros((n + 1, vocab), dtype=np.int64)
    for _ in range(SAMPLES):
        result = verify_tree(tokens, parents, draft, target, generator)
        nodes = result.accepted_nodes
        assert isinstance(result, VerifyResult) and result.num_proposed == n
        assert result.num_accepted == len(nodes) == len(result.tokens) - 1
        assert result.tokens[:-1] == [int(tokens[i]) for i in nodes]
        assert all(parents[b] == a for a, b in zip([-1] + nodes, nodes)), "not a root-to-node path"
        counts[nodes[-1] + 1 if nodes else 0, result.tokens[-1]] += 1

    probs = _joint(plan)
    assert counts[probs == 0].sum() == 0, "sampled an outcome the plan gives probability 0"
    assert (counts[probs * SAMPLES >= 30] > 0).all(), "never sampled an outcome the plan makes likely"
    p_value = _chi_square_p(counts, probs)
    assert p_value > FALSE_ALARM, f"samples do not follow the plan: chi-square p = {p_value:.2e}"

    # Power: the same samples reject a wrong plan (the next token from the node's target
    # row instead of the residual), so passing above is not for lack of samples.
    wrong = (plan.path_end_probs[:, None] * target).numpy()
    assert np.abs(wrong - probs).max() > 0.02, "the toy case cannot tell the two plans apart"
    if (counts[wrong == 0] > 0).any():
        return  # support alone already tells them apart
    p_wrong = _chi_square_p(counts, wrong)
    assert p_wrong < FALSE_ALARM, f"the test cannot tell the plan from a wrong one: p = {p_wrong:.2e}"


def test_same_seed_same_results():
    tokens, parents, draft, target = _sampler_case(True)

    def run(seed: int) -> list[TreeVerifyResult]:
        generator = torch.Generator().manual_seed(seed)
        return [verify_tree(tokens, parents, draft, target, generator) for _ in range(30)]

    first = run(7)
    assert run(7) == first
    assert len({tuple(r.accepted_nodes) for r in first}) > 1, "30 draws all equal: the sampler ignores its randomness"
    assert verify_tree(tokens, parents, draft, target).num_proposed == 6  # generator=None: torch's global RNG


# --- greedy ------------------------------------------------------------------------------

# Nodes: 0 = token 2 and 1 = token 1 under the root; 2 = token 0 and 3 = token 1 under node 1;
# 4 = token 2 under node 0. Rows: root, then nodes 0..4.
GREEDY_TOKENS = torch.tensor([2, 1, 0, 1, 2])
GREEDY_PARENTS = [-1, -1, 1, 1, 0]


def _greedy_target(*argmaxes: int, vocab: int = 3) -> torch.Tensor:
    rows = torch.full((len(argmaxes), vocab), 0.1)
    rows[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 0.8
    return rows  # [n + 1, V]


def test_greedy_follows_the_argmax_child_even_when_it_is_a_later_sibling():
    target = _greedy_target(1, 0, 1, 2, 0, 1)  # root -> node 1 (2nd sibling) -> node 3 (2nd child), bonus 0
    result = verify_tree_greedy(GREEDY_TOKENS, GREEDY_PARENTS, None, target)
    assert result == TreeVerifyResult(tokens=[1, 1, 0], num_accepted=2, num_proposed=5, accepted_nodes=[1, 3])
    assert isinstance(result, VerifyResult) and result.acceptance_length == 3


def test_greedy_recovers_the_argmax_where_no_child_matches():
    target = _greedy_target(1, 0, 2, 0, 0, 0)  # node 1's children hold 0 and 1; the argmax there is 2
    assert verify_tree_greedy(GREEDY_TOKENS, GREEDY_PARENTS, None, target) == TreeVerifyResult([1, 2], 1, 5, [1])
    target = _greedy_target(0, 0, 0, 0, 0, 0)  # no child of the root holds 0
    assert verify_tree_greedy(GREEDY_TOKENS, GREEDY_PARENTS, None, target) == TreeVerifyResult([0], 0, 5, [])
    target = _greedy_target(2, 2, 0, 0, 0, 1)  # root -> node 0 -> node 4 (a leaf): bonus 1
    assert verify_tree_greedy(GREEDY_TOKENS, GREEDY_PARENTS, None, target) == TreeVerifyResult([2, 2, 1], 2, 5, [0, 4])


def test_greedy_breaks_ties_by_first_index_and_prefers_the_earliest_sibling():
    tokens, parents = torch.tensor([1, 0, 0]), [-1, -1, -1]  # node 2 repeats node 1's token
    target = torch.tensor([[0.4, 0.4, 0.2], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])  # tie 0 vs 1 -> 0
    assert verify_tree_greedy(tokens, parents, None, target) == TreeVerifyResult([0, 2], 1, 3, [1])


def test_greedy_takes_logits_and_ignores_draft_probs_and_generator():
    target = _greedy_target(1, 0, 1, 2, 0, 1)
    expected = verify_tree_greedy(GREEDY_TOKENS, GREEDY_PARENTS, None, target)
    logits = torch.log(target).to(torch.bfloat16)
    junk = torch.rand(5, 3)
    got = verify_tree_greedy(GREEDY_TOKENS, torch.tensor(GREEDY_PARENTS), junk, logits, torch.Generator())
    assert got == expected


@pytest.mark.parametrize("verify", [verify_tree, verify_tree_greedy])
def test_empty_tree_commits_one_token_from_row_0(verify):
    target = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    result = verify(torch.tensor([], dtype=torch.long), [], None, target, torch.Generator().manual_seed(0))
    assert result == TreeVerifyResult([2], 0, 0, [])


# --- edge cases --------------------------------------------------------------------------


def test_drafter_with_no_mass_left_for_a_sibling_stays_finite():
    # The drafter puts all its mass on token 0, yet a second sibling (token 1) is offered:
    # it cannot be a real sample. The plan must stay finite and never accept a token the
    # target forbids.
    target = torch.tensor([[0.2, 0.8, 0.0], [1 / 3] * 3, [1 / 3] * 3, [1 / 3] * 3], dtype=torch.float64)
    draft = torch.tensor([[1.0, 0.0, 0.0]] * 3, dtype=torch.float64)
    plan = tree_verification_plan(torch.tensor([0, 1, 2]), [-1, -1, -1], draft, target)
    assert torch.isfinite(plan.next_token_weights).all() and torch.isfinite(plan.path_end_probs).all()
    torch.testing.assert_close(plan.accept_probs, torch.tensor([0.2, 1.0, 0.0], dtype=torch.float64))
    assert plan.path_end_probs.sum().item() == pytest.approx(1.0)


def test_target_equal_to_drafter_accepts_the_first_child_surely():
    tokens, parents, draft, _ = _random_tree(8, 5, seed=3)
    target = torch.cat([draft[:1], draft])  # row 0: the root's; others arbitrary but valid
    plan = tree_verification_plan(tokens, parents, draft, target)
    first_child = parents.index(-1)
    assert plan.accept_probs[first_child].item() == 1.0
    assert torch.isfinite(plan.next_token_weights).all() and (plan.next_token_weights.sum(1) > 0).all()


@pytest.mark.parametrize("verify", [verify_tree, verify_tree_greedy])
def test_inputs_are_not_modified(verify):
    tokens, parents, draft, target = _random_tree(10, 6, seed=4)
    draft, target = draft.float(), target.float()
    parents_t = torch.tensor(parents)
    before = (tokens.clone(), parents_t.clone(), draft.clone(), target.clone())
    verify(tokens, parents_t, draft, target, torch.Generator().manual_seed(0))
    verify(tokens, parents_t, None, target, torch.Generator().manual_seed(0))
    for a, b in zip(before, (tokens, parents_t, draft, target)):
        assert torch.equal(a, b)


def test_full_size_vocabulary():
    tokens, parents, _, _ = _random_tree(16, 50, seed=5)  # small token ids are valid in any vocabulary
    g = torch.Generator().manual_seed(6)
    target = torch.softmax(torch.randn(17, 151_936, generator=g), -1)
    draft = torch.softmax(torch.randn(16, 151_936, generator=g), -1)
    for draft_probs in (draft, None):
        result = verify_tree(tokens, parents, draft_probs, target, torch.Generator().manual_seed(0))
        assert result.tokens[:-1] == [int(tokens[i]) for i in result.accepted_nodes]
        assert 0 <= result.tokens[-1] < 151_936


# --- validation ------------------------------------------------------------------------------

P4 = torch.full((4, 3), 1 / 3)  # a valid target for 3 nodes


@pytest.mark.parametrize("verify", [verify_tree, verify_tree_greedy])
@pytest.mark.parametrize("tokens,parents,target,message", [
    (torch.tensor([[0, 1, 2]]), [-1, 0, 1], P4, r"tokens must be a 1-D integer tensor \[n\]"),
    (torch.tensor([0.0, 1.0, 2.0]), [-1, 0, 1], P4, r"tokens must be a 1-D integer tensor"),
    ([0, 1, 2], [-1, 0, 1], P4, r"tokens must be a 1-D integer tensor"),
    (torch.tensor([0, 1, 2]), [-1, 0], P4, r"one entry per node: n = 3 \(len\(tokens\)\); got 2"),
    (torch.tensor([0, 1, 2]), [-1, 1, 0], P4, r"parents\[1\] = 1: a node's parent must be an earlier node"),
    (torch.tensor([0, 1, 2]), [-1, 2, 0], P4, r"parents\[1\] = 2.*every parent comes before its children"),
    (torch.tensor([0, 1, 2]), [-2, 0, 0], P4, r"parents\[0\] = -2"),
    (torch.tensor([0, 1, 2]), torch.tensor([-1.0, 0.0, 0.0]), P4, r"parents must be a 1-D integer tensor"),
    (torch.tensor([0, 1, 2]), torch.tensor([[-1, 0, 0]]), P4, r"parents must be a 1-D integer tensor"),
    (torch.tensor([0, 1, 2]), "abc", P4, r"parents must be a 1-D integer tensor \[n\] or a list of ints"),
    (torch.tensor([0, 1, 2]), [-1, 0, 1], P4[:3], r"n \+ 1 = 4 rows for n = 3 tree nodes"),
    (torch.tensor([0, 1, 2]), [-1, 0, 1], P4[0], r"target_probs must be a 2-D tensor \[n \+ 1, V\]"),
    (torch.tensor([0, 1, 3]), [-1, 0, 1], P4, r"tokens must lie in \[0, V\) = \[0, 3\)"),
])
def test_input_errors(verify, tokens, parents, target, message):
    with pytest.raises(ValueError, match=message):
        verify(tokens, parents, None, target)


@pytest.mark.parametrize("draft", [torch.full((3, 4), 0.25), torch.full((2, 3), 1 / 3), torch.full((3,), 1 / 3)])
def test_draft_probs_shape_errors(draft):
    with pytest.raises(ValueError, match=r"draft_probs must have shape \[n, V\] = \[3, 3\]"):
        verify_tree(torch.tensor([0, 1, 2]), [-1, 0, 0], draft, P4)


@pytest.mark.parametrize("bad", ["negative", "nan", "zero-row"])
def test_non_probabilities_are_rejected(bad):
    row = {"negative": [-1.0, 1.0, 1.0], "nan": [float("nan"), 0.5, 0.5], "zero-row": [0.0, 0.0, 0.0]}[bad]
    target = P4.clone()
    target[2] = torch.tensor(row)
    with pytest.raises(ValueError, match="target_probs must hold probabilities"):
        verify_tree(torch.tensor([0, 1, 2]), [-1, 0, 0], None, target)
    with pytest.raises(ValueError, match="draft_probs must hold probabilities"):
        verify_tree(torch.tensor([0, 1, 2]), [-1, 0, 0], target[1:], P4)


def test_registry():
    assert TREE_VERIFIERS == {"greedy": verify_tree_greedy, "token": verify_tree, "coupled": verify_tree_coupled}
    assert get_tree_verifier("token") is verify_tree
    with pytest.raises(ValueError, match=r"unknown tree verifier 'block'; allowed: 'greedy', 'token', 'coupled'"):
        get_tree_verifier("block")
