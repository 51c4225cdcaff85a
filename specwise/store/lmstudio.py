"""GGUF files LM Studio keeps: `<models>/<publisher>/<repository>/<file>.gguf`.

The models folder is `$LMSTUDIO_MODELS`, else `~/.lmstudio/models` and the older
`~/.cache/lm-studio/models`. A model is named by its path under the folder
(`publisher/repository/file.gguf`), by `publisher/repository` when that holds one model
file, or by its file name (with or without `.gguf`) when no other file has it.
"""

from __future__ import annotations

import os
from pathlib import Path

from specwise.errors import ModelError
from specwise.store.names import is_projector, suggestion


def lmstudio_models_dirs() -> list[Path]:
    """Where LM Studio's models may be: `$LMSTUDIO_MODELS` alone when set, else both default folders."""
    configured = os.environ.get("LMSTUDIO_MODELS")
    if configured:
        return [Path(configured).expanduser()]
    home = Path.home()
    return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def listing() -> list[tuple[str, Path]]:
    """(name, path) for every GGUF file in LM Studio's folders; a name found twice keeps its first."""
    found: dict[str, Path] = {}
    for root in lmstudio_models_dirs():
        for path in sorted(root.rglob("*.gguf")) if root.is_dir() else ():
            relative = path.relative_to(root)
            if path.is_file() and not any(part.startswith(".") for part in relative.parts):
                found.setdefault(relative.as_posix(), path)
    return list(found.items())


def _matches(text: str, files: list[tuple[str, Path]]) -> list[tuple[str, Path]]:
    wanted = text.strip("/").casefold()
    whole = [(name, path) for name, path in files if name.casefold() in (wanted, f"{wanted}.gguf")]
    if whole:
        return whole
    models = [(name, path) for name, path in files if not is_projector(path)]
    for rule in (
        lambda name: name.casefold().rpartition("/")[0] == wanted,  # publisher/repository
        lambda name: name.casefold().rpartition("/")[2] in (wanted, f"{wanted}.gguf"),  # the file name
    ):
        matches = [(name, path) for name, path in models if rule(name)]
        if matches:
            return matches
    return []


def find(text: str) -> Path:
    """The GGUF file of the LM Studio model `text` (what follows `lmstudio:`)."""
    files = listing()
    matches = _matches(text, files)
    if len(matches) == 1:
        return matches[0][1]
    if matches:
        raise ModelError(f"lmstudio:{text} names {len(matches)} files; give one of: "
                         + ", ".join(f"lmstudio:{name}" for name, _ in matches))
    folders = " or ".join(str(root) for root in lmstudio_models_dirs())
    if not files:
        raise ModelError(f"lmstudio:{text}: no GGUF file in LM Studio's models folder ({folders}); set "
                         "LMSTUDIO_MODELS to the folder LM Studio downloads into")
    raise ModelError(f"lmstudio:{text}: no such model in {folders}"
                     + suggestion(text, [name for name, _ in files], prefix="lmstudio:"))
