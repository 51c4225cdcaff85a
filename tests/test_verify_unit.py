"""Unit tests of the verification rules: greedy semantics, hand-worked plans, edge cases,
determinism, input validation and the registry. Losslessness itself is proven in
test_verify_exact.py."""

from __future__ import annotations

import pytest
import torch

from specwise.verify import (
    VERIFIERS,
    VerifyResult,
    block_verification_plan,
    get_verifier,
    token_verification_plan,
    verify_block,
    verify_coupled,
    verify_greedy,
    verify_tokens,
)

SAMPLERS = [verify_tokens, verify_block]
PLANS = [token_verification_plan, block_verification_plan]
ALL = [verify_greedy, verify_tokens, verify_block]


def _random_step(k: int, vocab: int, seed: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(2 * k + 1, vocab, generator=g, dtype=torch.float64)
    target = torch.softmax(logits[: k + 1], -1).to(dtype)  # [k + 1, V]
    draft = torch.softmax(logits[k + 1 :], -1).to(dtype)  # [k, V]
    tokens = torch.multinomial(draft.double(), 1, generator=g).flatten()  # [k]
    return tokens, draft, target


def _one_hot(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(tokens, vocab).to(torch.float64)  # [k, V]


def _assert_plans_close(a, b, tol=1e-12, same_rule=True):
    if same_rule:  # position_probs mean a_i for token-level, h_i for block
        torch.testing.assert_close(a.position_probs, b.position_probs, atol=tol, rtol=0)
    torch.testing.assert_close(a.num_accepted_probs, b.num_accepted_probs, atol=tol, rtol=0)
    torch.testing.assert_close(a.next_token_dists, b.next_token_dists, atol=tol, rtol=0)


# --- greedy ----------------------------------------------------------------------------

GREEDY_TARGET = torch.tensor([[0.1, 0.7, 0.2],
                              [0.6, 0.3, 0.1],
                              [0.2, 0.2, 0.6],
                              [0.3, 0.3, 0.4]])  # argmax per row: 1, 0, 2, 2


def test_greedy_commits_accepted_prefix_and_argmax_at_first_mismatch():
    assert verify_greedy(torch.tensor([1, 0, 1]), None, GREEDY_TARGET) == VerifyResult([1, 0, 2], 2, 3)
    assert verify_greedy(torch.tensor([1, 2, 2]), None, GREEDY_TARGET) == VerifyResult([1, 0], 1, 3)
    assert verify_greedy(torch.tensor([0, 0, 2]), None, GREEDY_TARGET) == VerifyResult([1], 0, 3)


def test_greedy_all_accepted_adds_bonus_argmax_of_last_row():
    result = verify_greedy(torch.tensor([1, 0, 2]), None, GREEDY_TARGET)
    assert result == VerifyResult([1, 0, 2, 2], 3, 3)
    assert result.all_accepted and result.acceptance_length == 4


def test_greedy_breaks_ties_by_first_index():
    target = torch.tensor([[0.4, 0.4, 0.2], [0.1, 0.45, 0.45]])  # ties: 0 vs 1, then 1 vs 2
    assert verify_greedy(torch.tensor([1]), None, target) == VerifyResult([0], 0, 1)
    assert verify_greedy(torch.tensor([0]), None, target) == VerifyResult([0, 1], 1, 1)
    logits = torch.tensor([[2.0, 5.0, 5.0, -float("inf")], [7.0, 7.0, 7.0, 7.0]])
    assert verify_greedy(torch.tensor([1]), None, logits) == VerifyResult([1, 0], 1, 1)


def test_greedy_takes_logits_and_ignores_draft_probs_and_generator():
    logits = torch.log(GREEDY_TARGET).to(torch.bfloat16)
    expected = verify_greedy(torch.tensor([1, 0, 1]), None, GREEDY_TARGET)
    junk = torch.rand(3, 3)
    assert verify_greedy(torch.tensor([1, 0, 1]), junk, logits, torch.Generator().manual_seed(0)) == expected


def test_greedy_k0_is_the_argmax_of_row_0():
    assert verify_greedy(torch.tensor([], dtype=torch.long), None, GREEDY_TARGET[:1]) == VerifyResult([1], 0, 0)


# --- plans worked by hand ------------------------------------------------------------------

# V = 2, k = 2. w_1 = min(1, 0.5 / 0.8) = 0.625; w_2 = min(1, 0.625 * 0.9 / 0.3) = 1.
# r_1 = max(0.625 * 0.9 - 0.3, 0) + max(0.625 * 0.1 - 0.7, 0) = 0.2625,
# h_1 = 0.2625 / (0.2625 + 1 - 0.625) = 7/17, h_2 = w_2 = 1: block accepts both tokens surely,
# where token-level rejects x_1 with probability 0.375.
HAND_TOKENS = torch.tensor([0, 0])
HAND_DRAFT = torch.tensor([[0.8, 0.2], [0.3, 0.7]], dtype=torch.float64)
HAND_TARGET = torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]], dtype=torch.float64)


def test_token_plan_by_hand():
    plan = token_verification_plan(HAND_TOKENS, HAND_DRAFT, HAND_TARGET)
    torch.testing.assert_close(plan.position_probs, torch.tensor([0.625, 1.0], dtype=torch.float64))
    torch.testing.assert_close(plan.num_accepted_probs, torch.tensor([0.375, 0.0, 0.625], dtype=torch.float64))
    torch.testing.assert_close(plan.next_token_dists[0], torch.tensor([0.0, 1.0], dtype=torch.float64))  # residual
    torch.testing.assert_close(plan.next_token_dists[2], HAND_TARGET[2])  # bonus
    assert plan.expected_tokens == pytest.approx(1 + 2 * 0.625)


def test_block_plan_by_hand():
    plan = block_verification_plan(HAND_TOKENS, HAND_DRAFT, HAND_TARGET)
    torch.testing.assert_close(plan.position_probs, torch.tensor([7 / 17, 1.0], dtype=torch.float64))
    torch.testing.assert_close(plan.num_accepted_probs, torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(plan.next_token_dists[0], torch.tensor([0.0, 1.0], dtype=torch.float64))
    # After one accepted token: normalize(max(w_1 * t_2 - d_2, 0)).
    torch.testing.assert_close(plan.next_token_dists[1], torch.tensor([1.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(plan.next_token_dists[2], HAND_TARGET[2])
    generator = torch.Generator().manual_seed(0)
    assert all(verify_block(HAND_TOKENS, HAND_DRAFT, HAND_TARGET, generator).num_accepted == 2 for _ in range(50))


def test_block_equals_token_level_for_one_draft_token():
    tokens, draft, target = _random_step(1, 20, seed=3)
    block, token = block_verification_plan(tokens, draft, target), token_verification_plan(tokens, draft, target)
    _assert_plans_close(block, token)


def test_plans_are_proper_distributions():
    tokens, draft, target = _random_step(5, 50, seed=4)
    for plan_fn in PLANS:
        plan = plan_fn(tokens, draft, target)
        assert plan.position_probs.shape == (5,) and plan.next_token_dists.shape == (6, 50)
        assert ((plan.position_probs >= 0) & (plan.position_probs <= 1)).all()
        assert (plan.num_accepted_probs >= 0).all()
        assert plan.num_accepted_probs.sum().item() == pytest.approx(1, abs=1e-12)
        assert (plan.next_token_dists >= 0).all()
        torch.testing.assert_close(plan.next_token_dists.sum(1), torch.ones(6, dtype=torch.float64))
    recovered = token_verification_plan(tokens, draft, target).next_token_dists[:5]
    assert (recovered[target[:5] <= draft] == 0).all(), "recovered tokens come only from where t > d"


# --- point masses ------------------------------------------------------------------------


@pytest.mark.parametrize("plan_fn", PLANS)
def test_point_masses_match_explicit_one_hot_drafts(plan_fn):
    tokens, _, target = _random_step(4, 30, seed=5)
    _assert_plans_close(plan_fn(tokens, None, target), plan_fn(tokens, _one_hot(tokens, 30), target))


def test_point_mass_token_plan_accepts_with_target_prob_and_zeroes_the_draft_token():
    tokens, _, target = _random_step(3, 10, seed=6)
    plan = token_verification_plan(tokens, None, target)
    torch.testing.assert_close(plan.position_probs, target[torch.arange(3), tokens])
    for i, x in enumerate(tokens.tolist()):
        residual = target[i].clone()
        residual[x] = 0
        torch.testing.assert_close(plan.next_token_dists[i], residual / residual.sum())


def test_block_equals_token_level_for_point_masses():
    # With one possible draft block there is nothing for block verification to gain:
    # h_i = r_i / (1 - w_{i+1}) telescopes to P(j accepted) = w_j (1 - t_{j+1}(x_{j+1})).
    tokens, _, target = _random_step(4, 30, seed=7)
    block, token = block_verification_plan(tokens, None, target), token_verification_plan(tokens, None, target)
    _assert_plans_close(block, token, same_rule=False)


@pytest.mark.parametrize("verify", SAMPLERS)
def test_point_masses_sample(verify):
    tokens, _, target = _random_step(3, 10, seed=8)
    result = verify(tokens, None, target, torch.Generator().manual_seed(0))
    assert result.tokens[: result.num_accepted] == tokens[: result.num_accepted].tolist()
    assert len(result.tokens) == result.num_accepted + 1 and result.num_proposed == 3


# --- k = 0 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("plan_fn", PLANS)
@pytest.mark.parametrize("draft", [None, torch.zeros(0, 4)], ids=["None", "empty"])
def test_k0(plan_fn, draft):
    verify = verify_tokens if plan_fn is token_verification_plan else verify_block
    target = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    empty = torch.tensor([], dtype=torch.long)
    plan = plan_fn(empty, draft, target)
    assert plan.num_accepted_probs.tolist() == [1.0] and plan.position_probs.numel() == 0
    torch.testing.assert_close(plan.next_token_dists, target.double())
    assert verify(empty, draft, target, torch.Generator().manual_seed(0)) == VerifyResult([2], 0, 0)


# --- edge cases --------------------------------------------------------------------------


@pytest.mark.parametrize("plan_fn", PLANS)
def test_draft_prob_zero_at_the_draft_token_does_not_divide_by_zero(plan_fn):
    # A caller broke the contract (x_1 cannot have been drawn from d_1). The rules must stay
    # finite, accept x_1 when the target allows it, and never accept a token the target forbids.
    target = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], dtype=torch.float64)
    draft = torch.tensor([[0.0, 0.4, 0.6]], dtype=torch.float64)
    allowed = plan_fn(torch.tensor([0]), draft, target)
    assert allowed.position_probs.tolist() == [1.0] and allowed.num_accepted_probs.tolist() == [0.0, 1.0]
    forbidden = plan_fn(torch.tensor([2]), torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64), target)
    assert forbidden.num_accepted_probs.tolist() == [1.0, 0.0]
    for plan in (allowed, forbidden):
        assert torch.isfinite(plan.next_token_dists).all() and torch.isfinite(plan.num_accepted_probs).all()


@pytest.mark.parametrize("plan_fn", PLANS)
@pytest.mark.parametrize("verify", SAMPLERS)
def test_zero_residual_falls_back_to_target(plan_fn, verify):
    tokens, draft, target = _random_step(3, 8, seed=9)
    target = target.clone()
    target[:3] = draft  # t_i == d_i: every draft token is accepted, every residual is zero
    plan = plan_fn(tokens, draft, target)
    torch.testing.assert_close(plan.num_accepted_probs, torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(plan.next_token_dists[:3], target[:3])
    assert verify(tokens, draft, target, torch.Generator().manual_seed(0)).num_accepted == 3


@pytest.mark.parametrize("plan_fn", PLANS)
def test_low_precision_inputs_are_renormalized_in_float64(plan_fn):
    tokens, draft, target = _random_step(4, 64, seed=10)
    rounded = plan_fn(tokens, draft.to(torch.bfloat16).float(), target.to(torch.bfloat16).float())
    exact = plan_fn(tokens, draft, target)
    assert rounded.num_accepted_probs.dtype == torch.float64
    assert rounded.num_accepted_probs.sum().item() == pytest.approx(1, abs=1e-12)
    torch.testing.assert_close(rounded.next_token_dists.sum(1), torch.ones(5, dtype=torch.float64))
    torch.testing.assert_close(rounded.num_accepted_probs, exact.num_accepted_probs, atol=0.05, rtol=0)


@pytest.mark.parametrize("verify", ALL)
def test_inputs_are_not_modified(verify):
    tokens, draft, target = _random_step(3, 16, seed=11, dtype=torch.float32)
    before = (tokens.clone(), draft.clone(), target.clone())
    verify(tokens, draft, target, torch.Generator().manual_seed(0))
    verify(tokens, None, target, torch.Generator().manual_seed(0))
    for a, b in zip(before, (tokens, draft, target)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("verify", SAMPLERS)
def test_full_size_vocabulary(verify):
    tokens, draft, target = _random_step(4, 151_936, seed=12, dtype=torch.float32)
    for draft_probs in (draft, None):
        result = verify(tokens, draft_probs, target, torch.Generator().manual_seed(0))
        assert result.tokens[: result.num_accepted] == tokens[: result.num_accepted].tolist()
        assert 0 <= result.tokens[-1] < 151_936


# --- determinism ---------------------------------------------------------------------------


@pytest.mark.parametrize("verify", SAMPLERS)
def test_same_seed_same_results(verify):
    tokens, draft, target = _random_step(3, 6, seed=13)

    def run(seed: int) -> list[VerifyResult]:
        generator = torch.Generator().manual_seed(seed)
        return [verify(tokens, draft, target, generator) for _ in range(30)]

    first = run(7)
    assert run(7) == first
    assert len({tuple(r.tokens) for r in first}) > 1, "30 draws all equal: the sampler ignores its randomness"
    assert verify(tokens, draft, target).num_proposed == 3  # generator=None uses torch's global RNG


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("verify", ALL)
@pytest.mark.parametrize("tokens,draft,target,message", [
    (torch.tensor([0, 1]), torch.full((2, 4), 0.25), torch.full((2, 4), 0.25), r"k \+ 1 = 3 rows"),
    (torch.tensor([0, 1]), None, torch.full((4,), 0.25), r"2-D tensor \[k \+ 1, V\]"),
    (torch.tensor([[0, 1]]), None, torch.full((3, 4), 0.25), r"1-D integer tensor"),
    (torch.tensor([0.0, 1.0]), None, torch.full((3, 4), 0.25), r"1-D integer tensor"),
    ([0, 1], None, torch.full((3, 4), 0.25), r"1-D integer tensor"),
    (torch.tensor([0, 4]), None, torch.full((3, 4), 0.25), r"lie in \[0, V\) = \[0, 4\)"),
])
def test_shape_errors(verify, tokens, draft, target, message):
    with pytest.raises(ValueError, match=message):
        verify(tokens, draft, target)


@pytest.mark.parametrize("verify", SAMPLERS)
@pytest.mark.parametrize("draft", [torch.full((2, 5), 0.2), torch.full((3, 4), 0.25), torch.full((2,), 0.5)])
def test_draft_probs_shape_errors(verify, draft):
    with pytest.raises(ValueError, match=r"draft_probs must have shape \[k, V\] = \[2, 4\]"):
        verify(torch.tensor([0, 1]), draft, torch.full((3, 4), 0.25))


@pytest.mark.parametrize("verify", SAMPLERS)
@pytest.mark.parametrize("bad", ["negative", "nan", "zero-row"])
def test_non_probabilities_are_rejected(verify, bad):
    target = torch.full((3, 4), 0.25)
    target[1] = {"negative": torch.tensor([-1.0, 1.0, 0.5, 0.5]),
                 "nan": torch.tensor([float("nan"), 0.5, 0.25, 0.25]),
                 "zero-row": torch.zeros(4)}[bad]
    with pytest.raises(ValueError, match="target_probs must hold probabilities"):
        verify(torch.tensor([0, 1]), None, target)
    with pytest.raises(ValueError, match="draft_probs must hold probabilities"):
        verify(torch.tensor([0, 1]), target[1:], torch.full((3, 4), 0.25))


# --- registry --------------------------------------------------------------------------------


def test_registry():
    assert VERIFIERS == {"greedy": verify_greedy, "token": verify_tokens, "block": verify_block,
                         "coupled": verify_coupled}
    assert get_verifier("block") is verify_block
    with pytest.raises(ValueError, match=r"unknown verifier 'typical'; allowed: 'greedy', 'token', 'block', "
                                         r"'coupled'"):
        get_verifier("typical")
