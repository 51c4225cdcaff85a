"""Validated, frozen settings: how to sample (SamplingParams) and how to speculate (SpecConfig).

Both are checked on construction so that a bad value fails at the call site with a
message naming the field and its allowed range, never deep inside PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# ConfigError and the tree-shape helpers are part of this module's API too (re-exported).
from specwise.device import DEVICE_WORDS, is_cuda_name, is_device_name
from specwise.settings import (AUTO, ConfigError, SettingInfo, check_settings, drafter_settings,  # noqa: F401
                               is_int, is_number, parse_tree_shape, setting, settings_of, tree_shape_nodes)

RUNNERS = ("auto", "hf", "lean")
VERIFIERS = ("auto", "greedy", "token", "block", "coupled")
# Drafters whose drafts are point masses under sampling too: coupled verification keeps their tokens
# exactly as often as rejection sampling does (t(x)), so "auto" verifies them coupled.
POINT_MASS_DRAFTERS = ("ngram", "suffix", "recycle")
TARGET_FORMATS = ("auto", "gguf", "dense")
MAX_TREE_NODES = 256
# The longest suffix the n-gram drafter tries: a lookup compares every window of each length from
# ngram_max down, about ngram_max squared times the context in all, so the bound keeps it small.
MAX_NGRAM = 32
# The range of a temperature (but 0) and of a repetition penalty: the logits are divided by them in
# float32, so that far smaller values overflow to inf (and NaN probabilities) and far larger ones
# flatten every distribution to uniform.
SCALE_LOW, SCALE_HIGH = 1e-4, 1e4


def _require(ok: bool, name: str, allowed: str, value: object) -> None:
    if not ok:
        shown = list(value) if isinstance(value, tuple) else value
        raise ConfigError(name, f"{name} must be {allowed}; got {shown!r}", value)


_is_number = is_number


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
        _require(_is_number(self.temperature) and (self.temperature == 0 or
                                                   SCALE_LOW <= self.temperature <= SCALE_HIGH),
                 "temperature", f"a finite number >= 0: 0 (greedy) or from {SCALE_LOW:g} to {SCALE_HIGH:g}",
                 self.temperature)
        _require(is_int(self.top_k) and self.top_k >= 0,
                 "top_k", "an integer >= 0 (0 = disabled)", self.top_k)
        _require(_is_number(self.top_p) and 0 < self.top_p <= 1,
                 "top_p", "a number in (0, 1] (1 = disabled)", self.top_p)
        _require(_is_number(self.repetition_penalty) and SCALE_LOW <= self.repetition_penalty <= SCALE_HIGH,
                 "repetition_penalty", f"a number > 0, from {SCALE_LOW:g} to {SCALE_HIGH:g} (1 = disabled)",
                 self.repetition_penalty)
        _require(self.seed is None or (is_int(self.seed) and 0 <= self.seed < 2**63),
                 "seed", "None or an integer in [0, 2**63)", self.seed)
        _require(is_int(self.max_new_tokens) and self.max_new_tokens >= 1,
                 "max_new_tokens", "an integer >= 1", self.max_new_tokens)
        _require(isinstance(self.ignore_eos, bool), "ignore_eos", "true or false", self.ignore_eos)
        # Accept lists from callers (JSON, CLI) but store tuples so the object stays hashable.
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        for token_id in self.stop_token_ids:
            _require(is_int(token_id) and token_id >= 0,
                     "stop_token_ids", "a sequence of integers >= 0", self.stop_token_ids)
        for text in self.stop_strings:
            _require(isinstance(text, str) and text != "",
                     "stop_strings", "a sequence of non-empty strings", self.stop_strings)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


# Which settings matter for a configuration (what its label and description show).
def _chain(spec: SpecConfig) -> bool:
    return spec.drafter != "none" and not spec.tree


def _adaptive(spec: SpecConfig) -> bool:
    return _chain(spec) and spec.adaptive is not False  # True, or AUTO: adaptive for some requests


def _adaptive_label(spec: SpecConfig, base: SpecConfig) -> str | None:
    if spec.adaptive is False:
        return None
    return f"{'adaptive' if spec.adaptive is True else AUTO}{spec.k_min}-{spec.k_max}"


def _tree(spec: SpecConfig) -> bool:
    return spec.drafter != "none" and spec.tree


def _suffix(spec: SpecConfig) -> bool:
    return spec.drafter == "suffix" or (spec.drafter == "recycle" and spec.recycle_with == "suffix")


def _ngram(spec: SpecConfig) -> bool:
    return spec.drafter == "ngram" or (spec.drafter == "recycle" and spec.recycle_with == "ngram")


def _recycle(spec: SpecConfig) -> bool:
    return spec.drafter == "recycle"


def _draft_model(spec: SpecConfig) -> bool:
    return spec.drafter == "draft-model"


@dataclass(frozen=True)
class SpecConfig:
    """How to speculate: which drafter, which verifier, how many tokens per block.

    k is the draft block length. With adaptive=True, the engine picks k in
    [k_min, k_max] each step from the measured acceptance and costs (see
    specwise.adaptive), starting from k; with adaptive=False every step drafts k.
    adaptive "auto" (the default) is adaptive k, except for a sampled request
    with a seed that is not verified coupled, which keeps k fixed so that the seed
    repeats its output (`resolve_adaptive`). verifier "auto" means greedy at
    temperature 0; under sampling, coupled verification (the tokens plain sampling
    with the same seed gives, whatever k, drafter, tree or batch) for point-mass
    drafters and trees, and block verification for a chain sampled from a draft
    model, which it keeps more often (`resolve_verifier`; docs/DESIGN.md, "Coupled").

    tree_nodes > 0 drafts a tree instead of a chain (k is then unused): at most
    tree_nodes nodes, tree_depth levels, tree_branching children per node, verified
    with verify_tree_coupled ("auto" and "coupled"), verify_tree ("token") or
    verify_tree_greedy. Block verification
    has no tree form, and adaptive sizing does not yet cover trees (adaptive "auto"
    leaves a tree's size fixed; adaptive=True is refused with one). The tree is
    dynamic (each level's node budget goes to the likeliest paths) unless tree_shape
    fixes it: children per node at each level, e.g. (3, 2, 1) is 3 children of the
    context, 2 under each of them and 1 under each of those, 3 + 6 + 6 = 15 nodes;
    tree_nodes, tree_depth and tree_branching then follow from the shape.

    Each field is declared once with `setting(...)` (specwise.settings): the CLI flags,
    the benchmark's method keys, the server's `speculative` object and the method
    labels are generated from these declarations. The defaults are the configuration
    measured best over Spec-Bench's six tasks with the GGUF target (docs/BENCHMARKS.md;
    the numbers in docs/guide.md, "Python API"): n-gram drafting with adaptive k in
    [1, 12], starting from k = 4, ahead of a fixed k = 4 on every machine measured.
    adaptive=False gives the previous default, a fixed k = 4.
    """

    drafter: str = setting("ngram", "who proposes tokens: ngram (prompt lookup), suffix (suffix tries over this and "
                                    "earlier requests), recycle (the target's own earlier candidates), "
                                    "draft-model, eagle, layerskip (the target's own first layers), none, "
                                    "or a registered name", words="a registered drafter name", drafter=True)
    k: int = setting(4, "draft block size: tokens proposed per step (adaptive: the first step's)", low=1, high=64,
                     relevant=_chain, label=lambda s, base: None if s.adaptive is True else f"k{s.k}")
    adaptive: bool | str = setting(AUTO, "choose k each step in [k_min, k_max] from measured acceptance and "
                                         "costs; auto: adaptive, except that a sampled request with a seed "
                                         "whose verifier is not coupled keeps k fixed, so that the seed repeats "
                                         "its output (and trees, which adaptive sizing does not cover, keep "
                                         "their size)", auto=True,
                                   relevant=_chain, label=_adaptive_label)
    k_min: int = setting(1, "smallest k adaptive drafting may choose", low=1, high=64, relevant=_adaptive)
    k_max: int = setting(12, "largest k adaptive drafting may choose", low="k_min", high=64, relevant=_adaptive)
    k_by_match: bool = setting(True, "adaptive k with a retrieval drafter (ngram, suffix, recycle): keep the "
                                     "acceptance per length of the drafter's match and choose each step's k "
                                     "from its match (false: one acceptance for all steps)",
                               relevant=_adaptive,
                               label=lambda s, base: None if s.k_by_match else "pooled")
    tree_nodes: int = setting(0, "draft a tree of at most this many nodes instead of a chain (0 = chain)",
                              low=0, high=MAX_TREE_NODES, relevant=_tree,
                              label=lambda s, base: None if s.tree_shape else
                              f"tree{s.tree_nodes}d{s.tree_depth}b{s.tree_branching}")
    tree_depth: int = setting(4, "most levels of a draft tree (its depth: the draft tokens on its longest path)",
                              low=1, high=64, relevant=_tree)
    tree_branching: int = setting(3, "most children per draft tree node", low=1, high=64, relevant=_tree)
    tree_shape: tuple[int, ...] = setting((), "a fixed draft tree: children per node at each level, e.g. 3,2,1 "
                                              "(3 + 6 + 6 = 15 nodes); sets the tree's nodes, depth and branching",
                                          relevant=_tree, label=lambda s, base: "tree" + "x".join(
                                              map(str, s.tree_shape)) if s.tree_shape else None)
    ngram_min: int = setting(1, "shortest suffix the n-gram drafter matches", low=1, high=MAX_NGRAM,
                             relevant=_ngram, drafter=True)
    ngram_max: int = setting(4, "longest suffix the n-gram drafter matches (tried first)", low="ngram_min",
                             high=MAX_NGRAM,
                             relevant=_ngram, drafter=True,
                             label=lambda s, base: f"n{s.ngram_min}-{s.ngram_max}"
                             if (s.ngram_min, s.ngram_max) != (base.ngram_min, base.ngram_max) else None)
    recycle_with: str = setting("suffix", "the recycle drafter takes this retrieval drafter's draft where it matches "
                                          "at least 2 tokens of the context's end (none: the table alone)",
                                choices=("none", "ngram", "suffix"), short_key="with", relevant=_recycle,
                                drafter=True, label=lambda s, base: f"with-{s.recycle_with}")
    recycle_candidates: int = setting(8, "successors the recycle drafter keeps per token (a tree's widest branching)",
                                      low=1, high=32, short_key="candidates", relevant=_recycle, drafter=True,
                                      server=False,
                                      label=lambda s, base: f"c{s.recycle_candidates}"
                                      if s.recycle_candidates != base.recycle_candidates else None)
    # The suffix settings are the operator's: each combination is a drafter with a store of its own,
    # so a request that could set them could multiply the server's memory.
    # 48 rather than 24: a draft is at most the depth less the match (up to half of it), and at 24 that capped
    # repeated text at 12 tokens a step (docs/guide.md, Suffix drafting).
    suffix_depth: int = setting(48, "longest path the suffix drafter indexes: the matched end of the context "
                                    "(up to half of it) plus the draft", low=2, high=256,
                                relevant=_suffix, server=False, drafter=True, label=lambda s, base: f"d{s.suffix_depth}"
                                if s.suffix_depth != base.suffix_depth else None)
    suffix_factor: int = setting(1, "the suffix drafter drafts at most this many tokens per matched token",
                                 low=1, high=64, relevant=_suffix, server=False, drafter=True,
                                 label=lambda s, base: f"f{s.suffix_factor}" if s.suffix_factor != base.suffix_factor
                                 else None)
    suffix_min_percent: int = setting(10, "the suffix drafter keeps a draft branch while its empirical frequency "
                                          "(the product of each step's share among the continuations seen) is at "
                                          "least this many percent", low=0, high=100, relevant=_suffix, server=False,
                                      drafter=True,
                                      label=lambda s, base: f"p{s.suffix_min_percent}"
                                      if s.suffix_min_percent != base.suffix_min_percent else None)
    suffix_cache_tokens: int = setting(250_000, "tokens of earlier requests (prompts and outputs) the suffix "
                                                  "drafter keeps to draft from, oldest dropped first; 0 = the "
                                                  "current request only", low=0, high=1_000_000_000,
                                       short_key="cache",
                                       relevant=_suffix, server=False, drafter=True,
                                       label=lambda s, base: f"cache{s.suffix_cache_tokens}"
                                       if s.suffix_cache_tokens != base.suffix_cache_tokens else None)
    draft_vocab: int = setting(0, "the draft model proposes only its N most frequent tokens (plus special and "
                                  "prompt tokens): a smaller output layer; 0 = all tokens", low=0,
                               short_key="vocab", relevant=_draft_model, drafter=True, resource=True,
                               label=lambda s, base: f"v{s.draft_vocab}" if s.draft_vocab else None)
    draft_quantize: str | None = setting(None, "int8: int8 weight-only draft model (cheaper drafting; the target "
                                               "is never quantized); gguf: the draft model's GGUF blocks as stored; "
                                               "none: as it comes (its GGUF blocks beside a gguf target when it "
                                               "comes from a GGUF file, else dense)", choices=(None, "int8", "gguf"),
                                         short_key="quantize", relevant=_draft_model, drafter=True, resource=True,
                                         label=lambda s, base: s.draft_quantize)
    layerskip_exit: int = setting(0, "layerskip drafts with the target's first N decoder layers, then its final "
                                     "norm and output layer; 0 = choose N per request from L/4, L/2, 3L/4 by "
                                     "measuring agreement on the prompt", low=0, high=1024, short_key="exit",
                                  relevant=lambda s: s.drafter == "layerskip", drafter=True,
                                  label=lambda s, base: f"exit{s.layerskip_exit}" if s.layerskip_exit else None)
    verifier: str = setting("auto", "greedy, token (Leviathan et al.), block (Sun et al.) or coupled (a draft "
                                    "token is kept when it is the target's own draw with the position's "
                                    "noise: the output is plain sampling's with the same seed, whatever k, "
                                    "drafter, tree or batch); auto: greedy at temperature 0, else coupled "
                                    "for point-mass drafters (ngram, suffix, recycle) and trees, block "
                                    "for a draft model's chains", choices=VERIFIERS,
                            relevant=lambda s: s.drafter != "none",
                            label=lambda s, base: s.verifier if s.verifier != "auto" else None)
    runner: str = setting("auto", "model runner for target and draft model: lean (static cache, fused "
                                  "projections, CPU kernels; Llama/Qwen2), hf, or auto (lean where supported)",
                          choices=RUNNERS, drafter=True, resource=True,  # a draft model runs in the same runner
                          label=lambda s, base: s.runner if s.runner != "auto" else None)
    target_format: str = setting("auto", "the target's weights: gguf (the GGUF file's blocks as stored, run by "
                                         "specwise's kernel), dense (the model prepared in --dtype), or auto "
                                         "(gguf for models that come from a GGUF file)", choices=TARGET_FORMATS,
                                 resource=True,
                                 # dense is what every label meant before the gguf format existed
                                 label=lambda s, base: "gguf" if s.target_format == "gguf" else None)
    # Where the models live is chosen once per decoder (its models are loaded there), not per request.
    device: str = setting("auto", "where models, caches and sampling live: cpu, cuda, cuda:N, or auto (the "
                                  "first CUDA device when PyTorch sees one, else the CPU); the CPU kernels and "
                                  "the gguf format run on the CPU only", words=DEVICE_WORDS, valid=is_device_name,
                          server=False, label=lambda s, base: s.device.replace(":", "") if s.device != "auto" else None)
    compile_step: bool = setting(False, "compile the lean runner's scoring step with torch.compile, one graph per "
                                        "block size (CUDA graphs on a GPU); the first pass of each size compiles",
                                 server=False, label=lambda s, base: "torch.compile" if s.compile_step else None)
    drafter_options: dict = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        check_settings(self)
        if is_cuda_name(self.device):
            self._check_cuda()
        if self.tree_shape != ():
            self._apply_tree_shape()
        if self.tree_nodes:
            if self.adaptive is True:
                raise ConfigError("adaptive", "adaptive must be False with tree drafting (tree_nodes > 0): "
                                              "adaptive sizing does not cover trees yet; set tree_nodes=0 "
                                              f"for an adaptive chain, or adaptive=False (or {AUTO!r}) for a "
                                              "fixed tree")
            if self.verifier == "block":
                raise ConfigError("verifier", "verifier 'block' has no tree form; with tree_nodes > 0 use "
                                              "'auto' or 'token' (recursive rejection sampling over the tree)")

    def _check_cuda(self) -> None:
        """Refuse what only the CPU kernels run, on a CUDA device (named explicitly: "auto" is
        resolved by the decoder, which runs such a target dense instead)."""
        if self.target_format == "gguf":
            raise ConfigError("target_format", f"target_format 'gguf' runs the GGUF blocks with specwise's CPU "
                                               f"kernels; on device {self.device!r} use target_format 'dense' "
                                               "(or 'auto'), or device 'cpu'")
        if self.drafter == "draft-model" and self.draft_quantize is not None:
            raise ConfigError("draft_quantize", f"draft_quantize {self.draft_quantize!r} runs on specwise's CPU "
                                                f"kernels; on device {self.device!r} leave draft_quantize unset, "
                                                "or use device 'cpu'")

    def _apply_tree_shape(self) -> None:
        shape = self.tree_shape
        _require(isinstance(shape, (tuple, list)) and 1 <= len(shape) <= 64
                 and all(is_int(b) and 1 <= b <= 64 for b in shape),
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

    def resolve_adaptive(self, sampling: SamplingParams, verifier: str | None = None) -> bool:
        """Whether a generation with these sampling settings chooses its k each step (adaptive k).

        True and False are taken as given. AUTO is adaptive k for a chain, except where the
        request samples (temperature > 0) with a seed and is not verified coupled: under
        rejection sampling or block verification, which random draws decide which token depends
        on the block lengths, and adaptive k follows measured times, so the output could differ
        between two runs; with k fixed, the seed gives the same output every time. Coupled
        verification commits plain sampling's tokens whatever k is, as greedy verification
        commits greedy decoding's, and an unseeded request has nothing to repeat. Trees and
        plain decoding (drafter "none") are never adaptive under AUTO. verifier: the one the
        generation runs (None: `resolve_verifier`'s).
        """
        if isinstance(self.adaptive, bool):
            return self.adaptive
        if not _chain(self):
            return False
        if sampling.greedy or sampling.seed is None:
            return True
        return (verifier or self._sampling_verifier()) == "coupled"

    def resolve_verifier(self, sampling: SamplingParams) -> str:
        """The verifier actually used: greedy decoding always verifies greedily; plain decoding
        (drafter "none") samples with position-keyed noise, which is the coupled rule with no
        draft; "auto" under sampling is coupled for point-mass drafters (which it keeps as often as
        rejection sampling does) and for trees (kept more often than by recursive rejection
        sampling on the tiny models), block for a sampled chain (kept more often than coupled:
        docs/DESIGN.md, "Coupled")."""
        if sampling.greedy:
            return "greedy"
        if self.verifier == "greedy":
            raise ConfigError("verifier", 
                "verifier 'greedy' needs temperature 0; got temperature "
                f"{sampling.temperature}. Use verifier 'coupled', 'token' or 'block' for sampling."
            )
        return self._sampling_verifier()

    def _sampling_verifier(self) -> str:
        """The verifier of a sampled generation ('greedy' if asked for, which sampling refuses)."""
        if self.drafter == "none":
            return "coupled"
        if self.verifier == "auto":
            return "coupled" if self.drafter in POINT_MASS_DRAFTERS or self.tree else "block"
        return self.verifier


def spec_settings() -> tuple[SettingInfo, ...]:
    """Every declared speculation setting (SpecConfig's fields but drafter_options), in declaration order."""
    return settings_of(SpecConfig)
