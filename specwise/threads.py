"""How many threads a native pass runs with while other programs take cores (docs/DESIGN.md, "Threads under load").

A GGUF pass meets at a barrier about 280 times (gguf_pass.cpp). When another program holds one of
the cores, the scheduler deschedules one of the pass's threads for milliseconds at a time and every
barrier waits for it: on two cores with one busy, a one-token pass took 82 ms with two threads and
65 ms with one, a five-token pass 330 ms against 103 (docs/BENCHMARKS.md, "Threads under load").

So the process keeps one `ThreadGovernor`, consulted around every native pass (target, drafter, a
batch of requests). It measures, over windows of passes, what share of their thread time the pass's
threads actually ran (process CPU time / wall time / threads; the threads spin at barriers, so on an
idle machine the share is about 1). When the share falls below `LOW_SHARE`, the next passes run with
as many threads as the cores they got. While below the ceiling, it reads the machine's idle time
(Linux: /proc/stat) and goes back up when the cores it left are idle again; where that file does not
exist it tries the ceiling again now and then. The ceiling is the thread count the user set
(`torch.set_num_threads`, `--threads`).

Every pass gives the same values whatever its thread count (threads split output features, heads and
rows, never one sum: docs/DESIGN.md, "Numerics"), so this changes time only, never a token. Benchmarks
of fixed thread counts (`specwise bench cost`) turn it off; so does SPECWISE_FIXED_THREADS=1.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from specwise.kernels.cpu import cpu_ticks, usable_cores

WINDOW_S = 0.25  # wall time of passes per measurement
LOW_SHARE = 0.8  # below this share of their thread time, the pass's threads were descheduled
SPARE_CORES = 0.75  # idle cores (of those this process may run on) that bring a thread back
CALM_WINDOWS = 2  # consecutive windows with spare cores before going back up
RETRY_WINDOWS = 16  # without /proc/stat: windows below the ceiling before trying it again


def cpu_idle_ticks() -> tuple[float, float] | None:
    """(idle, total) clock ticks so far of the CPUs this process may run on (Linux' /proc/stat), or None."""
    try:
        return cpu_ticks(os.sched_getaffinity(0))
    except AttributeError:  # no affinity here: the whole machine
        return cpu_ticks()


@dataclass
class Window:
    """The passes measured since the last decision."""

    wall: float = 0.0  # seconds inside passes
    cpu: float = 0.0  # process CPU seconds inside passes
    threads: int = 0  # the thread count they ran with
    idle: tuple[float, float] | None = None  # cpu_idle_ticks() at the window's start


class ThreadGovernor:
    """The thread count of the next pass, from how the last passes' threads were scheduled."""

    def __init__(self, *, clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = time.process_time,
                 idle_ticks: Callable[[], tuple[float, float] | None] = cpu_idle_ticks,
                 cores: int | None = None) -> None:
        self.clock, self.cpu_clock, self.idle_ticks = clock, cpu_clock, idle_ticks
        self.cores = cores or usable_cores()
        self.enabled = os.environ.get("SPECWISE_FIXED_THREADS", "").lower() not in ("1", "true", "yes", "on")
        self.ceiling = 0  # the user's thread count (0: not read yet)
        self.current = 0  # the count the passes run with
        self.set_by_us = 0  # what this governor last gave torch, to tell a user's change from ours
        self.window = Window()
        self.depth = 0  # passes in progress (a pass inside a pass runs as its outer one)
        self.calm = 0  # consecutive windows with spare cores, while below the ceiling
        self.below = 0  # windows since going below the ceiling (for the retry without /proc/stat)
        self.decisions: list[tuple[int, int, float]] = []  # (from, to, share or spare cores), the latest few

    def threads(self) -> int:
        """The thread count for the next pass (also sets torch's, which `pass_scope` restores)."""
        user = torch.get_num_threads()
        if user != self.set_by_us or not self.ceiling:  # first use, or the user chose another count
            self.ceiling = self.current = user
            self.window, self.calm, self.below = Window(), 0, 0
        if self.enabled and self.current != user:
            torch.set_num_threads(self.current)
            self.set_by_us = self.current
        else:
            self.set_by_us = user
        return self.current if self.enabled else user

    @contextlib.contextmanager
    def pass_scope(self) -> Iterator[int]:
        """Around one pass: its thread count, measured; torch's count is the user's again afterwards."""
        if self.depth:
            yield torch.get_num_threads()
            return
        threads = self.threads()
        self.depth += 1
        start, cpu = self.clock(), self.cpu_clock()
        try:
            yield threads
        finally:
            wall, used = self.clock() - start, self.cpu_clock() - cpu
            self.depth -= 1
            if self.set_by_us != self.ceiling:
                torch.set_num_threads(self.ceiling)
            self.set_by_us = self.ceiling
            self.observe(threads, wall, used)

    def observe(self, threads: int, wall: float, cpu: float) -> None:
        """One pass of `threads` threads took `wall` seconds and `cpu` seconds of the process's CPU time."""
        if not self.enabled or self.ceiling <= 1:
            return
        w = self.window
        if w.threads != threads:  # a window holds passes of one thread count
            self.window = w = Window(threads=threads, idle=self.idle_ticks() if threads < self.ceiling else None)
        w.wall += wall
        w.cpu += cpu
        if w.wall >= WINDOW_S:
            now = self.idle_ticks() if threads < self.ceiling else None
            self.decide(w, now)
            self.window = Window(threads=self.current, idle=now if self.current < self.ceiling else None)

    def decide(self, w: Window, now: tuple[float, float] | None) -> None:
        """The thread count after window `w` (`now`: cpu_idle_ticks() at its end, when below the ceiling)."""
        share = w.cpu / (w.wall * w.threads)
        if w.threads > 1 and share < LOW_SHARE:  # descheduled: as many threads as the cores they got
            self.move(max(1, min(w.threads - 1, int(share * w.threads + 0.25))), share)
            return
        if w.threads >= self.ceiling:
            return
        self.below += 1
        if now is None or w.idle is None:  # no idle count here: try the ceiling again now and then
            if self.below >= RETRY_WINDOWS:
                self.move(self.ceiling, 0.0)
            return
        spare = (now[0] - w.idle[0]) / max(now[1] - w.idle[1], 1e-9) * self.cores
        self.calm = self.calm + 1 if spare >= SPARE_CORES else 0
        if self.calm >= CALM_WINDOWS:
            self.move(min(self.ceiling, w.threads + max(1, int(spare + 0.25))), spare)

    def move(self, threads: int, measure: float) -> None:
        self.decisions = [*self.decisions[-7:], (self.current, threads, round(measure, 3))]
        self.current, self.calm, self.below = threads, 0, 0


GOVERNOR = ThreadGovernor()


def pass_threads() -> contextlib.AbstractContextManager[int]:
    """The process's governor around one native pass: `with pass_threads(): ...`."""
    return GOVERNOR.pass_scope()


@contextlib.contextmanager
def fixed_threads() -> Iterator[None]:
    """Passes inside run with torch's thread count as set (for timing fixed thread counts)."""
    before = GOVERNOR.enabled
    GOVERNOR.enabled = False
    try:
        yield
    finally:
        GOVERNOR.enabled = before
