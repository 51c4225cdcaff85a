"""specwise.verify makes the decisions of the independent float64 reference (tests/reference_verify.py):
the same plans, the same draws, the same tokens.

specwise.verify is what the engine runs, and what tests/test_verify_exact.py and
tests/test_verify_tree.py prove lossless by exact enumeration; the reference computes the same
rules position by position on the host. On the CPU the chain plans must be bitwise the
reference's and every decision the same for the same generator state; the tree plans agree
to float64 rounding (a row sum over several rows may group its terms differently). On CUDA
(marked gpu, skipped without one) the plans agree to float64 rounding and the decisions are
the same for these draws.
"""

from __future__ import annotations

import pytest
import torch

import reference_verify as reference
from specwise.verify import (block_verification_plan, token_verification_plan, tree_verification_plan,
                             verify_block, verify_tokens, verify_tree)

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]
CHAIN = [(reference.verify_tokens, verify_tokens, reference.token_verification_plan, token_verification_plan),
         (reference.verify_block, verify_block, reference.block_verification_plan, block_verification_plan)]


def _case(seed: int, k: int, vocab: int, point_masses: bool, sharp: bool = False):
    """Random draft tokens and distributions; some zeros, some near-identical rows, so clipping,
    empty residuals and zero-probability tokens all occur."""
    g = torch.Generator().manual_seed(seed)
    scale = 6.0 if sharp else 1.0
    target = torch.softmax(torch.randn(k + 1, vocab, generator=g) * scale, dim=-1)
    target[torch.rand(k + 1, vocab, generator=g) < 0.2] = 0.0
    target[:, 0] += 1e-3  # every row keeps some mass
    if point_masses:
        draft = None
        tokens = torch.multinomial(target[:k] + 0.05, 1, generator=g).flatten()
    else:
        draft = torch.softmax(torch.randn(k, vocab, generator=g) * scale, dim=-1)
        if seed % 3 == 0 and k:
            draft[0] = target[0] / target[0].sum()  # an identical row: its residual is empty
        tokens = torch.multinomial(draft, 1, generator=g).flatten()
    if seed % 2:
        target = target.float()  # the engine's float32 probabilities
    return tokens, draft, target


@pytest.mark.parametrize("rule", CHAIN, ids=["token", "block"])
@pytest.mark.parametrize("point_masses", [False, True], ids=["sampled", "point"])
def test_chain_plans_are_bitwise_the_reference_on_cpu(rule, point_masses):
    _, _, reference_plan, plan = rule
    for seed in range(60):
        tokens, draft, target = _case(seed, k=seed % 6, vocab=7 + seed % 5, point_masses=point_masses,
                                      sharp=seed % 4 == 0)
        expected = reference_plan(tokens, draft, target)
        got = plan(tokens, draft, target)
        assert torch.equal(got.position_probs, expected.position_probs), seed
        assert torch.equal(got.next_token_weights, expected.next_token_weights), seed
        # P(j accepted) comes from the verifier's own map from positions to outcomes.
        assert torch.equal(got.num_accepted_probs, expected.num_accepted_probs), seed


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rule", CHAIN, ids=["token", "block"])
@pytest.mark.parametrize("point_masses", [False, True], ids=["sampled", "point"])
def test_chain_plans_on_cuda_equal_the_reference_to_rounding(rule, point_masses):
    _, _, reference_plan, plan = rule
    for seed in range(60):
        tokens, draft, target = _case(seed, k=seed % 6, vocab=7 + seed % 5, point_masses=point_masses,
                                      sharp=seed % 4 == 0)
        expected = reference_plan(tokens, draft, target)
        got = plan(tokens, None if draft is None else draft.cuda(), target.cuda())
        assert got.position_probs.is_cuda
        for name in ("position_probs", "num_accepted_probs", "next_token_dists"):
            torch.testing.assert_close(getattr(got, name).cpu(), getattr(expected, name), rtol=1e-12, atol=1e-15,
                                       msg=lambda m, name=name: f"seed {seed}, {name}: {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rule", CHAIN, ids=["token", "block"])
@pytest.mark.parametrize("point_masses", [False, True], ids=["sampled", "point"])
def test_chain_decisions_equal_the_reference(rule, point_masses, device):
    reference_verify, verify, _, _ = rule
    for seed in range(300):
        tokens, draft, target = _case(seed, k=1 + seed % 8, vocab=5 + seed % 40, point_masses=point_masses,
                                      sharp=seed % 4 == 0)
        want_gen, got_gen = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        want = reference_verify(tokens, draft, target, want_gen)
        on_device = None if draft is None else draft.to(device)
        got = verify(tokens, on_device, target.to(device), got_gen)
        assert got == want, seed
        # The same number of draws: the generator ends where the reference's does.
        assert torch.equal(got_gen.get_state(), want_gen.get_state()), seed


@pytest.mark.parametrize("rule", CHAIN, ids=["token", "block"])
def test_the_verifiers_refuse_what_the_reference_refuses(rule):
    reference_verify, verify, _, plan = rule
    tokens = torch.tensor([1])
    bad = torch.tensor([[0.5, -0.1, 0.6], [0.2, 0.3, 0.5]])
    with pytest.raises(ValueError, match="target_probs must hold probabilities"):
        reference_verify(tokens, None, bad)
    with pytest.raises(ValueError, match="target_probs must hold probabilities"):
        verify(tokens, None, bad)
    with pytest.raises(ValueError, match="target_probs must hold probabilities"):
        plan(tokens, None, bad)
    with pytest.raises(ValueError, match="draft_probs must hold probabilities"):
        verify(tokens, bad[:1], bad.abs())
    with pytest.raises(ValueError, match="rows"):
        verify(tokens, None, bad[:1])


def _tree_case(seed: int, vocab: int, point_masses: bool):
    """A random tree (parents before children, up to 3 children per node); children drawn
    without replacement from their parent's draft row, or point masses."""
    g = torch.Generator().manual_seed(seed)
    n = 1 + seed % 9
    parents = [-1]
    for i in range(1, n):
        parents.append(int(torch.randint(-1, i, (1,), generator=g)))
    target = torch.softmax(torch.randn(n + 1, vocab, generator=g) * (4.0 if seed % 3 == 0 else 1.0), dim=-1)
    target[torch.rand(n + 1, vocab, generator=g) < 0.2] = 0.0
    target[:, 0] += 1e-3
    rows = torch.softmax(torch.randn(n + 1, vocab, generator=g), dim=-1)  # the drafter's row at each parent
    tokens, used = [], {}
    for i, p in enumerate(parents):
        taken = used.setdefault(p, [])
        weights = rows[p + 1].clone()
        weights[taken] = 0.0
        token = int(torch.multinomial(weights, 1, generator=g)) if weights.sum() > 0 else 0
        if point_masses and seed % 2:
            token = int(torch.randint(vocab, (1,), generator=g))  # repeats among siblings allowed
        taken.append(token)
        tokens.append(token)
    draft = None if point_masses else torch.stack([rows[p + 1] for p in parents])
    return torch.tensor(tokens), torch.tensor(parents), draft, target


@pytest.mark.parametrize("point_masses", [False, True], ids=["sampled", "point"])
def test_tree_plans_equal_the_reference_on_cpu(point_masses):
    for seed in range(80):
        tokens, parents, draft, target = _tree_case(seed, vocab=6 + seed % 7, point_masses=point_masses)
        expected = reference.tree_verification_plan(tokens, parents, draft, target)
        got = tree_verification_plan(tokens, parents, draft, target)
        torch.testing.assert_close(got.accept_probs, expected.accept_probs, rtol=1e-12, atol=1e-15)
        # Rows are defined up to a positive factor: compare them normalized.
        torch.testing.assert_close(got.next_token_weights / got.next_token_weights.sum(1, keepdim=True),
                                   expected.next_token_dists, rtol=1e-12, atol=1e-15)
        # Reach and path-end probabilities come from the verifier's own path arithmetic.
        torch.testing.assert_close(got.reach_probs, expected.reach_probs, rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(got.path_end_probs, expected.path_end_probs, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("point_masses", [False, True], ids=["sampled", "point"])
def test_tree_decisions_equal_the_reference(point_masses, device):
    for seed in range(200):
        tokens, parents, draft, target = _tree_case(seed, vocab=5 + seed % 30, point_masses=point_masses)
        want_gen, got_gen = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        want = reference.verify_tree(tokens, parents, draft, target, want_gen)
        got = verify_tree(tokens, parents, None if draft is None else draft.to(device), target.to(device), got_gen)
        assert got == want, seed
        assert torch.equal(got_gen.get_state(), want_gen.get_state()), seed


def test_tree_verifier_refuses_what_the_reference_refuses():
    tokens, parents = torch.tensor([1, 0]), [-1, 0]
    bad = torch.tensor([[0.5, -0.1, 0.6], [0.2, 0.3, 0.5], [0.2, 0.3, 0.5]])
    for verify in (reference.verify_tree, verify_tree):
        with pytest.raises(ValueError, match="target_probs must hold probabilities"):
            verify(tokens, parents, None, bad)
    with pytest.raises(ValueError, match="draft_probs must hold probabilities"):
        verify_tree(tokens, parents, bad[:2], bad.abs())
