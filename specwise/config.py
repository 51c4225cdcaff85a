"""Validated, frozen settings: how to sample (SamplingParams) and how to speculate (SpecConfig).

Both are checked on construction so that a bad value fails at the call site with a
message naming the field and its allowed range, never deep inside PyTorch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

RUNNERS = ("auto", "hf", "lean")
VERIFIERS = ("auto", "greedy", "token", "block")
MAX_TREE_NODES = 256


def tree_shape_nodes(shape: Sequence[int]) -> int:
    """Nodes of a fixed tree with shape[i] children per node at level i: (3, 2, 1) -> 3 + 6 + 6."""
    total, width = 0, 1
    for branching in shape:
        width *= branching
        total += width
    return total


def parse_tree_shape(text: str) -> tuple[int, ...]:
    """'3,2,1' or '3x2x1' -> (3, 2, 1); '' -> () (a dynamic tree). Ranges are SpecConfig's to check."""
    parts = [p.strip() for p in text.replace("x", ",").split(",")] if text.strip() else []
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError("tree_shape", f"tree_shape must be children per level such as 3,2,1 (or 3x2x1); "
                                        f"got {text!r}") from None


class ConfigError(ValueError):
    """A setting out of its allowed range; `field` names it (the message starts with it)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _require(ok: bool, name: str, allowed: str, value: object) -> None:
    if not ok:
        shown = list(value) if isinstance(value, tuple) else value
        raise ConfigError(name, f"{name} must be {allowed}; got {shown!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class SamplingParams:
    """How plain sampling from the target would pick each token.

    temperature 0 means greedy (argmax, first index on ties). The processors run in
    Hugging Face's order: repetition penalty, temperature, top-k, top-p.
    top_k = 0 and top_p = 1.0 disable those filters. ignore_eos keeps generating
    past the model's end-of-sequence tokens (benchmarks and load tests want a fixed
    length); explicit stop_token_ids still stop.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        _require(_is_number(self.temperature) and self.temperature >= 0,
                 "temperature", "a finite number >= 0 (0 = greedy)", self.temperature)
        _require(_is_int(self.top_k) and self.top_k >= 0,
                 "top_k", "an integer >= 0 (0 = disabled)", self.top_k)
        _require(_is_number(self.top_p) and 0 < self.top_p <= 1,
                 "top_p", "a number in (0, 1] (1 = disabled)", self.top_p)
        _require(_is_number(self.repetition_penalty) and self.repetition_penalty > 0,
                 "repetition_penalty", "a number > 0 (1 = disabled)", self.repetition_penalty)
        _require(self.seed is None or (_is_int(self.seed) and 0 <= self.seed < 2**63),
                 "seed", "None or an integer in [0, 2**63)", self.seed)
        _require(_is_int(self.max_new_tokens) and self.max_new_tokens >= 1,
                 "max_new_tokens", "an integer >= 1", self.max_new_tokens)
        _require(isinstance(self.ignore_eos, bool), "ignore_eos", "true or false", self.ignore_eos)
        # Accept lists from callers (JSON, CLI) but store tuples so the object stays hashable.
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        for token_id in self.stop_token_ids:
            _require(_is_int(token_id) and token_id >= 0,
                     "stop_token_ids", "a sequence of integers >= 0", self.stop_token_ids)
        for text in self.stop_strings:
            _require(isinstance(text, str) and text != "",
                     "stop_strings", "a sequence of non-empty strings", self.stop_strings)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class SpecConfig:
    """How to speculate: which drafter, which verifier, how many tokens per block.

    k is the draft block length. With adaptive=True, the engine picks k in
    [k_min, k_max] each step from the measured acceptance and costs (see
    specwise.adaptive). verifier "auto" means greedy at temperature 0 and block
    verification otherwise.

    tree_nodes > 0 drafts a tree instead of a chain (k is then unused): at most
    tree_nodes nodes, tree_depth levels, tree_branching children per node, verified
    with verify_tree ("auto" and "token") or verify_tree_greedy. Block verification
    has no tree form, and adaptive sizing does not yet cover trees. The tree is
    dynamic (each level's node budget goes to the likeliest paths) unless tree_shape
    fixes it: children per node at each level, e.g. (3, 2, 1) is 3 children of the
    context, 2 under each of them and 1 under each of those, 3 + 6 + 6 = 15 nodes;
    tree_nodes, tree_depth and tree_branching then follow from the shape.
    """

    drafter: str = "draft-model"
    verifier: str = "auto"
    k: int = 5
    adaptive: bool = False
    k_min: int = 1
    k_max: int = 12
    ngram_min: int = 1
    ngram_max: int = 4
    draft_quantize: str | None = None  # "int8": int8 weight-only draft model (never the target)
    draft_vocab: int = 0  # > 0: the draft model proposes only its N most frequent tokens (specwise.drafters.vocab)
    runner: str = "auto"  # model runner for target and draft model: "hf", "lean", or "auto" (lean where supported)
    tree_nodes: int = 0  # 0: chain drafting; > 0: node budget of a draft tree
    tree_depth: int = 4
    tree_branching: int = 3  # most children per tree node
    tree_shape: tuple[int, ...] = ()  # a fixed tree: children per node at each level; () = dynamic
    drafter_options: dict = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        _require(isinstance(self.drafter, str) and self.drafter != "",
                 "drafter", "a registered drafter name", self.drafter)
        _require(self.verifier in VERIFIERS, "verifier", f"one of {', '.join(VERIFIERS)}", self.verifier)
        _require(_is_int(self.k) and 1 <= self.k <= 64, "k", "an integer in [1, 64]", self.k)
        _require(_is_int(self.k_min) and 1 <= self.k_min <= 64, "k_min", "an integer in [1, 64]", self.k_min)
        _require(_is_int(self.k_max) and self.k_min <= self.k_max <= 64,
                 "k_max", f"an integer in [k_min={self.k_min}, 64]", self.k_max)
        _require(_is_int(self.ngram_min) and self.ngram_min >= 1,
                 "ngram_min", "an integer >= 1", self.ngram_min)
        _require(self.draft_quantize in (None, "int8"), "draft_quantize", "None or 'int8'", self.draft_quantize)
        _require(_is_int(self.draft_vocab) and self.draft_vocab >= 0,
                 "draft_vocab", "an integer >= 0 (0 = all tokens)", self.draft_vocab)
        _require(self.runner in RUNNERS, "runner", f"one of {', '.join(RUNNERS)}", self.runner)
        _require(_is_int(self.ngram_max) and self.ngram_max >= self.ngram_min,
                 "ngram_max", f"an integer >= ngram_min={self.ngram_min}", self.ngram_max)
        _require(_is_int(self.tree_nodes) and 0 <= self.tree_nodes <= MAX_TREE_NODES,
                 "tree_nodes", f"an integer in [0, {MAX_TREE_NODES}] (0 = chain drafting)", self.tree_nodes)
        _require(_is_int(self.tree_depth) and 1 <= self.tree_depth <= 64,
                 "tree_depth", "an integer in [1, 64]", self.tree_depth)
        _require(_is_int(self.tree_branching) and 1 <= self.tree_branching <= 64,
                 "tree_branching", "an integer in [1, 64]", self.tree_branching)
        if self.tree_shape != ():
            self._apply_tree_shape()
        if self.tree_nodes:
            if self.adaptive:
                raise ConfigError("adaptive", "adaptive must be False with tree drafting (tree_nodes > 0): "
                                              "adaptive sizing does not cover trees yet; set tree_nodes=0 "
                                              "for an adaptive chain, or adaptive=False for a fixed tree")
            if self.verifier == "block":
                raise ConfigError("verifier", "verifier 'block' has no tree form; with tree_nodes > 0 use "
                                              "'auto' or 'token' (recursive rejection sampling over the tree)")

    def _apply_tree_shape(self) -> None:
        shape = self.tree_shape
        _require(isinstance(shape, (tuple, list)) and 1 <= len(shape) <= 64
                 and all(_is_int(b) and 1 <= b <= 64 for b in shape),
                 "tree_shape", "1 to 64 integers in [1, 64] (children per node at each level)", shape)
        nodes = tree_shape_nodes(shape)
        _require(nodes <= MAX_TREE_NODES, "tree_shape",
                 f"a tree of at most {MAX_TREE_NODES} nodes (this one has {nodes})", shape)
        if self.tree_nodes not in (0, nodes):
            raise ConfigError("tree_nodes", f"tree_nodes={self.tree_nodes} contradicts tree_shape={list(shape)} "
                                            f"({nodes} nodes): give one of them")
        # Frozen: the derived budget is set once here, so every reader of tree_nodes/depth sees the tree.
        object.__setattr__(self, "tree_shape", tuple(shape))
        object.__setattr__(self, "tree_nodes", nodes)
        object.__setattr__(self, "tree_depth", len(shape))
        object.__setattr__(self, "tree_branching", max(shape))

    def tree_summary(self) -> str:
        """The tree settings in words, for reports: 'fixed tree 3x2x1 (15 nodes)' or
        'tree of 16 nodes, depth 4, branching 3'."""
        if self.tree_shape:
            return f"fixed tree {'x'.join(map(str, self.tree_shape))} ({self.tree_nodes} nodes)"
        return f"tree of {self.tree_nodes} nodes, depth {self.tree_depth}, branching {self.tree_branching}"

    @property
    def tree(self) -> bool:
        """Whether this configuration drafts trees rather than chains."""
        return self.tree_nodes > 0

    def resolve_verifier(self, sampling: SamplingParams) -> str:
        """The verifier actually used: greedy decoding always verifies greedily."""
        if sampling.greedy:
            return "greedy"
        if self.verifier == "greedy":
            raise ConfigError("verifier", 
                "verifier 'greedy' needs temperature 0; got temperature "
                f"{sampling.temperature}. Use verifier 'token' or 'block' for sampling."
            )
        if self.verifier == "auto":
            return "token" if self.tree else "block"
        return self.verifier
