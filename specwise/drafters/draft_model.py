"""An independent small causal LM as drafter (Leviathan et al. 2023).

It shares the target's tokenizer, keeps its own KV cache across steps and, at
each proposal, rolls the cache back to the longest prefix it shares with the
new context and feeds only the rest: after a step that is the accepted tokens
plus the recovered or bonus token, never the whole context.
Under sampling it draws each token from the same processing the target uses
(`specwise.sampling`) and reports that exact distribution.

Trees (`propose_tree`) grow level by level, like EAGLE-2's dynamic trees: each
level's children go to the frontier nodes whose paths are most likely under the
drafter, one drafter pass (`forward_tree`) per level. Unlike EAGLE-2 no drawn
node is pruned afterwards: under sampling, dropping a node for its own
probability would bias which tokens are proposed and break the without-replacement
law tree verification relies on, so each level's budget is spent before drawing,
by the parents' path probabilities times their sorted child probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence

import math

import torch

from specwise.config import SamplingParams
from specwise.drafters.base import DraftProposal, DrafterContext, TreeProposal, register_drafter
from specwise.models.runner import ModelRunner, TreeRunner
from specwise.sampling import (draft_token, logits_to_probs, process_logits, sample_without_replacement,
                               seen_token_mask, tree_seen_mask)
from specwise.verify.result import VerifyResult


class VocabularyMismatchError(ValueError):
    """The drafter's tokens do not mean the same strings as the target's."""


def check_same_vocabulary(target_tokenizer, draft_tokenizer, target_name: str, draft_name: str) -> None:
    """Refuse a drafter whose tokenizer maps any token differently from the target's."""
    if target_tokenizer is None or draft_tokenizer is None:
        return
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        differing = len(set(target_vocab.items()) ^ set(draft_vocab.items()))
        raise VocabularyMismatchError(
            f"drafter {draft_name!r} has a different vocabulary from target {target_name!r} "
            f"({len(draft_vocab)} vs {len(target_vocab)} tokens, {differing} entries differ); "
            "a draft model must share the target's tokenizer: pick one from the same model family, "
            "or use the 'ngram' drafter"
        )


class DraftModelDrafter:
    """Drafts autoregressively with a small LM over its own rollback-able cache."""

    name = "draft-model"

    def __init__(self, runner: ModelRunner, vocab_size: int) -> None:
        self.runner = runner
        self.vocab_size = vocab_size  # the target's logits width
        self._cached: list[int] = []
        self._sampling = SamplingParams()
        self._generator: torch.Generator | None = None

    def start(self, prompt_ids: Sequence[int], sampling: SamplingParams,
              generator: torch.Generator) -> None:
        self._sampling = sampling
        self._generator = generator
        # The cache is kept: a new prompt that shares a prefix with the last one reuses it.

    def _sync(self, context: Sequence[int]) -> torch.Tensor:
        """Bring the cache to `context` and return the logits after it ([vocab])."""
        limit = min(len(self._cached), len(context) - 1)  # feed at least one token to get logits
        common = 0
        if limit > 0:
            same = torch.as_tensor(self._cached[:limit]) == torch.as_tensor(list(context[:limit]))
            common = limit if bool(same.all()) else int((~same).nonzero()[0])
        self.runner.rollback(self.runner.length - common)
        logits = self.runner.forward(context[common:])
        self._cached = list(context)
        return logits[-1]

    def _fit_width(self, logits: torch.Tensor) -> torch.Tensor:
        """Make the drafter's logits as wide as the target's (padding rows of the embedding differ)."""
        width = logits.shape[-1]
        if width > self.vocab_size:
            return logits[..., :self.vocab_size]
        if width < self.vocab_size:
            pad = logits.new_full((*logits.shape[:-1], self.vocab_size - width), float("-inf"))
            return torch.cat([logits, pad], dim=-1)
        return logits

    def propose(self, context: Sequence[int], k: int) -> DraftProposal:
        if k <= 0:
            return DraftProposal.empty()
        params = self._sampling
        logits = self._sync(context)
        seen = None
        if params.repetition_penalty != 1.0:
            seen = seen_token_mask(context, [], self.vocab_size)[0]
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(k):
            logits = self._fit_width(logits)
            token, probs = draft_token(logits, params, seen, self._generator)
            if probs is not None:
                rows.append(probs)  # [V]: exactly what the token was drawn from
            tokens.append(token)
            if seen is not None:
                seen = seen.clone()
                seen[token] = True
            if i + 1 < k:
                logits = self.runner.forward([token])[-1]
                self._cached.append(token)
        draft_probs = None if params.greedy else torch.stack(rows)  # [k, V]
        return DraftProposal(torch.tensor(tokens, dtype=torch.long), draft_probs)

    def propose_tree(self, context: Sequence[int], nodes: int, depth: int, branching: int) -> TreeProposal:
        """A tree of at most `nodes` nodes, `depth` levels and `branching` children per node.

        Greedy: children are the drafter's top tokens (point masses). Sampling: children
        are an ordered sample without replacement from the drafter's processed distribution
        at their parent, which is reported as their probs row.
        """
        if nodes <= 0 or depth <= 0 or branching <= 0:
            return TreeProposal.empty()
        if not isinstance(self.runner, TreeRunner):
            raise ValueError(f"tree drafting needs a draft-model runner with forward_tree and keep; "
                             f"{type(self.runner).__name__} has none")
        params = self._sampling
        frontier_logits = self._fit_width(self._sync(context))[None]  # [1, V]
        base = self.runner.length
        tokens: list[int] = []
        parents: list[int] = []
        rows: list[torch.Tensor] = []
        path_logp: list[float] = []  # drafter log-probability of each node's path
        frontier = [-1]  # the nodes whose children this level draws (-1: the context)
        for level in range(depth):
            seen = None
            if params.repetition_penalty != 1.0:
                seen = tree_seen_mask(context, tokens, parents, self.vocab_size)[[f + 1 for f in frontier]]
            if params.greedy:
                probs = None
                logp = process_logits(frontier_logits, params, seen).log_softmax(dim=-1)  # [F, V] confidence
            else:
                probs = logits_to_probs(frontier_logits, params, seen)  # [F, V]: what children are drawn from
                logp = probs.log()
            top = torch.topk(logp, min(branching, logp.shape[-1]), dim=-1)  # [F, b], sorted per row
            prior = torch.tensor([0.0 if f < 0 else path_logp[f] for f in frontier])[:, None]
            counts = _children_per_parent(prior + top.values, math.ceil((nodes - len(tokens)) / (depth - level)))
            added: list[int] = []
            for row, (parent, count) in enumerate(zip(frontier, counts)):
                if count == 0:
                    continue
                if probs is None:
                    children = top.indices[row, :count]
                else:
                    children = sample_without_replacement(probs[row], count, self._generator)
                    rows.extend([probs[row]] * len(children))
                for child in children.tolist():
                    added.append(len(tokens))
                    tokens.append(child)
                    parents.append(parent)
                    path_logp.append(float(prior[row, 0]) + float(logp[row, child]))
            frontier = added
            if not frontier or len(tokens) >= nodes or level + 1 == depth:
                break
            # One pass gives the new frontier's next-token logits: over the new level only where
            # the runner can grow a cached tree, else over the whole tree so far.
            if getattr(self.runner, "can_extend_trees", False):
                start = frontier[0]  # the level's nodes are the last ones added, in order
                logits = self.runner.forward_tree(tokens[start:], parents[start:], extend=start > 0)
            else:
                self.runner.rollback(self.runner.length - base)
                logits = self.runner.forward_tree(tokens, parents)[frontier]
            frontier_logits = self._fit_width(logits)  # [F, V]
        self.runner.rollback(self.runner.length - base)  # the lazy prefix sync expects the context only
        return TreeProposal(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long),
                            None if params.greedy else torch.stack(rows))  # probs [n, V]

    def observe(self, result: VerifyResult) -> None:
        pass  # rollback happens lazily in _sync, against the context actually committed


def _children_per_parent(estimates: torch.Tensor, budget: int) -> list[int]:
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


def _factory(ctx: DrafterContext) -> DraftModelDrafter:
    from specwise.models.catalog import DEFAULT_DRAFTER
    from specwise.models.loading import LoadedModel, load_model

    model = ctx.options.get("model", DEFAULT_DRAFTER)
    quantize = ctx.options.get("quantize")
    if isinstance(model, LoadedModel) and quantize:
        if model.path is None:
            raise ValueError("quantize needs a drafter loaded by name or path; for a model in memory, "
                             "apply specwise.models.quantize.quantize_int8 to a copy yourself")
        model = str(model.path)  # a separate quantized copy; the float drafter stays as it is
    if not isinstance(model, LoadedModel):
        model = load_model(model, ctx.options.get("dtype") or ctx.target.dtype, quantize=quantize)
    check_same_vocabulary(ctx.target.tokenizer, model.tokenizer, ctx.target.name, model.name)
    if model.tokenizer is None or ctx.target.tokenizer is None:
        width = model.model.get_output_embeddings().out_features
        if width != ctx.vocab_size:
            raise VocabularyMismatchError(
                f"drafter {model.name!r} has {width} output tokens but target {ctx.target.name!r} "
                f"has {ctx.vocab_size}; a draft model must share the target's vocabulary")
    return DraftModelDrafter(model.runner(ctx.spec.runner), ctx.vocab_size)


register_drafter("draft-model", _factory)
