"""The public entry points: SpecDecoder (reusable) and generate / stream (one call)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from specwise.batching import DEFAULT_PREFILL_CHUNK, Batcher
from specwise.conversation import Conversation
from specwise.config import SamplingParams, SpecConfig, drafter_settings
from specwise.device import DeviceError, resolve_device
from specwise.drafters import DrafterContext, create_drafter
from specwise.drafters.base import Drafter
from specwise.drafters.pool import DEFAULT_IDLE_DRAFTERS, DrafterPool
from specwise.drafters.scope import Scope
from specwise.stats import SpecStats
from specwise.errors import USER_ERRORS, ModelError
from specwise.engine import GenerationResult, GenerationStream, SpeculativeEngine, check_prompt
from specwise.store.catalog import DEFAULT_DRAFTER, DEFAULT_TARGET
from specwise.store.loading import LoadedModel, has_gguf_source, load_model
from specwise.runners.protocols import ModelRunner
from specwise.prefix_cache import DEFAULT_PREFIX_CACHE_BYTES, PrefixCache


Prompt = str | Sequence[int] | Sequence[dict]


def eos_token_ids(model: LoadedModel) -> tuple[int, ...]:
    """Every id that ends plain generation for this model (generation config and tokenizer)."""
    ids: set[int] = set()
    configured = getattr(model.model.generation_config, "eos_token_id", None)
    if configured is not None:
        ids.update([configured] if isinstance(configured, int) else configured)
    if model.tokenizer is not None and model.tokenizer.eos_token_id is not None:
        ids.add(model.tokenizer.eos_token_id)
    return tuple(sorted(ids))


class SpecDecoder:
    """A target model with its drafters, ready for many generations.

    With max_batch = 1 it decodes one sequence at a time (it owns the target's KV
    cache) and calls from several threads are serialized. With max_batch > 1, up to
    that many generations from different threads run together: each keeps its own
    cache and drafter, and every step scores all their blocks in one target pass
    (specwise.batching); a prompt is read in chunks of prefill_chunk tokens between
    those passes. Each generation's output is what it would be alone.

    The decoder keeps the KV entries of earlier prompts and outputs (specwise.prefix_cache, at
    most prefix_cache_bytes; 0: off) and a prompt starting with one of them reads only the rest:
    in the gguf format this changes no token. `conversation()` continues a chat turn by turn.
    """

    def __init__(self, target: str | LoadedModel = DEFAULT_TARGET, spec: SpecConfig | None = None, *,
                 drafter_model: str | LoadedModel | None = None, dtype: str | torch.dtype | None = None,
                 max_batch: int = 1, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES) -> None:
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1; got {max_batch!r}")
        if not isinstance(prefill_chunk, int) or prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be an integer >= 1; got {prefill_chunk!r}")
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self._batchers: dict[tuple, Batcher] = {}
        self._batch_slots = threading.BoundedSemaphore(max_batch)
        # Drafters by configuration, the idle ones bounded: requests choose configurations.
        self._drafters = DrafterPool(max(DEFAULT_IDLE_DRAFTERS, 2 * max_batch))
        self._drafters_share: dict = {}  # what this decoder's drafters share (DrafterContext.shared)
        self.spec = spec or SpecConfig()
        self.dtype = dtype
        self.drafter_model = drafter_model
        self._source = target  # a name or path loads each format on demand; a loaded model is its own format
        # Loaded targets by (format, device): a loaded model is its own format on its own device.
        self._targets: dict[tuple[str, str], LoadedModel] = (
            {(target.format, str(target.device)): target} if isinstance(target, LoadedModel) else {})
        self._auto_format: dict[str, str] = {}  # what "auto" resolved to on each device, once tried
        self.device = self.resolve_device(self.spec.device)  # fails now on a device that is not here
        self.target = self.target_model(self.spec.target_format)
        self._runners: dict[tuple, ModelRunner] = {}
        self.runner = self.runner_for(self.spec.runner, self.spec.target_format, compile_step=self.spec.compile_step)
        self.eos_token_ids = eos_token_ids(self.target)
        self._lock = threading.Lock()  # one generation at a time over the shared KV cache
        self.drafter_for(self.spec)  # fail now, not at the first request, on a bad drafter

    def resolve_device(self, device: str | None = None) -> torch.device:
        """The torch.device for a SpecConfig.device (None: this decoder's); "auto" is where a given
        loaded model already lives, else the first CUDA device if there is one, else the CPU."""
        if device is None:
            return self.device
        if isinstance(self._source, LoadedModel):
            here = self._source.device
            if device != "auto" and resolve_device(device) != here:
                raise DeviceError(f"this decoder was given a model loaded on {here}, not {device}; move it "
                                  f"(model.to(...)) or give the target's name or path to load it there")
            return here
        return resolve_device(device)

    def resolve_format(self, target_format: str, device: str | None = None) -> str:
        """"gguf" or "dense" for a SpecConfig.target_format; "auto" is gguf for a model that comes
        from a GGUF file, on the CPU (a file that cannot run as stored is refused, naming why),
        else dense."""
        place = self.resolve_device(device)
        if target_format == "gguf" and place.type != "cpu":
            raise DeviceError(f"target_format 'gguf' runs the GGUF blocks with specwise's CPU kernels, not on "
                              f"{place}; use target_format 'dense' (or 'auto'), or device 'cpu'")
        if target_format != "auto":
            return target_format
        if isinstance(self._source, LoadedModel):
            return self._source.format
        if place.type != "cpu":
            return "dense"  # the GGUF blocks run on CPU kernels only
        if str(place) not in self._auto_format:
            self._auto_format[str(place)] = self._auto_target(place).format
        return self._auto_format[str(place)]

    def check_format(self, target_format: str, device: str | None = None) -> None:
        """Raise a user error (specwise.errors.USER_ERRORS) when this decoder cannot run its target
        in this format on this device; loads nothing, so that a request can be refused up front."""
        place = self.resolve_device(device)
        if target_format == "auto":
            return
        self.resolve_format(target_format, str(place))  # gguf off the CPU
        if (target_format, str(place)) in self._targets:
            return
        if isinstance(self._source, LoadedModel):
            raise ValueError(f"this decoder was given a loaded {self._source.format} model; the {target_format} "
                             "format needs the target's name or path; use target_format 'auto'")
        if target_format == "gguf" and not has_gguf_source(self._source):
            raise ModelError("this model does not come from a GGUF file (a known model name or a .gguf path); "
                             "use target_format 'auto' or 'dense'")

    def _auto_target(self, place: torch.device) -> LoadedModel:
        # A GGUF source runs as stored. One that cannot is refused with the reason, not run dense
        # instead: the dense format writes a bfloat16 copy of the model, only when asked for.
        return self.target_model("gguf" if has_gguf_source(self._source) else "dense", str(place))

    def target_model(self, target_format: str = "auto", device: str | None = None) -> LoadedModel:
        """The target in this format ("auto", "gguf" or "dense") on this device (None: the
        decoder's), loaded once per decoder."""
        place = self.resolve_device(device)
        resolved = self.resolve_format(target_format, str(place))
        key = (resolved, str(place))
        if key not in self._targets:
            if isinstance(self._source, LoadedModel):
                raise ValueError(f"this decoder was given a loaded {self._source.format} model; the {resolved} "
                                 "format needs the target's name or path")
            self._targets[key] = load_model(self._source, self.dtype, format=resolved, device=place)
        return self._targets[key]

    def runner_for(self, kind: str, target_format: str = "auto", device: str | None = None, *,
                   compile_step: bool = False) -> ModelRunner:
        """The target's runner of this kind ("auto", "hf", "lean") in this format on this device,
        made once per decoder; compile_step: the lean runner's compiled scoring step."""
        model = self.target_model(target_format, device)
        key = (kind, model.format, str(model.device), compile_step)
        if key not in self._runners:
            self._runners[key] = model.runner(kind, compile_step=compile_step)
        return self._runners[key]

    def cached_prefix_tokens(self, prompt_ids: Sequence[int], spec: SpecConfig | None = None,
                             scope: Scope = ()) -> int:
        """Tokens of this prompt whose KV entries the prefix cache holds now for a generation with
        `spec` in sharing scope `scope` (what it would not read again); 0 when that generation's runner
        has not been made yet (nothing is loaded to answer)."""
        spec = spec or self.spec
        try:  # only what is made already: answering must never load a model
            place = str(self.resolve_device(spec.device))
        except (DeviceError, ValueError):  # a device this decoder cannot use: the request will say why
            return 0
        target_format = spec.target_format
        if target_format == "auto":
            target_format = (self._source.format if isinstance(self._source, LoadedModel)
                             else self._auto_format.get(place, "gguf" if has_gguf_source(self._source) else "dense"))
        runner = self._runners.get((spec.runner, target_format, place, spec.compile_step))
        if runner is None:
            return 0
        return self.prefix_cache.cached_tokens(runner, list(prompt_ids)[:-1], scope)

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def drafter_for(self, spec: SpecConfig) -> Drafter:
        """The drafter for this configuration, made once while it is in use (the one-at-a-time path
        shares it); one unused while many others were made is dropped (specwise.drafters.pool)."""
        return self._drafters.shared(self._drafter_key(spec), lambda: self._new_drafter(spec))

    def _drafter_options(self, spec: SpecConfig) -> dict:
        options = dict(spec.drafter_options)
        if spec.drafter == "draft-model":
            options.setdefault("model", self.drafter_model or DEFAULT_DRAFTER)
            options.setdefault("dtype", self.dtype)
            options.setdefault("quantize", spec.draft_quantize)
            options.setdefault("vocab", spec.draft_vocab)
        return options

    def _drafter_key(self, spec: SpecConfig) -> tuple:
        """Configurations with the same key share a drafter: the same target (format, device), the
        settings declared as the drafter's (config.drafter_settings) and the drafter options."""
        target = self.target_model(spec.target_format, spec.device)
        options = self._drafter_options(spec)
        return (target.format, str(target.device), drafter_settings(spec),
                tuple(sorted((k, id(v) if isinstance(v, LoadedModel) else v) for k, v in options.items())))

    def _new_drafter(self, spec: SpecConfig) -> Drafter:
        target = self.target_model(spec.target_format, spec.device)  # a feature drafter reads its states
        context = DrafterContext(target, spec, self.runner.vocab_size, self._drafter_options(spec),
                                 shared=self._drafters_share)
        try:
            return create_drafter(spec.drafter, context)
        except USER_ERRORS as exc:  # the drafter setting's error (ConfigError's `field`): a server names it
            if getattr(exc, "field", None) is None:
                exc.field = "drafter"
            raise

    @contextmanager
    def _borrowed_drafter(self, spec: SpecConfig) -> Iterator[Drafter]:
        """A drafter of this configuration for one batched generation alone (a drafter holds one
        generation's state); returned for the next one afterwards."""
        with self._drafters.borrowed(self._drafter_key(spec), lambda: self._new_drafter(spec)) as drafter:
            yield drafter

    def drafters(self) -> list[Drafter]:
        """The drafters held now (in use, and a bounded number of idle ones), e.g. to report what
        they hold."""
        return self._drafters.drafters()

    def batchers(self) -> list[Batcher]:
        """The batchers made so far (one per target runner that batched generations used)."""
        return list(self._batchers.values())

    def batcher_for(self, spec: SpecConfig) -> Batcher:
        """The batcher of the target runner this configuration names, made once per decoder."""
        runner = self.runner_for(spec.runner, spec.target_format, spec.device)
        model = self.target_model(spec.target_format, spec.device)
        key = (spec.runner, model.format, str(model.device))
        if key not in self._batchers:
            batcher = Batcher(lambda: model.runner(spec.runner), prefill_chunk=self.prefill_chunk,
                              name=f"{model.name}-{model.format}")
            prior = self._cost_prior(runner)(512)  # T(rows) at a typical context, where it was measured
            batcher.planner.prior = prior
            self._batchers[key] = batcher
        return self._batchers[key]

    def encode(self, prompt: Prompt, chat: bool | None = None) -> list[int]:
        """Token ids for a prompt: ids as given, text (chat template applied if chat), or messages.

        chat=None applies the chat template to text when the tokenizer has one.
        """
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer; pass token ids instead of text")
            use_chat = chat if chat is not None else bool(getattr(self.tokenizer, "chat_template", None))
            if use_chat:
                return self.encode([{"role": "user", "content": prompt}])
            return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        items = list(prompt)
        if items and isinstance(items[0], dict):
            if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
                raise ValueError("messages need a tokenizer with a chat template; pass text or token ids")
            from jinja2 import TemplateError

            try:
                ids = self.tokenizer.apply_chat_template(items, add_generation_prompt=True, tokenize=True)
            except TemplateError as error:  # a template that does not compile, or refuses these messages
                raise ValueError(f"the model's chat template rejected these messages: {error} (the template "
                                 "comes with the model; --raw sends the text without it)") from None
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return list(ids)
        return [int(t) for t in items]

    def stream(self, prompt: Prompt, sampling: SamplingParams | None = None, *,
               spec: SpecConfig | None = None, chat: bool | None = None) -> GenerationStream:
        """Generate, yielding TokenEvents as tokens are committed; `.result` at the end."""
        sampling = sampling or SamplingParams()
        spec = spec or self.spec
        ids = self.encode(prompt, chat)
        self.check(ids, sampling)
        if self.max_batch > 1:
            return self._batched_stream(ids, sampling, spec)
        runner = self.runner_for(spec.runner, spec.target_format, spec.device, compile_step=spec.compile_step)
        engine = SpeculativeEngine(runner, self.drafter_for(spec), spec, tokenizer=self.tokenizer,
                                   eos_token_ids=self.eos_token_ids,
                                   cost_prior=self._cost_prior(runner) if spec.adaptive is not False else None,
                                   prefix_cache=self.prefix_cache)
        inner = engine.stream(ids, sampling)  # checks only; nothing runs until iterated
        return GenerationStream(self._locked(inner), inner.stats)

    def _batched_stream(self, ids: list[int], sampling: SamplingParams, spec: SpecConfig) -> GenerationStream:
        if spec.compile_step:
            raise ValueError("compile_step compiles one sequence's step; it does not apply to batched decoding "
                             "(max_batch > 1)")
        if spec.drafter == "layerskip":  # it drafts in the target runner's own cache, not in a shared pass
            raise ValueError("drafter 'layerskip' drafts with the target's own runner, one sequence at a time; "
                             "it does not apply to batched decoding: use max_batch 1 (--max-batch 1)")
        batcher = self.batcher_for(spec)
        stats = SpecStats()

        def events():
            with self._batch_slots, self._borrowed_drafter(spec) as drafter, batcher.join() as member:
                engine = SpeculativeEngine(member, drafter, spec, tokenizer=self.tokenizer,
                                           eos_token_ids=self.eos_token_ids, prefix_cache=self.prefix_cache)
                return (yield from engine.stream(ids, sampling, stats).events)

        return GenerationStream(events(), stats)

    def _cost_prior(self, runner: ModelRunner):
        """prompt length -> the target's T(n) saved by `specwise bench cost` for this model,
        dtype, thread count and runner (None where nothing matches)."""
        from specwise.cost_model import cached_cost_function
        from specwise.runners.lean import LeanRunner

        kind = "lean" if isinstance(runner, LeanRunner) else "hf"
        model = next(m for m in self._targets.values() if m.runs(runner.model))
        threads, weights = torch.get_num_threads(), model.weights
        return lambda length: cached_cost_function(model.name, weights, threads, kind, length)

    def check(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        """Raise ValueError if these ids cannot be generated from (empty, out of vocabulary,
        or prompt + max_new_tokens beyond the context window). Loads nothing, takes no lock."""
        check_prompt(self.runner, prompt_ids, sampling)

    def _locked(self, inner: GenerationStream):
        with self._lock:
            return (yield from inner.events)

    def generate(self, prompt: Prompt, sampling: SamplingParams | None = None, *,
                 spec: SpecConfig | None = None, chat: bool | None = None) -> GenerationResult:
        return self.stream(prompt, sampling, spec=spec, chat=chat).result

    def conversation(self, system: str | None = None) -> Conversation:
        """A chat continued turn by turn (`Conversation.send`): each turn's prompt starts with the
        last turn's prompt and answer, which the prefix cache holds, so only the new part is read."""
        return Conversation(self, system)


_DECODERS: dict[tuple, SpecDecoder] = {}


def _decoder(target, drafter_model, dtype, device: str) -> SpecDecoder:
    key = (target if isinstance(target, str) else id(target),
           drafter_model if drafter_model is None or isinstance(drafter_model, str) else id(drafter_model),
           str(dtype), device)
    if key not in _DECODERS:
        _DECODERS[key] = SpecDecoder(target, SpecConfig(drafter="none", device=device), drafter_model=drafter_model,
                                     dtype=dtype)
    return _DECODERS[key]


def stream(prompt: Prompt, *, target: str | LoadedModel = DEFAULT_TARGET, drafter: str | None = None,
           sampling: SamplingParams | None = None, spec: SpecConfig | None = None,
           drafter_model: str | LoadedModel | None = None, dtype: str | torch.dtype | None = None,
           chat: bool | None = None) -> GenerationStream:
    """Speculative generation as a stream of TokenEvents (models are loaded once per process).

    `drafter` names a drafter with SpecConfig's other defaults; a given `spec` names its own (giving
    both is refused, since one would be ignored).
    """
    if drafter is not None and spec is not None:
        raise ValueError(f"give drafter={drafter!r} or spec=, not both: a spec names its own drafter "
                         f"(spec.drafter={spec.drafter!r}); put the drafter in the spec instead, "
                         f"e.g. dataclasses.replace(spec, drafter={drafter!r})")
    spec = spec or (SpecConfig(drafter=drafter) if drafter is not None else SpecConfig())
    return _decoder(target, drafter_model, dtype, spec.device).stream(prompt, sampling, spec=spec, chat=chat)


def generate(prompt: Prompt, *, target: str | LoadedModel = DEFAULT_TARGET, drafter: str | None = None,
             sampling: SamplingParams | None = None, spec: SpecConfig | None = None,
             drafter_model: str | LoadedModel | None = None, dtype: str | torch.dtype | None = None,
             chat: bool | None = None) -> GenerationResult:
    """Generate text (or ids) from a prompt: text, token ids and SpecStats in the result.

    Example: `specwise.generate("Write a haiku", drafter="ngram", sampling=SamplingParams(max_new_tokens=64))`.
    """
    return stream(prompt, target=target, drafter=drafter, sampling=sampling, spec=spec,
                  drafter_model=drafter_model, dtype=dtype, chat=chat).result
