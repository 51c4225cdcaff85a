"""Continue an interrupted `specwise bench run` in the same directory (`--resume`).

A run on this CPU takes hours; a stopped one keeps every finished question. A
question counts as finished when every method has a record for every turn;
the records of a half-done question are dropped and the question is run again
(its later turns depend on each method's own earlier answers). The resumed
run must measure the same thing: the settings below must equal the earlier
run's, or resuming is refused with the keys that differ.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from specwise.bench.prompts import Question

# run.json keys that define what a run measures; the machine and timestamps may differ.
SAME_KEYS = ("target", "drafter_model", "questions_file", "per_task", "tasks", "chat", "sampling",
             "warmup_tokens", "baseline", "tie_ulps", "methods", "sweep")


def check_same_run(earlier: dict, now: dict) -> None:
    """Raise ValueError naming every setting in which `now` differs from the `earlier` run."""
    from specwise.bench.provenance import portable

    # run.json holds its paths relative to the repository or $SPECWISE_HOME: compare in that form.
    earlier, now = portable(earlier), portable(now)
    differ = [key for key in SAME_KEYS if _plain(earlier.get(key)) != _plain(now.get(key))]
    if differ:
        details = "; ".join(f"{key}: was {earlier.get(key)!r}, now {now.get(key)!r}" for key in differ)
        raise ValueError(f"cannot resume: the run in this directory measured something else ({details}); "
                         "give the same options as the earlier run, or a new --out")


def _plain(value):
    """JSON round trip equivalence: tuples and lists compare alike."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def finished_questions(records: Sequence[dict], questions: Sequence[Question], labels: Sequence[str],
                       redo_contended: bool = False) -> tuple[list[dict], set[int]]:
    """(records of finished questions, their ids): every method has every turn of the question.

    redo_contended: a question with any timing taken while other processes used the CPU
    counts as unfinished, so that the whole question is measured again side by side.
    """
    from specwise.bench.machine import contended

    turns = {q.question_id: len(q.turns) for q in questions}
    seen: dict[int, set[tuple[str, int]]] = {}
    spoiled: set[int] = set()
    for record in records:
        seen.setdefault(record["question_id"], set()).add((record["method"], record["turn"]))
        if redo_contended and contended(record):
            spoiled.add(record["question_id"])
    done = {qid for qid, pairs in seen.items()
            if qid in turns and qid not in spoiled
            and pairs >= {(label, t + 1) for label in labels for t in range(turns[qid])}}
    kept = [r for r in records if r["question_id"] in done]
    return kept, done


def read_partial_records(path: Path) -> list[dict]:
    """The records of a run that may have been killed mid-line: a torn last line is dropped."""
    if not Path(path).is_file():
        return []
    records = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break  # written when the run was stopped
            raise ValueError(f"{path}:{number} is not a JSON record; the file was edited or damaged") from None
    return records
