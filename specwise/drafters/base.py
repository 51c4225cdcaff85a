"""The drafter protocols and the public registry of drafters by name.

A drafter proposes a block of tokens for a context and is told what the
verifier kept. Capabilities beyond that are protocols of their own, checked with
isinstance: a `TreeDrafter` can also propose a tree of candidates, a
`FeatureDrafter` drafts from the target's hidden states, a `SelfDrafter` drafts with the
target runner itself, a `PromptCachingDrafter`
keeps a cache across generations that can be emptied. To add a drafter: implement
`Drafter` and call `register_drafter("my-name", factory)`; the engine, CLI and
server then find it by name.

The built-in drafters register themselves when their modules are imported; the
registry imports those modules on first lookup, so that importing this module (or
the `specwise.drafters` package) does not pull in every drafter and what it needs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from specwise.config import SamplingParams, SpecConfig
from specwise.verify.result import VerifyResult

if TYPE_CHECKING:
    from specwise.store.loading import LoadedModel
    from specwise.runners.protocols import ModelRunner


@dataclass(frozen=True)
class DraftProposal:
    """A draft block.

    tokens: [k] long; k may be smaller than asked (even 0: nothing to propose).
    probs: [k, V] float, row i the exact distribution token i was sampled from
        (after the drafter's own processing), or None when the tokens were chosen
        deterministically (point masses; docs/DESIGN.md, "The losslessness contract", point 2).
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.numel())

    @staticmethod
    def empty() -> "DraftProposal":
        return DraftProposal(torch.empty(0, dtype=torch.long), None)


@dataclass(frozen=True)
class TreeProposal:
    """A draft tree, in the form verify_tree takes.

    tokens: [n] long, one token per node; parents: [n] long, parents[i] < i the node
        above node i, -1 for a child of the context. Siblings are in the order they
        were drawn (the order verification tries them).
    probs: [n, V] float, row i the drafter's processed distribution at node i's parent:
        the one node i and its earlier siblings were drawn from without replacement
        (not renormalized; verify_tree removes the earlier siblings), or None when the
        nodes were chosen deterministically (point masses).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.numel())

    @staticmethod
    def empty() -> "TreeProposal":
        return TreeProposal(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), None)

    def depths(self) -> list[int]:
        """Each node's depth: the draft tokens on its path, 1 for a child of the context."""
        depth: list[int] = []
        for parent in self.parents.tolist():
            depth.append(1 if parent < 0 else depth[parent] + 1)
        return depth

    @property
    def depth(self) -> int:
        """The tree's depth: its deepest node's (0 for an empty tree), at most SpecConfig.tree_depth."""
        return max(self.depths(), default=0)


@runtime_checkable
class Drafter(Protocol):
    """Anything that proposes tokens for the target to verify."""

    name: str

    def start(self, prompt_ids: Sequence[int], sampling: SamplingParams,
              generator: torch.Generator) -> None:
        """Begin a new generation (reset per-generation state such as a KV cache)."""

    def propose(self, context: Sequence[int], k: int) -> DraftProposal:
        """Propose up to k tokens to follow `context` (prompt + committed tokens)."""

    def observe(self, result: VerifyResult) -> None:
        """Feedback: what the verifier accepted of the last proposal."""


@runtime_checkable
class PromptCachingDrafter(Protocol):
    """A drafter whose cache keeps a prompt prefix across generations (draft model, EAGLE head)."""

    def forget(self) -> None:
        """Empty the cache: the next `start` reads its whole prompt."""


def forget_prompts(drafter: Drafter) -> None:
    """Drop what a drafter kept from earlier generations, so that its next `start` reads the
    whole prompt. Drafters with a cache keep a prompt prefix across generations, which
    serving wants; a benchmark does not, since the target re-reads every prompt and methods
    sharing one drafter would otherwise skip its prefill after the first."""
    if isinstance(drafter, PromptCachingDrafter):
        drafter.forget()


@runtime_checkable
class FreeDrafter(Drafter, Protocol):
    """A drafter whose proposals are point masses, cost next to nothing and leave its state as it was
    (n-gram lookup, suffix tries). Adaptive k may then ask it, in a plain step, for a one-token shadow
    draft that is never scored, to measure acceptance without a drafting step (specwise.adaptive)."""

    free_drafts: bool


@runtime_checkable
class RememberingDrafter(Protocol):
    """A drafter that learns from every generation it runs (the suffix drafter's earlier requests,
    the recycle drafter's table): the same prompt run again drafts from the first run's answer, so a
    rerun is not the same measurement."""

    remembers_requests: bool


@runtime_checkable
class ScoreReader(Protocol):
    """A drafter that learns from the target's scoring passes (Token Recycling): after each pass the
    engine hands it the fed ids and their logits, which verification computed anyway."""

    def read_scores(self, fed: Sequence[int], logits: torch.Tensor) -> None:
        """logits [len(fed), V]: row i the target's next-token logits after fed[i] (its context
        being the committed tokens and, in a tree, fed[i]'s ancestors)."""


@runtime_checkable
class RetrievalDrafter(Drafter, Protocol):
    """A drafter that copies what followed an earlier occurrence of the context's end (n-gram,
    suffix): how long that match is says how much to trust its draft."""

    def match_length(self, context: Sequence[int]) -> int:
        """The length of the longest suffix of the context this drafter would continue (0: none)."""

    def propose_tree(self, context: Sequence[int], nodes: int, depth: int, branching: int,
                     shape: Sequence[int] | None = None) -> TreeProposal:
        """As TreeDrafter.propose_tree."""


@runtime_checkable
class TreeDrafter(Drafter, Protocol):
    """A drafter that can also propose trees (used when SpecConfig.tree_nodes > 0)."""

    def propose_tree(self, context: Sequence[int], nodes: int, depth: int, branching: int,
                     shape: Sequence[int] | None = None) -> TreeProposal:
        """Propose at most `nodes` nodes, `depth` levels and `branching` children per node.

        shape (SpecConfig.tree_shape, passed only when set): children per node at each
        level of a fixed tree; nodes, depth and branching are then the shape's."""


@runtime_checkable
class FeatureDrafter(Drafter, Protocol):
    """A drafter fed with the target's hidden states of the committed context (EAGLE): the
    engine records them in its target passes and hands them over (needs a FeatureRunner)."""

    feature_layers: tuple[int, ...]  # the target's decoder layers whose outputs it reads

    def add_features(self, start: int, hidden: torch.Tensor) -> None:
        """hidden [n, len(feature_layers), H]: the target's states of context positions
        start..start + n - 1, which the target's cache now holds; later positions are void."""


@runtime_checkable
class SelfDrafter(Drafter, Protocol):
    """A drafter that drafts with the target runner itself (layerskip: its first layers and its cache):
    the engine hands it the runner it scores with before any generation."""

    def bind(self, target: "ModelRunner") -> None:
        """Draft with this runner from now on; raise ValueError naming the fix where it cannot."""


@dataclass(frozen=True)
class DrafterContext:
    """What a drafter factory may use to build a drafter for one target."""

    target: "LoadedModel"
    spec: SpecConfig
    vocab_size: int  # width of the target's logits; draft probs must have this width
    options: dict
    # What the drafters of one decoder share, by a key of the factory's choosing (the suffix
    # drafter's store of earlier requests); None: nothing shared, each drafter has its own.
    shared: dict | None = None


DrafterFactory = Callable[[DrafterContext], Drafter]
_REGISTRY: dict[str, DrafterFactory] = {}
# The module that registers each built-in drafter, imported on its first lookup.
_BUILT_IN: dict[str, str] = {
    "draft-model": "specwise.drafters.draft_model",
    "eagle": "specwise.eagle.drafter",
    "layerskip": "specwise.drafters.layerskip",
    "ngram": "specwise.drafters.ngram",
    "none": "specwise.drafters.ngram",
    "recycle": "specwise.drafters.recycle",
    "suffix": "specwise.drafters.suffix",
}


def _load_built_in(name: str) -> None:
    """Import the module of a built-in drafter not registered yet (it registers itself)."""
    if name in _BUILT_IN and name not in _REGISTRY:
        importlib.import_module(_BUILT_IN[name])  # a no-op while that module is registering it


def register_drafter(name: str, factory: DrafterFactory) -> None:
    """Make a drafter available by name to the engine, CLI and server."""
    _load_built_in(name)  # a built-in's name is taken even before its module is imported
    if name in _REGISTRY and _REGISTRY[name] is not factory:
        raise ValueError(f"a drafter named {name!r} is already registered")
    _REGISTRY[name] = factory


def available_drafters() -> list[str]:
    return sorted(set(_REGISTRY) | set(_BUILT_IN))


def create_drafter(name: str, context: DrafterContext) -> Drafter:
    _load_built_in(name)
    if name not in _REGISTRY:
        raise ValueError(f"unknown drafter {name!r}; available: {', '.join(available_drafters())}")
    return _REGISTRY[name](context)
