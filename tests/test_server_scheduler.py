"""The server's scheduler alone: bounded line, cancellation, one job per decoder at a time.

Fake decoders stand in for SpecDecoder: their streams yield one event per
permit the test releases, so every interleaving here is decided by the test.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from specwise.config import SamplingParams, SpecConfig
from specwise.server.scheduler import MAX_PASSED_OVER, Job, QueueFull, Scheduler, ShuttingDown, TooLarge
from specwise.stopping import TokenEvent


class FakeStream:
    def __init__(self, decoder: "FakeDecoder", tokens: int) -> None:
        self.decoder = decoder
        self.tokens = tokens
        self.closed = False
        self.result = f"result of {decoder.name}"

    def __iter__(self):
        for i in range(self.tokens):
            if not self.decoder.permits.acquire(timeout=10):
                raise TimeoutError("no permit")
            yield TokenEvent(i, str(i), False)

    def close(self) -> None:
        self.closed = True


class FakeDecoder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.permits = threading.Semaphore(0)
        self.streams: list[FakeStream] = []

    def stream(self, prompt_ids, sampling, *, spec) -> FakeStream:
        self.streams.append(FakeStream(self, 3))
        return self.streams[-1]


def _job(decoder: FakeDecoder, loop) -> Job:
    return Job(decoder.name, decoder, [1, 2], SamplingParams(max_new_tokens=3), SpecConfig(drafter="none"), loop)


async def _collect(job: Job) -> list:
    return [(m.kind, m.value) async for m in job.messages()]


async def _until(condition, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition never became true"
        await asyncio.sleep(0.005)


def test_line_is_bounded_and_cancelling_a_waiting_job_frees_its_place():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        decoder = FakeDecoder("a")
        finished: list[tuple[str, int]] = []
        scheduler = Scheduler(workers=1, max_queue=1, on_finish=lambda j, m, n: finished.append((m.kind, n)))
        running, waiting, refused = (_job(decoder, loop) for _ in range(3))
        scheduler.submit(running)
        await _until(lambda: scheduler.running == 1)
        scheduler.submit(waiting)
        with pytest.raises(QueueFull, match="max_queue=1"):
            scheduler.submit(refused)
        assert waiting.cancel() is True and waiting.cancel() is False
        assert scheduler.waiting == 0
        assert await _collect(waiting) == [("cancelled", 0)]
        scheduler.submit(refused)  # the freed place is usable again
        decoder.permits.release(6)
        assert [kind for kind, _ in await _collect(running)] == ["token"] * 3 + ["done"]
        assert (await _collect(refused))[-1] == ("done", "result of a")
        assert len(decoder.streams) == 2  # the cancelled job never started a stream
        await _until(lambda: len(finished) == 3)
        assert sorted(finished) == [("cancelled", 0), ("done", 3), ("done", 3)]
        scheduler.stop()

    asyncio.run(scenario())


def test_cancelling_a_running_job_closes_its_stream_after_the_current_token():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        decoder = FakeDecoder("a")
        scheduler = Scheduler(workers=1, max_queue=0)
        job = _job(decoder, loop)
        scheduler.submit(job)
        decoder.permits.release(1)
        first = await anext(job.messages())
        assert first.kind == "token"
        assert job.cancel() is True
        decoder.permits.release(1)  # let the step in progress finish
        rest = await _collect(job)
        assert rest[-1][0] == "cancelled" and rest[-1][1] <= 2
        assert decoder.streams[0].closed
        await _until(lambda: scheduler.running == 0)
        scheduler.stop()

    asyncio.run(scenario())


def test_a_worker_skips_jobs_whose_decoder_is_busy():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        a, b = FakeDecoder("a"), FakeDecoder("b")
        scheduler = Scheduler(workers=2, max_queue=4)
        a1, a2, b1 = _job(a, loop), _job(a, loop), _job(b, loop)
        for job in (a1, a2, b1):
            scheduler.submit(job)
        # a2 must wait for a1 (same decoder) while b1 runs on the second worker.
        await _until(lambda: len(a.streams) == 1 and len(b.streams) == 1)
        assert scheduler.running == 2 and scheduler.waiting == 1
        b.permits.release(3)
        assert (await _collect(b1))[-1][0] == "done"
        a.permits.release(6)
        assert (await _collect(a1))[-1][0] == "done"
        assert (await _collect(a2))[-1][0] == "done"
        scheduler.stop()

    asyncio.run(scenario())


def test_stop_cancels_waiting_and_running_jobs():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        decoder = FakeDecoder("a")
        scheduler = Scheduler(workers=1, max_queue=2)
        running, waiting = _job(decoder, loop), _job(decoder, loop)
        scheduler.submit(running)
        await _until(lambda: scheduler.running == 1)
        scheduler.submit(waiting)
        stopper = threading.Thread(target=scheduler.stop)
        stopper.start()
        decoder.permits.release(1)
        assert (await _collect(waiting)) == [("cancelled", 0)]
        assert (await _collect(running))[-1][0] == "cancelled"
        stopper.join(10)
        with pytest.raises(ShuttingDown, match="shutting down"):
            scheduler.submit(_job(decoder, loop))

    asyncio.run(scenario())


def test_settings_are_checked():
    with pytest.raises(ValueError, match="workers"):
        Scheduler(workers=0)
    with pytest.raises(ValueError, match="max_queue"):
        Scheduler(max_queue=-1)
    with pytest.raises(ValueError, match="kv_budget_tokens"):
        Scheduler(kv_budget_tokens=0)


def test_kv_budget_admits_what_fits_queues_the_rest_and_refuses_what_never_fits():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        a, b, c = FakeDecoder("a"), FakeDecoder("b"), FakeDecoder("c")
        # Each job reserves 2 prompt + 3 new tokens = 5; the budget holds two of them.
        scheduler = Scheduler(workers=3, max_queue=1, kv_budget_tokens=10)
        a1, b1, c1 = _job(a, loop), _job(b, loop), _job(c, loop)
        for job in (a1, b1, c1):
            scheduler.submit(job)
        await _until(lambda: len(a.streams) == 1 and len(b.streams) == 1)
        # c1 waits for the budget although a worker and its decoder are free.
        assert (scheduler.running, scheduler.waiting, scheduler.kv_used_tokens, scheduler.kv_queued_tokens) == (
            2, 1, 10, 5)
        with pytest.raises(QueueFull, match="max_queue=1"):
            scheduler.submit(_job(c, loop))
        huge = Job("c", c, [1] * 8, SamplingParams(max_new_tokens=3), SpecConfig(drafter="none"), loop)
        with pytest.raises(TooLarge) as refused:
            scheduler.submit(huge)
        assert (refused.value.tokens, refused.value.budget) == (11, 10)
        a.permits.release(3)
        assert (await _collect(a1))[-1][0] == "done"
        await _until(lambda: len(c.streams) == 1)  # a1's tokens were freed: c1 runs
        assert (scheduler.running, scheduler.waiting, scheduler.kv_used_tokens) == (2, 0, 10)
        b.permits.release(3)
        c.permits.release(3)
        assert (await _collect(b1))[-1][0] == "done" and (await _collect(c1))[-1][0] == "done"
        await _until(lambda: scheduler.idle)
        assert scheduler.kv_used_tokens == 0
        scheduler.stop()

    asyncio.run(scenario())


def test_a_job_that_does_not_fit_yet_is_not_overtaken():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        a, b, c = FakeDecoder("a"), FakeDecoder("b"), FakeDecoder("c")
        scheduler = Scheduler(workers=3, max_queue=2, kv_budget_tokens=12)
        big = Job("b", b, [1] * 5, SamplingParams(max_new_tokens=3), SpecConfig(drafter="none"), loop)  # 8
        small = _job(c, loop)  # 5: would fit beside a1 (5), but comes after big
        a1 = _job(a, loop)
        for job in (a1, big, small):
            scheduler.submit(job)
        await _until(lambda: len(a.streams) == 1)
        assert scheduler.waiting == 2 and not b.streams and not c.streams
        a.permits.release(3)
        await _until(lambda: len(b.streams) == 1)
        assert not c.streams  # 8 + 5 > 12: small waits for big
        b.permits.release(3)
        await _until(lambda: len(c.streams) == 1)
        c.permits.release(3)
        for job in (a1, big, small):
            assert (await _collect(job))[-1][0] == "done"
        scheduler.stop()

    asyncio.run(scenario())


def test_drain_refuses_new_jobs_and_lets_submitted_ones_finish():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        decoder = FakeDecoder("a")
        scheduler = Scheduler(workers=1, max_queue=2)
        running, waiting = _job(decoder, loop), _job(decoder, loop)
        scheduler.submit(running)
        scheduler.submit(waiting)
        scheduler.drain()
        assert scheduler.draining and not scheduler.idle
        with pytest.raises(ShuttingDown):
            scheduler.submit(_job(decoder, loop))
        decoder.permits.release(6)
        assert (await _collect(running))[-1][0] == "done" and (await _collect(waiting))[-1][0] == "done"
        await _until(lambda: scheduler.idle)
        scheduler.stop()

    asyncio.run(scenario())


class CachingDecoder(FakeDecoder):
    """A fake decoder whose prefix cache holds the given prompts' prefixes (first token -> cached tokens)."""

    def __init__(self, name: str, cached: dict[int, int]) -> None:
        super().__init__(name)
        self.cached = cached
        self.order: list[int] = []

    def cached_prefix_tokens(self, prompt_ids, spec, scope) -> int:
        return self.cached.get(prompt_ids[0], 0)

    def stream(self, prompt_ids, sampling, *, spec) -> FakeStream:
        self.order.append(prompt_ids[0])
        return super().stream(prompt_ids, sampling, spec=spec)


def _prompt_job(decoder: FakeDecoder, loop, first: int) -> Job:
    return Job(decoder.name, decoder, [first, 2], SamplingParams(max_new_tokens=3), SpecConfig(drafter="none"), loop)


def test_the_longest_cached_prefix_is_admitted_first_then_arrival():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        decoder = CachingDecoder("a", {30: 32, 40: 96, 50: 32})
        scheduler = Scheduler(workers=1, max_queue=8)
        jobs = [_prompt_job(decoder, loop, first) for first in (10, 20, 30, 40, 50)]
        for job in jobs:
            scheduler.submit(job)
        await _until(lambda: len(decoder.streams) == 1)
        decoder.permits.release(15)
        for job in jobs:
            assert (await _collect(job))[-1][0] == "done"
        # 10 was running; then 96 cached tokens, then the two of 32 in arrival order, then the rest
        assert decoder.order == [10, 40, 30, 50, 20]
        scheduler.stop()

    asyncio.run(scenario())


def test_a_job_passed_over_max_times_goes_first_whatever_the_cache():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        cached = {first: 64 for first in range(100, 120)}
        decoder = CachingDecoder("a", cached)
        scheduler = Scheduler(workers=1, max_queue=32)
        running, uncached = _prompt_job(decoder, loop, 1), _prompt_job(decoder, loop, 2)
        later = [_prompt_job(decoder, loop, first) for first in range(100, 110)]
        for job in (running, uncached, *later):
            scheduler.submit(job)
        await _until(lambda: len(decoder.streams) == 1)
        decoder.permits.release(3 * 12)
        for job in (running, uncached, *later):
            assert (await _collect(job))[-1][0] == "done"
        assert decoder.order.index(2) == 1 + MAX_PASSED_OVER  # passed over exactly MAX_PASSED_OVER times
        assert uncached.passed_over == MAX_PASSED_OVER
        scheduler.stop()

    asyncio.run(scenario())
