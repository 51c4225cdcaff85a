"""Generation off the event loop: worker threads, a KV budget, a bounded waiting line, cancellation.

Each generation runs in a worker thread. A decoder takes up to its `max_batch`
generations at once (SpecDecoder batches their target passes; with max_batch 1
it decodes one sequence at a time). A job is admitted (handed to a worker) when
a worker and a place in its decoder are free and its KV cache, prompt plus max_new_tokens, fits in what is
left of `kv_budget_tokens`; the others wait, at most `max_queue` of them; past
that `submit` raises QueueFull (the app answers 429) rather than letting the
line grow without limit. A job larger than the whole budget raises TooLarge:
it could never run, and cutting it short would change its output. The prefix
caches' blocks count in the budget too, and are evicted to admit a job. Admission
prefers, among the jobs waiting, the one whose prompt has the longest cached prefix
(it costs least to start, and its blocks might be evicted while it waits), then
first come, first served; a job passed over MAX_PASSED_OVER times goes first
whatever its cache, so none starves. A job that does not fit yet is not
overtaken by smaller ones behind it, so a long request cannot starve. With a
client share (specwise.server.limits.ClientShare), a client that holds its share
while another client waits is passed over, and holds at most its share of the
line.

`drain` stops admitting (ShuttingDown) while admitted jobs go on; `stop` then
cancels whatever is left.

Tokens travel to the event loop through one asyncio queue per job, so the
outputs of concurrent requests never meet. A cancelled job (its client went
away) leaves the line at once, or, when running, has its GenerationStream
closed after the step in progress; either way its place is freed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specwise.config import SamplingParams, SpecConfig
from specwise.drafters.scope import Scope, in_scope
from specwise.errors import USER_ERRORS
from specwise.prefix_cache import PrefixCache
from specwise.server.limits import ClientShare

log = logging.getLogger("specwise.server")

# How many later jobs with longer cached prefixes may be admitted before a waiting job: after that it
# goes first (the wait a long cached prefix may add to another request is bounded).
MAX_PASSED_OVER = 4


class QueueFull(Exception):
    """No place left in the waiting line."""


class ShuttingDown(Exception):
    """The scheduler admits nothing more: the server is draining or stopped."""


class TooLarge(Exception):
    """A job needs more KV cache than the whole budget."""

    def __init__(self, tokens: int, budget: int) -> None:
        super().__init__(f"{tokens} tokens of KV cache asked, the budget is {budget}")
        self.tokens = tokens
        self.budget = budget


@dataclass(frozen=True)
class Message:
    """What a worker tells the event loop about a job.

    kind: "token" (value: TokenEvent), "done" (GenerationResult), "failed" (the
    exception) or "cancelled" (the number of tokens generated before stopping).
    """

    kind: str
    value: Any

    @property
    def final(self) -> bool:
        return self.kind != "token"


@dataclass(eq=False)
class Job:
    """One generation request on its way through the scheduler."""

    model: str  # the served model name, for metrics
    decoder: Any  # a SpecDecoder (anything with .stream(ids, sampling, spec=...))
    prompt_ids: list[int]
    sampling: SamplingParams
    spec: SpecConfig
    loop: asyncio.AbstractEventLoop
    sharing: Scope = ()  # whose earlier requests its drafter may draft from (specwise.drafters.scope)
    client: str = ""  # whose share of the server it counts against (specwise.server.limits.ClientShare)
    started: bool = False  # a worker began generating it
    passed_over: int = 0  # times a job that came later was admitted first (for its cached prefix)
    _messages: asyncio.Queue = field(default_factory=asyncio.Queue, repr=False)
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    _finished: threading.Event = field(default_factory=threading.Event, repr=False)
    _scheduler: "Scheduler | None" = field(default=None, repr=False)

    @property
    def tokens(self) -> int:
        """The KV cache it may fill: prompt plus every token it may generate."""
        return len(self.prompt_ids) + self.sampling.max_new_tokens

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def cancel(self) -> bool:
        """Stop this job (idempotent); True when it had not finished yet."""
        if self._finished.is_set() or self._cancelled.is_set():
            return False
        self._cancelled.set()
        if self._scheduler is not None:
            self._scheduler._withdraw(self)
        return True

    async def messages(self) -> AsyncIterator[Message]:
        """The job's messages in order, up to and including the final one."""
        while True:
            message = await self._messages.get()
            yield message
            if message.final:
                return

    def _post(self, message: Message) -> None:
        """From a worker thread: hand a message to the event loop."""
        if message.final:
            self._finished.set()
        try:
            self.loop.call_soon_threadsafe(self._messages.put_nowait, message)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._cancelled.set()


class Scheduler:
    """Worker threads taking admitted jobs; the rest wait in one bounded, first-come first-served line."""

    def __init__(self, workers: int = 1, max_queue: int = 16, kv_budget_tokens: int | None = None,
                 on_finish: Callable[[Job, Message, int], None] | None = None,
                 share: ClientShare | None = None, caches: Sequence[PrefixCache] = ()) -> None:
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1; got {workers!r}")
        if not isinstance(max_queue, int) or max_queue < 0:
            raise ValueError(f"max_queue must be an integer >= 0; got {max_queue!r}")
        if kv_budget_tokens is not None and (not isinstance(kv_budget_tokens, int) or kv_budget_tokens < 1):
            raise ValueError(f"kv_budget_tokens must be an integer >= 1 or None; got {kv_budget_tokens!r}")
        self.workers = workers
        self.max_queue = max_queue
        self.kv_budget_tokens = kv_budget_tokens  # None: no limit
        self.on_finish = on_finish  # called in the worker with (job, final message, tokens generated)
        self.share = share  # None: first come, first served, whoever sends
        self.caches = list(caches)  # prefix caches whose blocks hold part of the budget (cache_budget.py)
        self._waiting: deque[Job] = deque()  # not admitted yet
        self._ready: deque[Job] = deque()  # admitted, for the next free worker
        self._busy: Counter[int] = Counter()  # admitted jobs per decoder (by id())
        self._active: set[Job] = set()  # admitted and not finished: they hold the budget
        self._condition = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._draining = False
        self._stopping = False
        self._started = False

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._active)

    @property
    def kv_used_tokens(self) -> int:
        """KV cache reserved by the admitted jobs (each its prompt plus max_new_tokens)."""
        with self._condition:  # reentrant: _admit asks while holding it
            return sum(job.tokens for job in self._active)

    @property
    def kv_cached_tokens(self) -> int:
        """KV cache the prefix caches hold (tokens of their blocks)."""
        return sum(cache.tokens for cache in self.caches)

    def counts_by_model(self) -> dict[str, tuple[int, int]]:
        """(running, waiting) jobs per served model name."""
        with self._condition:
            running, waiting = Counter(job.model for job in self._active), Counter(job.model for job in self._waiting)
        return {model: (running[model], waiting[model]) for model in running | waiting}

    @property
    def kv_queued_tokens(self) -> int:
        with self._condition:
            return sum(job.tokens for job in self._waiting)

    @property
    def draining(self) -> bool:
        return self._draining or self._stopping

    @property
    def idle(self) -> bool:
        """Nothing admitted and nothing waiting."""
        with self._condition:
            return not self._active and not self._waiting

    def start(self) -> None:
        with self._condition:
            if self._threads:
                return
            self._stopping = False
            self._started = True
            self._threads = [threading.Thread(target=self._work, name=f"specwise-worker-{i}", daemon=True)
                             for i in range(self.workers)]
        for thread in self._threads:
            thread.start()

    def drain(self) -> None:
        """Admit no new job (submit raises ShuttingDown); the jobs already submitted go on."""
        with self._condition:
            self._draining = True

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel every job and end the workers (each after the step it is in)."""
        with self._condition:
            self._stopping = True
            dropped = list(self._waiting) + list(self._ready)
            self._waiting.clear()
            self._ready.clear()
            for job in self._active:
                job._cancelled.set()  # each stops after its current step
            for job in dropped:
                self._release(job)
            self._condition.notify_all()
            threads, self._threads = self._threads, []
        for job in dropped:
            job._cancelled.set()
            self._finish(job, Message("cancelled", 0), 0)
        for thread in threads:
            thread.join(timeout)

    def submit(self, job: Job) -> None:
        """Admit a job or put it in line; raise QueueFull when the line is full, TooLarge when it can never fit."""
        if not self._started:
            self.start()  # for ASGI servers that skip the lifespan events
        with self._condition:
            if self._draining or self._stopping:
                raise ShuttingDown("the server is shutting down")
            if self.kv_budget_tokens is not None and job.tokens > self.kv_budget_tokens:
                raise TooLarge(job.tokens, self.kv_budget_tokens)
            job._scheduler = self
            self._waiting.append(job)
            self._admit()
            if job in self._waiting and len(self._waiting) > self.max_queue:
                self._waiting.remove(job)
                job._scheduler = None
                raise QueueFull(f"{len(self._active)} generating and {len(self._waiting)} waiting, "
                                f"the most this server queues (max_queue={self.max_queue})")
            if job in self._waiting and self.share is not None and not self.share.may_wait(job, self._waiting):
                self._waiting.remove(job)
                job._scheduler = None
                raise QueueFull(f"this client already has {self.share.waiting} requests waiting, its share of "
                                f"the line (max_queue={self.max_queue} x client share {self.share.share:g})")

    def _admit(self) -> None:
        """Move waiting jobs to the workers while workers, decoders and budget allow (holding the lock)."""
        free = None
        if self.kv_budget_tokens is not None:
            free = self.kv_budget_tokens - self.kv_used_tokens - self.kv_cached_tokens
        for job in self._admission_order():
            if len(self._active) >= self.workers:
                break
            if self._busy[id(job.decoder)] >= getattr(job.decoder, "max_batch", 1):
                continue  # another model's job may run meanwhile
            if self.share is not None and self.share.over_share(job, self._active, self._waiting):
                continue  # its client holds its share while another client waits: that one goes first
            if free is not None and job.tokens > free:
                free += self._evict_cached(job.tokens - free)  # cached blocks never keep a request waiting
            if free is not None and job.tokens > free:
                break  # nobody overtakes it: it runs as soon as enough is freed
            for earlier in self._waiting:
                if earlier is job:
                    break
                if earlier.decoder is job.decoder:
                    earlier.passed_over += 1
            self._waiting.remove(job)
            self._busy[id(job.decoder)] += 1
            self._active.add(job)
            self._ready.append(job)
            if free is not None:
                free -= job.tokens
        self._condition.notify_all()

    def _admission_order(self) -> list[Job]:
        """The waiting jobs in the order admission considers them: those passed over MAX_PASSED_OVER
        times first, then the longest cached prefix, then arrival."""
        if len(self._waiting) < 2:
            return list(self._waiting)

        def cached(job: Job) -> int:
            peek = getattr(job.decoder, "cached_prefix_tokens", None)
            return peek(job.prompt_ids, job.spec, job.sharing) if peek is not None else 0

        def key(item: tuple[int, Job]) -> tuple[int, int, int]:
            arrival, job = item
            return (0, 0, arrival) if job.passed_over >= MAX_PASSED_OVER else (1, -cached(job), arrival)

        return [job for _, job in sorted(enumerate(self._waiting), key=key)]

    def _evict_cached(self, tokens: int) -> int:
        """Evict at least `tokens` tokens of prefix-cache blocks (least recently used first), or all of
        them; return the tokens evicted."""
        evicted = 0
        for cache in self.caches:
            if evicted >= tokens:
                break
            evicted += cache.evict_tokens(tokens - evicted)
        return evicted

    def _release(self, job: Job) -> None:
        if job in self._active:
            self._busy[id(job.decoder)] -= 1
            self._active.discard(job)

    def _withdraw(self, job: Job) -> None:
        with self._condition:
            try:
                self._waiting.remove(job)
            except ValueError:
                return  # admitted (its worker will see the flag) or already finished
            self._admit()
        self._finish(job, Message("cancelled", 0), 0)

    def _next_job(self) -> Job | None:
        with self._condition:
            while not self._ready:
                if self._stopping:
                    return None
                self._condition.wait()
            return self._ready.popleft()

    def _work(self) -> None:
        while (job := self._next_job()) is not None:
            try:
                self._run(job)
            finally:
                with self._condition:
                    self._release(job)
                    if not self._stopping:
                        self._admit()
                    self._condition.notify_all()

    def _run(self, job: Job) -> None:
        generated = 0
        stream = None
        try:
            if job.cancelled:
                self._finish(job, Message("cancelled", 0), 0)
                return
            job.started = True
            stream = job.decoder.stream(job.prompt_ids, job.sampling, spec=job.spec)
            with in_scope(job.sharing):  # the drafter reads the scope in this thread, as it starts
                for event in stream:
                    generated += 1
                    job._post(Message("token", event))
                    if job.cancelled:
                        break
            if job.cancelled:
                message = Message("cancelled", generated)
            else:
                message = Message("done", stream.result)
        except Exception as exc:  # reported to the client as an error object, never a traceback
            if isinstance(exc, USER_ERRORS):  # the request's own doing: one line, no traceback
                log.warning("generation refused for model %s: %s", job.model, exc)
            else:
                log.exception("generation failed for model %s", job.model)
            message = Message("failed", exc)
        finally:
            if stream is not None:
                stream.close()  # stops the engine and releases the decoder's lock
        self._finish(job, message, generated)

    def _finish(self, job: Job, message: Message, generated: int) -> None:
        if self.on_finish is not None:
            try:
                self.on_finish(job, message, generated)
            except Exception:
                log.exception("recording metrics failed")
        job._post(message)

