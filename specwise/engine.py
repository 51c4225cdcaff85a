"""The decode loop: propose -> score -> verify -> commit -> observe.

How many tokens a chain step drafts is its k policy's (specwise.k_policy: fixed, adaptive, or
planned by the batch), chosen once per generation; the policy observes every step.

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

A `SelfDrafter` (layerskip) drafts with the target runner itself: the engine binds it to the
runner here, and the runner's own next pass reuses what drafting ran (specwise.runners.early_exit).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from specwise.config import SamplingParams, SpecConfig, tree_shape_nodes
from specwise.device import synchronize
from specwise.drafters.base import Drafter, FeatureDrafter, ScoreReader, SelfDrafter, TreeDrafter, TreeProposal
from specwise.k_policy import KPolicy, StepOutcome, choose_k_policy
from specwise.noise import PositionNoise, StepNoise, draw_seed
from specwise.stats import PhaseClock, SpecStats
from specwise.runners.protocols import FeatureRunner, ModelRunner, TreeRunner
from specwise.prefix_cache import PrefixCache
from specwise.sampling import logits_to_probs, make_generator, process_logits, seen_token_mask, tree_seen_mask
from specwise.stopping import StopTracker, TokenEvent
from specwise.verify import VerifyResult, get_tree_verifier, get_verifier, verify_greedy


@dataclass
class GenerationResult:
    """The outcome of one generation."""

    text: str
    token_ids: list[int]  # new tokens only, including a final EOS / stop token if one ended it
    prompt_ids: list[int]
    finish_reason: str  # "stop" (EOS, stop id or stop string) or "length"
    stats: SpecStats = field(default_factory=SpecStats)
    from_draft: list[bool] = field(default_factory=list)  # per token: accepted draft or target's own

    @property
    def seed(self) -> int | None:
        """The seed of this generation's randomness (the request's, or one drawn for it); giving it
        as SamplingParams.seed repeats the output. None under greedy decoding, which draws nothing."""
        return self.stats.seed


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
                 cost_prior: Callable[[int], Callable[[int], float] | None] | None = None,
                 prefix_cache: PrefixCache | None = None) -> None:
        """cost_prior: for adaptive k, maps a prompt's length to the target's measured T(n)
        (specwise.cost_model), or None where nothing was measured. prefix_cache: where a prompt's
        longest cached prefix is taken from, and the generation's entries kept when it ends."""
        self.cost_prior = cost_prior
        self.prefix_cache = prefix_cache
        self.target = target
        self.drafter = drafter
        self.spec = spec
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        if spec.tree:
            if not isinstance(drafter, TreeDrafter):
                raise ValueError(f"drafter {getattr(drafter, 'name', type(drafter).__name__)!r} cannot propose "
                                 "trees (no propose_tree); use tree_nodes=0 or a drafter with tree support "
                                 "(draft-model with the target's tokenizer, ngram)")
            if not isinstance(target, TreeRunner):
                raise ValueError(f"tree drafting needs a target runner with forward_tree and keep; "
                                 f"{type(target).__name__} has none (use runner 'hf' or 'lean')")
        self._reads_scores = isinstance(drafter, ScoreReader)
        if isinstance(drafter, SelfDrafter):
            drafter.bind(target)  # it drafts with this runner's own layers and cache (layerskip)
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
        clock, started = PhaseClock(stats), time.perf_counter()
        verifier = self.spec.resolve_verifier(sampling)
        verify = get_tree_verifier(verifier) if self.spec.tree else get_verifier(verifier)  # one host sync a step
        # An unseeded sampled request gets a seed of its own, reported, so that its output can be repeated.
        stats.seed = None if sampling.greedy else sampling.seed if sampling.seed is not None else draw_seed()
        # Coupled: drafter and verifier draw with the noise of each position (specwise.noise).
        noise = PositionNoise(stats.seed) if verifier == "coupled" else None
        generator = noise if noise is not None else make_generator(stats.seed)
        eos = () if sampling.ignore_eos else self.eos_token_ids
        stop = StopTracker(self.tokenizer, sampling.max_new_tokens, eos + sampling.stop_token_ids,
                           sampling.stop_strings)
        policy = None
        if not self.spec.tree:
            cost_prior = self.cost_prior
            prior = (lambda: cost_prior(len(prompt))) if cost_prior is not None else None
            policy = choose_k_policy(self.spec, sampling, self.drafter, self.target, clock, prior, verifier)
        gen = _Generation(context, sampling, generator, verify, clock, policy, noise)
        self._prefill(prompt, sampling, generator, clock)
        from_draft: list[bool] = []
        try:
            yield from self._decode(gen, stop, stats, started, from_draft)
        except GeneratorExit:  # closed early: the cache holds what was committed, worth keeping too
            self._remember(context)
            raise
        self._remember(context)
        return GenerationResult(stop.text, list(stop.token_ids), prompt, stop.finish_reason or "length",
                                stats, from_draft)

    def _decode(self, gen: _Generation, stop: StopTracker, stats: SpecStats, started: float,
                from_draft: list[bool]) -> Generator[TokenEvent, None, None]:
        context = gen.context
        while not stop.done:
            # Never draft past max_new_tokens: the bonus token fills the last place.
            room = stop.remaining - 1
            if gen.noise is not None:  # positions already committed are never drawn at again
                gen.noise.release_before(len(context))
            result, depth = self._tree_step(gen, room) if self.spec.tree else (self._chain_step(gen, room), None)
            context.extend(result.tokens)                                                # commit
            self.drafter.observe(result)                                                 # observe
            stats.record_step(result.num_proposed, result.num_accepted, depth)
            events = stop.push(result.tokens, result.num_accepted)
            stats.new_tokens = len(stop.token_ids)  # kept current: a closed stream still reports its counts
            stats.total_seconds = time.perf_counter() - started
            for event in events:
                from_draft.append(event.from_draft)
                yield event

    def _prefill(self, prompt: list[int], sampling: SamplingParams, generator: torch.Generator,
                 clock: PhaseClock) -> None:
        """The target's cache takes every prompt token but the last; the drafter reads the prompt."""
        with clock("prefill"):
            # A feature drafter reads the hidden states of every prompt token: it reads the whole prompt.
            cache = None if self._features else self.prefix_cache
            cached = cache.restore(self.target, prompt[:-1]) if cache is not None else 0
            if cache is None:
                self.target.reset()
            self.target.forward(prompt[cached:-1], logits=False, **self._features)
        clock.stats.prompt_tokens, clock.stats.cached_tokens = len(prompt), cached
        clock.stats.score_seconds += clock.last["prefill"]  # a target pass: scoring time too
        with clock("prefill"):  # a drafter may read the prompt here (its own prefill): prefill, not drafting
            self.drafter.start(prompt, sampling, generator)
        self._hand_over_features(0, None)

    def _remember(self, context: list[int]) -> None:
        """Keep the entries of the committed tokens in the prefix cache (the cache holds all but the
        last committed token, whose entry the next pass would write)."""
        if self.prefix_cache is not None and self.target.length <= len(context):
            self.prefix_cache.store(self.target, context[:self.target.length])

    def _chain_step(self, gen: _Generation, room: int) -> VerifyResult:
        """Propose a block, score it in one target pass, verify; the cache keeps the accepted tokens."""
        context, sampling, clock = gen.context, gen.sampling, gen.clock
        k = min(gen.policy.next_k(context), room)
        with clock("draft"):
            proposal = self.drafter.propose(context, k)                                 # propose
        block = self._checked_block(proposal.tokens.tolist(), k)
        with clock("score"):
            logits = self._score([context[-1]] + block)                                 # score [k + 1, V]
        with clock("verify"):
            self._hand_over_scores([context[-1]] + block, logits)
            seen = seen_token_mask(context, block, logits.shape[-1]) if sampling.repetition_penalty != 1 else None
            # The greedy rule reads only each row's first argmax: the processed logits, not their one-hot.
            target_probs = (process_logits(logits, sampling, seen) if gen.verify is verify_greedy
                            else logits_to_probs(logits, sampling, seen))              # [k + 1, V]
            result = gen.verify(proposal.tokens, proposal.probs, target_probs, gen.draws(len(context)))  # verify
        self.target.rollback(len(block) - result.num_accepted)                          # commit
        self._hand_over_features(len(context) - 1, slice(0, result.num_accepted + 1))
        gen.policy.observe(context, StepOutcome(k, len(block), result.num_accepted, result.tokens[0],
                                                clock.last["draft"], self._pass_seconds(clock)))  # observe
        return result

    def _tree_step(self, gen: _Generation, room: int) -> tuple[VerifyResult, int]:
        """Propose a tree, score it in one tree-attention pass, verify; the cache keeps the
        accepted path. Returns the result and the tree's depth."""
        context, sampling, clock = gen.context, gen.sampling, gen.clock
        # Every draft node takes a place in the cache beside the committed context: near the end of
        # the window the tree's size is capped by the places left, as its depth is by max_new_tokens.
        window = self.target.max_context - len(context)
        depth = min(self.spec.tree_depth, room, window)
        shape = self.spec.tree_shape[:depth]
        while shape and tree_shape_nodes(shape) > window:
            shape = shape[:-1]
        if self.spec.tree_shape:
            depth = len(shape)
        nodes = 0 if depth == 0 else tree_shape_nodes(shape) if shape else min(self.spec.tree_nodes, window)
        shape = shape or None
        with clock("draft"):
            tree = self.drafter.propose_tree(context, nodes, depth, self.spec.tree_branching, shape=shape)  # propose
        tokens, parents = self._checked_tree(tree, nodes, depth)
        start = self.target.length
        with clock("score"):
            # Node 0 is the last committed token; draft node i becomes node i + 1.
            logits = self._score([context[-1]] + tokens, [-1] + [p + 1 for p in parents])  # [n + 1, V]
        with clock("verify"):
            self._hand_over_scores([context[-1]] + tokens, logits)
            seen = None
            if sampling.repetition_penalty != 1:
                seen = tree_seen_mask(context, tokens, parents, logits.shape[-1])  # per path
            target_probs = logits_to_probs(logits, sampling, seen)                      # [n + 1, V]
            result = gen.verify(tree.tokens, tree.parents, tree.probs, target_probs, gen.draws(len(context)))
        # The cache keeps every committed token but the last: node 0 and the accepted path.
        kept = [0] + [i + 1 for i in result.accepted_nodes]
        self.target.keep(start, kept)                                                   # commit
        self._hand_over_features(len(context) - 1, kept)
        return result, tree.depth

    def _score(self, ids: list[int], parents: list[int] | None = None) -> torch.Tensor:
        """One target pass over the fed ids (a tree's, with parents), recording what a feature
        drafter reads; synchronized, so that its time is the pass's own (adaptive k reads it;
        the verifier waits for it anyway)."""
        if parents is None:
            logits = self.target.forward(ids, **self._features)
        else:
            logits = self.target.forward_tree(ids, parents, **self._features)
        synchronize(logits.device)
        return logits

    def _pass_seconds(self, clock: PhaseClock) -> float:
        """The last scoring pass's own time: a batch member's share of the shared pass where it has one
        (its scoring time includes waiting for the round), else the time scoring took."""
        own = getattr(self.target, "last_pass_seconds", None)
        return clock.last["score"] if own is None else own

    def _checked_block(self, block: list[int], k: int) -> list[int]:
        """A drafter's chain, refused when longer than asked (it would be scored past what the k
        policy chose, or past max_new_tokens) or outside the target's vocabulary."""
        if len(block) > k:
            raise ValueError(f"drafter {self.drafter.name!r} proposed {len(block)} tokens, more than the k = {k} "
                             "it was asked for (propose(context, k) returns at most k tokens)")
        self._check_vocabulary(block)
        return block

    def _checked_tree(self, tree: TreeProposal, nodes: int, depth: int) -> tuple[list[int], list[int]]:
        """A drafter's tree as token and parent lists, refused when larger or deeper than asked or
        outside the target's vocabulary."""
        tokens = tree.tokens.tolist()
        if len(tokens) > nodes or tree.depth > depth:
            raise ValueError(f"drafter {self.drafter.name!r} proposed {len(tokens)} nodes of depth up to "
                             f"{tree.depth}; asked for at most {nodes} nodes and depth {depth}")
        self._check_vocabulary(tokens)
        return tokens, tree.parents.tolist()

    def _check_vocabulary(self, tokens: list[int]) -> None:
        bad = [t for t in tokens if not 0 <= t < self.target.vocab_size]
        if bad:
            raise ValueError(f"drafter {self.drafter.name!r} proposed token ids outside the target's vocabulary "
                             f"[0, {self.target.vocab_size}): {bad[:5]}")

    def _hand_over_scores(self, fed: list[int], logits: torch.Tensor) -> None:
        """Give a drafter that learns from scoring passes the target's logits after each fed token
        (computed for verification anyway; the drafter's reading counts as verifying)."""
        if self._reads_scores:
            self.drafter.read_scores(fed, logits)

    def _hand_over_features(self, start: int, rows: slice | list[int] | None) -> None:
        """Give a feature drafter the target's states of the fed tokens that stayed in its cache."""
        if self._features:
            hidden = self.target.last_hidden  # [fed tokens, layers, H]
            self.drafter.add_features(start, hidden if rows is None else hidden[rows])


@dataclass
class _Generation:
    """What every step of one generation works with."""

    context: list[int]  # prompt + committed tokens
    sampling: SamplingParams
    generator: torch.Generator  # the drafter's (the noise itself when coupled)
    verify: Callable
    clock: PhaseClock
    policy: KPolicy | None  # chains only
    noise: PositionNoise | None = None  # coupled verification's position-keyed noise

    def draws(self, start: int) -> torch.Generator | StepNoise:
        """What the verifier draws from in a step whose first row predicts position `start`."""
        return self.generator if self.noise is None else self.noise.at(start)
