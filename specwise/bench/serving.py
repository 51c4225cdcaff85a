"""What the server benchmarks share: a server process started and stopped, one streamed request timed,
percentiles, and the concurrency axis of their plots.

Used by scripts/server_compare.py (specwise beside llama-server), scripts/load_test.py (the load
generator) and scripts/lab/load_compare.py (one request at a time against batched).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

START_SECONDS = 900  # loading a model and compiling its kernels on a busy 2-core machine


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(command: list[str], url: str, log: Path, timeout: float = START_SECONDS) -> subprocess.Popen:
    """Run `command` (its output into `log`) until `url`/health answers 200; a RuntimeError naming the log
    if it exits or does not answer within `timeout` seconds."""
    handle = Path(log).open("w")
    process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT,
                               env=os.environ | {"PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{command[0]} exited ({process.returncode}); its log: {log}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(1)
    process.kill()
    raise RuntimeError(f"{command[0]} did not answer /health within {timeout:.0f} s; its log: {log}")


def stop_server(process: subprocess.Popen, grace: float = 60) -> None:
    """SIGTERM (a specwise server drains), then SIGKILL after `grace` seconds."""
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()


def percentile(values: list[float], p: float) -> float | None:
    """The linear-interpolated p-th percentile, None without values."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * p / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class Streamed:
    """One streamed request, as a client saw it: HTTP status, seconds to the first text and to the end,
    the text, and what the last chunks reported (usage, specwise's `speculative`, llama-server's `timings`)."""

    status: int | None = None
    ttft: float | None = None
    latency: float | None = None
    text: str = ""
    usage: dict = field(default_factory=dict)
    speculative: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    error: str | None = None


async def stream(client: httpx.AsyncClient, path: str, body: dict) -> Streamed:
    """POST `body` to `path` with streaming and read the server-sent events to the end. Connection errors
    before any text raise httpx.RemoteProtocolError (nothing was answered: the caller may send it again);
    later ones, and error events, are the result's `error`."""
    result = Streamed()
    pieces: list[str] = []
    started = time.perf_counter()
    try:
        async with client.stream("POST", path, json=body) as response:
            result.status = response.status_code
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200].decode(errors='replace')}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                if "error" in chunk:
                    error = chunk["error"]
                    result.error = (error.get("message") if isinstance(error, dict) else str(error))[:200]
                for choice in chunk.get("choices") or []:
                    piece = choice.get("text") or (choice.get("delta") or {}).get("content")
                    if piece:
                        result.ttft = result.ttft or time.perf_counter() - started
                        pieces.append(piece)
                result.usage = chunk.get("usage") or result.usage
                result.speculative = chunk.get("speculative") or result.speculative
                result.timings = chunk.get("timings") or result.timings
        result.latency = time.perf_counter() - started
    except httpx.RemoteProtocolError:
        if result.ttft is None:
            raise
        result.error = "the server closed the stream early"
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.text = "".join(pieces)
    return result


def concurrency_axis(ax, concurrencies: list[int], ylabel: str, xlabel: str = "concurrent requests") -> None:
    """A plot's x axis of concurrency levels (powers of two, each labelled), its y label, grid and legend."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
