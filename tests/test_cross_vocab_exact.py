"""Token-Level Intersection (specwise.drafters.cross_vocab) is lossless, proven by exact enumeration.

Two toy vocabularies of strings over a tiny alphabet overlap in part. The target is a
context-dependent toy model over its own vocabulary (a distribution per prefix of target ids);
the drafter is one over its vocabulary, keyed by the text of the context (as a real drafter
reads the text through its own tokens). At each draft position the drafter's distribution goes
through `VocabularyMap.restrict`, the function the drafter runs; every draft block (chains stop
early where the restriction has no mass), every number of accepted tokens and every recovered or
bonus token is enumerated in float64 with the probabilities of the verifiers' own plans (and of
the independent float64 reference, tests/reference_verify.py). The distribution of the first L
committed target tokens must equal the target's to 1e-12.

Two wrong drafters fail the same check, so it can fail: one reports the drafter's unrestricted
distribution (its tokens outside the intersection at their own ids, as a drafter of the same
vocabulary would), one samples from the unrestricted distribution (falling back to the likeliest
shared token when it draws one outside) while reporting the restricted row. Reporting the
restricted entries without renormalizing is no such bug: the verifiers normalize every row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator

import pytest
import torch

import reference_verify as reference
from specwise.drafters.cross_vocab import VocabularyMap
from specwise.verify import block_verification_plan, token_verification_plan
from test_verify_exact import ToyModel, marginal, max_error, target_distribution

TOLERANCE = 1e-12


class TextToy:
    """A drafter toy model: a distribution over its vocabulary for every context text."""

    def __init__(self, vocab: int, seed: int, **options) -> None:
        self.model = ToyModel(vocab, seed, **options)

    def dist(self, text: str) -> torch.Tensor:  # [draft vocab] float64
        return torch.tensor(self.model.dist(tuple(map(ord, text))), dtype=torch.float64)


class Pair:
    """A target and a drafter with vocabularies of their own."""

    def __init__(self, target_tokens: list[str], draft_tokens: list[str], target_seed: int, draft_seed: int,
                 **draft_options) -> None:
        self.target_tokens = target_tokens
        self.target = ToyModel(len(target_tokens), target_seed)
        self.drafter = TextToy(len(draft_tokens), draft_seed, **draft_options)
        self.vocabulary = VocabularyMap.from_tokens(target_tokens, draft_tokens, len(target_tokens), len(draft_tokens))

    def text(self, ids: tuple[int, ...]) -> str:
        return "".join(self.target_tokens[i] for i in ids)


PAIRS = {
    # shared {a, b}; "ab" only the target's, "ba" only the drafter's (at the target's id of "b")
    "ab|ba": Pair(["a", "b", "ab"], ["b", "ba", "a"], 1, 2),
    # shared {a, b, c}; the drafter's longer tokens never shared; zeros make the restriction empty at times
    "abc|cab-zeros": Pair(["a", "b", "c", "ab"], ["c", "bc", "a", "cab", "b"], 3, 4, zero_frac=0.5),
    # shared {ab, ba}: no single letter of the target is shared
    "pairs-only": Pair(["ab", "a", "ba", "b"], ["ab", "ba", "bb", "aa"], 5, 6, alpha=0.5),
    # the same strings under other ids: everything shared
    "permuted": Pair(["a", "b", "c"], ["c", "a", "b"], 7, 8),
}
CASES = [("ab|ba", 2, 4), ("ab|ba", 3, 4), ("abc|cab-zeros", 2, 4), ("abc|cab-zeros", 3, 4),
         ("pairs-only", 2, 4), ("pairs-only", 3, 4), ("permuted", 2, 4)]
PLANS = {"token": token_verification_plan, "block": block_verification_plan,
         "reference-token": reference.token_verification_plan, "reference-block": reference.block_verification_plan}

# A drafter rule: the drafter's distribution [draft vocab] at a position -> (the law the draft token
# is drawn by, the row reported to the verifier), both [target vocab], or None: the chain stops.
Rule = Callable[[VocabularyMap, torch.Tensor], "tuple[torch.Tensor, torch.Tensor] | None"]


def tli(vocabulary: VocabularyMap, probs: torch.Tensor):
    row = vocabulary.restrict(probs)
    return None if row is None else (row, row)


def claims_unrestricted(vocabulary: VocabularyMap, probs: torch.Tensor):
    """Wrong: drawn as TLI draws, but reports the unrestricted distribution, the tokens outside the
    intersection at their own ids (as a drafter of the target's vocabulary would)."""
    row = vocabulary.restrict(probs)
    if row is None:
        return None
    reported = torch.zeros(vocabulary.target_width, dtype=torch.float64)
    shared = set(vocabulary.draft_ids.tolist())
    for own, p in enumerate(probs.tolist()):
        if own not in shared and own < vocabulary.target_width:
            reported[own] += p
    reported[vocabulary.target_ids] += probs[vocabulary.draft_ids]
    return row, reported


def samples_unrestricted(vocabulary: VocabularyMap, probs: torch.Tensor):
    """Wrong: draws from the unrestricted distribution, a token outside the intersection replaced by
    the likeliest shared one, and reports the restricted row."""
    row = vocabulary.restrict(probs)
    if row is None:
        return None
    law = torch.zeros(vocabulary.target_width, dtype=torch.float64)
    law[vocabulary.target_ids] = probs[vocabulary.draft_ids]
    law[int(row.argmax())] += 1.0 - float(probs[vocabulary.draft_ids].sum())
    return law, row


def draft_blocks(pair: Pair, rule: Rule, prefix: tuple[int, ...], k: int,
                 block: tuple[int, ...] = (), p: float = 1.0,
                 rows: tuple[torch.Tensor, ...] = ()) -> Iterator[tuple[tuple[int, ...], float, torch.Tensor | None]]:
    """(block, probability, reported rows [len(block), target vocab]) for every draft block with
    positive probability; a block ends at k tokens or where the rule stops the chain."""
    step = None if len(block) == k else rule(pair.vocabulary, pair.drafter.dist(pair.text(prefix + block)))
    if step is None:
        yield block, p, torch.stack(rows) if rows else None
        return
    law, reported = step
    for token in torch.nonzero(law).flatten().tolist():
        yield from draft_blocks(pair, rule, prefix, k, block + (token,), p * float(law[token]), rows + (reported,))


def speculative_distribution(pair: Pair, rule: Rule, plan_fn, k: int, length: int):
    """Exact distribution of the first `length` committed target tokens, and how many blocks were
    cut short by an empty restriction."""
    out: dict[tuple[int, ...], float] = defaultdict(float)
    pending = [defaultdict(float) for _ in range(length)]  # by prefix length
    pending[0][()] = 1.0
    short = 0
    for n in range(length):  # every step commits >= 1 token: lengths only grow
        for prefix, mass in pending[n].items():
            for block, p_block, rows in draft_blocks(pair, rule, prefix, k):
                short += len(block) < k
                plan = plan_fn(torch.tensor(block, dtype=torch.long), rows,
                               pair.target.rows(prefix, block, len(block) + 1))  # [len(block) + 1, V]
                dists = plan.next_token_dists.tolist()
                for j, p_j in enumerate(plan.num_accepted_probs.tolist()):
                    for y, p_y in enumerate(dists[j]):
                        if p_j == 0.0 or p_y == 0.0:
                            continue
                        seq = prefix + block[:j] + (y,)
                        if len(seq) >= length:
                            out[seq[:length]] += mass * p_block * p_j * p_y
                        else:
                            pending[len(seq)][seq] += mass * p_block * p_j * p_y
    return out, short


def test_the_intersection_is_the_tokens_of_the_same_string():
    vocabulary = PAIRS["ab|ba"].vocabulary
    assert vocabulary.draft_ids.tolist() == [2, 0] and vocabulary.target_ids.tolist() == [0, 1]
    assert vocabulary.draft_id(0) == 2 and vocabulary.draft_id(1) == 0
    row = vocabulary.restrict(torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64))  # [b, ba, a]
    assert torch.allclose(row, torch.tensor([0.75, 0.25, 0.0], dtype=torch.float64), atol=0, rtol=1e-15)
    assert vocabulary.restrict(torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)) is None
    wide = VocabularyMap.from_tokens(["a", "b", None], ["b", "x", "a", "a2"], target_width=3, draft_width=3)
    assert len(wide) == 2  # "a2" lies past the drafter's width: it can never be drawn


@pytest.mark.parametrize("verifier", list(PLANS))
@pytest.mark.parametrize("name,k,length", CASES)
def test_tli_commits_the_targets_distribution_exactly(name, k, length, verifier):
    pair = PAIRS[name]
    dist, short = speculative_distribution(pair, tli, PLANS[verifier], k, length)
    for n in range(1, length + 1):
        err = max_error(marginal(dist, n), target_distribution(pair.target, n))
        assert err <= TOLERANCE, f"TLI + {verifier} on {name}, k={k}, first {n} tokens: max abs error {err:.3e}"
    assert abs(sum(dist.values()) - 1.0) <= TOLERANCE
    if name == "abc|cab-zeros":
        assert short > 0, "no chain was cut short: the empty restriction is not exercised"


@pytest.mark.parametrize("rule", [claims_unrestricted, samples_unrestricted])
@pytest.mark.parametrize("verifier", ["token", "block"])
@pytest.mark.parametrize("name", ["ab|ba", "abc|cab-zeros"])
def test_wrong_drafters_fail_the_same_check(name, verifier, rule):
    pair, k, length = PAIRS[name], 2, 4
    dist, _ = speculative_distribution(pair, rule, PLANS[verifier], k, length)
    err = max_error(marginal(dist, length), target_distribution(pair.target, length))
    assert err > 1e-3, f"{rule.__name__} on {name}: error only {err:.3e}; the check has no power"
