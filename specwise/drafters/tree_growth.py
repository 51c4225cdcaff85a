"""Growing a draft tree level by level: the part the draft-model and EAGLE drafters share.

Like EAGLE-2's dynamic trees, each level's children go to the frontier nodes whose
paths are most likely under the drafter. Unlike EAGLE-2 no drawn node is pruned
afterwards: under sampling, dropping a node for its own probability would bias
which tokens are proposed and break the without-replacement law tree verification
relies on, so each level's budget is split before drawing, by the parents' path
probabilities times their sorted child probabilities.

Greedy: a node's children are the drafter's top tokens (point masses). Sampling:
an ordered sample without replacement from the drafter's processed distribution at
the parent, reported as each child's probs row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from specwise.config import SamplingParams
from specwise.drafters.base import TreeProposal
from specwise.sampling import logits_to_probs, process_logits, sample_without_replacement, tree_seen_mask

# expand(level, tokens, parents, added, parent_rows) -> logits [len(added), V] after each new node:
# tokens/parents hold the whole tree so far, `added` the indices of the level just drawn and
# parent_rows each one's parent's row in the previous level's logits.
Expand = Callable[[int, list[int], list[int], list[int], list[int]], torch.Tensor]


def grow_tree(context: Sequence[int], root_logits: torch.Tensor, nodes: int, depth: int, branching: int,
              params: SamplingParams, generator: torch.Generator | None, expand: Expand,
              shape: Sequence[int] | None = None) -> TreeProposal:
    """A tree of at most `nodes` nodes, `depth` levels, `branching` children per node.

    root_logits [1, V]: the drafter's logits after the context (target width, -inf where
    it cannot propose). One `expand` call per level after the first. shape: a fixed tree,
    shape[i] children under every node of level i (fewer only where the drafter has fewer
    tokens it may propose), instead of giving each level's budget to the likeliest paths.
    """
    if shape is not None:
        depth, branching = min(depth, len(shape)), max(shape)
    vocab_size = root_logits.shape[-1]
    frontier_logits = root_logits
    tokens: list[int] = []
    parents: list[int] = []
    rows: list[torch.Tensor] = []
    path_logp: list[float] = []  # drafter log-probability of each node's path
    frontier = [-1]  # the nodes whose children this level draws (-1: the context)
    for level in range(depth):
        seen = None
        if params.repetition_penalty != 1.0:
            seen = tree_seen_mask(context, tokens, parents, vocab_size)[[f + 1 for f in frontier]]
        if params.greedy:
            probs = None
            logp = process_logits(frontier_logits, params, seen).log_softmax(dim=-1)  # [F, V] confidence
        else:
            probs = logits_to_probs(frontier_logits, params, seen)  # [F, V]: what children are drawn from
            logp = probs.log()
        top = torch.topk(logp, min(branching, logp.shape[-1]), dim=-1)  # [F, b], sorted per row
        prior = torch.tensor([0.0 if f < 0 else path_logp[f] for f in frontier], device=logp.device)[:, None]
        if shape is not None:
            room = torch.isfinite(top.values).sum(dim=-1).tolist()  # tokens each parent may still offer
            counts = [min(shape[level], r) for r in room]
        else:
            counts = children_per_parent(prior + top.values, math.ceil((nodes - len(tokens)) / (depth - level)))
        added: list[int] = []
        parent_rows: list[int] = []
        for row, (parent, count) in enumerate(zip(frontier, counts)):
            if count == 0:
                continue
            if probs is None:
                children = top.indices[row, :count]
            else:
                # Level L's children take position len(context) + L: with position-keyed noise (coupled
                # verification) they are the first finishers of the race the target runs there.
                children = sample_without_replacement(probs[row], count, generator, position=len(context) + level)
                rows.extend([probs[row]] * len(children))
            for child in children.tolist():
                added.append(len(tokens))
                parent_rows.append(row)
                tokens.append(child)
                parents.append(parent)
                path_logp.append(float(prior[row, 0]) + float(logp[row, child]))
        frontier = added
        if not frontier or len(tokens) >= nodes or level + 1 == depth:
            break
        frontier_logits = expand(level, tokens, parents, added, parent_rows)  # [F, V]
    return TreeProposal(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long),
                        None if params.greedy else torch.stack(rows))  # probs [n, V]


def children_per_parent(estimates: torch.Tensor, budget: int) -> list[int]:
    """How many children each frontier node gets: the `budget` best (parent, rank) slots by
    estimated path log-probability ([F, b], rows sorted; -inf where no token is left).
    Rows are sorted, so a parent's chosen slots are always its first ones."""
    flat = estimates.flatten()
    take = min(budget, int(torch.isfinite(flat).sum()))
    counts = [0] * estimates.shape[0]
    if take > 0:
        for index in torch.topk(flat, take).indices.tolist():
            counts[index // estimates.shape[1]] += 1
    return counts
