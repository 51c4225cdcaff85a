"""Pick the configuration to export from `specwise bench run` output: the best measured speedup.

Speedups are the bench report's own (`specwise.bench.report.aggregate`): pooled (all tokens
over all seconds) or the task mean (geometric mean of the per-task speedups, which weighs
every task alike). Each method's settings come back from run.json, whose description of a
specwise method lists every setting that mattered for it (`describe`), so the command line
that the run was started with is not needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specwise.config import SpecConfig, spec_settings
from specwise.export.model import ExportError, Subject

POOLED = "pooled"
TASK_MEAN = "task-mean"
RANKINGS = (POOLED, TASK_MEAN)


@dataclass(frozen=True)
class Candidate:
    """One specwise method of a run, with its measured speedups."""

    label: str
    spec: SpecConfig
    model: str | None
    pooled: float | None
    task_mean: float | None
    mean_k: float | None


def spec_from_description(description: str) -> tuple[SpecConfig, str | None]:
    """'specwise, model M: drafter=ngram, k=4, ...' (run.json's method description) -> (SpecConfig, M)."""
    head, sep, body = description.partition(": ")
    if not sep or not head.startswith("specwise"):
        raise ExportError(f"not a specwise method description: {description!r}")
    model = head.split(", model ", 1)[1].strip() if ", model " in head else None
    infos = {info.name: info for info in spec_settings()}
    values: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in body.split(", "))):
        name, _, text = item.partition("=")
        if name not in infos:
            raise ExportError(f"unknown setting {name!r} in the method description {description!r}")
        info = infos[name]
        if info.type == tuple[int, ...] and text == "dynamic":
            values[name] = ()
        elif text == "None":
            values[name] = None
        else:
            values[name] = info.parse(text)
    return SpecConfig(**values), model


def _mean_k(records: Sequence[dict]) -> float | None:
    """Draft tokens per step that drafted: an adaptive configuration's k as an engine would fix it."""
    proposed = sum(r.get("proposed") or 0 for r in records)
    drafting = sum((r.get("proposed_at") or [0])[0] for r in records)
    return proposed / drafting if drafting else None


def load_runs(directories: Sequence[Path]) -> tuple[list[dict], dict]:
    """Records and one run description over one or several `specwise bench run` folders."""
    from specwise.bench.report import read_meta, read_records

    records, metas = [], []
    for directory in map(Path, directories):
        if not (directory / "records.jsonl").is_file():
            raise ExportError(f"{directory} has no records.jsonl; give a folder written by `specwise bench run`")
        meta_path = directory / "run.json"
        if not meta_path.is_file():
            raise ExportError(f"{directory} has no run.json, which holds each method's settings")
        metas.append(read_meta(meta_path))
        records += read_records(directory / "records.jsonl")
    if len(metas) == 1:
        return records, metas[0]
    from specwise.bench.cli import merge_meta  # the bench's own merge: it refuses mixed baselines

    return records, merge_meta(metas, [Path(d) for d in directories])


def candidates(records: Sequence[dict], meta: dict) -> list[Candidate]:
    """Every specwise method that drafts (plain decoding has nothing to export), with its speedups."""
    from specwise.bench.report import OVERALL, aggregate, task_mean_speedup, task_order

    baseline = meta.get("baseline")
    rows = aggregate(records, baseline)
    tasks = task_order(records)
    out = []
    for method in meta.get("methods", []):
        label = method["label"]
        if method.get("family") != "specwise" or (OVERALL, label) not in rows:
            continue
        spec, model = spec_from_description(method.get("description", ""))
        if spec.drafter == "none":
            continue
        if spec.drafter == "draft-model" and model is None:
            model = meta.get("drafter_model")
        mine = [r for r in records if r["method"] == label]
        out.append(Candidate(label, spec, model, rows[OVERALL, label].speedup,
                             task_mean_speedup(rows, tasks, label) if len(tasks) > 1 else None, _mean_k(mine)))
    return out


def best_from_bench(directories: Sequence[Path], ranking: str | None = None) -> Subject:
    """The specwise method with the best measured speedup over the runs in `directories`.

    ranking: "pooled" or "task-mean"; None chooses the task mean when the runs hold several
    tasks and every method has one, else the pooled speedup.
    """
    if ranking is not None and ranking not in RANKINGS:
        raise ExportError(f"--rank must be one of {', '.join(RANKINGS)}; got {ranking!r}")
    records, meta = load_runs(directories)
    found = candidates(records, meta)
    where = ", ".join(map(str, directories))
    if not found:
        raise ExportError(f"no specwise method that drafts in {where}: nothing to export (the bench's "
                          "specwise methods are its `--method specwise:...` configurations)")
    if ranking is None:
        ranking = TASK_MEAN if all(c.task_mean is not None for c in found) else POOLED
    key = (lambda c: c.task_mean) if ranking == TASK_MEAN else (lambda c: c.pooled)
    measured = [c for c in found if key(c) is not None]
    if not measured:
        raise ExportError(f"no {ranking} speedup in {where}: the runs need a baseline (hf-generate) "
                          + ("and every method on every task" if ranking == TASK_MEAN else ""))
    best = max(measured, key=key)
    words = "task mean (geometric mean of the per-task speedups)" if ranking == TASK_MEAN else \
        "pooled speedup (all tokens over all seconds)"
    origin = (f"{where}: {best.label}, the best {words} of {len(measured)} specwise method(s): "
              f"{key(best):.3f}x vs {meta.get('baseline')}")
    return Subject(spec=best.spec, target=meta.get("target"),
                   draft_model=best.model if best.spec.drafter == "draft-model" else None, origin=origin,
                   label=best.label, mean_k=best.mean_k, speedup=key(best), ranked_by=ranking)
