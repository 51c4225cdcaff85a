"""GGUF files other tools keep on this machine, run as stored: `ollama:NAME[:TAG]`,
`lmstudio:NAME` and `hf:ORG/NAME[/FILE.gguf]`.

Each source has a module that reads its own layout (`ollama.py`, `lmstudio.py`, `hf_cache.py`):
`find(name)` gives the file or a one-line ModelError naming where it looked and the close names,
`listing()` gives every (name, file) it holds. Nothing is copied: the file is read where it is.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specwise.errors import ModelError
from specwise.store import hf_cache, lmstudio, ollama


@dataclass(frozen=True)
class Source:
    """One tool's store of GGUF files."""

    prefix: str  # what a model name starts with, before the ':'
    title: str
    form: str  # the name's form after the prefix, for help and errors
    find: Callable[[str], Path]
    listing: Callable[[], list[tuple[str, Path]]]
    folders: Callable[[], list[Path]]  # where it looks


SOURCES: dict[str, Source] = {source.prefix: source for source in (
    Source("ollama", "Ollama", "NAME[:TAG]", ollama.find, ollama.listing, lambda: [ollama.ollama_models_dir()]),
    Source("lmstudio", "LM Studio", "NAME", lmstudio.find, lmstudio.listing, lmstudio.lmstudio_models_dirs),
    Source("hf", "Hugging Face cache", "ORG/NAME[/FILE.gguf]", hf_cache.find, hf_cache.listing,
           lambda: [hf_cache.hf_hub_cache_dir()]),
)}
FORMS = ", ".join(f"{source.prefix}:{source.form}" for source in SOURCES.values())


@dataclass(frozen=True)
class FoundModel:
    """A GGUF file another tool keeps, and the name that runs it."""

    source: str  # a key of SOURCES
    name: str  # what follows "<source>:"
    path: Path  # the file (an Ollama blob, a snapshot's link into the hub cache's blobs)
    size: int  # bytes of the file itself, links followed

    @property
    def address(self) -> str:
        """The model name specwise takes: `ollama:smollm2:latest`."""
        return f"{self.source}:{self.name}"


def split_found_name(name_or_path: str | os.PathLike) -> tuple[Source, str] | None:
    """(its source, the name after the prefix) for a name such as `ollama:smollm2`; None for anything else."""
    prefix, colon, rest = os.fspath(name_or_path).partition(":")
    source = SOURCES.get(prefix)
    return (source, rest) if colon and source is not None else None


def is_found_name(name_or_path: str | os.PathLike) -> bool:
    """Whether a model name asks for a file another tool keeps (`ollama:`, `lmstudio:`, `hf:`)."""
    return split_found_name(name_or_path) is not None


def found_gguf(name: str | os.PathLike) -> Path:
    """The GGUF file a found name points to; ModelError, one line, naming what was looked for."""
    split = split_found_name(name)
    if split is None:
        raise ModelError(f"{os.fspath(name)!r} names no model another tool keeps ({FORMS})")
    source, rest = split
    if not rest.strip("/"):
        raise ModelError(f"{source.prefix}: needs a model name after it ({source.prefix}:{source.form})")
    return source.find(rest)


def found_models() -> list[FoundModel]:
    """Every GGUF file the sources hold, source by source."""
    return [FoundModel(source.prefix, name, path, path.stat().st_size)
            for source in SOURCES.values() for name, path in source.listing()]


def searched_folders() -> list[tuple[str, Path]]:
    """(source, folder) for every folder looked in, there or not."""
    return [(source.prefix, folder) for source in SOURCES.values() for folder in source.folders()]
