"""The device verifiers make the reference's decisions: same plans, same draws, same tokens.

The reference is the float64 plan of token.py / block.py / tree.py, which
tests/test_verify_exact.py and tests/test_verify_tree.py prove lossless by exact
enumeration. On the CPU the vectorized verifiers run the reference's own operations, so
their plans must be bitwise equal and every decision the same for the same generator
state; on CUDA (marked gpu, skipped without one) the plans agree to float64 rounding and
the decisions are the same for these draws.
"""

from __future__ import annotations

import pytest
import torch

from specwise.verify import (block_verification_plan, token_verification_plan, tree_verification_plan,
                             verify_block, verify_tokens, verify_tree)
from specwise.verify.vectorized import (block_plan, token_plan, verify_block_vectorized,
                                        verify_tokens_vectorized)
from specwise.verify.tree_vectorized import tree_plan, verify_tree_vectorized

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]
CHAIN = [(verify_tokens, verify_tokens_vectorized, token_verification_plan, token_plan),
         (verify_block, verify_block_vectorized, block_verification_plan, block_plan)]


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
        assert bool(got.valid)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rule", CHAIN, ids=["token", "block"])
@pytest.mark.parametrize("point_masses", [False, True], ids=["sampled", "point"])
def test_chain_decisions_equal_the_reference(rule, point_masses, device):
    reference, vectorized, _, _ = rule
    for seed in range(300):
        tokens, draft, target = _case(seed, k=1 + seed % 8, vocab=5 + seed % 40, point_masses=point_masses,
                                      sharp=seed % 4 == 0)
        want_gen, got_gen = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        want = reference(tokens, draft, target, want_gen)
        on_device = None if draft is None else draft.to(device)
        got = vectorized(tokens, on_device, target.to(device), got_gen)
        assert got == want, seed
        # The same number of draws: the generator ends where the reference's does.
        assert torch.equal(got_gen.get_state(), want_gen.get_state()), seed


@pytest.mark.parametrize("vectorized", [verify_tokens_vectorized, verify_block_vectorized])
def test_vectorized_refuses_what_the_reference_refuses(vectorized):
    tokens = torch.tensor([1])
    bad = torch.tensor([[0.5, -0.1, 0.6], [0.2, 0.3, 0.5]])
    with pytest.raises(ValueError, match="probabilities"):
        vectorized(tokens, None, bad)
    with pytest.raises(ValueError, match="rows"):
        vectorized(tokens, None, bad[:1])


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
        expected = tree_verification_plan(tokens, parents, draft, target)
        got = tree_plan(tokens, parents, draft, target)
        torch.testing.assert_close(got.accept_probs, expected.accept_probs, rtol=1e-12, atol=1e-15)
        # Rows are defined up to a positive factor: compare them normalized.
        torch.testing.assert_close(got.next_token_weights / got.next_token_weights.sum(1, keepdim=True),
                                   expected.next_token_dists, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("point_masses", [False, True], ids=["sampled", "point"])
def test_tree_decisions_equal_the_reference(point_masses, device):
    for seed in range(200):
        tokens, parents, draft, target = _tree_case(seed, vocab=5 + seed % 30, point_masses=point_masses)
        want_gen, got_gen = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        want = verify_tree(tokens, parents, draft, target, want_gen)
        got = verify_tree_vectorized(tokens, parents, None if draft is None else draft.to(device),
                                     target.to(device), got_gen)
        assert got == want, seed
        assert torch.equal(got_gen.get_state(), want_gen.get_state()), seed
