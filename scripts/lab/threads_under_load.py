"""Decoding speed while another program keeps cores busy: the thread governor on and off, and llama.cpp.

For each condition (machine idle; --busy processes spinning on a core each), and each method, runs
greedy generations of --tokens new tokens from the same prompt, methods taking turns, and prints
tokens/s (median of --rounds, after one warm-up generation each) and the governor's decisions. The methods: specwise's plain decoding and
its default (adaptive n-gram), with the governor (specwise/threads.py) and with fixed threads; and
llama.cpp's plain decoding of the same file at the same thread count, when llama-cpp-python is
installed. Every specwise output is checked against the first one: a thread count never changes a token.
Then one governed generation of 128 tokens during which the busy processes end after 4 s: its tokens
per second of wall time, and the governor's decisions (down when the load starts, up when it ends).

    .venv/bin/python scripts/lab/threads_under_load.py --busy 1 --tokens 64 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

SPIN = "while True:\n    pass\n"


def main() -> None:
    from specwise import SamplingParams, SpecConfig, SpecDecoder
    from specwise.bench.llamacpp import LlamaCppMethod, llamacpp_available
    from specwise.store.catalog import DEFAULT_TARGET
    from specwise.threads import GOVERNOR

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=1, help="spinning processes in the loaded condition")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    args = parser.parse_args()

    threads = torch.get_num_threads()
    plain = SpecDecoder(DEFAULT_TARGET, SpecConfig(drafter="none", target_format="gguf"))
    default = SpecDecoder(plain.target, SpecConfig(target_format="gguf"))
    prompt = plain.encode("Write a Python function that parses an ISO 8601 date, with tests.")
    sampling = SamplingParams(max_new_tokens=args.tokens, ignore_eos=True)
    llama = LlamaCppMethod(DEFAULT_TARGET, [], threads) if llamacpp_available() else None

    def specwise_run(decoder, governed: bool):
        def run() -> tuple[float, list[int]]:
            GOVERNOR.enabled = governed
            start = time.perf_counter()
            out = decoder.generate(prompt, sampling)
            return time.perf_counter() - start, list(out.token_ids)
        return run

    methods = {"plain, governed": specwise_run(plain, True), "plain, fixed threads": specwise_run(plain, False),
               "default, governed": specwise_run(default, True), "default, fixed threads": specwise_run(default, False)}
    if llama is not None:
        methods["llama.cpp plain"] = lambda: (lambda o: (o.seconds, o.token_ids))(llama.generate(prompt, sampling))

    for run in methods.values():  # warm-up: the first generation of each pays one-time costs
        run()
    reference = None
    table: dict[str, dict[str, float]] = {}
    for condition, busy in (("idle", 0), (f"{args.busy} core(s) busy", args.busy)):
        spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
        try:
            time.sleep(0.5)
            times: dict[str, list[float]] = {name: [] for name in methods}
            for r in range(args.rounds):
                for name, run in methods.items():
                    seconds, tokens = run()
                    times[name].append(seconds)
                    if not name.startswith("llama"):
                        reference = reference or tokens
                        assert tokens == reference, f"{name}: the tokens changed ({condition}, round {r})"
                    print(f"  {condition:18s} {name:24s} {args.tokens / seconds:6.2f} tokens/s", flush=True)
            table[condition] = {name: args.tokens / statistics.median(t) for name, t in times.items()}
            print(f"{condition}: governor decisions (from, to, share or spare cores): {GOVERNOR.decisions}")
        finally:
            for p in spinners:
                p.kill()
    GOVERNOR.enabled = True
    print(f"\ntokens/s, median of {args.rounds}, {threads} threads, {args.tokens} tokens a generation")
    names = list(methods)
    print("| condition | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for condition, row in table.items():
        print(f"| {condition} | " + " | ".join(f"{row[n]:.2f}" for n in names) + " |")
    timeline = load_ends(plain, prompt, args.busy)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"threads": threads, "tokens": args.tokens, "rounds": args.rounds,
                                        "tokens_per_s": table, "load_ends_after_4_s": timeline}, indent=1))


def load_ends(decoder, prompt: list[int], busy: int) -> dict:
    """A governed generation during which `busy` spinning processes end after 4 s: tokens each second."""
    from specwise import SamplingParams
    from specwise.threads import GOVERNOR

    GOVERNOR.enabled, GOVERNOR.decisions = True, []
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
    time.sleep(0.5)
    start, stamps = time.perf_counter(), []
    try:
        for _ in decoder.stream(prompt, SamplingParams(max_new_tokens=128, ignore_eos=True)):
            stamps.append(time.perf_counter() - start)
            if spinners and stamps[-1] > 4.0:
                for p in spinners:
                    p.kill()
                spinners = []
    finally:
        for p in spinners:
            p.kill()
    per_second = [sum(1 for t in stamps if s <= t < s + 1) for s in range(int(stamps[-1]) + 1)]
    print(f"\nload ends after 4 s: tokens in each second {per_second}; decisions {GOVERNOR.decisions}")
    return {"tokens_each_second": per_second, "decisions": GOVERNOR.decisions}


if __name__ == "__main__":
    main()
