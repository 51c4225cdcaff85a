"""A coding assistant's edits as the benchmark: aider, the real client, driven against each server.

Each task of scripts/data/aider_tasks/ (a few small Python files and an instruction) is copied into a
throwaway directory, and aider is run there once per server, non-interactively: the instruction as its
one message, the whole-file edit format (the model writes each edited file out in full: mostly text it
has just read, which is where drafting from the prompt or from earlier answers pays), greedy
(temperature 0, aider's default), no git, no repository map, no network beside the server, no
analytics. Servers, all on the same GGUF file, one request at a time:
- specwise-plain (specwise serve --drafter none), specwise (its default drafter), specwise-suffix;
- llama-server plain, with n-gram speculation (ngram-mod) and with a draft model: the candidates for its
  best speculative setting, started as scripts/server_compare.py starts them (same build, same flags).
Recorded per server and task, and overall: aider's wall time, the completion tokens and the seconds
the server spent on its requests (read from its /metrics before and after: specwise's counters,
llama-server's --metrics), tokens/s over those seconds and over the decoding alone, τ where specwise
reports it, and whether the edited files equal those of the plain run of the same server (specwise-plain
for specwise, llama-server for llama-server's rows): at temperature 0 a lossless server edits exactly as
its plain decoding does. Writes results.json (with provenance) and table.md into --out.

aider pins its own versions of many packages, so it lives in a virtual environment of its own:
    python scripts/bench_aider.py --setup            # once: $SPECWISE_HOME/aider-venv (or install.sh --aider)
    python scripts/bench_aider.py --out /tmp/aider --quick          # 2 tasks, specwise rows, a small budget
    python scripts/bench_aider.py --out docs/results/aider          # every task and server
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

AIDER_VERSION = "0.86.2"
TASKS_DIR = Path(__file__).resolve().parent / "data" / "aider_tasks"
# name: (how server_compare.py starts it, more specwise serve options)
SERVERS: dict[str, tuple[str, str]] = {
    "specwise-plain": ("specwise", "--drafter none"),
    "specwise": ("specwise", ""),  # its default drafter: n-gram, adaptive k
    "specwise-suffix": ("specwise", "--drafter suffix"),
    "llama-server": ("llama-server", ""),
    "llama-server-ngram": ("llama-server-ngram", ""),
    "llama-server-draft": ("llama-server-draft", ""),
}
PLAIN = {"specwise": "specwise-plain", "llama-server": "llama-server"}  # each family's reference for the edits
QUICK_SERVERS = "specwise-plain,specwise-suffix"
QUICK_TASKS = 2


# ---------------------------------------------------------------- tasks

@dataclass
class Task:
    """An instruction and the files aider is given to edit (name -> text)."""

    name: str
    instruction: str
    files: dict[str, str]

    @property
    def size(self) -> int:
        return sum(len(text) for text in self.files.values())


def load_tasks(directory: Path = TASKS_DIR) -> list[Task]:
    """Every task under `directory`: <name>/task.json ({"instruction", "files"}) and <name>/files/."""
    tasks = []
    for spec in sorted(Path(directory).glob("*/task.json")):
        data = json.loads(spec.read_text())
        files = {name: (spec.parent / "files" / name).read_text() for name in data["files"]}
        tasks.append(Task(spec.parent.name, data["instruction"], files))
    if not tasks:
        raise SystemExit(f"no tasks in {directory}: each is <name>/task.json beside <name>/files/")
    return tasks


def quick_tasks(tasks: list[Task], count: int = QUICK_TASKS) -> list[Task]:
    """The `count` smallest tasks (the shortest answers), in their usual order."""
    smallest = {task.name for task in sorted(tasks, key=lambda task: (task.size, task.name))[:count]}
    return [task for task in tasks if task.name in smallest]


def set_up(task: Task, directory: Path) -> Path:
    """The task's files written into a fresh `directory` (aider's working directory)."""
    directory.mkdir(parents=True, exist_ok=False)
    for name, text in task.files.items():
        (directory / name).write_text(text)
    return directory


def snapshot(directory: Path, names: list[str]) -> dict[str, str | None]:
    """The text of each named file (None where it is gone)."""
    return {name: (directory / name).read_text() if (directory / name).is_file() else None for name in names}


# ---------------------------------------------------------------- servers and aider

def family(server: str) -> str:
    return "specwise" if server.startswith("specwise") else "llama-server"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as {metric name: the sum of its samples' values}, labels added up."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_and_labels, _, value = line.rpartition(" ")
        name = name_and_labels.split("{", 1)[0]
        try:
            sums[name] = sums.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return sums


def usage(before: dict[str, float], after: dict[str, float], kind: str) -> dict:
    """What a server did between two readings of its /metrics: tokens, seconds, speculation steps."""
    def grew(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    if kind == "specwise":
        seconds = grew("specwise_request_latency_seconds_sum")  # from each request's arrival to its last token
        return {"completion_tokens": int(grew("specwise_generated_tokens_total")),
                "prompt_tokens": int(grew("specwise_prompt_tokens_total")), "server_seconds": seconds,
                "decode_seconds": seconds - grew("specwise_time_to_first_token_seconds_sum"),
                "steps": int(grew("specwise_spec_steps_total")),
                "accepted": int(grew("specwise_spec_draft_tokens_accepted_total"))}
    decode = grew("llamacpp:tokens_predicted_seconds_total")
    return {"completion_tokens": int(grew("llamacpp:tokens_predicted_total")),
            "prompt_tokens": int(grew("llamacpp:prompt_tokens_total")),
            "server_seconds": decode + grew("llamacpp:prompt_seconds_total"), "decode_seconds": decode,
            "steps": 0, "accepted": 0}


def aider_files(model: str, context: int, max_tokens: int, directory: Path) -> tuple[Path, Path]:
    """aider's model settings (whole-file edits, no repository map, the answer's token budget) and
    metadata (context window, no cost), so that it neither guesses nor looks them up online."""
    settings = directory / "model-settings.yml"  # JSON is YAML
    settings.write_text(json.dumps([{"name": f"openai/{model}", "edit_format": "whole", "use_repo_map": False,
                                     "extra_params": {"max_tokens": max_tokens}}]))
    metadata = directory / "model-metadata.json"
    metadata.write_text(json.dumps({f"openai/{model}": {
        "max_input_tokens": context, "max_output_tokens": max_tokens, "max_tokens": max_tokens,
        "input_cost_per_token": 0.0, "output_cost_per_token": 0.0, "litellm_provider": "openai", "mode": "chat"}}))
    return settings, metadata


def aider_command(aider: Path, url: str, model: str, task: Task, settings: Path, metadata: Path,
                  history: Path, timeout: float) -> list[str]:
    return [str(aider), "--model", f"openai/{model}", "--openai-api-base", f"{url}/v1", "--openai-api-key", "none",
            "--model-settings-file", str(settings), "--model-metadata-file", str(metadata),
            "--edit-format", "whole", "--map-tokens", "0", "--no-git", "--yes-always", "--no-check-update",
            "--analytics-disable", "--no-show-model-warnings", "--no-show-release-notes", "--no-pretty",
            "--no-fancy-input", "--no-auto-lint", "--no-auto-test", "--no-suggest-shell-commands",
            "--no-detect-urls", "--no-restore-chat-history", "--chat-history-file", str(history),
            "--timeout", str(int(timeout)), "--message", task.instruction, *task.files]


def aider_environment(home: Path) -> dict[str, str]:
    """aider's environment: a throwaway home (its caches and analytics settings stay there) and litellm's
    own table of models instead of the one it would download."""
    keep = {name: value for name, value in os.environ.items() if name in ("PATH", "LANG", "LC_ALL", "TMPDIR")}
    return keep | {"HOME": str(home), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "AIDER_ANALYTICS": "false",
                   "PYTHONUNBUFFERED": "1"}


def _server_compare():
    """scripts/server_compare.py, whose server commands and yardstick record this script shares."""
    spec = importlib.util.spec_from_file_location("server_compare", Path(__file__).with_name("server_compare.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def server_command(compare, server: str, args: argparse.Namespace, port: int) -> list[str]:
    kind, options = SERVERS[server]
    settings = argparse.Namespace(**vars(args))
    settings.specwise_args = f"{options} {args.specwise_args}".strip()
    settings.llama_args = f"--metrics {args.llama_args}".strip()  # its counters are what is read
    return compare.server_command(kind, settings, 1, port)


def served_model(url: str) -> str:
    return httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]


def warm_up(url: str, model: str) -> None:
    """One short request first, so that no task pays for a cold start."""
    response = httpx.post(url + "/v1/chat/completions", timeout=600, json={
        "model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0})
    if response.status_code != 200:
        raise SystemExit(f"the warm-up request failed: HTTP {response.status_code}: {response.text[:200]}")


# ---------------------------------------------------------------- records

@dataclass
class Record:
    server: str
    task: str
    wall_seconds: float
    exit_code: int | None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    server_seconds: float = 0.0
    decode_seconds: float = 0.0
    steps: int = 0
    accepted: int = 0
    edited: bool = False  # any file differs from the task's
    same_as_plain: bool | None = None  # the files equal the family's plain run's (None: no plain run)
    files: dict[str, str | None] = field(default_factory=dict)

    @property
    def tau(self) -> float | None:
        return 1 + self.accepted / self.steps if self.steps else None


def rate(tokens: float, seconds: float) -> float | None:
    return tokens / seconds if seconds > 0 else None


def compare_to_plain(records: list[Record]) -> None:
    """Mark each record whose family's plain run did the same task: are its files the same?"""
    plain = {(r.server, r.task): r.files for r in records}
    for record in records:
        reference = plain.get((PLAIN[family(record.server)], record.task))
        record.same_as_plain = None if reference is None else record.files == reference


def overall(records: list[Record], server: str) -> dict:
    mine = [r for r in records if r.server == server]
    total = {name: sum(getattr(r, name) for r in mine)
             for name in ("wall_seconds", "completion_tokens", "prompt_tokens", "server_seconds", "decode_seconds",
                          "steps", "accepted")}
    compared = [r.same_as_plain for r in mine if r.same_as_plain is not None]
    return {"server": server, "tasks": len(mine), "failed": sum(r.exit_code != 0 for r in mine), **total,
            "tokens_per_second": rate(total["completion_tokens"], total["server_seconds"]),
            "decode_tokens_per_second": rate(total["completion_tokens"], total["decode_seconds"]),
            "tau": 1 + total["accepted"] / total["steps"] if total["steps"] else None,
            "same_as_plain": f"{sum(compared)}/{len(compared)}" if compared else None}


def table(records: list[Record], servers: list[str]) -> str:
    def n(value: float | None, digits: int = 2) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    def same(value: bool | None) -> str:
        return "-" if value is None else "yes" if value else "no"

    lines = ["| server | task | wall s | completion tokens | tokens/s | decode tokens/s | τ | edited "
             "| same as plain |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in records:
        failed = "" if r.exit_code == 0 else f" (aider exit {r.exit_code})"
        lines.append(f"| {r.server} | {r.task}{failed} | {r.wall_seconds:.1f} | {r.completion_tokens} | "
                     f"{n(rate(r.completion_tokens, r.server_seconds))} | "
                     f"{n(rate(r.completion_tokens, r.decode_seconds))} | {n(r.tau)} | {same(r.edited)} | "
                     f"{same(r.same_as_plain)} |")
    totals = [overall(records, server) for server in servers if any(r.server == server for r in records)]
    base = next((t["tokens_per_second"] for t in totals if t["server"] == "llama-server"), None)
    lines += ["", "| server | tasks | wall s | completion tokens | tokens/s | x llama-server | decode tokens/s | τ "
              "| same as plain |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for t in totals:
        ratio = t["tokens_per_second"] / base if base and t["tokens_per_second"] else None
        failed = f" ({t['failed']} failed)" if t["failed"] else ""
        lines.append(f"| {t['server']} | {t['tasks']}{failed} | {t['wall_seconds']:.1f} | {t['completion_tokens']} | "
                     f"{n(t['tokens_per_second'])} | {n(ratio)} | {n(t['decode_tokens_per_second'])} | "
                     f"{n(t['tau'])} | {t['same_as_plain'] or '-'} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- running

def run_task(aider: Path, url: str, model: str, server: str, task: Task, args: argparse.Namespace) -> Record:
    kind = family(server)
    with tempfile.TemporaryDirectory(prefix="specwise-aider-") as scratch:
        scratch = Path(scratch)
        work = set_up(task, scratch / "repo")
        (scratch / "home").mkdir()
        settings, metadata = aider_files(model, args.context, args.max_tokens, scratch)
        log = args.out / "logs" / f"{server}-{task.name}.log"
        command = aider_command(aider, url, model, task, settings, metadata, log.with_suffix(".chat.md"),
                                args.timeout)
        before = parse_metrics(httpx.get(url + "/metrics", timeout=30).text)
        started = time.perf_counter()
        environment = aider_environment(scratch / "home")
        with log.open("w") as handle:
            try:
                exit_code: int | None = subprocess.run(command, cwd=work, stdout=handle, stderr=subprocess.STDOUT,
                                                       stdin=subprocess.DEVNULL, env=environment,
                                                       timeout=args.timeout).returncode
            except subprocess.TimeoutExpired:
                exit_code = None
        wall = time.perf_counter() - started
        after = parse_metrics(httpx.get(url + "/metrics", timeout=30).text)
        files = snapshot(work, list(task.files))
    record = Record(server, task.name, round(wall, 3), exit_code, **usage(before, after, kind), files=files,
                    edited=files != task.files)
    for name, text in files.items():  # kept for a look at what each server wrote
        if text is not None:
            (args.out / "files" / server / task.name).mkdir(parents=True, exist_ok=True)
            (args.out / "files" / server / task.name / name).write_text(text)
    return record


def set_up_aider(venv: Path) -> Path:
    """aider in a virtual environment of its own (it pins many packages that specwise's must not change)."""
    aider = venv / "bin" / "aider"
    if aider.is_file() and f"aider {AIDER_VERSION}" in subprocess.run(
            [str(aider), "--version"], capture_output=True, text=True).stdout:
        return aider
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    subprocess.run([python, "-m", "pip", "install", "--quiet", f"aider-chat=={AIDER_VERSION}"], check=True)
    return aider


def main() -> int:
    from specwise.bench.machine import cpu_model, usable_cores
    from specwise.paths import specwise_home

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setup", action="store_true", help=f"install aider {AIDER_VERSION} into --aider-venv "
                        "and stop")
    parser.add_argument("--aider-venv", type=Path, default=None,
                        help="aider's virtual environment (default: $SPECWISE_HOME/aider-venv)")
    parser.add_argument("--out", type=Path, help="where results.json, table.md, logs/ and files/ go")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke test: the {QUICK_TASKS} smallest tasks, {QUICK_SERVERS}, a small budget")
    parser.add_argument("--servers", default=None, help=f"of {', '.join(SERVERS)} (default: all)")
    parser.add_argument("--tasks", default=None, help="task names (default: every task; --quick: the smallest)")
    parser.add_argument("--gguf", type=Path, default=None, help="the GGUF file every server runs "
                        "(default: the default target's)")
    parser.add_argument("--max-tokens", type=int, default=None, help="an answer's budget (default 2048; --quick 512)")
    parser.add_argument("--context", type=int, default=8192, help="llama-server's context; aider's window")
    parser.add_argument("--threads", type=int, default=usable_cores())
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one aider run may take")
    parser.add_argument("--specwise-args", default="", help="more options for specwise serve")
    parser.add_argument("--llama-server", default=None, help="llama-server binary (default: the one "
                        "scripts/build_llama_server.sh built)")
    parser.add_argument("--llama-args", default="", help="more options for llama-server")
    parser.add_argument("--llama-ngram-args", default="--spec-type ngram-mod --spec-ngram-mod-n-match 24 "
                        "--spec-ngram-mod-n-min 4 --spec-ngram-mod-n-max 16", help="the llama-server-ngram row's")
    parser.add_argument("--draft-gguf", type=Path, default=None, help="the llama-server-draft row's draft model "
                        "(default: the default drafter's GGUF file)")
    parser.add_argument("--llama-draft-args", default="--spec-type draft-simple --spec-draft-n-max 8 "
                        "--spec-draft-n-min 1", help="the llama-server-draft row's")
    args = parser.parse_args()
    venv = args.aider_venv or specwise_home() / "aider-venv"
    if args.setup:
        print(f"aider: {set_up_aider(venv)}")
        return 0
    if args.out is None:
        parser.error("--out is required (or --setup)")
    aider = venv / "bin" / "aider"
    if not aider.is_file():
        raise SystemExit(f"no aider at {aider}: install it with python scripts/bench_aider.py --setup "
                         "(or bash scripts/install.sh --aider)")
    servers = (args.servers or (QUICK_SERVERS if args.quick else ",".join(SERVERS))).split(",")
    unknown = [s for s in servers if s not in SERVERS]
    if unknown:
        parser.error(f"unknown servers {unknown}; choose from {', '.join(SERVERS)}")
    tasks = load_tasks()
    if args.tasks:
        wanted = args.tasks.split(",")
        missing = sorted(set(wanted) - {t.name for t in tasks})
        if missing:
            parser.error(f"unknown tasks {missing}; there are {', '.join(t.name for t in tasks)}")
        tasks = [t for t in tasks if t.name in wanted]
    elif args.quick:
        tasks = quick_tasks(tasks)
    args.max_tokens = args.max_tokens or (512 if args.quick else 2048)
    run(args, aider, servers, tasks, f"{cpu_model()}, {usable_cores()} cores")
    return 0


def run(args: argparse.Namespace, aider: Path, servers: list[str], tasks: list[Task], machine: str) -> None:
    from specwise.bench.provenance import portable, provenance
    from specwise.bench.serving import free_port, start_server, stop_server
    from specwise.store.catalog import DEFAULT_DRAFTER, DEFAULT_TARGET
    from specwise.store.prepare import gguf_file

    compare = _server_compare()
    args.gguf = args.gguf or gguf_file(DEFAULT_TARGET)
    if "llama-server-draft" in servers:
        args.draft_gguf = args.draft_gguf or gguf_file(DEFAULT_DRAFTER)
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    version = subprocess.run([str(aider), "--version"], capture_output=True, text=True).stdout.strip()
    yardsticks = [compare.yardstick(args)] if any(family(s) == "llama-server" for s in servers) else []
    command = shlex.join(["python", "scripts/bench_aider.py", *sys.argv[1:]])
    print(f"{machine}; {version}; {len(tasks)} tasks; servers {', '.join(servers)}", flush=True)
    records: list[Record] = []
    started = time.perf_counter()
    for server in servers:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        try:
            process = start_server(server_command(compare, server, args, port), url,
                                   args.out / "logs" / f"{server}.log")
        except RuntimeError as error:
            raise SystemExit(str(error)) from None
        try:
            model = served_model(url)
            warm_up(url, model)
            for task in tasks:
                record = run_task(aider, url, model, server, task, args)
                records.append(record)
                print(json.dumps({k: v for k, v in asdict(record).items() if k != "files"}), flush=True)
        finally:
            stop_server(process)
    compare_to_plain(records)
    results = {"provenance": provenance(command, yardsticks, bandwidth=False), "machine": machine, "aider": version,
               "args": {k: str(v) for k, v in vars(args).items()}, "seconds": round(time.perf_counter() - started, 1),
               "overall": [overall(records, s) for s in servers],
               "records": [asdict(r) | {"tau": r.tau} for r in records]}
    (args.out / "results.json").write_text(json.dumps(portable(results), indent=1))
    text = table(records, servers)
    (args.out / "table.md").write_text(f"{machine}; {version}; GGUF {args.gguf.name}; budget {args.max_tokens} "
                                       f"tokens\n\n{text}\n")
    print(text)
    print(f"{results['seconds']:.0f} s in all; {args.out / 'results.json'}")


if __name__ == "__main__":
    raise SystemExit(main())
