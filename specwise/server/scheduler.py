"""Generation off the event loop: worker threads, a bounded waiting line, cancellation.

A SpecDecoder decodes one sequence at a time, so each generation runs in a
worker thread and the requests beyond those being served wait, at most
`max_queue` of them; past that `submit` raises QueueFull (the app answers 429)
rather than letting the line grow without limit. A worker only takes a job whose
decoder is free, so with several models and several workers no worker sits
blocked on a busy decoder's lock while another model's job waits.

Tokens travel to the event loop through one asyncio queue per job, so the
outputs of concurrent requests never meet. A cancelled job (its client went
away) leaves the line at once, or, when running, has its GenerationStream
closed after the step in progress; either way its place is freed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from specwise.config import SamplingParams, SpecConfig
from specwise.drafters.scope import Scope, in_scope

log = logging.getLogger("specwise.server")


class QueueFull(Exception):
    """No place left in the waiting line."""


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
    started: bool = False  # a worker began generating it
    _messages: asyncio.Queue = field(default_factory=asyncio.Queue, repr=False)
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    _finished: threading.Event = field(default_factory=threading.Event, repr=False)
    _scheduler: "Scheduler | None" = field(default=None, repr=False)

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
    """Worker threads taking jobs from one bounded, first-come first-served line."""

    def __init__(self, workers: int = 1, max_queue: int = 16,
                 on_finish: Callable[[Job, Message, int], None] | None = None) -> None:
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1; got {workers!r}")
        if not isinstance(max_queue, int) or max_queue < 0:
            raise ValueError(f"max_queue must be an integer >= 0; got {max_queue!r}")
        self.workers = workers
        self.max_queue = max_queue
        self.on_finish = on_finish  # called in the worker with (job, final message, tokens generated)
        self._waiting: deque[Job] = deque()
        self._busy: set[int] = set()  # id() of the decoders generating now
        self._active: set[Job] = set()
        self._condition = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._started = False

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._active)

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

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel every job and end the workers (each after the step it is in)."""
        with self._condition:
            self._stopping = True
            dropped = list(self._waiting)
            self._waiting.clear()
            for job in self._active:
                job._cancelled.set()  # each stops after its current step
            self._condition.notify_all()
            threads, self._threads = self._threads, []
        for job in dropped:
            job._cancelled.set()
            self._finish(job, Message("cancelled", 0), 0)
        for thread in threads:
            thread.join(timeout)

    def submit(self, job: Job) -> None:
        """Put a job in line, or raise QueueFull when the line is full."""
        if not self._started:
            self.start()  # for ASGI servers that skip the lifespan events
        with self._condition:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            idle = self.workers - len(self._active)
            if len(self._waiting) >= self.max_queue + idle:
                raise QueueFull(f"{len(self._active)} generating and {len(self._waiting)} waiting, "
                                f"the most this server queues (max_queue={self.max_queue})")
            job._scheduler = self
            self._waiting.append(job)
            self._condition.notify_all()

    def _withdraw(self, job: Job) -> None:
        with self._condition:
            try:
                self._waiting.remove(job)
            except ValueError:
                return  # running (it will see the flag) or already finished
            self._condition.notify_all()
        self._finish(job, Message("cancelled", 0), 0)

    def _next_job(self) -> Job | None:
        with self._condition:
            while True:
                if self._stopping:
                    return None
                job = next((j for j in self._waiting if id(j.decoder) not in self._busy), None)
                if job is not None:
                    self._waiting.remove(job)
                    self._busy.add(id(job.decoder))
                    self._active.add(job)
                    return job
                self._condition.wait()

    def _work(self) -> None:
        while (job := self._next_job()) is not None:
            try:
                self._run(job)
            finally:
                with self._condition:
                    self._busy.discard(id(job.decoder))
                    self._active.discard(job)
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

