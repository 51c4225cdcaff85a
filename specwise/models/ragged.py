"""One scoring pass over the blocks of several sequences, each in its own runner's cache.

Continuous batching (specwise.batching) gathers every active request's block (its
last committed token plus its draft chain or tree) into one pass, so the weights
are read once for all of them. The rows are flattened with no padding: each row
carries its own position, writes its key and value into its own sequence's
cache, and attends to exactly the entries it would see in a pass of its sequence
alone, in the same order. On the GGUF runner's compiled pass a row's result does
not depend on the other rows of the pass (docs/DESIGN.md, "Numerics"), so each
sequence gets bit for bit the logits it would get alone.

Runners without the compiled pass (bfloat16 lean, Hugging Face) score each
block with their own pass, one after the other: correct, and no faster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specwise.kernels.gguf import kernel_path
from specwise.models.checks import check_hidden_layers, check_tree, check_window
from specwise.models.layers import rms_norm
from specwise.models.tree_layout import tree_layout


@dataclass(frozen=True)
class Block:
    """Tokens one sequence appends and scores: a chain (parents None) or a tree (parents[i] < i,
    -1 for a child of the last cached token), as in forward / forward_tree."""

    ids: Sequence[int]
    parents: Sequence[int] | None = None
    hidden_layers: Sequence[int] | None = None


def can_score_together(runners: Sequence[object]) -> bool:
    """True when these runners share one model whose layers run in the compiled GGUF pass."""
    from specwise.models.lean import LeanRunner

    if not runners or not all(isinstance(r, LeanRunner) for r in runners):
        return False
    first = runners[0]
    return (first.decoder_pass is not None and first.device.type == "cpu" and first._output is None
            and all(r.model is first.model for r in runners))


@torch.inference_mode()
def score_together(runners: Sequence[object], blocks: Sequence[Block]) -> list[torch.Tensor]:
    """Append block i to runners[i]'s cache and return each block's logits [len(ids), vocab] (float32),
    exactly as runners[i].forward(ids) / forward_tree(ids, parents) would; in one pass where the
    runners allow it (can_score_together), else one pass per block."""
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
    if live:
        for i, logits in zip(live, _one_pass([runners[i] for i in live], [blocks[i] for i in live])):
            out[i] = logits
    return out  # type: ignore[return-value]


def _alone(runner, block: Block) -> torch.Tensor:
    extra = {} if block.hidden_layers is None else {"hidden_layers": block.hidden_layers}
    if block.parents is None:
        return runner.forward(block.ids, **extra)
    return runner.forward_tree(block.ids, block.parents, **extra)


def _one_pass(runners: Sequence, blocks: Sequence[Block]) -> list[torch.Tensor]:
    first = runners[0]
    positions: list[int] = []
    slots: list[int] = []
    owners: list[int] = []
    offsets: list[int] = [0]
    seen: list[int] = []
    trees: list[tuple[int, torch.Tensor, list[int]] | None] = []
    wanted: set[int] = set()
    for owner, (runner, block) in enumerate(zip(runners, blocks)):
        if runner._keys is None:
            runner.reset()
        ids, start, n = [int(t) for t in block.ids], runner.length, len(block.ids)
        if min(ids) < 0 or max(ids) >= runner.embed_rows:
            raise ValueError(f"token ids must be in [0, {runner.embed_rows}); got {ids}")
        wanted |= check_hidden_layers(block.hidden_layers, len(runner.layers))
        if block.parents is None:
            check_window(start, n, runner.max_context)
            depth, visible = list(range(n)), None
            trees.append(None)
        else:
            check_tree(ids, block.parents, start, runner.max_context)
            visible, depth = tree_layout(block.parents)
            trees.append((start, visible, depth))
        runner._reserve(start + n)
        context = list(range(start))
        for i in range(n):
            positions.append(start + depth[i])
            slots.append(start + i)
            owners.append(owner)
            # The cached context, then the block's own rows this row may see: in cache order.
            mine = range(i + 1) if visible is None else visible[i].nonzero().flatten().tolist()
            seen.extend(context)
            seen.extend(start + j for j in mine)
            offsets.append(len(seen))
    device = first.device
    all_ids = torch.tensor([int(t) for block in blocks for t in block.ids], dtype=torch.long, device=device)
    hidden = first.embed_tokens(all_ids)[None]  # [1, rows, hidden]
    cos, sin = first.rotary(hidden, torch.tensor(positions, device=device)[None])
    rows = hidden[0].contiguous()  # updated in place
    order = sorted(wanted)
    captured = torch.empty(rows.shape[0], len(order), rows.shape[1]) if order else None
    first.decoder_pass._pass.run_ragged(
        rows, [(r._keys, r._values) for r in runners], torch.tensor(owners, dtype=torch.long),
        torch.tensor(slots, dtype=torch.long), torch.tensor(offsets, dtype=torch.long),
        torch.tensor(seen, dtype=torch.int32), cos[0], sin[0], order, captured, kernel_path())
    from specwise.models.lean import _apply

    logits = _apply(first.lm_head, rms_norm(rows[None], first.final_norm, first.eps))[0].float()
    out, row = [], 0
    for runner, block, tree in zip(runners, blocks, trees):
        n = len(block.ids)
        runner._length += n
        runner._tree = tree  # a tree can be extended or kept exactly as after forward_tree
        if block.hidden_layers is not None:
            runner.last_hidden = captured[row:row + n][:, [order.index(i) for i in block.hidden_layers]]
        out.append(logits[row:row + n])
        row += n
    return out
