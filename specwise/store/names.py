"""Matching the names of models other tools keep: close names for an error message, and which
GGUF files are not language models."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path


def is_projector(path: Path) -> bool:
    """A vision model's image projector (`mmproj-*.gguf`), stored beside the language model."""
    return path.name.lower().startswith("mmproj")


def _likeness(wanted: str, name: str) -> float:
    """How alike two names are (0 to 1), whole or by the last part of a path (`org/repo/file.gguf`)."""
    folded = name.casefold()
    tail = folded.rpartition("/")[2].removesuffix(".gguf")
    return max(difflib.SequenceMatcher(None, wanted, folded).ratio(),
               difflib.SequenceMatcher(None, wanted, tail).ratio())


def close_names(wanted: str, names: Iterable[str], *, limit: int = 5) -> list[str]:
    """Up to `limit` of `names` nearest to `wanted` (case ignored), nearest first."""
    folded = wanted.casefold().removesuffix(".gguf")
    scored = sorted(((_likeness(folded, name), name) for name in set(names)), key=lambda item: (-item[0], item[1]))
    # A name that contains what was asked for ("qwen" in "qwen2.5-coder:1.5b") is close too.
    return [name for score, name in scored if score >= 0.6 or folded in name.casefold()][:limit]


def suggestion(wanted: str, names: Iterable[str], *, prefix: str = "", limit: int = 5) -> str:
    """'; close names: a, b' (or '; it holds: a, b, ...' when none is close), each written after
    `prefix`; '' when there are no names."""
    names = sorted(set(names))
    if not names:
        return ""
    close = close_names(wanted, names, limit=limit)
    if close:
        return "; close names: " + ", ".join(prefix + name for name in close)
    shown = ", ".join(prefix + name for name in names[:limit])
    return f"; it holds: {shown}" + (f" and {len(names) - limit} more" if len(names) > limit else "")
