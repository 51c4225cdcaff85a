"""GGUF files Ollama keeps: a model name, through its manifest, to the model blob.

Ollama's store (`$OLLAMA_MODELS`, else `~/.ollama/models`) is content-addressed, like an OCI
registry: `manifests/<registry>/<namespace>/<name>/<tag>` is a JSON manifest whose layers
name blobs by digest, and the layer of media type `application/vnd.ollama.image.model` is the
GGUF file, kept as `blobs/sha256-<hex>`. A name is `[[registry/]namespace/]name[:tag]`:
registry `registry.ollama.ai`, namespace `library` and tag `latest` by default, as `ollama`
itself reads it. The blob is read as stored; Ollama's own template layer is not used (the chat
template comes from the GGUF file, as for any other file).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from specwise.errors import ModelError
from specwise.store.names import suggestion

DEFAULT_REGISTRY = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"

# Ollama's characters for a name part; a namespace has no dots. ".." is refused separately, so
# that no name reaches outside the manifests folder.
_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_NAMESPACE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
FORM = "[[registry/]namespace/]name[:tag]"


def ollama_models_dir() -> Path:
    """Ollama's models folder: `$OLLAMA_MODELS`, else `~/.ollama/models`."""
    configured = os.environ.get("OLLAMA_MODELS")
    return Path(configured).expanduser() if configured else Path.home() / ".ollama" / "models"


@dataclass(frozen=True)
class OllamaName:
    """A model name as Ollama reads it, every part filled in."""

    registry: str
    namespace: str
    model: str
    tag: str

    @classmethod
    def parse(cls, text: str) -> OllamaName:
        """`name`, `name:tag`, `namespace/name[:tag]` or `registry/namespace/name[:tag]`."""
        path, _, tag = text.partition(":")
        parts = path.split("/")
        if len(parts) > 3 or ":" in tag:
            raise ModelError(f"ollama:{text}: not an Ollama model name ({FORM})")
        registry, namespace = DEFAULT_REGISTRY, DEFAULT_NAMESPACE
        if len(parts) == 3:
            registry, namespace, model = parts
        elif len(parts) == 2:
            namespace, model = parts
        else:
            (model,) = parts
        name = cls(registry, namespace, model, tag or DEFAULT_TAG)
        checks = ((name.registry, _PART), (name.namespace, _NAMESPACE), (name.model, _PART), (name.tag, _PART))
        if not all(pattern.fullmatch(part) and ".." not in part for part, pattern in checks):
            raise ModelError(f"ollama:{text}: not an Ollama model name ({FORM}; letters, digits, '_', '-' "
                             "and '.')")
        return name

    def manifest(self, root: Path) -> Path:
        return root / "manifests" / self.registry / self.namespace / self.model / self.tag

    @property
    def short(self) -> str:
        """The shortest name that reads back as this one, with its tag: `smollm2:latest`, `user/m:q4`."""
        if self.registry != DEFAULT_REGISTRY:
            return f"{self.registry}/{self.namespace}/{self.model}:{self.tag}"
        if self.namespace != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"


def manifest_names(root: Path) -> list[OllamaName]:
    """Every model the store has a manifest for (`manifests/<registry>/<namespace>/<name>/<tag>`)."""
    manifests = root / "manifests"
    names = []
    for path in sorted(manifests.glob("*/*/*/*")) if manifests.is_dir() else ():
        if path.is_file() and not path.name.startswith("."):
            registry, namespace, model, tag = path.relative_to(manifests).parts
            names.append(OllamaName(registry, namespace, model, tag))
    return names


def _find_manifest(root: Path, name: OllamaName, asked: str) -> Path:
    path = name.manifest(root)
    if path.is_file():
        return path
    known = manifest_names(root)
    # Ollama matches names without regard to case; a file system that does not is matched here.
    same = [other for other in known if other.short.casefold() == name.short.casefold()]
    if same:
        return same[0].manifest(root)
    if not known:
        where = (f"Ollama's models folder {root} holds no manifests" if root.is_dir() else
                 f"there is no Ollama models folder at {root}")
        raise ModelError(f"ollama:{asked}: no manifest at {path}; {where} (set OLLAMA_MODELS to the folder "
                         "`ollama pull` writes to; a Linux service keeps it in /usr/share/ollama/.ollama/models)")
    raise ModelError(f"ollama:{asked}: no manifest at {path}"
                     + suggestion(name.short, [other.short for other in known], prefix="ollama:"))


def model_blob(root: Path, name: OllamaName, asked: str | None = None) -> Path:
    """The GGUF blob the manifest of `name` points to; ModelError, one line, when the manifest is
    missing or damaged or its blob is gone."""
    asked = asked or name.short
    manifest = _find_manifest(root, name, asked)
    again = f"pull it again with `ollama pull {name.short}`"
    try:
        content = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ModelError(f"ollama:{asked}: the manifest {manifest} is not a JSON manifest ({reason}); {again}") \
            from None
    if not isinstance(content, dict):
        raise ModelError(f"ollama:{asked}: the manifest {manifest} is not a JSON manifest (a JSON "
                         f"{type(content).__name__}, not an object); {again}")
    layers = content.get("layers")
    models = [layer for layer in layers if isinstance(layer, dict) and layer.get("mediaType") == MODEL_MEDIA_TYPE] \
        if isinstance(layers, list) else []
    if not models:
        raise ModelError(f"ollama:{asked}: the manifest {manifest} has no layer of type {MODEL_MEDIA_TYPE}; {again}")
    digest = _DIGEST.fullmatch(str(models[0].get("digest", "")))
    if digest is None:
        raise ModelError(f"ollama:{asked}: the manifest {manifest} gives the model layer the digest "
                         f"{models[0].get('digest')!r}, not sha256:<64 hex digits>; {again}")
    blob = root / "blobs" / f"sha256-{digest.group(1)}"
    if not blob.is_file():
        raise ModelError(f"ollama:{asked}: the model blob {blob} named by the manifest {manifest} is missing; {again}")
    return blob


def find(text: str) -> Path:
    """The GGUF file of the Ollama model `text` (what follows `ollama:`)."""
    return model_blob(ollama_models_dir(), OllamaName.parse(text), text)


def listing() -> list[tuple[str, Path]]:
    """(name, blob) for every Ollama model whose manifest names a blob that is there."""
    root = ollama_models_dir()
    found = []
    for name in manifest_names(root):
        try:
            found.append((name.short, model_blob(root, name)))
        except ModelError:  # a damaged or half-pulled model: named when asked for, not listed
            continue
    return found
