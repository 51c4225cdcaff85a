"""The verification rules as readable float64 loops on the host: the independent reference
that tests/test_verify_equivalence.py compares specwise.verify with.

Written position by position and node by node, the way the rules are stated in
docs/DESIGN.md, sharing no arithmetic with specwise.verify (only its plan and result types,
and specwise.sampling.sample for the committed token). Inputs are assumed well-formed: the
equivalence tests feed only valid ones, and input checks are tested on specwise.verify itself.
The draws are the engine's: one uniform per position or node, then one for the committed token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specwise.sampling import sample
from specwise.verify import TreeVerificationPlan, TreeVerifyResult, VerificationPlan, VerifyResult


def _float64_rows(probs: torch.Tensor, name: str) -> tuple[torch.Tensor, list[float]]:
    """A float64 copy of probs (unnormalized) and its row sums."""
    rows = probs.detach().to(torch.float64, copy=True)  # [m, V]
    sums = rows.sum(dim=1).tolist()
    if rows.numel() and (not all(0.0 < s < math.inf for s in sums) or float(rows.min()) < 0.0):
        raise ValueError(f"{name} must hold probabilities: finite, non-negative, every row with positive mass")
    return rows, sums


def _clipped_ratio(num: float, den: float) -> float:
    """min(1, num / den); den == 0 reads as an infinite ratio unless num == 0 too."""
    if num <= 0.0:
        return 0.0
    if num >= den:
        return 1.0
    return num / den


# --- chains --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Step:
    tokens: list[int]  # x_1..x_k
    target_probs: torch.Tensor  # [k + 1, V] as given
    target: torch.Tensor  # [k + 1, V] float64, unnormalized; rows 0..k-1 become the residuals
    target_sums: list[float]
    draft: torch.Tensor | None  # [k, V] float64, unnormalized; None: point masses
    draft_sums: list[float]
    target_at_draft: list[float]  # t_i(x_i), normalized
    draft_at_draft: list[float]  # d_i(x_i), normalized


def _prepare(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor) -> _Step:
    tokens = draft_tokens.tolist()
    k = len(tokens)
    target, target_sums = _float64_rows(target_probs, "target_probs")
    t_x = [float(target[i, x]) / target_sums[i] for i, x in enumerate(tokens)]
    if draft_probs is None:
        draft, draft_sums, d_x = None, [1.0] * k, [1.0] * k
    else:
        draft, draft_sums = _float64_rows(draft_probs, "draft_probs")
        d_x = [float(draft[i, x]) / draft_sums[i] for i, x in enumerate(tokens)]
    return _Step(tokens, target_probs.detach(), target, target_sums, draft, draft_sums, t_x, d_x)


def _residuals(step: _Step, weights: list[float]) -> list[float]:
    """Rows i < k of step.target become max(w_i t_i - d_i, 0) (scaled by the draft's row sum);
    returns their masses with t_i, d_i normalized. A row of zero mass falls back to t_i."""
    masses = []
    for i, w in enumerate(weights):
        row = step.target[i]  # [V] a view
        row.mul_(w * step.draft_sums[i] / step.target_sums[i])
        if step.draft is None:
            x = step.tokens[i]
            row[x] = max(float(row[x]) - 1.0, 0.0)
        else:
            row.sub_(step.draft[i]).clamp_min_(0.0)
        masses.append(float(row.sum()) / step.draft_sums[i])
        if masses[-1] <= 0.0:
            row.copy_(step.target_probs[i])
    return masses


def _token_plan(step: _Step) -> VerificationPlan:
    accept = [_clipped_ratio(t, d) for t, d in zip(step.target_at_draft, step.draft_at_draft)]
    num_accepted = []
    reach = 1.0  # P(x_1..x_j all accepted)
    for a in accept:
        num_accepted.append(reach * (1.0 - a))
        reach *= a
    num_accepted.append(reach)
    _residuals(step, [1.0] * len(accept))
    return VerificationPlan(torch.tensor(accept, dtype=torch.float64),
                            torch.tensor(num_accepted, dtype=torch.float64), step.target)


def _block_plan(step: _Step) -> VerificationPlan:
    k = len(step.tokens)
    weights = [1.0]  # w_0..w_k
    for t, d in zip(step.target_at_draft, step.draft_at_draft):
        weights.append(_clipped_ratio(weights[-1] * t, d))
    r = _residuals(step, weights[:k])  # r_0..r_{k-1}
    h = []  # h_1..h_k
    for i in range(1, k):
        den = r[i] + 1.0 - weights[i]
        h.append(r[i] / den if den > 0 else 1.0)
    if k:
        h.append(weights[k])
    num_accepted = [0.0] * (k + 1)  # P(j accepted) = h_j * prod_{i > j} (1 - h_i), with h_0 = 1
    none_later = 1.0
    for j in range(k, 0, -1):
        num_accepted[j] = h[j - 1] * none_later
        none_later *= 1.0 - h[j - 1]
    num_accepted[0] = none_later
    return VerificationPlan(torch.tensor(h, dtype=torch.float64),
                            torch.tensor(num_accepted, dtype=torch.float64), step.target)


def token_verification_plan(draft_tokens, draft_probs, target_probs) -> VerificationPlan:
    return _token_plan(_prepare(draft_tokens, draft_probs, target_probs))


def block_verification_plan(draft_tokens, draft_probs, target_probs) -> VerificationPlan:
    return _block_plan(_prepare(draft_tokens, draft_probs, target_probs))


def _draw(step: _Step, plan: VerificationPlan, generator, last_hit: bool) -> VerifyResult:
    k = len(step.tokens)
    uniforms = torch.rand(k, generator=generator, dtype=torch.float64).tolist()
    limits = plan.position_probs.tolist()
    if last_hit:  # block: the largest i with eta_i < h_i, or 0
        accepted = next((i for i in range(k, 0, -1) if uniforms[i - 1] < limits[i - 1]), 0)
    else:  # token-level: the first i with u_i >= a_i, or k
        accepted = next((i for i, (u, a) in enumerate(zip(uniforms, limits)) if u >= a), k)
    next_token = sample(plan.next_token_weights[accepted], generator)
    return VerifyResult(step.tokens[:accepted] + [next_token], accepted, k)


def verify_tokens(draft_tokens, draft_probs, target_probs, generator=None) -> VerifyResult:
    step = _prepare(draft_tokens, draft_probs, target_probs)
    return _draw(step, _token_plan(step), generator, last_hit=False)


def verify_block(draft_tokens, draft_probs, target_probs, generator=None) -> VerifyResult:
    step = _prepare(draft_tokens, draft_probs, target_probs)
    return _draw(step, _block_plan(step), generator, last_hit=True)


# --- trees ---------------------------------------------------------------------------------


def _children(parents: list[int]) -> list[list[int]]:
    """The nodes under each row (0: the root, i + 1: node i), in drawn order."""
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        children[p + 1].append(i)
    return children


def _try_sibling(t: torch.Tensor, mass: float, x: int, draft_row: torch.Tensor, draft_sum: float,
                 tried: list[int]) -> tuple[float, float]:
    """Accept x with min(1, t(x) / d_j(x)), d_j the draft row without the earlier siblings'
    tokens; t (in place) becomes max(t - d_j, 0) up to a factor. Returns P(accept) and t's mass."""
    removed = sorted(set(tried))
    left = draft_sum - (float(draft_row[removed].sum()) if removed else 0.0)
    if left <= 0.0:  # no draft mass left (a broken contract): read d_j as zero
        return _clipped_ratio(float(t[x]) / mass, 0.0), mass
    d_x = 0.0 if x in removed else float(draft_row[x]) / left
    accept = _clipped_ratio(float(t[x]) / mass, d_x)
    residual = t.sub(draft_row, alpha=mass / left)  # [V] mass * (t / mass - d_j)
    if removed:
        residual[removed] = t[removed]
    residual_mass = float(residual.clamp_min_(0.0).sum())
    if residual_mass <= 0.0:  # t == d_j: rejection has probability zero; keep t
        return accept, mass
    t.copy_(residual)
    return accept, residual_mass


def tree_verification_plan(tokens, parents, draft_probs, target_probs) -> TreeVerificationPlan:
    token_list, parent_list = tokens.tolist(), [int(p) for p in parents]
    n = len(token_list)
    children = _children(parent_list)
    weights, target_sums = _float64_rows(target_probs, "target_probs")  # [n + 1, V]
    draft, draft_sums = (None, [1.0] * n) if draft_probs is None else _float64_rows(draft_probs, "draft_probs")
    accept = [0.0] * n
    for row, kids in enumerate(children):
        t, mass = weights[row], target_sums[row]  # a view: the final residual lands in the plan
        tried: list[int] = []
        for child in kids:
            x = token_list[child]
            if draft is None:
                accept[child] = _clipped_ratio(float(t[x]) / mass, 1.0)
                if accept[child] < 1.0:
                    t[x] = 0.0  # max(t - one-hot(x), 0)
                    mass = float(t.sum())
            else:
                accept[child], mass = _try_sibling(t, mass, x, draft[child], draft_sums[child], tried)
            tried.append(x)
    reach = [1.0] + [0.0] * n
    end = [0.0] * (n + 1)
    for row, kids in enumerate(children):  # parents precede children, so reach[row] is final here
        none_yet = reach[row]
        for child in kids:
            reach[child + 1] = none_yet * accept[child]
            none_yet *= 1.0 - accept[child]
        end[row] = none_yet
    return TreeVerificationPlan(torch.tensor(accept, dtype=torch.float64), torch.tensor(reach, dtype=torch.float64),
                                torch.tensor(end, dtype=torch.float64), weights)


def verify_tree(tokens, parents, draft_probs, target_probs, generator=None) -> TreeVerifyResult:
    token_list, parent_list = tokens.tolist(), [int(p) for p in parents]
    plan = tree_verification_plan(tokens, parents, draft_probs, target_probs)
    uniforms = torch.rand(len(token_list), generator=generator, dtype=torch.float64).tolist()
    accept = plan.accept_probs.tolist()
    children = _children(parent_list)
    path: list[int] = []
    while True:  # the first accepted child of the path's last node, until there is none
        row = path[-1] + 1 if path else 0
        node = next((c for c in children[row] if uniforms[c] < accept[c]), None)
        if node is None:
            break
        path.append(node)
    next_token = sample(plan.next_token_weights[path[-1] + 1 if path else 0], generator)
    return TreeVerifyResult([token_list[i] for i in path] + [next_token], len(path), len(token_list), path)
