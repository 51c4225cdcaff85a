"""An independent small causal LM as drafter (Leviathan et al. 2023).

It shares the target's tokenizer, keeps its own KV cache across steps and, at
each proposal, rolls the cache back to the longest prefix it shares with the
new context and feeds only the rest: after a step that is the accepted tokens
plus the recovered or bonus token, never the whole context.
Under sampling it draws each token from the same processing the target uses
(`specwise.sampling`) and reports that exact distribution.

Trees (`propose_tree`) grow level by level like EAGLE-2's dynamic trees
(specwise.drafters.tree_growth), one drafter pass (`forward_tree`) per level.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specwise.config import SamplingParams
from specwise.drafters.base import DraftProposal, DrafterContext, TreeProposal, register_drafter
from specwise.drafters.chain import common_prefix_length, draft_chain
from specwise.drafters.pairing import check_pairing, same_vocabulary
from specwise.drafters.tree_growth import grow_tree
from specwise.runners.protocols import ModelRunner, OutputRestrictingRunner, TreeExtendingRunner, TreeRunner
from specwise.verify.result import VerifyResult


class DraftModelDrafter:
    """Drafts autoregressively with a small LM over its own rollback-able cache."""

    name = "draft-model"

    def __init__(self, runner: ModelRunner, vocab_size: int, kept: Sequence[int] | None = None) -> None:
        """kept: the token ids this drafter may propose (specwise.drafters.vocab; None: all); each
        prompt's own tokens are added to them. Needs a runner with restrict_output (lean)."""
        self.runner = runner
        self.vocab_size = vocab_size  # the target's logits width
        self.kept = None if kept is None else frozenset(kept)
        if self.kept is not None and not isinstance(runner, OutputRestrictingRunner):
            raise ValueError(f"draft_vocab needs the lean runner (runner 'auto' or 'lean'); "
                             f"{type(runner).__name__} computes every token's logit")
        self._extends_trees = isinstance(runner, TreeExtendingRunner)  # trees grow a level per pass
        self._kept_now: frozenset[int] | None = None  # what the runner's output layer holds now
        self._cached: list[int] = []
        self._sampling = SamplingParams()
        self._generator: torch.Generator | None = None

    def start(self, prompt_ids: Sequence[int], sampling: SamplingParams,
              generator: torch.Generator) -> None:
        self._sampling = sampling
        self._generator = generator
        # The cache is kept: a new prompt that shares a prefix with the last one reuses it.
        if self.kept is not None:
            width = self.runner.vocab_size
            wanted = self.kept | {t for t in prompt_ids if 0 <= t < width}
            if wanted != self._kept_now:  # re-slice the output layer only when the set changes
                self.runner.restrict_output(sorted(wanted))  # kept_tokens are within width already
                self._kept_now = wanted
        if len(prompt_ids) > 1:
            # Prefill now, so that the first proposal's time is drafting only: adaptive k reads
            # draft seconds per token, and a prompt's prefill charged to 5 draft tokens would
            # make drafting look several times dearer than it is. The last prompt token is fed
            # again by the first proposal, which needs its logits.
            self._prefill(list(prompt_ids[:-1]))

    def forget(self) -> None:
        """Empty the cache: the next start reads its whole prompt (see base.forget_prompts)."""
        self.runner.reset()
        self._cached = []

    def _keep_common_prefix(self, ids: Sequence[int], most: int) -> int:
        """Roll the cache back to the longest prefix (at most `most` tokens) it shares with `ids`."""
        common = common_prefix_length(self._cached, ids, most)
        self.runner.rollback(self.runner.length - common)
        return common

    def _prefill(self, ids: list[int]) -> None:
        """Bring the cache to `ids` without computing any logits."""
        common = self._keep_common_prefix(ids, len(ids))
        if ids[common:]:
            self.runner.forward(ids[common:], logits=False)
        self._cached = ids

    def _sync(self, context: Sequence[int]) -> torch.Tensor:
        """Bring the cache to `context` and return the logits after it ([vocab])."""
        common = self._keep_common_prefix(context, len(context) - 1)  # feed at least one token for logits
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

        def next_logits(i: int, token: int) -> torch.Tensor:
            logits = self.runner.forward([token])[-1]
            self._cached.append(token)
            return self._fit_width(logits)

        return draft_chain(self._fit_width(self._sync(context)), context, k, self._sampling, self._generator,
                           next_logits)

    def propose_tree(self, context: Sequence[int], nodes: int, depth: int, branching: int,
                     shape: Sequence[int] | None = None) -> TreeProposal:
        """A tree of at most `nodes` nodes, `depth` levels and `branching` children per node
        (or of a fixed shape), grown level by level (specwise.drafters.tree_growth), one
        drafter pass per level."""
        if nodes <= 0 or depth <= 0 or branching <= 0:
            return TreeProposal.empty()
        if not isinstance(self.runner, TreeRunner):
            raise ValueError(f"tree drafting needs a draft-model runner with forward_tree and keep; "
                             f"{type(self.runner).__name__} has none")
        root = self._fit_width(self._sync(context))[None]  # [1, V]
        base = self.runner.length

        def expand(level: int, tokens: list[int], parents: list[int], added: list[int],
                   parent_rows: list[int]) -> torch.Tensor:
            # The new level's next-token logits: over that level only where the runner can grow
            # a cached tree, else over the whole tree so far.
            if self._extends_trees:
                start = added[0]  # the level's nodes are the last ones added, in order
                logits = self.runner.forward_tree(tokens[start:], parents[start:], extend=start > 0)
            else:
                self.runner.rollback(self.runner.length - base)
                logits = self.runner.forward_tree(tokens, parents)[added]
            return self._fit_width(logits)

        tree = grow_tree(context, root, nodes, depth, branching, self._sampling, self._generator, expand, shape)
        self.runner.rollback(self.runner.length - base)  # the lazy prefix sync expects the context only
        return tree

    def observe(self, result: VerifyResult) -> None:
        pass  # rollback happens lazily in _sync, against the context actually committed


def _factory(ctx: DrafterContext):
    """A DraftModelDrafter where the draft model shares the target's tokenizer, else a CrossVocabDrafter."""
    from specwise.drafters import cross_vocab_drafter
    from specwise.store.catalog import DEFAULT_DRAFTER
    from specwise.store.loading import LoadedModel, has_gguf_source, load_model, load_tokenizer

    model = ctx.options.get("model", DEFAULT_DRAFTER)
    quantize = ctx.options.get("quantize")
    if isinstance(model, LoadedModel) and quantize:
        if model.path is None:
            raise ValueError("quantize needs a drafter loaded by name or path; for a model in memory, "
                             "apply specwise.runners.int8.quantize_int8 to a copy yourself")
        # A separate copy; the loaded drafter stays as it is. Its GGUF blocks are found by its name.
        model = model.name if quantize == "gguf" else str(model.path)
    if not isinstance(model, LoadedModel):
        # The vocabularies first: settings a drafter of another vocabulary cannot take are refused before
        # any weights are read or converted.
        if not same_vocabulary(ctx.target.tokenizer, load_tokenizer(model)):
            cross_vocab_drafter.check_cross_vocab_settings(ctx, ctx.target.name, str(model))
        # Beside a target running its GGUF blocks, a draft model from a GGUF file runs its own
        # blocks too unless told otherwise: no dense copy of it is written.
        as_stored = quantize == "gguf" or (quantize is None and ctx.target.format == "gguf"
                                           and ctx.target.device.type == "cpu" and has_gguf_source(model))
        if as_stored:
            model = load_model(model, format="gguf")
        else:
            model = load_model(model, ctx.options.get("dtype") or ctx.target.dtype, quantize=quantize,
                               device=ctx.target.device)
    width = model.model.get_output_embeddings().out_features
    if not same_vocabulary(ctx.target.tokenizer, model.tokenizer):
        return cross_vocab_drafter.cross_vocab_drafter(ctx, model.runner(ctx.spec.runner), model.tokenizer,
                                                       ctx.target.name, model.name)
    check_pairing(ctx.target.tokenizer, ctx.vocab_size, model.tokenizer, width, ctx.target.name, model.name)
    return DraftModelDrafter(model.runner(ctx.spec.runner), ctx.vocab_size,
                             _kept_tokens(ctx, model, width))


def _kept_tokens(ctx: DrafterContext, model, width: int) -> list[int] | None:
    """The drafter's restricted vocabulary from options vocab=N (0: none) and vocab_file=PATH."""
    from specwise.drafters import vocab

    try:
        size = int(ctx.options.get("vocab") or 0)
    except (TypeError, ValueError):
        raise ValueError(f"draft_vocab must be an integer; got {ctx.options.get('vocab')!r}") from None
    if size <= 0:
        return None
    tokenizer = ctx.target.tokenizer or model.tokenizer
    if tokenizer is None:
        raise ValueError("draft_vocab needs the model's tokenizer: its special tokens and token list")
    ordered = vocab.find_token_list(tokenizer, ctx.options.get("vocab_file"))
    return vocab.kept_tokens(ordered, size, tokenizer.all_special_ids, width)


register_drafter("draft-model", _factory)
