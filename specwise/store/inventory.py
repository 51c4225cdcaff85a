"""What specwise keeps in its cache home, item by item with sizes: for `specwise models list`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specwise.paths import cost_dir, disk_usage, gguf_dir, heads_dir, kernels_dir, models_dir, tokenizers_dir


@dataclass(frozen=True)
class CachedItem:
    kind: str  # "gguf", "dense", "tokenizer", "kernel", "cost", "head"
    name: str
    path: Path
    size: int  # bytes on disk
    source: str | None = None  # the file a dense copy or a tokenizer was made from, where recorded


def _source(marker: Path, *keys: str) -> str | None:
    try:
        value = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, str) else None


def cached_items() -> list[CachedItem]:
    """Everything in the cache home, by kind; partial (dot-named) directories left out."""
    from specwise.gguf.tokenizer import MARKER as TOKENIZER_MARKER
    from specwise.store.dense import MARKER as DENSE_MARKER

    kinds = (("gguf", gguf_dir(), None), ("dense", models_dir(), (DENSE_MARKER, "source", "path")),
             ("tokenizer", tokenizers_dir(), (TOKENIZER_MARKER, "source")), ("kernel", kernels_dir(), None),
             ("cost", cost_dir(), None), ("head", heads_dir(), None))
    items = []
    for kind, directory, marker in kinds:
        for path in sorted(directory.iterdir()) if directory.is_dir() else ():
            if path.name.startswith(".") or (kind == "gguf" and path.suffix != ".gguf"):
                continue
            source = _source(path / marker[0], *marker[1:]) if marker and path.is_dir() else None
            items.append(CachedItem(kind, path.name, path, disk_usage(path), source))
    return items
