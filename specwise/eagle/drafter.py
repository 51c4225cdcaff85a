"""The EAGLE drafter: drafts with the head over the target's own hidden states.

The engine records the target's states at the head's `feature_layers` in every
target pass and hands over those of the tokens that stay committed
(`add_features`), so after each step the drafter holds the target's states for
every context token but the last, exactly what the head's positions need: head
position i reads the states after c_i and the embedding of c_{i+1}. Like the
draft-model drafter it keeps its own cache in step with the context lazily, by the
longest common prefix; draft positions (fed the head's own states) are always
dropped again, since after verification the target's real states replace them.

Draft logits cover the draft vocabulary; they are spread to the target's width
(-inf elsewhere) before the shared processing, so a sampled token's reported
distribution is exactly the one it was drawn from, zero outside the draft vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specwise.config import SamplingParams
from specwise.drafters.base import DraftProposal, DrafterContext, TreeProposal, register_drafter
from specwise.drafters.chain import common_prefix_length, draft_chain
from specwise.drafters.tree_growth import grow_tree
from specwise.eagle.head import EagleHead, HeadCache
from specwise.runners.tree_layout import tree_layout
from specwise.verify.result import VerifyResult


class MissingFeaturesError(RuntimeError):
    """The drafter was asked to draft without the target's hidden states for the context."""


class EagleDrafter:
    """Chains and trees from an EagleHead; needs the engine's feature hand-off."""

    name = "eagle"

    def __init__(self, head: EagleHead, embeddings: torch.Tensor, vocab_size: int) -> None:
        """head: trained for this target; embeddings: the target's input embedding [V, H];
        vocab_size: the target's logits width (draft probs have this width)."""
        self.head = head.eval().requires_grad_(False)
        self.embeddings = embeddings
        self.vocab_size = vocab_size
        self.feature_layers: tuple[int, ...] = head.config.feature_layers
        self.dtype = head.fc.weight.dtype
        self._draft_ids = head.draft_to_target.clone()
        self._features = torch.empty(0, head.config.hidden_size, dtype=self.dtype)  # fused, one row per position
        self._cache = HeadCache(head.config, self.dtype, head.fc.weight.device)
        self._cached: list[int] = []  # tokens c_0..c_m behind head cache positions 0..m-1
        self._sampling = SamplingParams()
        self._generator: torch.Generator | None = None

    # -- the engine's side -------------------------------------------------------------------------

    def start(self, prompt_ids: Sequence[int], sampling: SamplingParams, generator: torch.Generator) -> None:
        self._sampling = sampling
        self._generator = generator
        self._features = self._features[:0]  # the engine hands the prompt's states over next

    def forget(self) -> None:
        """Empty the head's cache: the next proposal reads the whole context (see base.forget_prompts)."""
        self._cache.rollback_to(0)
        self._cached = []

    @torch.inference_mode()
    def add_features(self, start: int, hidden: torch.Tensor) -> None:
        """The target's states [n, layers, H] of context positions start..start + n - 1."""
        if start > self._features.shape[0]:
            raise MissingFeaturesError(f"features handed over from position {start}, but only "
                                       f"{self._features.shape[0]} positions are known")
        fused = self.head.fuse(hidden.to(self.dtype))  # [n, H]
        self._features = torch.cat([self._features[:start], fused])

    def observe(self, result: VerifyResult) -> None:
        pass  # the committed tokens' features arrive through add_features; the cache syncs lazily

    # -- drafting ------------------------------------------------------------------------------------

    def _embed(self, tokens: Sequence[int]) -> torch.Tensor:
        return self.embeddings[torch.as_tensor(list(tokens), dtype=torch.long)].to(self.dtype)

    def _sync(self, context: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Bring the head cache to the context's n - 1 positions; the last one's (logits [Vd], state [H])."""
        n = len(context)
        if self._features.shape[0] < n - 1:
            raise MissingFeaturesError(
                f"the eagle drafter has the target's hidden states for {self._features.shape[0]} positions "
                f"but the context needs {n - 1}; it must run in an engine that hands them over (add_features)")
        common = common_prefix_length(self._cached, context, n)
        valid = min(max(common - 1, 0), n - 2)  # head positions still right; feed at least one
        self._cache.rollback_to(min(valid, self._cache.length))
        valid = self._cache.length
        positions = torch.arange(valid, n - 1)
        logits, hidden = self.head.forward_cached(self._embed(context[valid + 1:n]), self._features[valid:n - 1],
                                                  positions, self._cache)
        self._cached = list(context)
        return logits[-1], hidden[-1]

    def _widen(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., Vd] -> target-width logits [..., V], -inf outside."""
        wide = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf")).float()
        wide[..., self._draft_ids] = logits.float()
        return wide

    @torch.inference_mode()
    def propose(self, context: Sequence[int], k: int) -> DraftProposal:
        if k <= 0 or len(context) < 2:
            return DraftProposal.empty()
        n = len(context)
        logits, state = self._sync(context)

        def next_logits(i: int, token: int) -> torch.Tensor:
            nonlocal state  # draft token i + 1 reads the head's own output state after token i
            step_logits, step_state = self.head.forward_cached(
                self._embed([token]), state[None], torch.tensor([n - 1 + i]), self._cache)
            state = step_state[0]
            return self._widen(step_logits[0])

        proposal = draft_chain(self._widen(logits), context, k, self._sampling, self._generator, next_logits)
        self._cache.rollback_to(n - 1)  # draft positions hold the head's own states: never reused
        return proposal

    @torch.inference_mode()
    def propose_tree(self, context: Sequence[int], nodes: int, depth: int, branching: int,
                     shape: Sequence[int] | None = None) -> TreeProposal:
        """Level by level as the draft-model drafter grows trees (one head pass per level); a
        node's children read its own output state. Greedy: top tokens as point masses;
        sampling: an ordered sample without replacement, its distribution the probs row."""
        if nodes <= 0 or depth <= 0 or branching <= 0 or len(context) < 2:
            return TreeProposal.empty()
        base = len(context) - 1  # head cache length after the sync
        logits, state = self._sync(context)
        states = state[None]  # [F, H]: the frontier's output states, which its children read
        layout = None  # (visible, offsets) of the levels grown so far, extended level by level

        def expand(level: int, tokens: list[int], parents: list[int], added: list[int],
                   parent_rows: list[int]) -> torch.Tensor:
            # The new level at head position base + level; each node sees the context and its ancestors.
            nonlocal states, layout
            first = added[0]  # the new nodes are tokens[first:], after every earlier level's
            layout = tree_layout(parents[first:], layout if first else None)
            visible = layout[0]
            mask = torch.cat([torch.ones(len(added), base, dtype=torch.bool), visible[first:, :len(tokens)]], dim=1)
            level_logits, states = self.head.forward_cached(
                self._embed(tokens[first:]), states[parent_rows], torch.full((len(added),), base + level),
                self._cache, mask)
            return self._widen(level_logits)

        tree = grow_tree(context, self._widen(logits)[None], nodes, depth, branching, self._sampling,
                         self._generator, expand, shape)
        self._cache.rollback_to(base)
        return tree


def _factory(ctx: DrafterContext) -> EagleDrafter:
    from specwise.eagle.io import default_head_dir, head_path, load_head

    head = ctx.options.get("head")
    if head is None:
        default = default_head_dir(ctx.target.name)
        if not head_path(default).exists():
            # Named relative to specwise's home: a server repeats this message to its clients.
            name = default.name
            raise ValueError(f"the eagle drafter needs a trained head for {name!r} and none is installed "
                             f"(heads/{name}/ under $SPECWISE_HOME): train one with `specwise train-drafter "
                             f"--target {name} --minutes 60` (it lands there), or pass --drafter-option head=PATH")
        head = default
    model = ctx.target.model
    if ctx.target.device.type != "cpu":
        raise ValueError(f"the eagle drafter runs on the CPU only so far; the target is on {ctx.target.device}: "
                         "use device 'cpu' with it, or another drafter (draft-model, ngram) on the GPU")
    if not isinstance(head, EagleHead):
        head = load_head(head, model, ctx.target.name)
    embeddings = model.get_input_embeddings().weight
    head = head.to(device=embeddings.device, dtype=embeddings.dtype)
    return EagleDrafter(head, embeddings.detach(), ctx.vocab_size)


register_drafter("eagle", _factory)
