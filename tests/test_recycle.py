"""The recycle drafter (Token Recycling): its table, its combination with retrieval, and the engine
with it keeping the target's greedy tokens and its distribution."""

import pytest
import torch

from specwise import SamplingParams, SpecConfig, SpeculativeEngine
from specwise.drafters import DrafterContext, create_drafter, sharing_scope
from specwise.drafters.ngram import NgramDrafter
from specwise.drafters.recycle import MAX_TABLES, RecycleDrafter, RecycleTable, RecycleTables
from specwise.drafters.suffix import SuffixDrafter
from specwise.stats import SpecStats
from specwise.runners.hf import HFRunner
from specwise.testing import tiny_loaded, tiny_model

from helpers import (ALPHA, GREEDY_PROMPTS, LENGTH, PROMPT, SAMPLES, SAMPLING, SMALL_TREE, hf_greedy, p_value,
                     run_engine)

VOCAB = 80


def logits_with_order(*orders: list[int], vocab: int = VOCAB) -> torch.Tensor:
    """[len(orders), vocab] logits whose best tokens are each order's, best first."""
    rows = torch.zeros(len(orders), vocab)
    for row, order in zip(rows, orders):
        for rank, token in enumerate(order):
            row[token] = 10.0 - rank
    return rows


# ----------------------------------------------------------------------------- the table

def test_table_learns_each_fed_tokens_successors_and_walks_them():
    table = RecycleTable(VOCAB, 3)
    assert table.chain(5, 4) == [] and table.next_of(5) == []
    table.learn([5, 6, 7], torch.tensor([[6, 1, 2], [7, 3, 4], [9, 5, 6]]))
    assert table.next_of(6) == [7, 3, 4]
    assert table.chain(5, 4) == [6, 7, 9]  # 9 has no successors yet: the chain stops there
    assert table.chain(5, 2) == [6, 7]
    table.learn([6], torch.tensor([[8, 7, 1]]))  # the latest pass wins
    assert table.chain(5, 3) == [6, 8]


def test_table_tree_is_breadth_first_within_limits_and_nodes():
    table = RecycleTable(VOCAB, 3)
    table.learn([1, 2, 3], torch.tensor([[2, 3, 4], [5, 6, 7], [8, 9, 10]]))
    tokens, parents = table.tree(1, [2, 2], nodes=10)
    assert tokens == [2, 3, 5, 6, 8, 9] and parents == [-1, -1, 0, 0, 1, 1]
    tokens, parents = table.tree(1, [3, 1], nodes=4)
    assert tokens == [2, 3, 4, 5] and parents == [-1, -1, -1, 0]


def test_read_scores_keeps_the_target_best_candidates():
    drafter = RecycleDrafter(RecycleTables(VOCAB, 2))
    drafter.start([1], SamplingParams(), torch.Generator())
    drafter.read_scores([1, 4], logits_with_order([4, 9], [11, 3]))
    assert drafter.propose([0, 1], 3).tokens.tolist() == [4, 11]
    assert drafter.propose([0, 1], 1).tokens.tolist() == [4]
    assert len(drafter.propose([0, 1], 0)) == 0


def test_tables_are_kept_per_scope_and_bounded():
    tables = RecycleTables(VOCAB, 2, max_tables=2)
    a, b = tables.table(("a",)), tables.table(("b",))
    assert tables.table(("a",)) is a and a is not b
    assert tables.table(None) is not tables.table(None)  # a private table each time, never kept
    tables.table(("c",))  # b is now the least recently used
    assert len(tables) == 2 and tables.table(("a",)) is a and tables.table(("b",)) is not b
    assert MAX_TABLES >= 1


def test_a_scope_never_drafts_from_another_scope_table():
    tables = RecycleTables(VOCAB, 2)
    drafter = RecycleDrafter(tables)
    with sharing_scope("alice"):
        drafter.start([1], SamplingParams(), torch.Generator())
    drafter.read_scores([1], logits_with_order([4, 9]))
    with sharing_scope("bob"):
        drafter.start([1], SamplingParams(), torch.Generator())
    assert len(drafter.propose([1], 3)) == 0
    with sharing_scope("alice"):
        drafter.start([1], SamplingParams(), torch.Generator())
    assert drafter.propose([1], 3).tokens.tolist() == [4]


# ----------------------------------------------------------------------------- with retrieval

@pytest.mark.parametrize("retrieval, expected", [
    (NgramDrafter(1, 4), [5, 6, 3, 4, 40]),  # the n-gram draft runs to the context's end
    (SuffixDrafter(depth=12, min_percent=0), [5, 6, 60]),  # the suffix draft: factor x the 2-token match
], ids=["ngram", "suffix"])
def test_retrieval_is_taken_where_it_matches_two_tokens_and_continued_by_the_table(retrieval, expected):
    drafter = RecycleDrafter(RecycleTables(VOCAB, 2), retrieval)
    context = [3, 4, 5, 6, 3, 4]  # "3 4" occurred before, followed by 5 6
    drafter.start(context, SamplingParams(), torch.Generator())
    drafter.read_scores([4, 6], logits_with_order([40, 1], [60, 1]))
    assert drafter.propose(context, 6).tokens.tolist() == expected
    assert drafter.propose(context, 2).tokens.tolist() == [5, 6]
    # "9 4" ends the context: a one-token match only, so the table's draft for 4 is taken instead.
    other = [3, 4, 5, 6, 9, 4]
    drafter.start(other, SamplingParams(), torch.Generator())
    assert drafter.propose(other, 2).tokens.tolist() == [40]


def test_registry_settings_and_labels():
    from specwise.bench.methods import spec_label

    spec = SpecConfig(drafter="recycle", recycle_with="ngram", recycle_candidates=4, ngram_max=3, adaptive=False)
    target = tiny_loaded(0)
    drafter = create_drafter("recycle", DrafterContext(target, spec, VOCAB, {}))
    assert isinstance(drafter, RecycleDrafter) and isinstance(drafter.retrieval, NgramDrafter)
    assert drafter.retrieval.ngram_max == 3 and drafter.tables.candidates == 4
    assert spec_label(spec) == "specwise-recycle-k4-n1-3-with-ngram-c4"
    alone = create_drafter("recycle", DrafterContext(target, SpecConfig(drafter="recycle", recycle_with="none"),
                                                     VOCAB, {}))
    assert alone.retrieval is None
    shared: dict = {}
    one, two = (create_drafter("recycle", DrafterContext(target, SpecConfig(drafter="recycle"), VOCAB, {}, shared))
                for _ in range(2))
    assert one.tables is two.tables  # one decoder: one set of tables
    assert two.retrieval.store is one.retrieval.store
    with pytest.raises(ValueError, match="recycle_with must be one of 'none', 'ngram', 'suffix'|recycle_with"):
        SpecConfig(drafter="recycle", recycle_with="eagle")


# ----------------------------------------------------------------------------- the engine

@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0)


PROMPTS, TREE = GREEDY_PROMPTS, SMALL_TREE


def run(target, drafter, prompt, **options):
    return run_engine(target, drafter, prompt, **{"k": 4, **options})


@pytest.mark.parametrize("retrieval", [None, "ngram", "suffix"])
@pytest.mark.parametrize("tree", [{}, TREE, dict(adaptive=True)], ids=["chain", "tree", "adaptive"])
def test_recycle_drafter_is_greedy_identical_and_learns(target, retrieval, tree):
    make = {None: lambda: None, "ngram": lambda: NgramDrafter(1, 4),
            "suffix": lambda: SuffixDrafter(depth=12, min_percent=0)}[retrieval]
    drafter = RecycleDrafter(RecycleTables(VOCAB, 4), make())
    for prompt in PROMPTS:
        assert run(target, drafter, prompt, **tree).token_ids == hf_greedy(target, prompt, 40)
    prompt = PROMPTS[0]
    result = run(target, drafter, prompt, max_new=80, eos=(), **tree)
    assert result.token_ids == hf_greedy(target, prompt, 80, eos=False)
    # The table has seen the target's candidates after every token it scored: it drafts, and is right
    # well above chance (1 in 80; a table filled from the wrong rows of a pass is right at chance). A
    # random tiny model's next token depends on its whole context, so far from always.
    assert result.stats.proposed > 0 and result.stats.accepted > 3 * result.stats.proposed / VOCAB


def test_the_engine_hands_over_every_scored_row(target):
    seen: list[tuple[list[int], torch.Tensor]] = []

    class Recording(RecycleDrafter):
        def read_scores(self, fed, logits):
            seen.append((list(fed), logits.clone()))
            super().read_scores(fed, logits)

    prompt = PROMPTS[1]
    result = run(target, Recording(RecycleTables(VOCAB, 2)), prompt, max_new=12, eos=())
    assert len(seen) == result.stats.steps
    context = list(prompt)
    for (fed, logits), step_tokens in zip(seen, _steps(result)):
        assert fed[0] == context[-1] and logits.shape == (len(fed), target.config.vocab_size)
        expected = target(torch.tensor([context[:-1] + fed])).logits[0, len(context) - 1:]
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
        context += step_tokens


def _steps(result) -> list[list[int]]:
    """The committed tokens step by step, from the per-token draft flags (a step ends with its own token)."""
    steps, current = [], []
    for token, drafted in zip(result.token_ids, result.from_draft):
        current.append(token)
        if not drafted:
            steps.append(current)
            current = []
    return steps


@pytest.mark.slow
@pytest.mark.parametrize("retrieval, tree", [
    (None, {}), ("ngram", {}), (None, dict(tree_nodes=6, tree_depth=LENGTH - 1, tree_branching=3)),
], ids=["chain", "chain-ngram", "tree"])
def test_sampled_recycle_drafts_keep_the_target_distribution(target, exact, retrieval, tree):
    # The table learns from every pass of every sample: many proposals, often accepted, all point
    # masses that the verifier must correct exactly.
    drafter = RecycleDrafter(RecycleTables(VOCAB, 3), NgramDrafter(1, 2) if retrieval else None)
    engine = SpeculativeEngine(HFRunner(target), drafter, SpecConfig(drafter="recycle", k=LENGTH - 1, adaptive=False, **tree))
    counts, stats = {}, SpecStats()
    for seed in range(SAMPLES):
        result = engine.generate(PROMPT, SamplingParams(**{**SAMPLING.__dict__, "seed": seed}))
        counts[tuple(result.token_ids)] = counts.get(tuple(result.token_ids), 0) + 1
        stats = stats.merge(result.stats)
    assert stats.proposed > SAMPLES and stats.accepted > 0.1 * stats.proposed
    p = p_value(counts, exact)
    assert p > ALPHA, f"chi-square p = {p:.2e}"
