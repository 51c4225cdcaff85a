"""Where a pass of the compiled decoder spends its time, step by step, at several row counts.

A lab build of the GGUF kernel (SPECWISE_STEP_TIMES=1, set here before the kernel is built) has thread 0
add each step's wall time, barrier to barrier, to a table the kernel exports (specwise_step_ns,
gguf_pass_layers.cpp); "output and rest" is what the pass took beyond the layers' steps: the output
layer, the embedding, the calls around them. With several SPECWISE_INTERLEAVE settings, each setting's
model is loaded side by side and their passes alternate, in turned order from round to round, so that
the swings of a machine's memory bandwidth fall on all of them.

    python scripts/lab/pass_steps.py [--gguf FILE] [--n 1,5,16] [--interleave auto,0] [--rounds 7]

Prints, per row count, each setting's best pass (ms) and the median over the rounds of each step's
share of a pass (ms), and the ratio of each setting to the first.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics

os.environ["SPECWISE_STEP_TIMES"] = "1"  # before the kernel is built: its flags name the lab build

import torch  # noqa: E402

from specwise.bench.cost import RunnerPasses  # noqa: E402
from specwise.kernels import gguf as gk  # noqa: E402
from specwise.store import loading  # noqa: E402
from specwise.store.catalog import DEFAULT_TARGET  # noqa: E402

STEPS = ["norm + quantize", "qkv", "rotary", "attention", "quantize o", "o", "residual + quantize",
         "gate + up", "activation", "quantize down", "down"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=None, help="a GGUF file or catalog name (default: the default target)")
    parser.add_argument("--n", default="1,5,16", help="rows a pass")
    parser.add_argument("--interleave", default="auto", help="SPECWISE_INTERLEAVE settings, ';'-separated")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--context", type=int, default=128, help="tokens in the cache before each pass")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ns = [int(n) for n in args.n.split(",")]
    settings = [s.strip() for s in args.interleave.split(";") if s.strip()]
    name = args.gguf or DEFAULT_TARGET
    timers = []
    for setting in settings:
        os.environ["SPECWISE_INTERLEAVE"] = setting
        loading._LOADED.clear()  # a model per setting: the layout is chosen at load
        timers.append(RunnerPasses(loading.load_model(name, format="gguf"), "lean"))
    steps = (ctypes.c_double * 16).in_dll(ctypes.CDLL(gk.gguf_kernel_module().__file__), "specwise_step_ns")
    context = list(range(100, 100 + args.context))
    for timer in timers:
        timer.start(context)
    best: dict[tuple[int, int], float] = {}
    shares: dict[tuple[int, int], list[list[float]]] = {}
    for round_ in range(args.rounds):
        for n in ns:
            ids = list(range(500, 500 + n))
            order = list(range(len(timers)))
            for i in order if round_ % 2 == 0 else order[::-1]:
                timers[i].time(ids)  # warm
                for k in range(16):
                    steps[k] = 0.0
                total = timers[i].time(ids)
                best[i, n] = min(best.get((i, n), float("inf")), total)
                layer = [steps[k] / 1e6 for k in range(1, len(STEPS) + 1)]
                shares.setdefault((i, n), []).append([*layer, total * 1e3 - sum(layer)])
    print(f"{name}, {args.threads} threads, context {args.context}; settings: {' | '.join(settings)}")
    for n in ns:
        print(f"\n{n} rows: best pass " + " | ".join(f"{best[i, n] * 1e3:.2f} ms" for i in range(len(timers))))
        for k, step in enumerate([*STEPS, "output and rest"]):
            cells = [statistics.median(row[k] for row in shares[i, n]) for i in range(len(timers))]
            ratios = "".join(f"  {c / cells[0]:5.2f}" for c in cells[1:]) if cells[0] > 0 else ""
            print(f"  {step:>22}: " + " ".join(f"{c:7.3f}" for c in cells) + ratios)


if __name__ == "__main__":
    main()
