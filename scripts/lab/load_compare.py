"""The server under load, one request at a time against batched, with the same requests.

For each scheduler (--max-batch 1: one generation at a time; --max-batch N: continuous
batching) it starts `specwise serve` with the given model options, warms it up, then
runs scripts/load_test.py at each concurrency (the same built-in prompts, greedy,
chat), reading the server's /metrics around each run for the mean draft length k
and τ. Writes results.json, a Markdown table (table.md) and load.png (aggregate
tokens/s and p50 latency against concurrency) into --out.

    python scripts/lab/load_compare.py --out docs/results/load --batches 1,8 --concurrency 1,2,4,8 \
        -- --drafter ngram --adaptive
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import load_test  # noqa: E402  (scripts/load_test.py, the load generator users run)

from specwise.bench.machine import cpu_model, memory_bandwidth, usable_cores  # noqa: E402
from specwise.bench.serving import concurrency_axis, free_port, start_server, stop_server  # noqa: E402


def _metric_sums(url: str) -> dict[str, float]:
    """Totals over labels of the speculation counters."""
    text = httpx.get(url + "/metrics", timeout=30).text
    sums: dict[str, float] = {}
    for name in ("specwise_spec_steps_total", "specwise_spec_draft_tokens_proposed_total",
                 "specwise_spec_draft_tokens_accepted_total", "specwise_generated_tokens_total"):
        sums[name] = sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))
    return sums


def _serve(batch: int, serve_args: list[str], port: int, log: Path) -> subprocess.Popen:
    command = [str(Path(sys.executable).with_name("specwise")), "serve", "--port", str(port), "--max-batch", str(batch),
               *serve_args]
    return start_server(command, f"http://127.0.0.1:{port}", log)


def measure(batch: int, concurrencies: list[int], args: argparse.Namespace, serve_args: list[str]) -> list[dict]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = _serve(batch, serve_args, port, args.out / f"serve-batch-{batch}.log")
    rows = []
    try:
        common = ["--url", url, "--max-tokens", str(args.max_tokens), "--endpoint", "chat", "--json",
                  "--time-limit", str(args.time_limit)]
        load_test.run(common + ["--requests", "2", "--concurrency", "2"])  # warm-up: kernels, caches
        for concurrency in concurrencies:
            requests = max(args.requests, 2 * concurrency)
            before = _metric_sums(url)
            summary = load_test.run(common + ["--requests", str(requests), "--concurrency", str(concurrency)])
            after = _metric_sums(url)
            delta = {k: after[k] - before[k] for k in after}
            steps = delta["specwise_spec_steps_total"]
            row = {"max_batch": batch, "concurrency": concurrency, "requests": requests, **summary,
                   "mean_k": delta["specwise_spec_draft_tokens_proposed_total"] / steps if steps else 0.0,
                   "tau": (delta["specwise_spec_draft_tokens_accepted_total"] + steps) / steps if steps else 0.0}
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("max_batch", "concurrency")} | {
                k: row.get(k) for k in ("tokens_per_second", "latency_seconds", "ttft_seconds", "mean_k", "tau")}), flush=True)
    finally:
        stop_server(process)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| scheduler | concurrency | tokens/s | latency p50 | latency p99 | TTFT p50 | TTFT p99 | mean k | τ |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        name = "one at a time" if r["max_batch"] == 1 else f"batched ({r['max_batch']})"
        lat, ttft = r.get("latency_seconds") or {}, r.get("ttft_seconds") or {}
        lines.append(f"| {name} | {r['concurrency']} | {r['tokens_per_second']:.1f} | {lat.get('p50', 0):.2f} s | "
                     f"{lat.get('p99', 0):.2f} s | {ttft.get('p50', 0):.2f} s | {ttft.get('p99', 0):.2f} s | "
                     f"{r['mean_k']:.2f} | {r['tau']:.2f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, machine: str) -> None:
    from specwise.bench import plots  # noqa: F401  (selects the headless backend)
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    concurrencies = sorted({r["concurrency"] for r in rows})
    for batch in sorted({r["max_batch"] for r in rows}):
        mine = [r for r in rows if r["max_batch"] == batch]
        label = "one at a time" if batch == 1 else f"batched (max {batch})"
        xs = [r["concurrency"] for r in mine]
        left.plot(xs, [r["tokens_per_second"] for r in mine], marker="o", label=label)
        right.plot(xs, [(r.get("latency_seconds") or {}).get("p50", 0) for r in mine], marker="o", label=label)
    for ax, ylabel in ((left, "aggregate tokens/s"), (right, "latency p50 (s)")):
        concurrency_axis(ax, concurrencies, ylabel)
    fig.suptitle(machine, fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", default="1,8", help="--max-batch values to compare")
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--requests", type=int, default=8, help="requests per run (at least 2 x concurrency)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--time-limit", type=float, default=900.0)
    parser.add_argument("serve_args", nargs=argparse.REMAINDER, help="after --: options for specwise serve")
    args = parser.parse_args()
    serve_args = [a for a in args.serve_args if a != "--"]
    args.out.mkdir(parents=True, exist_ok=True)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        rows += measure(batch, concurrencies, args, serve_args)
    machine = f"{cpu_model()}, {usable_cores()} cores, read bandwidth {memory_bandwidth():.1f} GB/s"
    (args.out / "results.json").write_text(json.dumps({"machine": machine, "serve_args": serve_args,
                                                       "rows": rows}, indent=2))
    (args.out / "table.md").write_text(f"{machine}\n\n{table(rows)}\n")
    plot(rows, args.out / "load.png", machine)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
