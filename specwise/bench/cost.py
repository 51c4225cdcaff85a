"""Measure T(n): a model's time for one forward pass over n new tokens after a cached context.

Through specwise's own runner (the code path the engine uses): prefill a context
of the given length once, then for each n time `forward(n tokens)` and undo it
with `rollback(n)`, a few times, and keep the median. The result is saved where
an adaptive-k tuner can load it: `$SPECWISE_HOME/cost/<model>-<dtype>-<threads>t.json`.
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
from specwise.models.loading import LoadedModel

DEFAULT_NS = (1, 2, 4, 6, 8, 12, 16, 24, 32)
DEFAULT_CONTEXTS = (128, 512, 1024)
DEFAULT_REPEATS = 5


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cost_path(model_name: str, dtype: torch.dtype | str, threads: int, runner: str = "hf") -> Path:
    """Where the cost table of a model at a dtype, thread count and runner lives."""
    from specwise.models.prepare import specwise_home

    safe = model_name.rstrip("/").replace("/", "_").replace("\\", "_")
    dtype = dtype if isinstance(dtype, str) else dtype_name(dtype)
    suffix = "" if runner == "hf" else f"-{runner}"  # hf tables keep their earlier names
    return specwise_home() / "cost" / f"{safe}-{dtype}-{threads}t{suffix}.json"


def measure(loaded: LoadedModel, contexts: Sequence[int] = DEFAULT_CONTEXTS, ns: Sequence[int] = DEFAULT_NS,
            repeats: int = DEFAULT_REPEATS, seed: int = 0, progress=None, runner: str = "hf") -> dict:
    """Median seconds of forward(n) at each context length: {"seconds": {context: {n: s}}, ...}.

    Contexts that do not fit the model's window with the largest n are skipped
    (listed under "skipped_contexts"). n = 1 is always measured: it is the unit.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1; got {repeats}")
    ns = sorted({1, *(int(n) for n in ns)})
    if ns[0] < 1:
        raise ValueError(f"n must be >= 1; got {ns[0]}")
    kind = runner
    runner = loaded.runner(kind)
    vocab = min(len(loaded.tokenizer), runner.vocab_size) if loaded.tokenizer is not None else runner.vocab_size
    generator = torch.Generator().manual_seed(seed)
    seconds: dict[str, dict[str, float]] = {}
    skipped = []
    for context in sorted(int(c) for c in contexts):
        if context < 1 or context + ns[-1] > runner.max_context:
            skipped.append(context)
            continue
        ids = torch.randint(0, vocab, (context + ns[-1],), generator=generator).tolist()
        runner.reset()
        runner.forward(ids[:context], logits=False)
        runner.forward(ids[context:context + ns[-1]])  # warm-up at the largest size
        runner.rollback(ns[-1])
        seconds[str(context)] = {}
        for n in ns:
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                runner.forward(ids[context:context + n])
                samples.append(time.perf_counter() - start)
                runner.rollback(n)
            seconds[str(context)][str(n)] = statistics.median(samples)
            if progress is not None:
                progress()
    return {
        "model": loaded.name,
        "runner": kind,
        "dtype": dtype_name(loaded.dtype),
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "ns": ns,
        "seconds": seconds,
        "skipped_contexts": skipped,
        "machine": machine_info(dtype_name(loaded.dtype)),
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def save(result: dict, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1), encoding="utf-8")
    tmp.replace(path)
    return path


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def cost_function(result: dict, context: int | None = None):
    """T(n) in seconds from a measured table, at the measured context closest to `context`.

    Between measured n it interpolates linearly; beyond the largest it extrapolates
    from the last two points. This is what an adaptive-k tuner takes as target_cost.
    """
    available = sorted(int(c) for c in result["seconds"])
    if not available:
        raise ValueError(f"the cost table of {result.get('model')} has no measured context")
    chosen = min(available, key=lambda c: abs(c - context)) if context is not None else available[0]
    table = sorted((int(n), s) for n, s in result["seconds"][str(chosen)].items())

    def cost(n: int) -> float:
        for (n0, s0), (n1, s1) in zip(table, table[1:]):
            if n <= n1:
                return s0 + (s1 - s0) * (max(n, n0) - n0) / (n1 - n0)
        if len(table) == 1:
            return table[0][1]
        (n0, s0), (n1, s1) = table[-2], table[-1]
        return s1 + (s1 - s0) * (n - n1) / (n1 - n0)

    return cost


def print_table(results: Sequence[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for result in results:
        table = Table(title=f"T(n) of {result['model']}, {result.get('runner', 'hf')} runner ({result['dtype']}, {result['threads']} threads, "
                            f"median of {result['repeats']})")
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
