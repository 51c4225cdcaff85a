"""Aggregate benchmark records into per-task numbers, and write summary.md.

Speedup of a method for a task = its total new tokens / total seconds, divided by
the same ratio of the baseline (hf-generate) over the same task's records of the
same run. τ and α of specwise methods come from their merged SpecStats (never a
mean of per-prompt ratios); for Hugging Face methods τ is new tokens per target
forward pass (HF does not report its drafts) and α is unknown.

The overall row pools tokens and seconds, so tasks with long prompts (summarization, rag:
minutes per question) outweigh short ones; the task mean (geometric mean of the per-task
speedups) weighs every task alike, and the report gives both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specwise.numerics import DEFAULT_TIE_ULPS, FAILURE, NUMERICAL
from specwise.bench.prompts import TASKS
from specwise.stats import SpecStats

OVERALL = "overall"
TASK_MEAN = "task mean (geometric)"


@dataclass
class Row:
    """One method's totals over one task (or OVERALL)."""

    task: str
    method: str
    generations: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    speedup: float | None = None
    tau: float | None = None
    tau_kind: str | None = None  # "steps" (specwise: accepted + 1 per step) or "forwards" (HF)
    alpha: float | None = None
    per_position: list[float] = field(default_factory=list)
    identical: int = 0
    numerical: int = 0
    failures: int = 0

    @property
    def tokens_per_second(self) -> float | None:
        return self.new_tokens / self.seconds if self.seconds > 0 else None


def stats_from_record(record: dict) -> SpecStats:
    return SpecStats(steps=record["steps"] or 0, proposed=record["proposed"] or 0,
                     accepted=record["accepted"] or 0, new_tokens=record["new_tokens"],
                     proposed_at=list(record["proposed_at"] or []), accepted_at=list(record["accepted_at"] or []),
                     draft_seconds=record["draft_seconds"] or 0.0, score_seconds=record["score_seconds"] or 0.0,
                     verify_seconds=record["verify_seconds"] or 0.0, total_seconds=record["wall_seconds"],
                     prefill_seconds=record.get("prefill_seconds") or 0.0)


def _row(task: str, method: str, records: Sequence[dict]) -> Row:
    row = Row(task, method, generations=len(records), new_tokens=sum(r["new_tokens"] for r in records),
              seconds=sum(r["wall_seconds"] for r in records))
    for r in records:
        check = r.get("check")
        row.identical += check == "identical"
        row.numerical += check == NUMERICAL
        row.failures += check == FAILURE
    if records and all(r.get("family") == "specwise" for r in records):
        stats = SpecStats.combine([stats_from_record(r) for r in records])
        row.tau, row.tau_kind, row.alpha = stats.acceptance_length, "steps", stats.acceptance_rate
        row.per_position = stats.per_position_acceptance
    elif records and all(r.get("steps") for r in records):
        row.tau, row.tau_kind = row.new_tokens / sum(r["steps"] for r in records), "forwards"
    return row


def task_order(records: Iterable[dict]) -> list[str]:
    seen = list(dict.fromkeys(r["task"] for r in records))
    return sorted(seen, key=lambda t: (TASKS.index(t) if t in TASKS else len(TASKS), seen.index(t)))


def aggregate(records: Sequence[dict], baseline: str | None) -> dict[tuple[str, str], Row]:
    """Rows keyed (task, method), OVERALL included; speedups relative to `baseline` within a task."""
    methods = list(dict.fromkeys(r["method"] for r in records))
    rows: dict[tuple[str, str], Row] = {}
    for task in task_order(records) + [OVERALL]:
        for method in methods:
            chosen = [r for r in records if r["method"] == method and task in (OVERALL, r["task"])]
            if chosen:
                rows[task, method] = _row(task, method, chosen)
        base = rows.get((task, baseline)) if baseline else None
        base_rate = base.tokens_per_second if base else None
        for method in methods:
            row = rows.get((task, method))
            if row is not None and base_rate and row.tokens_per_second is not None:
                row.speedup = row.tokens_per_second / base_rate
    return rows


def task_mean_speedup(rows: dict, tasks: Sequence[str], method: str) -> float | None:
    """Geometric mean of `method`'s per-task speedups; None unless every task has one."""
    speedups = [rows[t, method].speedup if (t, method) in rows else None for t in tasks]
    if not speedups or any(s is None or s <= 0 for s in speedups):
        return None
    return math.exp(sum(math.log(s) for s in speedups) / len(speedups))


# --------------------------------------------------------------------------- markdown


def _fmt(value, spec: str = ".2f", none: str = "–") -> str:
    return none if value is None else format(value, spec)


def _table(header: Sequence[str], lines: Iterable[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return out


def _by_task(rows: dict, tasks: Sequence[str], methods: Sequence[str], value) -> list[str]:
    return _table(["task"] + list(methods),
                  ([task] + [value(rows[task, m]) if (task, m) in rows else "–" for m in methods]
                   for task in list(tasks) + [OVERALL]))


def _weights(meta: dict) -> str:
    """What the target ran from: its GGUF blocks as stored, or a dense dtype."""
    dtype = meta.get("machine", {}).get("dtype", "?")
    return "GGUF blocks as stored" if meta.get("target_format") == "gguf" or dtype == "gguf" else f"dense {dtype}"


def _provenance_lines(provenance: dict | None) -> list[str]:
    """The code, machine and yardsticks a run records (bench/provenance.py), one line each."""
    if not provenance:
        return ["- provenance: not recorded (a run from before runs recorded their commit)"]
    code, machine = provenance["specwise"], provenance["machine"]
    commit = code.get("commit") or "not a git checkout"
    lines = [f"- specwise {code.get('version', '?')} at {commit}"
             + (" with uncommitted changes" if code.get("dirty") else ""),
             f"- measured {provenance.get('date', '?')} on {machine.get('class', machine.get('cpu', '?'))} "
             f"(family {machine.get('family', '?')} model {machine.get('model', '?')}), read bandwidth "
             f"{machine.get('read_bandwidth_gbs', '?')} GB/s"]
    if provenance.get("environment"):
        lines.append("- environment: " + ", ".join(f"{k}={v}" for k, v in provenance["environment"].items()))
    for yardstick in provenance.get("yardsticks", []):
        build = yardstick.get("build") or {}
        buffers = ", ".join(f"{name} {mib:.0f} MiB" for name, mib in (yardstick.get("buffers") or {}).items())
        lines.append(f"- yardstick: {yardstick.get('name')} ({yardstick.get('package')} {yardstick.get('version')}); "
                     f"build: {build.get('cmake_args') or build.get('note') or 'not recorded'}"
                     + (f"; weight buffers: {buffers}" if buffers else "")
                     + (f"; reports: {yardstick['system_info']}" if yardstick.get("system_info") else ""))
    return lines


def summary_markdown(records: Sequence[dict], meta: dict) -> str:
    from specwise.bench.provenance import portable

    meta = portable(meta)  # as run.json holds it: paths relative to the repository or $SPECWISE_HOME
    baseline = meta.get("baseline")
    rows = aggregate(records, baseline)
    tasks = task_order(records)
    methods = list(dict.fromkeys(r["method"] for r in records))
    machine = meta.get("machine", {})
    lines = [f"# specwise bench: {meta.get('started', '')}", ""]
    lines += ["## Setup", "", f"- command: `{meta.get('command', '')}`",
              f"- machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, "
              f"{machine.get('torch_threads', '?')} torch threads",
              f"- target weights: {_weights(meta)}; torch {machine.get('torch', '?')}, "
              f"transformers {machine.get('transformers', '?')}, Python {machine.get('python', '?')}",
              *_provenance_lines(meta.get("provenance")),
              f"- target {meta.get('target', '?')}, drafter model {meta.get('drafter_model', '?')}",
              f"- prompts: {meta.get('questions_file', '?')}, {meta.get('questions', '?')} questions "
              f"({meta.get('per_task') or 'all'} per task), chat template {'on' if meta.get('chat', True) else 'off'}",
              f"- sampling: {meta.get('sampling', {})}",
              f"- warm-up: one generation of {meta.get('warmup_tokens', '?')} tokens per method"
              + (f" on the first prompt's last {meta['warmup_prompt_tokens']} tokens; "
                 if meta.get("warmup_prompt_tokens") else " on the first prompt; ") +
              "then prompt by prompt, every method in a rotated order",
              f"- speedup baseline: {baseline or 'none'}", ""]
    if meta.get("merged_from"):
        lines += ["Merged from separate runs (each a side-by-side comparison on its own tasks; "
                  "the overall row pools their tokens and seconds):", ""]
        lines += [f"- `{m['directory']}` ({', '.join(m.get('tasks') or [])}; {m.get('started')} to "
                  f"{m.get('finished')}): `{m.get('command')}`" for m in meta["merged_from"]] + [""]
    if meta.get("methods"):
        lines += ["Methods:", ""] + [f"- `{m['label']}`: {m['description']}" for m in meta["methods"]] + [""]
    total_failures = sum(r.failures for (t, _), r in rows.items() if t == OVERALL)
    total_numerical = sum(r.numerical for (t, _), r in rows.items() if t == OVERALL)
    if total_failures or total_numerical:
        lines += [f"**MISMATCHES vs {baseline}: {total_failures} FAILURE, {total_numerical} numerical** "
                  "(details below)", ""]
    lines += ["## Overall", ""]
    lines += _table(["method", "generations", "new tokens", "seconds", "tokens/s", "speedup", "τ", "α",
                     "identical", "numerical", FAILURE],
                    ([m, str(r.generations), str(r.new_tokens), f"{r.seconds:.2f}", _fmt(r.tokens_per_second),
                      _fmt(r.speedup, ".3f"), _fmt(r.tau) + ("*" if r.tau_kind == "forwards" else ""),
                      _fmt(r.alpha, ".3f"), str(r.identical), str(r.numerical), str(r.failures)]
                     for m in methods if (r := rows.get((OVERALL, m)))))
    lines += ["", "τ* (Hugging Face): new tokens per target forward pass; HF does not report its drafts.", ""]
    lines += [f"## Speedup vs {baseline} by task (total tokens / total seconds, same run)", ""]
    lines += _by_task(rows, tasks, methods, lambda r: _fmt(r.speedup, ".3f"))
    if len(tasks) > 1:
        lines.append("| " + " | ".join([TASK_MEAN] + [_fmt(task_mean_speedup(rows, tasks, m), ".3f")
                                                     for m in methods]) + " |")
        lines += ["", f"Overall pools tokens and seconds (long-prompt tasks weigh most); {TASK_MEAN} "
                  "weighs every task alike."]
    lines.append("")
    lines += ["## Tokens per second by task", ""]
    lines += _by_task(rows, tasks, methods, lambda r: _fmt(r.tokens_per_second)) + [""]
    lines += ["## τ (tokens per step) by task", ""]
    lines += _by_task(rows, tasks, methods, lambda r: _fmt(r.tau) + ("*" if r.tau_kind == "forwards" else "")) + [""]
    lines += ["## α (accepted / proposed) by task", ""]
    lines += _by_task(rows, tasks, methods, lambda r: _fmt(r.alpha, ".3f")) + [""]
    positional = [(m, rows[OVERALL, m].per_position) for m in methods
                  if (OVERALL, m) in rows and rows[OVERALL, m].per_position]
    if positional:
        width = max(len(p) for _, p in positional)
        lines += ["## Per-position acceptance (overall)", ""]
        lines += _table(["method"] + [str(i + 1) for i in range(width)],
                        ([m] + [_fmt(p[i], ".3f") if i < len(p) else "" for i in range(width)]
                         for m, p in positional)) + [""]
    lines += _sweep_section(rows, meta)
    lines += _contention_section(records)
    lines += _mismatch_section(records, baseline, meta.get("tie_ulps", DEFAULT_TIE_ULPS))
    if meta.get("plots"):
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in meta["plots"]] + [""]
    return "\n".join(lines)


def sweep_rows(rows: dict, meta: dict) -> dict[str, list[tuple[int, Row]]]:
    """Per swept configuration, its overall rows by k."""
    out: dict[str, list[tuple[int, Row]]] = {}
    for group, members in (meta.get("sweep") or {}).items():
        out[group] = [(k, rows[OVERALL, label]) for k, label in members if (OVERALL, label) in rows]
    return out


def _sweep_section(rows: dict, meta: dict) -> list[str]:
    groups = sweep_rows(rows, meta)
    if not groups:
        return []
    lines = ["## Sweep over k (overall)", ""]
    lines += _table(["configuration", "k", "tokens/s", "speedup", "τ", "α"],
                    ([group, str(k), _fmt(r.tokens_per_second), _fmt(r.speedup, ".3f"), _fmt(r.tau),
                      _fmt(r.alpha, ".3f")] for group, members in groups.items() for k, r in members))
    return lines + [""]


def _contention_section(records: Sequence[dict]) -> list[str]:
    """Say how many timings ran while other processes used the CPU (they are not comparable)."""
    from specwise.bench.machine import CONTENDED, contended

    probed = [r for r in records if r.get("other_cpu") is not None]
    if not probed:
        return ["## Timing contention", "", "Not recorded (records from before specwise recorded it).", ""]
    bad = [r for r in probed if contended(r)]
    worst = max(r["other_cpu"] for r in probed)
    lines = ["## Timing contention", "",
             f"{len(bad)} of {len(probed)} generations ran while other processes used more than "
             f"{CONTENDED:.0%} of the CPU (largest share {worst:.1%})."]
    retaken = sum(1 for r in probed if r.get("retakes"))
    if retaken:
        lines[-1] += (f" {retaken} generation(s) were timed again after such contention; "
                      "their records hold the last timing.")
    lines.append("")
    if bad:
        lines += _table(["question", "turn", "method", "other processes' CPU share"],
                        ([str(r["question_id"]), str(r["turn"]), r["method"], f"{r['other_cpu']:.1%}"]
                         for r in bad)) + [""]
    return lines


def _mismatch_section(records: Sequence[dict], baseline: str | None, tie_ulps) -> list[str]:
    bad = [r for r in records if r.get("mismatch")]
    skipped = [r for r in records if str(r.get("check", "")).startswith("skipped")]
    if not bad and not skipped:
        return []
    lines = [f"## Mismatches vs {baseline}", "",
             "Rule: at the first diverging token, one target pass on the common prefix in the run's dtype; "
             f"numerical iff both tokens' logits lie within ulps · eps(dtype) · max(|top logit|, 1) of the "
             f"top logit, ulps = {tie_ulps} (see specwise/numerics.py).", ""]
    if bad:
        lines += _table(["question", "task", "turn", "method", "position", "tokens (ref / method)",
                         "top-2 margin", "gap (ulp)", "verdict"],
                        ([str(r["question_id"]), r["task"], str(r["turn"]), r["method"],
                          str(m["position"]), f"{m['reference_token']} / {m['method_token']}",
                          _fmt(m["top2_margin"], ".4g"), _fmt(m["margin_ulps"], ".2f"),
                          f"**{m['classification']}**"] for r in bad for m in [r["mismatch"]]))
        lines.append("")
    if skipped:
        lines += [f"{len(skipped)} later-turn generations were not compared: their prompt held the "
                  "method's own, differing, earlier answer.", ""]
    return lines


# --------------------------------------------------------------------------- files


RECORD_KEYS = ("method", "task", "new_tokens", "wall_seconds")  # what every reader of a record needs


def read_records(path: Path) -> list[dict]:
    """The records of a `specwise bench run` folder's records.jsonl; a ValueError naming the file and
    line where one is not a record (damaged, or another program's file)."""
    records = []
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not JSON ({error.msg}); the file is damaged or was "
                                 "not written by `specwise bench run`") from None
            missing = [key for key in RECORD_KEYS if not isinstance(record, dict) or key not in record]
            if missing:
                raise ValueError(f"{path}, line {number}: not a bench record (no {', '.join(missing)}); the file "
                                 "is damaged or was not written by `specwise bench run`")
            records.append(record)
    return records


def read_meta(path: Path) -> dict:
    """A run's run.json; a ValueError naming the file where it is not one."""
    try:
        meta = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error.msg}, line {error.lineno}); the file is damaged or was not "
                         "written by `specwise bench run`") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("methods", []), list) or not all(
            isinstance(m, dict) and "label" in m for m in meta.get("methods", [])):
        raise ValueError(f"{path}: not a run description (an object whose methods each have a label); the file "
                         "is damaged or was not written by `specwise bench run`")
    return meta


def write_report(out_dir: Path, records: Sequence[dict], meta: dict) -> Path:
    """summary.md and the plots, from records and the run's metadata; returns summary.md's path."""
    from specwise.bench.plots import plot_bench

    out_dir = Path(out_dir)
    rows = aggregate(records, meta.get("baseline"))
    meta = dict(meta, plots=[p.name for p in plot_bench(out_dir, rows, task_order(records),
                                                        list(dict.fromkeys(r["method"] for r in records)),
                                                        meta.get("baseline"), sweep_rows(rows, meta))])
    path = out_dir / "summary.md"
    path.write_text(summary_markdown(records, meta), encoding="utf-8")
    return path
