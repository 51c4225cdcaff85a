"""Benchmark questions: Spec-Bench's file format, its six tasks, selection and conversation turns.

A question is one JSON object a line: `{"question_id", "category", "turns": [...]}`.
Spec-Bench reports six tasks; its "multi-turn conversation" task is the eight
MT-bench categories together, and every other category is a task of its own
(so a file with other categories still works: each becomes its own task).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

MT_BENCH = "multi-turn conversation"
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
TASKS = (MT_BENCH, "translation", "summarization", "qa", "math_reasoning", "rag")
_TASK_ALIASES = {"mt-bench": MT_BENCH, "mtbench": MT_BENCH, "multi-turn": MT_BENCH, "conversation": MT_BENCH}

# Spec-Bench's 240-question split, package data (specwise/data/README.md); setuptools installs
# packages unpacked, so the resource is a file on disk.
DEFAULT_QUESTIONS = Path(str(resources.files("specwise") / "data" / "spec_bench_dev.jsonl"))


@dataclass(frozen=True)
class Question:
    question_id: int | str
    category: str
    turns: tuple[str, ...]

    @property
    def task(self) -> str:
        return task_of(self.category)


def task_of(category: str) -> str:
    """Spec-Bench's task for a category: MT-bench's eight categories are one task."""
    return MT_BENCH if category in MT_BENCH_CATEGORIES else category


def _key(name: str) -> str:
    return re.sub(r"[\s_-]+", "-", name.strip().lower())


def normalize_task(name: str) -> str:
    """A task name as the user may type it ("mt-bench", "math-reasoning", "QA") -> its canonical name."""
    key = _key(name)
    if key in _TASK_ALIASES:
        return _TASK_ALIASES[key]
    for task in TASKS:
        if _key(task) == key:
            return task
    return name.strip()


def load_questions(path: str | Path) -> list[Question]:
    """Read a Spec-Bench-format JSON-lines file; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"questions file {path} does not exist")
    questions = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                turns = item["turns"]
                if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
                    raise ValueError("'turns' must be a non-empty list of strings")
                questions.append(Question(item["question_id"], str(item["category"]), tuple(turns)))
            except (json.JSONDecodeError, KeyError, ValueError) as error:
                raise ValueError(f"{path}:{number}: not a Spec-Bench question ({error})") from None
    return questions


def _round_robin(groups: Sequence[Sequence[Question]], count: int) -> list[Question]:
    """Take one question from each group in turn until `count` are taken."""
    picked: list[Question] = []
    depth = 0
    while len(picked) < count and any(depth < len(g) for g in groups):
        for group in groups:
            if depth < len(group) and len(picked) < count:
                picked.append(group[depth])
        depth += 1
    return picked


def select_questions(questions: Iterable[Question], tasks: Sequence[str] | None = None,
                     categories: Sequence[str] | None = None,
                     per_task: int | None = None) -> list[Question]:
    """The questions to run, grouped by task in Spec-Bench's task order (others after, as met).

    per_task: at most this many per task, the first ones in file order; for a task
    made of several categories (MT-bench), spread over its categories in turn.
    """
    wanted_tasks = {normalize_task(t) for t in tasks} if tasks else None
    wanted_categories = set(categories) if categories else None
    by_task: dict[str, dict[str, list[Question]]] = {}
    for question in questions:
        if wanted_tasks is not None and question.task not in wanted_tasks:
            continue
        if wanted_categories is not None and question.category not in wanted_categories:
            continue
        by_task.setdefault(question.task, {}).setdefault(question.category, []).append(question)
    if wanted_tasks is not None:
        missing = wanted_tasks - set(by_task)
        if missing:
            raise ValueError(f"no questions for task(s) {', '.join(sorted(missing))}; "
                             f"tasks in Spec-Bench: {', '.join(TASKS)}")
    order = sorted(by_task, key=lambda t: TASKS.index(t) if t in TASKS else len(TASKS))
    selected: list[Question] = []
    for task in order:
        groups = list(by_task[task].values())
        limit = per_task if per_task is not None else sum(len(g) for g in groups)
        selected.extend(_round_robin(groups, limit))
    return selected


def conversation(question: Question, turn: int, answers: Sequence[str], chat: bool) -> list[dict] | str:
    """The prompt for `turn` (0-based), after the model's own earlier answers.

    With a chat template: alternating user / assistant messages ending with the
    user's turn. Without: the turns and answers as plain text, a blank line apart.
    """
    if len(answers) < turn:
        raise ValueError(f"turn {turn + 1} needs the answers to the {turn} turn(s) before it")
    if chat:
        messages: list[dict] = []
        for i in range(turn):
            messages += [{"role": "user", "content": question.turns[i]},
                         {"role": "assistant", "content": answers[i]}]
        return messages + [{"role": "user", "content": question.turns[turn]}]
    parts: list[str] = []
    for i in range(turn):
        parts += [question.turns[i], answers[i]]
    return "\n\n".join(parts + [question.turns[turn]])
