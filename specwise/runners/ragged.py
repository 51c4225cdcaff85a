"""One scoring pass over the blocks of several sequences, each in its own runner's cache.

Continuous batching (specwise.batching) gathers every active request's block (its
last committed token plus its draft chain or tree) into one pass, so the weights
are read once for all of them. The rows are flattened with no padding: each row
carries its own position, writes its key and value into its own sequence's
cache, and attends to exactly the entries it would see in a pass of its sequence
alone, in the same order. On the GGUF runner's native pass a row's result does
not depend on the other rows of the pass (the RAGGED kind, specwise.runners.passes),
so each sequence gets bit for bit the logits it would get alone. Each sequence's
share of the pass goes through its runner's pass interface (layout, embed, reserve,
append, logits), the very steps its own forward / forward_tree takes.

Runners without the native pass (bfloat16 lean, Hugging Face) score each
block with their own pass, one after the other: correct, and no faster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from specwise.runners.checks import check_hidden_layers
from specwise.runners.passes import Pass, choose_ragged
from specwise.threads import pass_threads

if TYPE_CHECKING:
    from specwise.runners.lean import BlockLayout


@dataclass(frozen=True)
class Block:
    """Tokens one sequence appends and scores: a chain (parents None) or a tree (parents[i] < i,
    -1 for a child of the last cached token), as in forward / forward_tree."""

    ids: Sequence[int]
    parents: Sequence[int] | None = None
    hidden_layers: Sequence[int] | None = None
    logits: bool = True  # False: a chain read for its cache entries only (a prompt chunk beside the blocks)


def ragged_pass(runners: Sequence[object]) -> Pass | None:
    """The one pass these runners' blocks can be scored in together (specwise.runners.passes), or
    None where each block must run its own runner's pass."""
    from specwise.runners.lean import LeanRunner

    if not runners or not all(isinstance(r, LeanRunner) for r in runners):
        return None
    first = runners[0]
    return choose_ragged(first.means, one_model=all(r.model is first.model for r in runners),
                         restricted=any(r.output_ids is not None for r in runners))


def can_score_together(runners: Sequence[object]) -> bool:
    """True when these runners share one model whose layers run in the compiled GGUF pass."""
    return ragged_pass(runners) is not None


@torch.inference_mode()
def score_together(runners: Sequence[object], blocks: Sequence[Block]) -> list[torch.Tensor | None]:
    """Append block i to runners[i]'s cache and return each block's logits [len(ids), vocab] (float32),
    exactly as runners[i].forward(ids) / forward_tree(ids, parents) would (None for a block read
    without logits, as forward(ids, logits=False)); in one pass where the runners allow it
    (can_score_together), else one pass per block. Rows being independent in that pass, a block
    read without logits beside the others writes the entries its own prefill would."""
    if len(runners) != len(blocks):
        raise ValueError(f"{len(runners)} runners but {len(blocks)} blocks")
    if len({id(r) for r in runners}) != len(runners):
        raise ValueError("each block needs a runner of its own: one pass cannot append two blocks to one cache")
    if not can_score_together(runners):
        return [_alone(runner, block) for runner, block in zip(runners, blocks)]
    live = [i for i, block in enumerate(blocks) if len(block.ids)]
    out: list[torch.Tensor | None] = [None] * len(blocks)
    for i, block in enumerate(blocks):
        if not len(block.ids):
            out[i] = _alone(runners[i], block)
        elif not block.logits and (block.parents is not None or block.hidden_layers is not None):
            raise ValueError("a block read without logits is a chain without hidden layers")
    if live:
        with pass_threads():  # fewer threads while other programs hold cores (specwise/threads.py)
            scored = _one_pass([runners[i] for i in live], [blocks[i] for i in live])
        for i, logits in zip(live, scored):
            out[i] = logits
    return out


def _alone(runner, block: Block) -> torch.Tensor | None:
    extra = {} if block.hidden_layers is None else {"hidden_layers": block.hidden_layers}
    if not block.logits:
        runner.forward(block.ids, logits=False, **extra)
        return None
    if block.parents is None:
        return runner.forward(block.ids, **extra)
    return runner.forward_tree(block.ids, block.parents, **extra)


def _one_pass(runners: Sequence, blocks: Sequence[Block]) -> list[torch.Tensor | None]:
    """Every block's rows in one run_ragged call, each sequence's before and after through its
    runner's pass interface, as its own pass does them."""
    from specwise.runners.lean import layers_of

    first = runners[0]
    layouts = [runner.layout(block.ids, block.parents) for runner, block in zip(runners, blocks)]
    order = sorted(frozenset().union(*(check_hidden_layers(block.hidden_layers, len(runner.layers))
                                       for runner, block in zip(runners, blocks))))
    hidden, cos, sin = first.embed([int(t) for block in blocks for t in block.ids],
                                   torch.cat([layout.positions for layout in layouts]))  # [rows, hidden]
    for runner, layout in zip(runners, layouts):
        runner.reserve(layout.start + layout.rows)
    owners, slots, counts, seen = zip(*(_rows(owner, layout) for owner, layout in enumerate(layouts)))
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cat(counts).cumsum(0)])
    captured = first.decoder_pass.run_ragged(
        hidden, [runner.cache for runner in runners], torch.cat(owners), torch.cat(slots), offsets,
        torch.cat(seen).to(torch.int32), cos, sin, order)  # hidden updated in place
    # Logits of the rows that want them only (the output layer is row-independent too).
    wanted = [block.logits for block, layout in zip(blocks, layouts) for _ in range(layout.rows)]
    logits = None if not any(wanted) else first.logits(
        hidden if all(wanted) else hidden[torch.tensor(wanted)])  # [wanted rows, vocab]
    out: list[torch.Tensor | None] = []
    row = kept = 0
    for runner, block, layout in zip(runners, blocks, layouts):
        n = layout.rows
        features = None if block.hidden_layers is None else layers_of(captured[row:row + n], order,
                                                                       block.hidden_layers)
        runner.append(layout, features)  # a tree can be extended or kept exactly as after forward_tree
        out.append(logits[kept:kept + n] if block.logits else None)
        kept += n if block.logits else 0
        row += n
    return out


def _rows(owner: int, layout: BlockLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A block's rows for run_ragged: their owner and cache slot [n] each, how many entries each row
    attends to [n], and those entries, row after row, each row's in cache order."""
    n, start = layout.rows, layout.start
    slots = torch.arange(start, start + n)
    if layout.visible is None:  # a chain: row i sees slots 0..start + i
        counts = slots + 1
        seen = torch.cat([torch.arange(count) for count in counts.tolist()])
    else:
        counts = layout.visible.sum(1)
        seen = layout.visible.nonzero()[:, 1]  # row-major: each row's slots ascending
    return torch.full((n,), owner, dtype=torch.long), slots, counts, seen
