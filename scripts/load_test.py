"""A bounded load test for a running specwise server (or any OpenAI-compatible one).

Sends N streaming requests, at most C at a time, and stops by itself when they
are done or the time limit passes (requests still running then are cancelled
and reported as unfinished). Reports throughput (requests/s, generated
tokens/s), latency and time-to-first-token percentiles, refusals (429) and
errors, and the mean acceptance length τ the server reported.

    python scripts/load_test.py --url http://127.0.0.1:8000 --requests 16 --concurrency 4 --max-tokens 64

Only loopback addresses are accepted unless --allow-remote is given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import httpx

from specwise.bench.serving import percentile, stream
from specwise.server.cli import is_loopback

PROMPTS = (
    "def fibonacci(n):",
    "Write a haiku about the sea.",
    "The three laws of thermodynamics are",
    "import numpy as np\n\ndef normalize(x):",
    "Once upon a time, in a small village,",
    "SELECT name, COUNT(*) FROM orders",
    "Explain what a hash table is.",
    "The capital of France is",
)


@dataclass
class Outcome:
    status: int | None = None  # HTTP status; None when it never got one
    error: str | None = None
    latency: float | None = None  # seconds from sending to the end of the stream
    ttft: float | None = None  # seconds from sending to the first content
    completion_tokens: int = 0
    acceptance_length: float | None = None


@dataclass
class Report:
    requests: int
    concurrency: int
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict:
        done = [o for o in self.outcomes if o.status == 200 and o.error is None]
        tokens = sum(o.completion_tokens for o in done)
        taus = [o.acceptance_length for o in done if o.acceptance_length is not None]
        statuses: dict[str, int] = {}
        for o in self.outcomes:
            statuses[str(o.status)] = statuses.get(str(o.status), 0) + 1
        return {
            "requests": self.requests,
            "concurrency": self.concurrency,
            "completed": len(done),
            "rejected_429": sum(1 for o in self.outcomes if o.status == 429),
            "failed": sum(1 for o in self.outcomes if (o.status != 200 or o.error) and o.status != 429),
            "unfinished": self.requests - len(self.outcomes),
            "statuses": statuses,
            "errors": sorted({o.error for o in self.outcomes if o.error})[:5],
            "seconds": round(self.seconds, 3),
            "requests_per_second": round(len(done) / self.seconds, 3) if self.seconds else 0.0,
            "tokens_per_second": round(tokens / self.seconds, 3) if self.seconds else 0.0,
            "completion_tokens": tokens,
            "latency_seconds": percentiles([o.latency for o in done if o.latency is not None]),
            "ttft_seconds": percentiles([o.ttft for o in done if o.ttft is not None]),
            "mean_acceptance_length": round(sum(taus) / len(taus), 4) if taus else None,
        }


def percentiles(values: list[float], points: tuple[int, ...] = (50, 90, 99)) -> dict:
    """Linear-interpolated percentiles, as {"p50": ..., ...} (None without data)."""
    return {f"p{p}": None if not values else round(percentile(values, p), 4) for p in points}


async def _one(client: httpx.AsyncClient, args: argparse.Namespace, model: str, index: int) -> Outcome:
    prompt = args.prompt or PROMPTS[index % len(PROMPTS)]
    body = {"model": model, "max_tokens": args.max_tokens, "temperature": args.temperature,
            "stream": True, "stream_options": {"include_usage": True}}
    if args.endpoint == "chat":
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
    else:
        path, body["prompt"] = "/v1/completions", prompt
    try:
        streamed = await stream(client, path, body)
    except httpx.HTTPError as exc:  # closed before any answer: reported, not sent again
        return Outcome(error=f"{type(exc).__name__}: {exc}")
    return Outcome(status=streamed.status, error=streamed.error, latency=streamed.latency, ttft=streamed.ttft,
                   completion_tokens=streamed.usage.get("completion_tokens", 0),
                   acceptance_length=streamed.speculative.get("acceptance_length"))


async def run_async(args: argparse.Namespace) -> Report:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    timeout = httpx.Timeout(args.time_limit, connect=10.0)
    limits = httpx.Limits(max_connections=args.concurrency)
    report = Report(args.requests, args.concurrency)
    async with httpx.AsyncClient(base_url=args.url.rstrip("/"), headers=headers, timeout=timeout,
                                 limits=limits) as client:
        model = args.model
        if model is None:
            response = await client.get("/v1/models")
            response.raise_for_status()
            model = response.json()["data"][0]["id"]
        next_index = iter(range(args.requests))

        async def worker() -> None:
            for index in next_index:  # shared: each request is taken by exactly one worker
                report.outcomes.append(await _one(client, args, model, index))

        started = time.perf_counter()
        tasks = [asyncio.create_task(worker()) for _ in range(min(args.concurrency, args.requests))]
        _, pending = await asyncio.wait(tasks, timeout=args.time_limit)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        report.seconds = time.perf_counter() - started
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    parser.add_argument("--requests", type=int, default=16, help="requests to send (N)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight at most (C)")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens of each request")
    parser.add_argument("--temperature", type=float, default=0.0, help="temperature of each request")
    parser.add_argument("--time-limit", type=float, default=300.0, help="stop after this many seconds")
    parser.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    parser.add_argument("--model", default=None, help="model name (default: the first in /v1/models)")
    parser.add_argument("--prompt", default=None, help="one prompt for every request (default: a built-in mix)")
    parser.add_argument("--api-key", default=os.environ.get("SPECWISE_API_KEY"),
                        help="API key (default: $SPECWISE_API_KEY)")
    parser.add_argument("--allow-remote", action="store_true", help="allow a non-loopback server address")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    for name in ("requests", "concurrency", "max_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.time_limit <= 0:
        parser.error("--time-limit must be > 0")
    host = urlparse(args.url).hostname or ""
    if not args.allow_remote and not is_loopback(host):
        parser.error(f"{host!r} is not a loopback address; pass --allow-remote to load-test another machine")
    return args


def run(argv: list[str] | None = None) -> dict:
    """Run the load test and return its summary (what main prints)."""
    args = parse_args(argv)
    return asyncio.run(run_async(args)).summary()


def format_summary(summary: dict) -> str:
    def row(name: str, values: dict) -> str:
        cells = "  ".join(f"{k}={'-' if v is None else f'{v * 1000:.1f} ms'}" for k, v in values.items())
        return f"{name:<22}{cells}"

    lines = [
        f"{'requests':<22}{summary['completed']} completed of {summary['requests']} "
        f"(concurrency {summary['concurrency']}), {summary['rejected_429']} refused (429), "
        f"{summary['failed']} failed, {summary['unfinished']} unfinished",
        f"{'wall time':<22}{summary['seconds']:.2f} s",
        f"{'throughput':<22}{summary['requests_per_second']:.2f} requests/s, "
        f"{summary['tokens_per_second']:.1f} tokens/s ({summary['completion_tokens']} tokens)",
        row("latency", summary["latency_seconds"]),
        row("time to first token", summary["ttft_seconds"]),
    ]
    if summary["mean_acceptance_length"] is not None:
        lines.append(f"{'mean τ':<22}{summary['mean_acceptance_length']:.3f} tokens per step")
    for error in summary["errors"]:
        lines.append(f"{'error':<22}{error}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = asyncio.run(run_async(args)).summary()
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0 if summary["completed"] == summary["requests"] else 1


if __name__ == "__main__":
    sys.exit(main())
