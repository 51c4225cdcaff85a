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
from specwise.cost_model import cost_function, cost_path, dtype_name, load  # noqa: F401 (re-exported)
from specwise.device import synchronize
from specwise.models.loading import LoadedModel

DEFAULT_NS = (1, 2, 4, 6, 8, 12, 16, 24, 32)
DEFAULT_CONTEXTS = (128, 512, 1024)
DEFAULT_REPEATS = 5


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
    device = loaded.device
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
                synchronize(device)
                start = time.perf_counter()
                runner.forward(ids[context:context + n])
                synchronize(device)  # a GPU pass returns before it has run
                samples.append(time.perf_counter() - start)
                runner.rollback(n)
            seconds[str(context)][str(n)] = statistics.median(samples)
            if progress is not None:
                progress()
    return {
        "model": loaded.name,
        "runner": kind,
        "dtype": loaded.weights,  # "gguf" for stored blocks, else the dense dtype
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "ns": ns,
        "seconds": seconds,
        "skipped_contexts": skipped,
        "machine": machine_info(loaded.weights),
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


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
        console.print(f"{machine['cpu']}, {machine['cores']} cores, flags {' '.join(machine.get('cpu_flags', []))}"
                      + (f", read bandwidth {machine['read_bandwidth_gb_s']} GB/s"
                         if "read_bandwidth_gb_s" in machine else ""))
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
