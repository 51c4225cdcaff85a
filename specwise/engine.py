"""The decode loop: propose -> score -> verify -> commit -> observe.

The target runs exactly once per step, over the last committed token followed by
the draft block, which gives the k + 1 distributions the verifier needs. Its
cache always holds every committed token but the last one, so after a step it
only has to forget the rejected draft tokens.

With tree drafting (SpecConfig.tree_nodes > 0) the block is a tree: the last
committed token is node 0 of one tree-attention pass, every draft node i is node
i + 1, and after verification the cache keeps node 0 and the accepted path only.

A `FeatureDrafter` (EAGLE) drafts from the target's hidden states: each target pass
then also records the layers it names, and the states of the tokens that stay in
the target's cache are handed to it, so it never needs a pass of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from specwise.adaptive import AdaptiveBlockSize
from specwise.config import SamplingParams, SpecConfig, tree_shape_nodes
from specwise.device import synchronize
from specwise.drafters.base import Drafter, FeatureDrafter, FreeDrafter, TreeDrafter
from specwise.metrics import SpecStats
from specwise.models.protocols import FeatureRunner, ModelRunner, PlannedRunner, TreeRunner
from specwise.sampling import logits_to_probs, make_generator, seen_token_mask, tree_seen_mask
from specwise.stopping import StopTracker, TokenEvent
from specwise.verify import VerifyResult, get_tree_verifier, get_verifier


@dataclass
class GenerationResult:
    """The outcome of one generation."""

    text: str
    token_ids: list[int]  # new tokens only, including a final EOS / stop token if one ended it
    prompt_ids: list[int]
    finish_reason: str  # "stop" (EOS, stop id or stop string) or "length"
    stats: SpecStats = field(default_factory=SpecStats)
    from_draft: list[bool] = field(default_factory=list)  # per token: accepted draft or target's own


class GenerationStream:
    """Iterate to receive TokenEvents as they are committed; `.result` once exhausted."""

    def __init__(self, events: Generator[TokenEvent, None, GenerationResult],
                 stats: SpecStats | None = None) -> None:
        self._events = events
        self._result: GenerationResult | None = None
        self.stats = stats or SpecStats()  # live: counts so far, also after close()

    @property
    def events(self) -> Generator[TokenEvent, None, GenerationResult]:
        """The generator behind the stream, returning the result when exhausted: for wrapping it
        (e.g. in a lock held while it runs) in another stream."""
        return self._events

    def __iter__(self) -> Iterator[TokenEvent]:
        self._result = yield from self._events
        return self._result

    def close(self) -> None:
        """Stop generating early (e.g. the client went away)."""
        self._events.close()

    @property
    def result(self) -> GenerationResult:
        if self._result is None:
            for _ in self:
                pass
        assert self._result is not None
        return self._result


class _Timer:
    def __init__(self) -> None:
        self.seconds = 0.0

    @contextmanager
    def __call__(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds = time.perf_counter() - start


def check_prompt(target: ModelRunner, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
    """Raise ValueError if the target cannot generate from these ids: empty, out of its
    vocabulary, or prompt + max_new_tokens beyond its context window."""
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty; give at least one token")
    bad = [t for t in prompt_ids if not 0 <= int(t) < target.vocab_size]
    if bad:
        raise ValueError(f"prompt token ids must be in [0, {target.vocab_size}); got {bad[:5]}")
    needed = len(prompt_ids) + sampling.max_new_tokens
    if needed > target.max_context:
        raise ValueError(
            f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({sampling.max_new_tokens}) = "
            f"{needed} exceeds the target's context window of {target.max_context} tokens; "
            "shorten the prompt or lower max_new_tokens")


class SpeculativeEngine:
    """Runs speculative decoding of one target with one drafter."""

    def __init__(self, target: ModelRunner, drafter: Drafter, spec: SpecConfig,
                 tokenizer=None, eos_token_ids: Sequence[int] = (),
                 cost_prior: Callable[[int], Callable[[int], float] | None] | None = None) -> None:
        """cost_prior: for adaptive k, maps a prompt's length to the target's measured T(n)
        (specwise.cost_model), or None where nothing was measured."""
        self.cost_prior = cost_prior
        self.target = target
        self.drafter = drafter
        self.spec = spec
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        if spec.tree:
            if not isinstance(drafter, TreeDrafter):
                raise ValueError(f"drafter {getattr(drafter, 'name', type(drafter).__name__)!r} cannot propose "
                                 "trees (no propose_tree); use tree_nodes=0 or a drafter with tree support "
                                 "(draft-model, ngram)")
            if not isinstance(target, TreeRunner):
                raise ValueError(f"tree drafting needs a target runner with forward_tree and keep; "
                                 f"{type(target).__name__} has none (use runner 'hf' or 'lean')")
        self._features: dict = {}  # extra target-pass arguments a feature drafter needs
        if isinstance(drafter, FeatureDrafter):
            if not isinstance(target, FeatureRunner):
                raise ValueError(f"drafter {drafter.name!r} reads the target's hidden states, which "
                                 f"{type(target).__name__} cannot record (use runner 'hf' or 'lean')")
            self._features = {"hidden_layers": tuple(drafter.feature_layers)}

    def stream(self, prompt_ids: Sequence[int], sampling: SamplingParams,
               stats: SpecStats | None = None) -> GenerationStream:
        """stats: where to count (a new SpecStats when None)."""
        self.check_prompt(prompt_ids, sampling)
        stats = stats if stats is not None else SpecStats()
        return GenerationStream(self._run(list(prompt_ids), sampling, stats), stats)

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> GenerationResult:
        return self.stream(prompt_ids, sampling).result

    def check_prompt(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        check_prompt(self.target, prompt_ids, sampling)

    def _run(self, context: list[int], sampling: SamplingParams,
             stats: SpecStats) -> Generator[TokenEvent, None, GenerationResult]:
        prompt = list(context)
        timer, started = _Timer(), time.perf_counter()
        generator = make_generator(sampling.seed)
        verifier = self.spec.resolve_verifier(sampling)
        verify = get_tree_verifier(verifier) if self.spec.tree else get_verifier(verifier)  # one host sync a step
        eos = () if sampling.ignore_eos else self.eos_token_ids
        stop = StopTracker(self.tokenizer, sampling.max_new_tokens, eos + sampling.stop_token_ids,
                           sampling.stop_strings)
        # Batched (specwise.batching): the batch plans each step's k in [0, k] (k_max if adaptive) for
        # the most tokens per second over all its sequences (specwise.goodput). Only where k changes no
        # output: greedy, or adaptive (its k follows timings anyway); a seeded sampled request with a
        # fixed k draws the same random numbers whatever runs beside it, so it repeats exactly.
        planned = self.target if isinstance(self.target, PlannedRunner) else None
        if planned is not None:
            plannable = (not self.spec.tree and getattr(self.drafter, "name", None) != "none"
                         and (verifier == "greedy" or self.spec.adaptive))
            planned.limit((self.spec.k_max if self.spec.adaptive else self.spec.k) if plannable else None)
        adaptive = None
        if self.spec.adaptive:
            prior = self.cost_prior(len(prompt)) if self.cost_prior is not None else None
            free = isinstance(self.drafter, FreeDrafter) and bool(self.drafter.free_drafts)
            adaptive = AdaptiveBlockSize(self.spec.k, self.spec.k_min, self.spec.k_max, target_prior=prior,
                                         shadow_drafts=free)
        with timer():
            self.target.reset()
            self.target.forward(context[:-1], logits=False, **self._features)
        stats.prefill_seconds = stats.score_seconds = timer.seconds
        with timer():  # a drafter may read the prompt here (its own prefill): prefill, not drafting
            self.drafter.start(prompt, sampling, generator)
        stats.prefill_seconds += timer.seconds
        self._hand_over_features(0, None)
        from_draft: list[bool] = []
        while not stop.done:
            # Never draft past max_new_tokens: the bonus token fills the last place.
            room = stop.remaining - 1
            if self.spec.tree:
                result, depth = self._tree_step(context, room, sampling, generator, verify, stats, timer)
            else:
                result, depth = self._chain_step(context, room, sampling, generator, verify, adaptive,
                                                 planned, stats, timer), None
            context.extend(result.tokens)                                                # commit
            self.drafter.observe(result)                                                 # observe
            stats.record_step(result.num_proposed, result.num_accepted, depth)
            events = stop.push(result.tokens, result.num_accepted)
            stats.new_tokens = len(stop.token_ids)  # kept current: a closed stream still reports its counts
            stats.total_seconds = time.perf_counter() - started
            for event in events:
                from_draft.append(event.from_draft)
                yield event
        return GenerationResult(stop.text, list(stop.token_ids), prompt, stop.finish_reason or "length",
                                stats, from_draft)

    def _chain_step(self, context: list[int], room: int, sampling: SamplingParams, generator: torch.Generator,
                    verify, adaptive: AdaptiveBlockSize | None, planned: PlannedRunner | None, stats: SpecStats,
                    timer: _Timer) -> VerifyResult:
        """Propose a block, score it in one target pass, verify; the cache keeps the accepted tokens."""
        k = adaptive.next_k() if adaptive else self.spec.k
        if planned is not None and (plan := planned.planned_k()) is not None:
            k = plan
        k = min(k, room)
        with timer():
            proposal = self.drafter.propose(context, k)                                 # propose
        stats.draft_seconds += (draft_time := timer.seconds)
        block = proposal.tokens.tolist()
        shadow = None
        if adaptive is not None and k == 0 and adaptive.shadows:
            # A plain step: a free drafter's one-token guess, never scored, measures α (adaptive.py).
            with timer():
                shadow = self.drafter.propose(context, 1)
            stats.draft_seconds += (shadow_time := timer.seconds)
        with timer():
            logits = self.target.forward([context[-1]] + block, **self._features)        # score [k + 1, V]
            synchronize(logits.device)  # the pass's own time (adaptive k reads it); the verifier waits anyway
        stats.score_seconds += (score_time := timer.seconds)
        with timer():
            seen = seen_token_mask(context, block, logits.shape[-1]) if sampling.repetition_penalty != 1 else None
            target_probs = logits_to_probs(logits, sampling, seen)                      # [k + 1, V]
            result = verify(proposal.tokens, proposal.probs, target_probs, generator)   # verify
        stats.verify_seconds += timer.seconds
        self.target.rollback(len(block) - result.num_accepted)
        self._hand_over_features(len(context) - 1, slice(0, result.num_accepted + 1))
        if adaptive:
            adaptive.observe(len(block), result.num_accepted, draft_time, score_time)
            if shadow is not None:
                guess = int(shadow.tokens[0]) if len(shadow) else None
                adaptive.observe_shadow(guess, result.tokens[0], shadow_time, point_mass=shadow.probs is None)
        if planned is not None:
            planned.observe(len(block), result.num_accepted, draft_time)
        return result

    def _tree_step(self, context: list[int], room: int, sampling: SamplingParams, generator: torch.Generator,
                   verify, stats: SpecStats, timer: _Timer) -> tuple[VerifyResult, int]:
        """Propose a tree, score it in one tree-attention pass, verify; the cache keeps the
        accepted path. Returns the result and the tree's depth."""
        depth = min(self.spec.tree_depth, room)
        nodes = self.spec.tree_nodes if depth > 0 else 0
        shape = {}  # passed only when set: drafters written before tree_shape keep working
        if self.spec.tree_shape:
            shape = {"shape": self.spec.tree_shape[:depth]}
            nodes = tree_shape_nodes(shape["shape"]) if depth > 0 else 0
        with timer():
            tree = self.drafter.propose_tree(context, nodes, depth, self.spec.tree_branching, **shape)  # propose
        stats.draft_seconds += timer.seconds
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        depths = tree.depths()
        if len(tokens) > nodes or max(depths, default=0) > depth:
            raise ValueError(f"drafter {self.drafter.name!r} proposed {len(tokens)} nodes of depth up to "
                             f"{max(depths, default=0)}; asked for at most {nodes} nodes and depth {depth}")
        start = self.target.length
        with timer():
            # Node 0 is the last committed token; draft node i becomes node i + 1.
            logits = self.target.forward_tree([context[-1]] + tokens, [-1] + [p + 1 for p in parents],
                                              **self._features)  # [n + 1, V]
            synchronize(logits.device)
        stats.score_seconds += timer.seconds
        with timer():
            seen = None
            if sampling.repetition_penalty != 1:
                seen = tree_seen_mask(context, tokens, parents, logits.shape[-1])  # per path
            target_probs = logits_to_probs(logits, sampling, seen)                      # [n + 1, V]
            result = verify(tree.tokens, tree.parents, tree.probs, target_probs, generator)  # verify
        stats.verify_seconds += timer.seconds
        # The cache keeps every committed token but the last: node 0 and the accepted path.
        kept = [0] + [i + 1 for i in result.accepted_nodes]
        self.target.keep(start, kept)
        self._hand_over_features(len(context) - 1, kept)
        return result, max(depths, default=0)

    def _hand_over_features(self, start: int, rows: slice | list[int] | None) -> None:
        """Give a feature drafter the target's states of the fed tokens that stayed in its cache."""
        if self._features:
            hidden = self.target.last_hidden  # [fed tokens, layers, H]
            self.drafter.add_features(start, hidden if rows is None else hidden[rows])
