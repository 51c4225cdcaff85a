"""Where each known model stands: its packages installed or not, its GGUF file and dense copy in the cache."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specwise.paths import disk_usage, gguf_dir, prepared_path
from specwise.store.catalog import KNOWN_MODELS
from specwise.store.dense import is_ready
from specwise.store.packages import installed_version, same_version


@dataclass(frozen=True)
class PartStatus:
    distribution: str
    pinned: str
    installed: str | None  # None: not installed

    @property
    def ok(self) -> bool:
        return self.installed is not None and same_version(self.installed, self.pinned)


@dataclass(frozen=True)
class ModelStatus:
    name: str
    role: str
    description: str
    parts: tuple[PartStatus, ...]
    prepared: bool
    path: Path  # the prepared directory (may not exist)
    size_on_disk: int  # bytes under `path`, 0 if absent
    gguf_path: Path | None  # an assembled GGUF kept in the cache
    gguf_size: int

    @property
    def installed(self) -> bool:
        return all(part.ok for part in self.parts)

    @property
    def installed_summary(self) -> str:
        """'yes (0.2.0)', 'no (3/22 missing)' or 'no (wrong version)'."""
        if self.installed:
            versions = sorted({part.installed for part in self.parts if part.installed})
            return f"yes ({', '.join(versions)})"
        missing = sum(part.installed is None for part in self.parts)
        if missing:
            return f"no ({missing}/{len(self.parts)} missing)"
        return "no (wrong version)"


def model_status() -> list[ModelStatus]:
    """For each known model: its packages, whether it is prepared, where, and how big."""
    statuses = []
    for model in KNOWN_MODELS.values():
        target = prepared_path(model.name)
        gguf_path = gguf_dir() / model.gguf_name
        statuses.append(ModelStatus(
            name=model.name,
            role=model.role,
            description=model.description,
            parts=tuple(PartStatus(p.distribution, p.version, installed_version(p.distribution)) for p in model.parts),
            prepared=is_ready(target, model.sha256),
            path=target,
            size_on_disk=disk_usage(target),
            gguf_path=gguf_path if gguf_path.is_file() else None,
            gguf_size=disk_usage(gguf_path),
        ))
    return statuses
