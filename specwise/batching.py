"""Continuous batching: many generations share one target pass per step.

Each generation runs its own SpeculativeEngine (own drafter, sampling settings,
random generator) in its own thread, over a `BatchMember`: a runner with its own
KV cache whose scoring passes are not run at once but handed to the `Batcher`.
When every member has handed in its block (its last token plus its draft chain
or tree), the batcher's thread scores all of them in one ragged pass
(specwise.runners.ragged) and each member verifies and commits its own rows.
Members join and leave between rounds.

A prompt is read in chunks of `prefill_chunk` tokens, one chunk per round, so a
long prompt never stalls the streams that are decoding. Where the runners share
the ragged pass, the chunk's rows ride in the members' scoring pass (the weights
are read once for both: a new request's prompt costs the others no extra pass);
elsewhere the chunk is read after the scoring pass, whose results are announced
first. A prompt's cache entries do not depend on its chunks or the rows beside
them, and a scored row never depends on the other rows of its pass, so each
generation's output is exactly what it is when it runs alone (docs/DESIGN.md,
"Numerics").

The batcher also measures the cost of its scoring passes, T(rows), and plans each
member's draft length for the next round from it and the member's own acceptance
(specwise.goodput), when the members ask for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specwise.goodput import GoodputPlanner
from specwise.runners.checks import check_window
from specwise.runners.passes import DECODER_PASS_ROWS
from specwise.runners.ragged import Block, can_score_together, score_together

log = logging.getLogger("specwise.batching")

DEFAULT_PREFILL_CHUNK = 128  # ~1.2 s of one 1.5B pass on 2 cores: the longest a prompt holds the others up
_FIRST_PATIENCE = 0.05  # seconds, until a pass has been timed


@dataclass(eq=False)
class _Request:
    member: "BatchMember"
    block: Block
    prefill: bool
    arrival: int
    since: float = field(default_factory=time.monotonic)
    read: int = 0  # prefill: tokens of the block read so far
    hidden: list[torch.Tensor] = field(default_factory=list)  # prefill with hidden_layers: per chunk
    done: bool = False
    pass_seconds: float | None = None  # scoring: this block's own share of the round's pass
    result: torch.Tensor | None = None
    error: BaseException | None = None


@dataclass
class BatchStats:
    """What the batcher has done, for /metrics: rounds, rows scored and members per round."""

    rounds: int = 0
    scored_rows: int = 0
    scored_blocks: int = 0
    prefill_chunks: int = 0
    prefill_tokens: int = 0
    score_seconds: float = 0.0
    last_rows: int = 0
    last_members: int = 0
    most_members: int = 0


class Batcher:
    """Runs the scoring passes of its members together, one round at a time, in its own thread."""

    def __init__(self, new_runner: Callable[[], object], *, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 name: str = "target") -> None:
        if not isinstance(prefill_chunk, int) or prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be an integer >= 1; got {prefill_chunk!r}")
        self.new_runner = new_runner
        self.prefill_chunk = prefill_chunk
        self.name = name
        self.stats = BatchStats()
        self.planner = GoodputPlanner()
        self._condition = threading.Condition()
        self._members: list[BatchMember] = []
        self._pending: dict[BatchMember, _Request] = {}
        self._spare: list[object] = []  # runners of members that left, for the next ones
        self._arrivals = 0
        self._patience = _FIRST_PATIENCE  # how long a round waits for the last members: about one pass
        self._thread: threading.Thread | None = None
        self._stopping = False

    @property
    def members(self) -> int:
        with self._condition:
            return len(self._members)

    def join(self) -> BatchMember:
        """A new member with an empty cache; leave() it when its generation ends."""
        with self._condition:
            runner = self._spare.pop() if self._spare else None
        if runner is None:
            runner = self.new_runner()
        member = BatchMember(self, runner)
        with self._condition:
            self._members.append(member)
            self.planner.join(member)
            if self._thread is None or not self._thread.is_alive():
                self._stopping = False
                self._thread = threading.Thread(target=self._loop, name=f"specwise-batch-{self.name}", daemon=True)
                self._thread.start()
        return member

    def stop(self) -> None:
        """End the batcher's thread (members still waiting get an error)."""
        with self._condition:
            self._stopping = True
            for request in self._pending.values():
                request.error, request.done = RuntimeError("the batcher stopped"), True
            self._pending.clear()
            self._condition.notify_all()
        if self._thread is not None:
            self._thread.join(10)

    def _leave(self, member: BatchMember) -> None:
        with self._condition:
            if member not in self._members:
                return
            self._members.remove(member)
            self.planner.leave(member)
            self._pending.pop(member, None)
            if len(self._spare) < 16:
                _empty(member.runner)  # the KV budget counts running requests only: keep no cache
                self._spare.append(member.runner)
            self._condition.notify_all()  # the others may all be waiting for this one

    def _submit(self, member: BatchMember, block: Block, prefill: bool) -> _Request:
        with self._condition:
            if member not in self._members:
                raise RuntimeError("this member has left its batch")
            self._arrivals += 1
            request = _Request(member, block, prefill, self._arrivals)
            self._pending[member] = request
            self._condition.notify_all()
            while not request.done:
                self._condition.wait()
        if request.error is not None:
            raise request.error
        return request

    def _loop(self) -> None:
        while True:
            with self._condition:
                # A round starts when every member has handed in its block, so that each pass holds every
                # active generation's rows; or when a member keeps the others waiting longer than a pass
                # takes (its consumer stopped reading, or its drafter is slow): they go on without it.
                while not self._stopping:
                    if self._pending and len(self._pending) == len(self._members):
                        break
                    if not self._pending:
                        self._condition.wait()
                        continue
                    oldest = min(r.since for r in self._pending.values())
                    left = oldest + self._patience - time.monotonic()
                    if left <= 0:
                        break
                    self._condition.wait(left)
                if self._stopping:
                    return
                requests = list(self._pending.values())
            try:
                self._round(requests)
            except BaseException as error:  # every member of the round fails with it; the batcher goes on
                log.exception("a batched pass failed")
                for request in requests:
                    if not request.done:
                        request.error, request.done = error, True
            with self._condition:
                for request in requests:
                    if request.done and self._pending.get(request.member) is request:
                        del self._pending[request.member]
                self._condition.notify_all()

    def _round(self, requests: Sequence[_Request]) -> None:
        scoring = [r for r in requests if not r.prefill and _admissible(r)]
        reading = [r for r in requests if r.prefill]
        reader = min(reading, key=lambda r: r.arrival) if reading else None  # it reaches its first token soonest
        if scoring:
            self.stats.last_members = len(requests)
            self.stats.most_members = max(self.stats.most_members, len(requests))
        if scoring and reader is not None and self._fuse(scoring, reader):
            reader = None  # its chunk was read in the scoring pass
        elif scoring:
            started = time.perf_counter()
            results = _score_each_failing_alone(scoring)
            seconds = time.perf_counter() - started
            rows = sum(len(r.block.ids) for r in scoring)
            self.planner.observe_pass(rows, seconds)
            self._patience = min(max(seconds, 0.005), 1.0)
            self._settle(scoring, results, seconds, rows)
            with self._condition:  # announced now: the members verify while a prompt chunk is read
                self._condition.notify_all()
            self.stats.score_seconds += seconds
        if reader is not None:
            try:
                self._read_chunk(reader)
            except Exception as error:  # this prompt's failure is its own: the others' rounds go on
                reader.error, reader.done = error, True
        self.stats.rounds += 1

    def _settle(self, scoring: Sequence[_Request], results: Sequence, seconds: float, rows: int) -> None:
        """Hand each scoring member its logits (or its error) and what its own rows cost."""
        cost = self.planner.cost()
        for request, outcome in zip(scoring, results):
            if isinstance(outcome, BaseException):
                request.error = outcome
            else:
                request.result = outcome
            # What its own rows cost, for its adaptive k: T(own rows) as the planner fits it from the
            # scoring passes so far, else its rows' share of this pass; never the wait for the round.
            own = len(request.block.ids)
            request.pass_seconds = max(cost(own), 1e-6) if cost is not None else seconds * own / rows
            request.done = True
        scored = sum(len(r.block.ids) for r in scoring)
        self.stats.scored_rows += scored
        self.stats.scored_blocks += len(scoring)
        self.stats.last_rows = scored

    def _fuse(self, scoring: Sequence[_Request], reader: _Request) -> bool:
        """Score the members' blocks and read the reader's next chunk in one pass, where the ragged pass
        takes them all (a chain without hidden layers, at most DECODER_PASS_ROWS rows in all); False,
        with nothing read or scored, where it does not or the shared pass fails (the round then scores
        and reads apart, each failure its own)."""
        chunk = list(reader.block.ids[reader.read:reader.read + self.prefill_chunk])
        runners = [r.member.runner for r in scoring] + [reader.member.runner]
        rows = sum(len(r.block.ids) for r in scoring) + len(chunk)
        if reader.block.hidden_layers is not None or rows > DECODER_PASS_ROWS or not can_score_together(runners):
            return False
        started = time.perf_counter()
        try:
            outcomes = score_together(runners, [r.block for r in scoring] + [Block(chunk, logits=False)])
        except Exception:
            log.warning("a pass of %d members and a prompt chunk failed; scoring and reading apart", len(scoring))
            return False
        seconds = time.perf_counter() - started
        # Not a scoring pass's cost (most of its rows skip the output layer): the planner's T(rows) and
        # the round's patience stay with the scoring passes.
        self._settle(scoring, outcomes[:-1], seconds, rows)
        self.stats.score_seconds += seconds
        self._advance(reader, chunk)
        with self._condition:
            self._condition.notify_all()
        return True

    def _read_chunk(self, request: _Request) -> None:
        ids = request.block.ids[request.read:request.read + self.prefill_chunk]
        extra = {} if request.block.hidden_layers is None else {"hidden_layers": request.block.hidden_layers}
        runner = request.member.runner
        runner.forward(ids, logits=False, **extra)
        if extra:
            request.hidden.append(runner.last_hidden)
        self._advance(request, ids)

    def _advance(self, request: _Request, ids: Sequence[int]) -> None:
        """Count a chunk of the request's prompt read; the prompt done, or its patience started again."""
        request.read += len(ids)
        self.stats.prefill_chunks += 1
        self.stats.prefill_tokens += len(ids)
        if request.read >= len(request.block.ids):
            if request.hidden:
                request.member.runner.last_hidden = torch.cat(request.hidden)
            request.done = True
        else:  # its patience starts again: waiting for it, the next round would start alone with its chunk
            request.since = time.monotonic()


def _admissible(request: _Request) -> bool:
    """Check a member's block against its own cache before the shared pass (the pass would raise
    for every member); a block that cannot be scored ends its member's request alone."""
    runner, block = request.member.runner, request.block
    try:
        bad = [t for t in block.ids if not 0 <= int(t) < runner.vocab_size]
        if bad:
            raise ValueError(f"block token ids must be in [0, {runner.vocab_size}); got {bad[:5]}")
        if block.parents is not None:
            if len(block.parents) != len(block.ids):
                raise ValueError(f"{len(block.ids)} tree tokens but {len(block.parents)} parents")
            wrong = [i for i, p in enumerate(block.parents) if not -1 <= int(p) < i]
            if wrong:
                raise ValueError(f"the parent of tree node {wrong[0]} must be -1 or an earlier node")
        check_window(runner.length, len(block.ids), runner.max_context)
    except ValueError as error:
        request.error, request.done = error, True
        return False
    return True


def _score_each_failing_alone(scoring: Sequence[_Request]) -> list[torch.Tensor | BaseException]:
    """Each block's logits, or the error scoring it raised: from one shared pass where the runners
    allow it, and when that pass raises, from each block scored alone (a shared pass appends to
    the caches only once it has run), so that an error stays its own member's."""
    runners, blocks = [r.member.runner for r in scoring], [r.block for r in scoring]
    if len(scoring) > 1 and can_score_together(runners):
        try:
            return list(score_together(runners, blocks))
        except Exception:
            log.warning("a batched pass of %d members failed; scoring each alone", len(scoring))
    outcomes: list[torch.Tensor | BaseException] = []
    for runner, block in zip(runners, blocks):
        try:
            outcomes.append(score_together([runner], [block])[0])
        except Exception as error:
            outcomes.append(error)
    return outcomes


def _empty(runner) -> None:
    """Let go of a runner's KV cache (its next reset() allocates a small one again)."""
    free = getattr(runner, "free_cache", None)
    if callable(free):
        free()
    else:
        runner.reset()


class BatchMember:
    """One generation's view of the shared target: the runner protocol (ModelRunner, TreeRunner,
    FeatureRunner) over a cache of its own, whose passes run in its batcher's rounds."""

    def __init__(self, batcher: Batcher, runner) -> None:
        self.batcher = batcher
        self.runner = runner
        self.vocab_size: int = runner.vocab_size
        self.max_context: int = runner.max_context
        self.device = getattr(runner, "device", torch.device("cpu"))
        self.model = getattr(runner, "model", None)
        # The last scoring pass's cost to this member alone (the engine's adaptive k reads it: the time
        # around forward() includes waiting for the round and the other members' rows).
        self.last_pass_seconds: float | None = None
        self._left = False

    def __enter__(self) -> BatchMember:
        return self

    def __exit__(self, *exc) -> None:
        self.leave()

    def leave(self) -> None:
        if not self._left:
            self._left = True
            self.batcher._leave(self)

    @property
    def length(self) -> int:
        return self.runner.length

    @property
    def last_hidden(self) -> torch.Tensor | None:
        return self.runner.last_hidden

    def reset(self) -> None:
        self.runner.reset()

    def rollback(self, n: int) -> None:
        self.runner.rollback(n)

    def keep(self, start: int, indices: Sequence[int]) -> None:
        self.runner.keep(start, indices)

    def limit(self, k_max: int | None) -> None:
        """The most this member drafts per step (None: not planned, e.g. trees)."""
        self.batcher.planner.limit(self, k_max)

    def planned_k(self) -> int | None:
        """The draft length the batcher's goodput plan gives this member for its next block (None:
        no plan yet; the engine's own choice stands)."""
        return self.batcher.planner.planned_k(self)

    def observe(self, proposed: int, accepted: int, draft_seconds: float) -> None:
        """Tell the planner how a block fared (its acceptance drives the next plans)."""
        self.batcher.planner.observe(self, proposed, accepted, draft_seconds)

    def forward(self, ids: Sequence[int], *, logits: bool = True,
                hidden_layers: Sequence[int] | None = None) -> torch.Tensor | None:
        ids = list(ids)
        if not ids:  # nothing to run: no need to wait for a round
            extra = {} if hidden_layers is None else {"hidden_layers": hidden_layers}
            return self.runner.forward(ids, logits=logits, **extra)
        block = Block(ids, None, None if hidden_layers is None else tuple(hidden_layers))
        request = self.batcher._submit(self, block, prefill=not logits)
        self.last_pass_seconds = request.pass_seconds
        return request.result if logits else None

    def forward_tree(self, ids: Sequence[int], parents: Sequence[int], *,
                     hidden_layers: Sequence[int] | None = None) -> torch.Tensor:
        block = Block(list(ids), list(parents), None if hidden_layers is None else tuple(hidden_layers))
        if not block.ids:
            return self.runner.forward_tree([], [])
        request = self.batcher._submit(self, block, prefill=False)
        self.last_pass_seconds = request.pass_seconds
        return request.result
