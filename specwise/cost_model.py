"""Measured forward costs T(n) on disk, and the function an adaptive tuner reads from them.

`specwise bench cost` measures a model's seconds for one forward pass over n new
tokens at a few context lengths and saves the table under
`$SPECWISE_HOME/cost/<model>-<dtype>-<threads>t[-<runner>].json`. The engine's
adaptive block size starts from the target's table when one matches (same model,
dtype, thread count and runner) instead of probing block sizes first, and then
follows its own online measurements (specwise.adaptive).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specwise.estimators import MeasuredCost
from specwise.paths import cost_dir


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cost_path(model_name: str, dtype: torch.dtype | str, threads: int, runner: str = "hf") -> Path:
    """Where the cost table of a model at a dtype, thread count and runner lives."""
    safe = model_name.rstrip("/").replace("/", "_").replace("\\", "_")
    dtype = dtype if isinstance(dtype, str) else dtype_name(dtype)
    suffix = "" if runner == "hf" else f"-{runner}"  # hf tables keep their earlier names
    return cost_dir() / f"{safe}-{dtype}-{threads}t{suffix}.json"


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def cost_function(result: dict, context: int | None = None) -> MeasuredCost:
    """T(n) in seconds from a measured table, at the measured context closest to `context`
    (linear between the measured n, specwise.estimators.MeasuredCost)."""
    available = sorted(int(c) for c in result["seconds"])
    if not available:
        raise ValueError(f"the cost table of {result.get('model')} has no measured context")
    chosen = min(available, key=lambda c: abs(c - context)) if context is not None else available[0]
    return MeasuredCost([(int(n), s) for n, s in result["seconds"][str(chosen)].items()])


_TABLES: dict[Path, tuple[int, dict | None]] = {}  # path -> (mtime_ns, parsed table or None if damaged)


def _saved_table(path: Path) -> dict | None:
    """The parsed table at `path`, read again only when the file changed (one read per generate
    would otherwise cost a JSON parse on every request a server answers)."""
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return None
    cached = _TABLES.get(path)
    if cached is None or cached[0] != mtime:
        try:
            table = load(path)
        except (OSError, ValueError):
            table = None
        cached = _TABLES[path] = (mtime, table)
    return cached[1]


def _same_gguf_layout(table: dict) -> bool:
    """Whether a gguf table was measured with the weights laid out as they load now (stored, or interleaved for
    the same block types): another layout is another kernel, whose T(n) differs most for 2-5 rows. Tables
    that record no layout were measured as stored."""
    from specwise.kernels.gguf import interleaved_type_names

    kernels = (table.get("machine") or {}).get("kernels") or {}
    try:
        return sorted(kernels.get("gguf_interleaved", [])) == interleaved_type_names()
    except (RuntimeError, ValueError):  # no kernel here, or SPECWISE_INTERLEAVE unreadable: no prior
        return False


def cached_cost_function(model_name: str, dtype: torch.dtype | str, threads: int, runner: str,
                         context: int | None = None) -> MeasuredCost | None:
    """T(n) from the saved table of this model, dtype, thread count and runner; None if none was saved."""
    table = _saved_table(cost_path(model_name, dtype, threads, runner))
    if table is None or (table.get("dtype") == "gguf" and not _same_gguf_layout(table)):
        return None
    try:
        return cost_function(table, context)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # a damaged table is no prior: the online measurement still works
