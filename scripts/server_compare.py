"""specwise's server beside llama.cpp's own llama-server: the same requests, the same machine, one run.

Three workloads of chat requests (greedy, streamed), each a set of client sessions run at once:
- multi-turn: a conversation of four turns (a Spec-Bench multi-turn question's two turns, then two
  follow-ups), each turn sent with the server's own earlier answers;
- rag: three questions about one long document (a Spec-Bench rag passage set), one request each, all
  starting with the document;
- single-turn: two single-turn questions (Spec-Bench qa and writing), one after the other.
At concurrency C there are C sessions, session i taking the i-th conversation, document or question pair,
so that every level shares its first sessions with the levels below it. Each server starts afresh for
each concurrency (nothing cached from an earlier level), is warmed up with one short request, and runs
the three workloads in turn. After the concurrency-1 workloads, the later turns' prompts are sent once more
"cold": the same messages with a marker in the first user message, so no cached prefix beyond the system
prompt matches, one at a time; a later turn's TTFT over its cold TTFT is the prompt cache's gain.

Reported per server, workload and concurrency: aggregate generated tokens/s (all sessions' tokens over the
workload's wall time), TTFT and whole-request latency p50/p99, and the later turns' TTFT relative to cold.
specwise's answers are compared across concurrencies (the same session's turn at every level where it runs:
the answer of a request generated beside others must equal its answer alone). Writes results.json,
table.md and servers.png into --out.

    bash scripts/build_llama_server.sh          # once: llama-server from the pinned llama.cpp source
    python scripts/server_compare.py --out docs/results/servers --concurrency 1,2,4,8 \\
        --servers specwise,llama-server,llama-server-ngram,llama-server-draft
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from specwise.bench.llamacpp import buffer_sizes
from specwise.bench.machine import cpu_model, memory_bandwidth, usable_cores
from specwise.bench.provenance import portable, provenance
from specwise.bench.serving import (concurrency_axis, free_port, percentile, start_server, stop_server,
                                    stream)
from specwise.bench.prompts import DEFAULT_QUESTIONS
from specwise.store.catalog import DEFAULT_DRAFTER, DEFAULT_TARGET
from specwise.store.prepare import gguf_file
from specwise.paths import specwise_home

FOLLOW_UPS = ("Summarize your last answer in two sentences.", "Give your answer a short title.")
RAG_QUESTIONS = ("List three facts that the passages above state.",
                 "Which of the passages above is the most informative, and why?")
WORKLOADS = ("multi-turn", "rag", "single-turn")
SERVERS = ("specwise", "llama-server", "llama-server-ngram", "llama-server-draft")


# ---------------------------------------------------------------- workloads

@dataclass
class Session:
    """One client's requests: `turns` user messages; `chained` sends each after the earlier turns and
    the server's own answers (a conversation), otherwise each turn is a request of its own."""

    workload: str
    index: int
    turns: list[str]
    chained: bool
    system: str | None = None


def sessions(workload: str, count: int, questions: Path, document_chars: int) -> list[Session]:
    rows = [json.loads(line) for line in questions.read_text().splitlines() if line.strip()]
    if workload == "multi-turn":
        pool = [r["turns"] for r in rows if len(r["turns"]) >= 2]
        picked = [list(t[:2]) + list(FOLLOW_UPS) for t in pool]
        chained = True
    elif workload == "rag":
        picked = []
        for r in rows:
            if r["category"] != "rag":
                continue
            text = r["turns"][0]
            passages, _, question = text.rpartition("\n")
            document = passages[:document_chars].rsplit(" ", 1)[0]
            picked.append([f"{document}\n\n{q}" for q in (question, *RAG_QUESTIONS)])
        chained = False
    else:
        qa = [r["turns"][0] for r in rows if r["category"] == "qa"]
        writing = [r["turns"][0] for r in rows if len(r["turns"]) >= 2]
        picked = [[a, b] for a, b in zip(qa, writing)]
        chained = False
    if len(picked) < count:
        raise SystemExit(f"{questions} holds {len(picked)} {workload} sessions; {count} were asked for")
    return [Session(workload, i, picked[i], chained) for i in range(count)]


# ---------------------------------------------------------------- requests

@dataclass
class Turn:
    workload: str
    session: int
    turn: int
    cold: bool = False
    ttft: float | None = None
    latency: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    text: str = ""
    error: str | None = None


async def chat(client: httpx.AsyncClient, messages: list[dict], max_tokens: int, record: Turn) -> Turn:
    body = {"model": client.headers["x-model"], "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}
    for attempt in range(2):
        try:
            return await _chat_once(client, body, record)
        except httpx.RemoteProtocolError as exc:
            # The server closed a kept-alive connection as the request went out (llama-server's HTTP
            # library closes one after a few requests): nothing was answered, so send it again once.
            if attempt or record.ttft is not None:
                record.error = f"{type(exc).__name__}: {exc}"
                return record
    return record


async def _chat_once(client: httpx.AsyncClient, body: dict, record: Turn) -> Turn:
    streamed = await stream(client, "/v1/chat/completions", body)
    record.ttft, record.latency, record.text, record.error = streamed.ttft, streamed.latency, streamed.text, \
        streamed.error
    record.completion_tokens = streamed.usage.get("completion_tokens", 0)
    record.prompt_tokens = streamed.usage.get("prompt_tokens")
    record.cached_tokens = (streamed.usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if "cache_n" in streamed.timings:  # llama-server's: prompt tokens taken from its cache
        record.cached_tokens = streamed.timings["cache_n"]
    return record


def model_header(url: str) -> dict[str, str]:
    """The model the server serves (its first in /v1/models), carried in a header the requests read."""
    return {"x-model": httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]}


def messages_for(session: Session, upto: int, answers: list[str], marker: str = "") -> list[dict]:
    """The messages of turn `upto`: a conversation's earlier turns and answers, or the turn alone."""
    messages: list[dict] = [{"role": "system", "content": session.system}] if session.system else []
    first = len(messages)
    turns = range(upto + 1) if session.chained else [upto]
    for t in turns:
        messages.append({"role": "user", "content": session.turns[t]})
        if t < upto:
            messages.append({"role": "assistant", "content": answers[t]})
    if marker:
        messages[first] = {"role": "user", "content": f"[{marker}] {messages[first]['content']}"}
    return messages


async def run_workload(url: str, plan: list[Session], max_tokens: int, timeout: float) -> tuple[list[Turn], float]:
    records: list[Turn] = []
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(timeout, connect=10.0), headers=model_header(url),
                                 limits=httpx.Limits(max_connections=len(plan) + 2)) as client:
        async def one(session: Session) -> None:
            answers: list[str] = []
            for t in range(len(session.turns)):
                record = await chat(client, messages_for(session, t, answers), max_tokens,
                                    Turn(session.workload, session.index, t))
                records.append(record)
                answers.append(record.text)
                if record.error:
                    return

        started = time.perf_counter()
        await asyncio.gather(*(one(s) for s in plan))
        return records, time.perf_counter() - started


async def run_cold(url: str, plan: list[Session], earlier: list[Turn], max_tokens: int, timeout: float) -> list[Turn]:
    """The later turns' prompts again, one at a time, with a marker that defeats every cached prefix."""
    answers = {(r.workload, r.session, r.turn): r.text for r in earlier}
    records = []
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(timeout, connect=10.0),
                                 headers=model_header(url)) as client:
        for session in plan:
            if session.workload == "single-turn":  # its turns share no prefix: nothing to compare
                continue
            for t in range(1, len(session.turns)):
                if (session.workload, session.index, t) not in answers:
                    continue
                mine = [answers[(session.workload, session.index, u)] for u in range(t)]
                marker = f"cold {session.workload} {session.index} {t}"
                records.append(await chat(client, messages_for(session, t, mine, marker), max_tokens,
                                          Turn(session.workload, session.index, t, cold=True)))
    return records


# ---------------------------------------------------------------- servers

def server_command(name: str, args: argparse.Namespace, concurrency: int, port: int) -> list[str]:
    if name == "specwise":
        return [str(Path(sys.executable).with_name("specwise")), "serve", "--port", str(port),
                "--target", str(args.gguf), "--target-format", "gguf", "--threads", str(args.threads),
                "--max-batch", str(max(concurrency, 1)), *shlex.split(args.specwise_args)]
    binary = str(llama_server_binary(args))
    if not Path(binary).is_file():
        raise SystemExit(f"no llama-server at {binary}: build it with bash scripts/build_llama_server.sh "
                         "or pass --llama-server PATH")
    command = [binary, "-m", str(args.gguf), "--port", str(port), "-t", str(args.threads), "-tb",
               str(args.threads), "-np", str(concurrency), "-c", str(args.context * concurrency), "-kvu",
               "--no-webui", "--jinja", *shlex.split(args.llama_args)]
    if name == "llama-server-ngram":
        command += shlex.split(args.llama_ngram_args)
    if name == "llama-server-draft":  # the draft model's GGUF blocks, as specwise's draft-model drafter reads them
        command += ["-md", str(args.draft_gguf), "-td", str(args.threads), "-tbd", str(args.threads),
                    *shlex.split(args.llama_draft_args)]
    return command


def llama_server_binary(args: argparse.Namespace) -> Path:
    return Path(args.llama_server or specwise_home() / "llama-server" / "llama-server")


def yardstick(args: argparse.Namespace) -> dict:
    """llama-server's build (what scripts/build_llama_server.sh recorded beside it), its --version, and the
    features and weight buffer types it reports when it loads the target (read from a start of its own at
    a log level that prints them; the measured runs log at the default level)."""
    binary = llama_server_binary(args)
    try:
        build = json.loads((binary.parent / "BUILD").read_text())
    except (OSError, ValueError):
        build = None
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    log = args.out / "llama-server-load.log"
    command = [str(binary), "-m", str(args.gguf), "--port", str(free_port()), "-t", str(args.threads), "-lv", "4"]
    with log.open("w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None and "listening on" not in log.read_text():
            time.sleep(0.5)
        stop_server(process)
    text = log.read_text(errors="replace")
    info = next((line.split("| CPU :", 1)[1] for line in text.splitlines() if "| CPU :" in line), "")
    return {"name": "llama-server", "binary": str(binary), "version": (version.stdout + version.stderr).strip(),
            "build": build, "system_info": ("CPU :" + info).strip() if info else None, "buffers": buffer_sizes(text)}


# ---------------------------------------------------------------- summary

def summarize(server: str, workload: str, concurrency: int, records: list[Turn], seconds: float,
              cold: list[Turn]) -> dict:
    done = [r for r in records if r.error is None and r.latency is not None]
    ttfts = [r.ttft for r in done if r.ttft is not None]
    latencies = [r.latency for r in done]
    later = {(r.session, r.turn): r.ttft for r in done if r.turn > 0 and r.ttft}
    ratios = [later[(c.session, c.turn)] / c.ttft for c in cold
              if c.workload == workload and c.error is None and c.ttft and (c.session, c.turn) in later]
    return {
        "server": server, "workload": workload, "concurrency": concurrency, "requests": len(records),
        "failed": len(records) - len(done), "errors": sorted({r.error for r in records if r.error})[:3],
        "seconds": round(seconds, 3), "completion_tokens": sum(r.completion_tokens for r in done),
        "tokens_per_second": round(sum(r.completion_tokens for r in done) / seconds, 3) if seconds else 0.0,
        "ttft_p50": percentile(ttfts, 50), "ttft_p99": percentile(ttfts, 99),
        "latency_p50": percentile(latencies, 50), "latency_p99": percentile(latencies, 99),
        "later_turn_ttft": percentile([t for t in later.values()], 50),
        "later_over_cold": ratios and {"mean": sum(ratios) / len(ratios), "max": max(ratios), "n": len(ratios)},
    }


def identity(records: list[dict]) -> dict:
    """specwise's answer to each (workload, session, turn) at every concurrency where it ran, against its
    answer at the lowest one (concurrency 1: alone)."""
    mine = [r for r in records if r["server"] == "specwise" and not r["cold"] and r["error"] is None]
    first: dict[tuple, tuple[int, str]] = {}
    for r in sorted(mine, key=lambda r: r["concurrency"]):
        key = (r["workload"], r["session"], r["turn"])
        first.setdefault(key, (r["concurrency"], r["text"]))
    pairs = [(r, first[(r["workload"], r["session"], r["turn"])]) for r in mine
             if r["concurrency"] != first[(r["workload"], r["session"], r["turn"])][0]]
    differ = [f"{r['workload']} session {r['session']} turn {r['turn']} at concurrency {r['concurrency']}"
              for r, (_, text) in pairs if r["text"] != text]
    return {"compared": len(pairs), "identical": len(pairs) - len(differ), "differ": differ[:10]}


def table(rows: list[dict]) -> str:
    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    lines = ["| workload | concurrency | server | tokens/s | TTFT p50 | TTFT p99 | latency p50 | latency p99 "
             "| later turn TTFT / cold |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(rows, key=lambda r: (WORKLOADS.index(r["workload"]), r["concurrency"])):
        ratio = r["later_over_cold"]
        gain = f"{ratio['mean']:.2f} (max {ratio['max']:.2f})" if ratio else "-"
        lines.append(f"| {r['workload']} | {r['concurrency']} | {r['server']} | {r['tokens_per_second']:.2f} | "
                     f"{s(r['ttft_p50'])} s | {s(r['ttft_p99'])} s | {s(r['latency_p50'])} s | "
                     f"{s(r['latency_p99'])} s | {gain}"
                     f"{' (' + str(r['failed']) + ' failed)' if r['failed'] else ''} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, machine: str) -> None:
    from specwise.bench import plots  # noqa: F401  (selects the headless backend)
    import matplotlib.pyplot as plt

    workloads = [w for w in WORKLOADS if any(r["workload"] == w for r in rows)]
    fig, axes = plt.subplots(2, len(workloads), figsize=(4.2 * len(workloads), 7), layout="constrained",
                             squeeze=False)
    for col, workload in enumerate(workloads):
        for server in dict.fromkeys(r["server"] for r in rows):
            mine = sorted((r for r in rows if r["workload"] == workload and r["server"] == server),
                          key=lambda r: r["concurrency"])
            xs = [r["concurrency"] for r in mine]
            axes[0][col].plot(xs, [r["tokens_per_second"] for r in mine], marker="o", label=server)
            axes[1][col].plot(xs, [r["ttft_p50"] or 0 for r in mine], marker="o", label=server)
        axes[0][col].set_title(workload)
        for row, label in ((0, "aggregate tokens/s"), (1, "TTFT p50 (s)")):
            concurrency_axis(axes[row][col], xs, label, "concurrent sessions")
    fig.suptitle(machine, fontsize=8)
    fig.savefig(path, dpi=80)  # small enough for docs/results (5 MB in all)
    plt.close(fig)


# ---------------------------------------------------------------- main

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--servers", default="specwise,llama-server,llama-server-ngram")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--gguf", type=Path, default=None, help="the GGUF file both servers run "
                        "(default: the default target's)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--document-chars", type=int, default=1500, help="length of each rag document")
    parser.add_argument("--threads", type=int, default=usable_cores())
    parser.add_argument("--context", type=int, default=4096, help="llama-server's context per slot")
    parser.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one request may take")
    parser.add_argument("--llama-server", default=None, help="llama-server binary (default: the one "
                        "scripts/build_llama_server.sh built)")
    parser.add_argument("--specwise-args", default="--drafter suffix", help="more options for specwise serve")
    parser.add_argument("--llama-args", default="", help="more options for llama-server")
    # ngram-mod (a rolling hash of the last n-match tokens, one pool for all slots), with the shorter drafts
    # its authors suggest for dense models; the draft-model row is the other candidate for its best setting.
    parser.add_argument("--llama-ngram-args", default="--spec-type ngram-mod --spec-ngram-mod-n-match 24 "
                        "--spec-ngram-mod-n-min 4 --spec-ngram-mod-n-max 16",
                        help="llama-server's n-gram speculation, for the llama-server-ngram row")
    parser.add_argument("--draft-gguf", type=Path, default=None, help="the draft model of the llama-server-draft "
                        "row (default: the default drafter's GGUF file)")
    parser.add_argument("--llama-draft-args", default="--spec-type draft-simple --spec-draft-n-max 8 "
                        "--spec-draft-n-min 1",
                        help="llama-server's draft-model speculation, for the llama-server-draft row")
    args = parser.parse_args()
    args.gguf = args.gguf or gguf_file(DEFAULT_TARGET)
    if "llama-server-draft" in args.servers.split(","):
        args.draft_gguf = args.draft_gguf or gguf_file(DEFAULT_DRAFTER)
    servers = args.servers.split(",")
    workloads = args.workloads.split(",")
    unknown = [w for w in workloads if w not in WORKLOADS] + [s for s in servers if s not in SERVERS]
    if unknown:
        parser.error(f"unknown workloads or servers: {unknown}")
    concurrencies = sorted(int(c) for c in args.concurrency.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    machine = f"{cpu_model()}, {usable_cores()} cores, read bandwidth {memory_bandwidth():.1f} GB/s"
    command = shlex.join(["python", "scripts/server_compare.py", *sys.argv[1:]])
    print(machine, flush=True)
    yardsticks = [yardstick(args)] if any(name.startswith("llama-server") for name in servers) else []
    for described in yardsticks:
        print(f"llama-server: {described['version'].splitlines()[0]}, {(described['build'] or {}).get('cmake_args')}, "
              f"buffers {described['buffers']}", flush=True)
    rows: list[dict] = []
    records: list[dict] = []
    for concurrency in concurrencies:
        for server in servers:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            try:
                process = start_server(server_command(server, args, concurrency, port), url,
                                       args.out / f"{server}-{concurrency}.log")
            except RuntimeError as error:
                raise SystemExit(str(error)) from None
            try:
                warm = Session("warm-up", 0, ["Say hello."], False)
                warmed, _ = asyncio.run(run_workload(url, [warm], 8, args.timeout))
                if warmed[0].error:
                    raise SystemExit(f"{server} failed the warm-up request: {warmed[0].error}")
                for workload in workloads:
                    plan = sessions(workload, concurrency, args.questions, args.document_chars)
                    done, seconds = asyncio.run(run_workload(url, plan, args.max_tokens, args.timeout))
                    cold = asyncio.run(run_cold(url, plan, done, args.max_tokens, args.timeout)) \
                        if concurrency == concurrencies[0] else []
                    row = summarize(server, workload, concurrency, done, seconds, cold)
                    rows.append(row)
                    records += [asdict(r) | {"server": server, "concurrency": concurrency} for r in done + cold]
                    print(json.dumps({k: row[k] for k in ("server", "workload", "concurrency", "tokens_per_second",
                                                          "ttft_p50", "latency_p50", "later_over_cold", "failed")}),
                          flush=True)
            finally:
                stop_server(process)
            (args.out / "results.json").write_text(json.dumps(portable(
                {"provenance": provenance(command, yardsticks, bandwidth=False),
                 "machine": machine, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
                 "identity": identity(records), "records": records}), indent=1))
    same = identity(records)
    (args.out / "table.md").write_text(
        f"{machine}\n\n{table(rows)}\n\nspecwise's answers against the same request at concurrency 1: "
        f"{same['identical']} of {same['compared']} identical\n")
    plot(rows, args.out / "servers.png", machine)
    print(table(rows))
    print(f"specwise answers identical across concurrencies: {same['identical']} of {same['compared']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
