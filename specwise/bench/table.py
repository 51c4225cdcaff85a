"""The published results tables, generated from result files: one source for every headline number.

A list of rows (a JSON file, `docs/results/headline.json`) names, for each machine, the benchmark
run (`bench run` records, one folder per task or one folder), the `bench cost` table and the
prompt-reading measurement that make its row. `render` turns them into the README's table or
docs/BENCHMARKS.md's headline, with the machine, date and commit of each; `write` replaces the
text between a document's markers

    <!-- bench table: readme -->
    ...
    <!-- /bench table -->

and `specwise bench table docs/results/headline.json --check README.md docs/BENCHMARKS.md` fails
when a document's table is not what the files give (a test runs it), so no number in them can
drift from its file.

A row's entries (paths relative to the list's folder):
- `bench`: a folder of `bench run` records (every records.jsonl under it but a merged `all/`);
  speedups are over `llamacpp-generate` in the same run, plain decoding is `specwise-ar-gguf`,
  and the fastest drafters are the other specwise methods on the GGUF target;
- `cost` (optional): a `bench cost` cost.json with specwise's lean runner and llama.cpp, context 128;
- `prefill` (optional): `scripts/lab/prefill_speed.py --out` JSON, or its printed table (.txt);
- `machine`, `date`, `commit`: where the files carry no provenance (runs before it was recorded),
  as the list states them (`commit`: the commit that added the files);
- `note` (optional): a footnote mark's text, e.g. what differed in the yardstick or the kernels.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from specwise.bench.report import aggregate, read_records, task_mean_speedup, task_order

BASELINE = "llamacpp-generate"
PLAIN = "specwise-ar-gguf"
FORMATS = ("readme", "benchmarks")
START = "<!-- bench table: {name} -->"
END = "<!-- /bench table -->"
NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


@dataclass
class Row:
    machine: str
    date: str
    commit: str
    prompts: str
    plain: tuple[float, float | None]  # pooled, task mean
    drafters: list[tuple[str, float, float | None]]  # name, pooled, task mean; fastest first
    prefill: tuple[float, float] | None = None  # tokens/s: specwise, llama.cpp
    ratios: tuple[float, float] | None = None  # T(5)/T(1): specwise, llama.cpp
    notes: list[str] = field(default_factory=list)


def drafter_name(label: str) -> str:
    """A method label as the docs name it: specwise-suffix-k16-gguf -> "suffix k 16",
    specwise-ngram-adaptive1-12-gguf -> "adaptive n-gram"."""
    parts = label.removeprefix("specwise-").removesuffix("-gguf").split("-")
    drafter, rest = parts[0], parts[1:]
    if drafter == "draft" and rest[:1] == ["model"]:
        drafter, rest = "draft model", rest[1:]
    drafter = {"ngram": "n-gram"}.get(drafter, drafter)
    if any(p.startswith("adaptive") for p in rest):
        return f"adaptive {drafter}"
    k = next((p[1:] for p in rest if re.fullmatch(r"k\d+", p)), None)
    return f"{drafter} k {k}" if k else drafter


def _bench_records(folder: Path) -> tuple[list[dict], list[dict]]:
    """Every record under `folder` (but a merged all/), and the run.json files beside them."""
    files = sorted(p for p in folder.rglob("records.jsonl") if "all" not in p.relative_to(folder).parts[:-1])
    if not files:
        raise ValueError(f"{folder} holds no records.jsonl of `specwise bench run`")
    records = [r for path in files for r in read_records(path)]
    metas = [json.loads((p.parent / "run.json").read_text(encoding="utf-8"))
             for p in files if (p.parent / "run.json").is_file()]
    return records, metas


def _prompts(records: list[dict]) -> str:
    tasks = task_order(records)
    per_task = {t: sum(1 for r in records if r["task"] == t and r["method"] == BASELINE) for t in tasks}
    counts = {len({r["question_id"] for r in records if r["task"] == t}) for t in tasks}
    words = NUMBER_WORDS.get(len(tasks), str(len(tasks))) + (" tasks" if len(tasks) > 1 else " task")
    if len(counts) == 1:
        return f"{words} × {counts.pop()}"
    return f"{words}, {sum(per_task.values())} generations"


def _cost_ratios(path: Path, context: str = "128") -> tuple[float, float] | None:
    results = json.loads(path.read_text(encoding="utf-8"))["results"]

    def ratio(runner: str) -> float | None:
        for result in results:
            seconds = result.get("seconds", {}).get(context, {})
            if result.get("runner") == runner and result.get("dtype") == "gguf" and "1" in seconds and "5" in seconds:
                return seconds["5"] / seconds["1"]
        return None

    mine, theirs = ratio("lean"), ratio("llama.cpp")
    return None if mine is None or theirs is None else (mine, theirs)


def _prefill(path: Path) -> tuple[float, float]:
    """tokens/s of specwise's GGUF reader and llama.cpp's, from a JSON record or a printed table."""
    if path.suffix == ".json":
        readers = json.loads(path.read_text(encoding="utf-8"))["readers"]
        mine = next(v for k, v in readers.items() if k.startswith("specwise lean, gguf blocks") and "batched" not in k)
        theirs = next(v for k, v in readers.items() if k.startswith("llama.cpp"))
        return mine["tokens_per_second"], theirs["tokens_per_second"]
    rows = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        prefix, _, table = line.partition("| ")
        if not table or (prefix.strip() and "q4_k_m" not in prefix):  # a file's rows: the default file's only
            continue
        cells = [cell.strip() for cell in table.rstrip(" |").split("|")]
        if len(cells) == 3 and cells[2].isdigit():
            rows[cells[0]] = float(cells[2])
    mine = next((v for k, v in rows.items() if k == "specwise lean, gguf blocks"), None)
    theirs = next((v for k, v in rows.items() if k.startswith("llama.cpp")), None)
    if mine is None or theirs is None:
        raise ValueError(f"{path}: no specwise and llama.cpp readings of the default file found")
    return mine, theirs


def build_row(entry: dict, root: Path) -> Row:
    records, metas = _bench_records(root / entry["bench"])
    rows = aggregate(records, BASELINE)
    tasks = task_order(records)
    methods = list(dict.fromkeys(r["method"] for r in records))
    if (tasks and (tasks[0], BASELINE) not in rows) or (("overall", PLAIN) not in rows):
        raise ValueError(f"{entry['bench']}: the run has no {BASELINE} or no {PLAIN} records")

    def speedups(method: str) -> tuple[float, float | None]:
        return rows["overall", method].speedup, task_mean_speedup(rows, tasks, method)

    drafters = [(drafter_name(m), *speedups(m)) for m in methods
                if m.startswith("specwise-") and m.endswith("-gguf") and m != PLAIN and not m.endswith("-gguf-gguf")]
    drafters.sort(key=lambda d: -d[1])
    provenance = next((m["provenance"] for m in metas if m.get("provenance")), None)
    if provenance:
        code = provenance["specwise"]
        machine = provenance["machine"]["class"]
        date = provenance["date"][:10]
        commit = (code["commit"] or "?")[:7] + (" (uncommitted changes)" if code.get("dirty") else "")
    else:
        missing = [key for key in ("machine", "date", "commit") if key not in entry]
        if missing:
            raise ValueError(f"{entry['bench']} records no provenance: the list must give {', '.join(missing)}")
        machine, date, commit = entry["machine"], entry["date"], entry["commit"]
    row = Row(entry.get("machine", machine), date, commit, _prompts(records), speedups(PLAIN), drafters[:2])
    if entry.get("cost"):
        row.ratios = _cost_ratios(root / entry["cost"])
    if entry.get("prefill"):
        row.prefill = _prefill(root / entry["prefill"])
    if entry.get("note"):
        row.notes.append(entry["note"])
    return row


def read_rows(path: Path) -> list[Row]:
    spec = json.loads(Path(path).read_text(encoding="utf-8"))
    return [build_row(entry, Path(path).parent) for entry in spec["rows"]]


def _x(value: float | None) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.2f} ×"


def _pair(pair: tuple[float, float] | None, spec: str) -> str:
    return "–" if pair is None else f"{format(pair[0], spec)} vs {format(pair[1], spec)}"


def render(rows: list[Row], form: str) -> str:
    """The markdown table (and its footnotes) in one of FORMATS."""
    if form not in FORMATS:
        raise ValueError(f"unknown table format {form!r}; choose {' or '.join(FORMATS)}")
    notes: list[str] = []

    def marks(row: Row) -> str:
        out = ""
        for note in row.notes:
            if note not in notes:
                notes.append(note)
            out += "¹²³⁴⁵⁶⁷⁸⁹"[notes.index(note)]
        return out

    lines = []
    if form == "readme":
        lines += ["| machine (2 cores) | measured | prompts | plain decoding | fastest drafter | "
                  "700-token prompt, tokens/s | T(5) / T(1) |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for row in rows:
            fastest = "; ".join(f"{name}: {_x(pooled)}" for name, pooled, _ in row.drafters) or "–"
            lines.append(f"| {row.machine}{marks(row)} | {row.date}, {row.commit} | {row.prompts} | {_x(row.plain[0])} | "
                         f"{fastest} | {_pair(row.prefill, '.0f')} | {_pair(row.ratios, '.2f')} |")
    else:
        lines += ["| machine (2 cores) | measured | prompts | plain decoding: pooled / task mean | "
                  "fastest drafters: pooled / task mean | 700-token prompt, tokens/s | T(5) / T(1) |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]

        def both(pooled: float, mean: float | None) -> str:
            return f"{pooled:.2f}" + ("" if mean is None else f" / {mean:.2f}")

        for row in rows:
            fastest = "; ".join(f"{name}: {both(p, m)}" for name, p, m in row.drafters) or "–"
            lines.append(f"| {row.machine}{marks(row)} | {row.date}, {row.commit} | {row.prompts} | "
                         f"{both(*row.plain)} | {fastest} | {_pair(row.prefill, '.0f')} | {_pair(row.ratios, '.2f')} |")
    if notes:
        lines.append("")
        lines += [f"{'¹²³⁴⁵⁶⁷⁸⁹'[i]} {note}" + ("  " if i < len(notes) - 1 else "") for i, note in enumerate(notes)]
    return "\n".join(lines) + "\n"


def replace_tables(text: str, tables: dict[str, str], where: str = "the document") -> str:
    """`text` with the part between each table's markers replaced; an error if a document has none."""
    found = 0
    for name, table in tables.items():
        start, end = START.format(name=name), END
        pattern = re.compile(re.escape(start) + r"\n.*?" + re.escape(end), re.S)
        text, count = pattern.subn(lambda _: f"{start}\n{table}{end}", text)
        found += count
    if not found:
        raise ValueError(f"{where} has no table markers ({START.format(name='readme')} ... {END}, "
                         f"or the benchmarks one)")
    return text
