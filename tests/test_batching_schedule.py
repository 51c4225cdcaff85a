"""How the batcher schedules a long prompt beside decoding streams (specwise/batching.py).

- after each chunk of a prompt, its patience starts again: the next round waits for the decoding
  members and holds their blocks beside the next chunk, instead of reading the chunk alone;
- the round's scoring results are announced before the chunk is read: a decoding member has its
  logits, and hands in its next block, while the chunk is being read;
- a member's adaptive k is timed by its own share of the pass, never by the wait for the round.
"""

from __future__ import annotations

import threading
import time

import pytest

from helpers import long_prompt
from specwise import SamplingParams, SpecConfig, SpecDecoder
from specwise.testing import tiny_gguf_loaded

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_gguf_loaded(tmp_path_factory.mktemp("target"), seed=0, max_positions=2048)


def watch_rounds(batcher, patience: float = 2.0) -> list[tuple[int, int]]:
    """Record each round's (scoring blocks, prompt chunks read); every round's patience is `patience`, so
    that who is in a round depends on the schedule, never on how fast a thread answers."""
    rounds: list[tuple[int, int]] = []
    original = batcher._round

    def recorded(requests):
        chunks = batcher.stats.prefill_chunks
        scoring = sum(1 for r in requests if not r.prefill)
        original(requests)
        rounds.append((scoring, batcher.stats.prefill_chunks - chunks))
        batcher._patience = patience

    batcher._round = recorded
    batcher._patience = patience
    return rounds


def read_beside_a_stream(decoder, prompt: list[int], stream_seed: int, stream_tokens: int) -> None:
    """Generate two tokens after `prompt` while a stream of a 20-token prompt is decoding, the stream
    stepping on for as long as the prompt is read."""
    stream = decoder.stream(long_prompt(20, seed=stream_seed),
                            SamplingParams(max_new_tokens=stream_tokens, ignore_eos=True))
    events = iter(stream)
    next(events)  # the stream is decoding
    reader = threading.Thread(target=decoder.generate,
                              args=(prompt, SamplingParams(max_new_tokens=2, ignore_eos=True)))
    reader.start()
    while reader.is_alive():
        next(events)
    reader.join()
    stream.close()


def test_a_stream_gets_a_step_in_every_round_while_a_long_prompt_is_read(target):
    decoder = SpecDecoder(target, SpecConfig(drafter="ngram", k=2), max_batch=2, prefill_chunk=32)
    batcher = decoder.batcher_for(decoder.spec)
    rounds = watch_rounds(batcher)
    read_beside_a_stream(decoder, prompt=long_prompt(1000, seed=2), stream_seed=1, stream_tokens=600)
    reading = [scoring for scoring, chunks in rounds if chunks]
    assert len(reading) >= 1000 // 32  # every chunk of the long prompt was read in a round of its own...
    # ...and, but for the round that read the first chunk (the stream may have been verifying), each of
    # those rounds scored the stream's block too.
    assert reading[1:].count(0) == 0, reading


def test_a_prompt_chunk_rides_in_the_scoring_pass_and_reads_what_it_reads_alone(target):
    decoder = SpecDecoder(target, SpecConfig(drafter="ngram", k=2), max_batch=2, prefill_chunk=32)
    batcher = decoder.batcher_for(decoder.spec)
    rounds = watch_rounds(batcher)
    apart: list[int] = []
    read_chunk = batcher._read_chunk
    batcher._read_chunk = lambda request: (apart.append(len(request.block.ids)), read_chunk(request))
    prompt = long_prompt(300, seed=5)
    alone = SpecDecoder(target, SpecConfig(drafter="ngram", k=2), prefix_cache_bytes=0)
    want = alone.generate(prompt, SamplingParams(max_new_tokens=2, ignore_eos=True)).token_ids
    got: list = []
    stream = decoder.stream(long_prompt(20, seed=6), SamplingParams(max_new_tokens=400, ignore_eos=True))
    events = iter(stream)
    next(events)
    reader = threading.Thread(target=lambda: got.append(
        decoder.generate(prompt, SamplingParams(max_new_tokens=2, ignore_eos=True)).token_ids))
    reader.start()
    while reader.is_alive():
        next(events)
    reader.join()
    stream.close()
    assert got == [want]
    fused = [(scoring, chunks) for scoring, chunks in rounds if chunks and scoring]
    assert len(fused) >= 299 // 32 - 1  # the long prompt's chunks rode in the stream's scoring passes...
    assert apart.count(299) <= 1  # ...read apart at most once: the first, when the stream may be verifying
    assert all(chunks == 1 for _, chunks in fused)


def test_results_are_announced_before_the_next_chunk_is_read(target):
    """Where a chunk cannot ride in the scoring pass (here: made so), it is read after the pass, whose
    results are announced first."""
    decoder = SpecDecoder(target, SpecConfig(drafter="ngram", k=2), max_batch=2, prefill_chunk=16)
    batcher = decoder.batcher_for(decoder.spec)
    batcher._fuse = lambda scoring, reader: False
    watch_rounds(batcher)  # each round holds the stream's block: what is checked is when it is announced
    read_chunk = batcher._read_chunk
    seen: list[bool] = []

    def observed(request):
        # The other member got its logits when the scoring pass ended: it hands in its next block while
        # this chunk is read (bounded wait: without the announcement it would wait for the round's end).
        if len(request.block.ids) > 100:  # the long prompt's chunks (the stream read its own prompt alone)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not any(not r.prefill for r in batcher._pending.values()):
                time.sleep(0.002)
            seen.append(any(not r.prefill for r in batcher._pending.values()))
        read_chunk(request)

    batcher._read_chunk = observed
    read_beside_a_stream(decoder, prompt=long_prompt(200, seed=4), stream_seed=3, stream_tokens=400)
    assert len(seen) == -(-199 // 16) and seen.count(True) >= len(seen) - 1, seen


def test_a_members_adaptive_k_is_timed_by_its_own_share_of_the_pass(target):
    decoder = SpecDecoder(target, SpecConfig(drafter="ngram", k=2), max_batch=2)
    batcher = decoder.batcher_for(decoder.spec)
    original = batcher._round

    def slow(requests):  # every round waits 0.2 s before its pass: time no member's rows cost
        time.sleep(0.2)
        original(requests)

    batcher._round = slow
    member = batcher.join()
    try:
        member.forward([1, 2, 3], logits=False)
        assert member.last_pass_seconds is None  # a prompt chunk: no scoring share
        started = time.perf_counter()
        member.forward([4, 5])
        waited = time.perf_counter() - started
        assert waited >= 0.2 and 0 < member.last_pass_seconds < 0.2 <= waited
    finally:
        member.leave()
