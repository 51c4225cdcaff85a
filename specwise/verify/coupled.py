"""Coupled verification: every committed token is the one plain sampling draws at its position.

Plain sampling with position-keyed noise (specwise.noise) commits at position n the winner y_n
of the exponential race over the target's distribution there: y_n = argmin_i E_n,i / t_n(i),
E_n the noise of (seed, n) alone. A chain step scores the draft x_1..x_k in one pass and
computes the target's own draw y_i at every row from that row's distribution and its
position's noise. x_i is kept exactly when it equals y_i; the first mismatch commits y_i
instead, and a fully accepted block commits the bonus y_{k+1}. A tree is walked the same way:
at each node the child whose token equals the target's draw there is taken, and the walk ends
with the draw at the last node reached.

*Why it is exact.* While every earlier draft token was kept, row i's prefix is the committed
text, so y_i is the token plain sampling commits at that position; every committed token is
such a draw. The output is therefore plain position-keyed sampling's, token for token, whatever
was drafted and however long the blocks were, and plain sampling follows the target because
the race's winner is a sample from t_n (the Gumbel-max trick). draft_probs is never read
(only its shape is checked): any draft is verified exactly.

*What it costs.* A draft drawn without the noise (a point mass: n-gram, suffix, recycle, text
from another vocabulary) is kept with probability t(x), as under rejection sampling of a point
mass, and the token after a mismatch follows t without x, as rejection sampling's residual
does. A drafter that samples from its own q draws with the same noise, x = argmin E / q
(drafter-invariant speculative decoding, Daliri, Musco and Suresh, arXiv 2408.07978); then
P(x = y) >= (1 - TV) / (1 + TV), below rejection sampling's 1 - TV where q differs from t.

One host synchronisation per step, as for the other rules: the draws of every row and whether
target_probs held probabilities. The noise is drawn on the host and sent with the work.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specwise.noise import StepNoise, race
from specwise.verify.chain import VerificationPlan
from specwise.verify.common import NOT_PROBABILITIES, check_inputs, send
from specwise.verify.result import TreeVerifyResult, VerifyResult
from specwise.verify.token import token_verification_plan
from specwise.verify.tree import TreeVerificationPlan, tree_verification_plan
from specwise.verify.tree_shape import check_tree


def target_draws(target_probs: torch.Tensor, noise: StepNoise, offsets: Sequence[int]) -> list[int]:
    """The target's own draw at each row: the race over row r with the noise of position
    noise.start + offsets[r]. One read-back; raises where target_probs are not probabilities."""
    if not isinstance(noise, StepNoise):
        raise ValueError(f"coupled verification draws from position-keyed noise (a StepNoise, "
                         f"PositionNoise.at(start)); got {type(noise).__name__}")
    probs = target_probs.detach()
    exponentials = send(noise.rows(offsets, probs.shape[1]), probs.device)  # [rows, V]
    draws = race(probs, exponentials)  # [rows]
    sums = probs.sum(dim=1)
    valid = torch.isfinite(sums).all() & (sums > 0).all() & (probs.amin() >= 0)
    *tokens, ok = torch.cat([draws, valid.long().reshape(1)]).tolist()
    if not ok:
        raise ValueError(f"target_probs {NOT_PROBABILITIES}")
    return tokens


def verify_coupled(
    draft_tokens: torch.Tensor,  # [k] long
    draft_probs: torch.Tensor | None,  # [k, V] or None: only its shape is checked
    target_probs: torch.Tensor,  # [k + 1, V]
    noise: StepNoise,  # row 0 predicts the token at position noise.start
) -> VerifyResult:
    """Keep draft tokens while each equals the target's draw at its position; then that draw."""
    tokens = check_inputs(draft_tokens, draft_probs, target_probs)
    k = len(tokens)
    draws = target_draws(target_probs, noise, range(k + 1))
    accepted = next((i for i in range(k) if tokens[i] != draws[i]), k)
    return VerifyResult(tokens=tokens[:accepted] + [draws[accepted]], num_accepted=accepted, num_proposed=k)


def verify_tree_coupled(
    tokens: torch.Tensor,  # [n] long
    parents: torch.Tensor | Sequence[int],  # [n], -1 for children of the root
    draft_probs: torch.Tensor | None,  # [n, V] or None: only its shape is checked
    target_probs: torch.Tensor,  # [n + 1, V]: row 0 after the context, row i + 1 after node i
    noise: StepNoise,  # row 0 predicts the token at position noise.start
) -> TreeVerifyResult:
    """Follow the child equal to the target's draw at each node (the earliest such sibling), then
    commit the draw at the last node reached. Node i at depth d (0 for a child of the root) holds
    the token of position start + d, so its row draws with the noise of position start + d + 1."""
    tree = check_tree(tokens, parents, draft_probs, target_probs)
    draws = target_draws(target_probs, noise, [0] + [d + 1 for d in tree.depths()])
    node = tree.descend(lambda row, child: tree.tokens[child] == draws[row])
    return tree.result(node, draws[node + 1])


def coupled_verification_plan(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                              target_probs: torch.Tensor) -> VerificationPlan:
    """The exact probabilities of coupled verification for a draft drawn independently of the
    step's noise (shapes as verify_coupled; draft_probs only checked): x_i is kept with probability
    t_i(x_i) and the token after a mismatch follows t_i without x_i, which is token-level
    verification of the same tokens as point masses. (A draft drawn with the same noise is
    correlated with the decisions; there the identity with plain sampling is what holds.)"""
    check_inputs(draft_tokens, draft_probs, target_probs)
    return token_verification_plan(draft_tokens, None, target_probs)


def tree_coupled_verification_plan(tokens: torch.Tensor, parents: torch.Tensor | Sequence[int],
                                   draft_probs: torch.Tensor | None,
                                   target_probs: torch.Tensor) -> TreeVerificationPlan:
    """As coupled_verification_plan for a tree: recursive rejection sampling of the same nodes as
    point masses (child c_j is taken with t's probability of c_j among the tokens its earlier
    siblings did not hold)."""
    check_tree(tokens, parents, draft_probs, target_probs)
    return tree_verification_plan(tokens, parents, None, target_probs)
