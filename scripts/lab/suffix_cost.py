"""Cost of the suffix drafter's structures: update and lookup time per step, memory per token.

Fills the shared store with N synthetic requests (Zipf-distributed tokens, a share of
each request copied from earlier ones, as code edits and repeated questions do), then
times a generation's steps: indexing the committed tokens and proposing a chain and a
tree. Usage: python scripts/lab/suffix_cost.py [--requests 10000] [--tokens 300] [--depth 24]
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import time

import torch

from specwise.config import SamplingParams, SpecConfig
from specwise.drafters.suffix import SuffixDrafter
from specwise.verify.result import VerifyResult


def synthetic_requests(count: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    weights = [1 / (rank + 1) ** 1.1 for rank in range(vocab)]
    population = list(range(vocab))
    requests: list[list[int]] = []
    for _ in range(count):
        tokens: list[int] = []
        while len(tokens) < length:
            if requests and rng.random() < 0.5:  # copy a span of an earlier request
                source = rng.choice(requests[-200:])
                start = rng.randrange(len(source))
                tokens += source[start:start + rng.randint(4, 40)]
            else:
                tokens += rng.choices(population, weights, k=rng.randint(4, 40))
        requests.append(tokens[:length])
    return requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--tokens", type=int, default=300, help="tokens per request (prompt + output)")
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--depth", type=int, default=SpecConfig().suffix_depth, help="the tries' depth (suffix_depth)")
    args = parser.parse_args()
    requests = synthetic_requests(args.requests + 1, args.tokens, args.vocab)
    drafter = SuffixDrafter(depth=args.depth, cache_tokens=args.requests * args.tokens)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sampling, generator = SamplingParams(), torch.Generator()
    started = time.perf_counter()
    for request in requests[:-1]:
        drafter.start(request, sampling, generator)  # adds the previous request to the store
    fill = time.perf_counter() - started
    drafter.start([], sampling, generator)
    usage = drafter.usage()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"store: {usage.requests} requests, {usage.tokens} tokens, {usage.nodes} nodes; "
          f"{fill / args.requests * 1e3:.2f} ms per request added; "
          f"~{(rss - rss0) * 1024 / max(usage.tokens, 1):.0f} bytes per token (peak RSS growth)")
    # A generation on new text, and one that repeats a stored request (its first half as the prompt).
    rng = random.Random(1)
    for kind in ("chain k=16", "tree 32 nodes d8 b4"):
        for repeat in (False, True):  # new text, or a stored request again (long matches, deep drafts)
            times: list[float] = []
            source = requests[rng.randrange(args.requests)]
            prompt = source[:args.tokens // 2] if repeat else requests[-1][:args.tokens // 2]
            drafter.start(prompt, sampling, generator)
            context = list(prompt)
            for step in range(args.steps):
                position = len(context) - len(prompt) + args.tokens // 2
                committed = source[position:position + rng.randint(1, 4)] if repeat else []
                committed = committed or [rng.randrange(args.vocab) for _ in range(rng.randint(1, 4))]
                context += committed
                drafter.observe(VerifyResult(committed, len(committed) - 1, len(committed) - 1))
                t = time.perf_counter()
                if kind.startswith("chain"):
                    drafter.propose(context, 16)
                else:
                    drafter.propose_tree(context, 32, 8, 4)
                times.append(time.perf_counter() - t)
            times.sort()
            what = "a stored request again" if repeat else "new text"
            print(f"{kind}, {what}: update + lookup per step median {statistics.median(times) * 1e3:.3f} ms, "
                  f"p90 {times[int(0.9 * len(times))] * 1e3:.3f} ms, max {times[-1] * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
