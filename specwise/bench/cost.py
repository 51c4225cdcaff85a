"""Measure T(n): a model's time for one forward pass over n new tokens after a cached context.

Through specwise's own runner (the code path the engine uses): prefill a context
of the given length once, then for each n time `forward(n tokens)` and undo it
with `rollback(n)`, a few times, and keep the median. Several runners of one model
(formats, llama.cpp) are timed side by side, taking turns repeat by repeat. The
result is saved where an adaptive-k tuner can load it: `$SPECWISE_HOME/cost/<model>-<dtype>-<threads>t.json`.
"""

from __future__ import annotations

import datetime
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from specwise.bench.machine import machine_info
from specwise.cost_model import cost_function, cost_path, dtype_name, load  # noqa: F401 (re-exported)
from specwise.device import synchronize
from specwise.store.loading import LoadedModel
from specwise.threads import fixed_threads

DEFAULT_NS = (1, 2, 4, 6, 8, 12, 16, 24, 32)
DEFAULT_CONTEXTS = (128, 512, 1024)
DEFAULT_REPEATS = 5


class RunnerPasses:
    """specwise's own runner as a pass timer (the code path the engine uses)."""

    def __init__(self, loaded: LoadedModel, runner: str = "hf") -> None:
        self.loaded, self.kind = loaded, runner
        self.runner = loaded.runner(runner)
        self.vocab = (min(len(loaded.tokenizer), self.runner.vocab_size) if loaded.tokenizer is not None
                      else self.runner.vocab_size)
        self.max_context = self.runner.max_context

    def start(self, context_ids: list[int]) -> None:
        self.runner.reset()
        with fixed_threads():
            self.runner.forward(context_ids, logits=False)

    def time(self, ids: list[int]) -> float:
        device = self.loaded.device
        synchronize(device)
        with fixed_threads():  # T(n) at the thread count asked for, even while the machine is busy
            start = time.perf_counter()
            self.runner.forward(ids)
            synchronize(device)  # a GPU pass returns before it has run
            seconds = time.perf_counter() - start
        self.runner.rollback(len(ids))
        return seconds

    def describe(self) -> dict:
        described = {"model": self.loaded.name, "runner": self.kind, "dtype": self.loaded.weights,  # "gguf": stored blocks
                     "threads": torch.get_num_threads(), "machine": machine_info(self.loaded.weights)}
        path = self.loaded.path
        if self.loaded.format == "gguf" and path is not None and path.suffix == ".gguf":  # a projection's memory time
            from specwise.gguf.file import pass_bytes

            described["pass_bytes"] = pass_bytes(path)
        return described


def measure_side_by_side(timers: Sequence, contexts: Sequence[int] = DEFAULT_CONTEXTS,
                         ns: Sequence[int] = DEFAULT_NS, repeats: int = DEFAULT_REPEATS, seed: int = 0,
                         progress=None) -> list[dict]:
    """T(n) of several pass timers (RunnerPasses, llama.cpp's), one result each in `measure`'s format.

    The timers take turns repeat by repeat on the same token ids, in a rotated order, so that their
    ratios hold even where the machine's speed drifts within a run (a shared memory bus does).
    A timer has start(context ids), time(ids) -> seconds of one pass over ids, the pass undone, and
    describe() -> its result's labels; max_context and vocab bound the ids.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1; got {repeats}")
    ns = sorted({1, *(int(n) for n in ns)})
    if ns[0] < 1:
        raise ValueError(f"n must be >= 1; got {ns[0]}")
    generator = torch.Generator().manual_seed(seed)
    vocab = min(timer.vocab for timer in timers)
    seconds: list[dict[str, dict[str, float]]] = [{} for _ in timers]
    skipped = []
    for context in sorted(int(c) for c in contexts):
        if context < 1 or any(context + ns[-1] > timer.max_context for timer in timers):
            skipped.append(context)
            continue
        ids = torch.randint(0, vocab, (context + ns[-1],), generator=generator).tolist()
        for timer in timers:
            timer.start(ids[:context])
            timer.time(ids[context:context + ns[-1]])  # warm-up at the largest size
        for n in ns:
            block = ids[context:context + n]
            samples: list[list[float]] = [[] for _ in timers]
            for timer in timers:
                timer.time(block)  # untimed: first passes of a size build what they need (llama.cpp: a graph)
            for repeat in range(repeats):
                for j in range(len(timers)):
                    i = (j + repeat) % len(timers)
                    samples[i].append(timers[i].time(block))
            for i in range(len(timers)):
                seconds[i].setdefault(str(context), {})[str(n)] = statistics.median(samples[i])
            if progress is not None:
                progress(len(timers))
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return [{**timer.describe(), "repeats": repeats, "ns": ns, "seconds": seconds[i], "skipped_contexts": skipped,
             "side_by_side": len(timers), "measured_at": stamp} for i, timer in enumerate(timers)]


def measure(loaded: LoadedModel, contexts: Sequence[int] = DEFAULT_CONTEXTS, ns: Sequence[int] = DEFAULT_NS,
            repeats: int = DEFAULT_REPEATS, seed: int = 0, progress=None, runner: str = "hf") -> dict:
    """Median seconds of forward(n) at each context length: {"seconds": {context: {n: s}}, ...}.

    Contexts that do not fit the model's window with the largest n are skipped
    (listed under "skipped_contexts"). n = 1 is always measured: it is the unit.
    """
    step = (lambda count: progress()) if progress is not None else None
    return measure_side_by_side([RunnerPasses(loaded, runner)], contexts, ns, repeats, seed, step)[0]


def save(result: dict, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1), encoding="utf-8")
    tmp.replace(path)
    return path


def print_table(results: Sequence[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if results:
        machine = results[0]["machine"]
        console.print(f"{machine['cpu']}, {machine['cores']} cores, flags {' '.join(machine.get('cpu_flags', []))}")
    for result in results:
        bandwidth = result["machine"].get("read_bandwidth_gb_s")
        table = Table(title=f"T(n) of {result['model']}, {result.get('runner', 'hf')} runner ({result['dtype']}, {result['threads']} threads, "
                            f"median of {result['repeats']}"
                            + (f"; read bandwidth {bandwidth} GB/s at {result['threads']} threads)" if bandwidth else ")"))
        table.add_column("n", justify="right")
        contexts = list(result["seconds"])
        for context in contexts:
            table.add_column(f"ctx {context}: ms", justify="right")
            table.add_column("T(n)/T(1)", justify="right")
        for n in result["ns"]:
            cells = [str(n)]
            for context in contexts:
                times = result["seconds"][context]
                cells += [f"{1000 * times[str(n)]:.2f}", f"{times[str(n)] / times['1']:.2f}"]
            table.add_row(*cells)
        console.print(table)
        if result["skipped_contexts"]:
            console.print(f"skipped contexts (beyond the model's window): {result['skipped_contexts']}")
