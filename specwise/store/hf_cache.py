"""GGUF files in the Hugging Face hub cache: `models--<org>--<name>/snapshots/<revision>/<file>.gguf`.

The cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`,
else `~/.cache/huggingface/hub` (where `huggingface_hub` downloads). huggingface_hub's own
scan reads the layout; a snapshot's files are links into `blobs/`, which the file readers
follow. Of a repository's revisions the one `main` points to is used (else the newest). A
model is named `org/name/file.gguf`, or `org/name` when that revision holds one model file.
"""

from __future__ import annotations

import os
from pathlib import Path

from specwise.errors import ModelError
from specwise.store.names import is_projector, suggestion


def hf_hub_cache_dir() -> Path:
    """The hub cache folder, read from the environment as huggingface_hub reads it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache).expanduser() if cache else Path.home() / ".cache") / "huggingface" / "hub"


def listing() -> list[tuple[str, Path]]:
    """(`org/name/file.gguf`, the file in its snapshot) for every GGUF file of every cached model."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    root = hf_hub_cache_dir()
    try:
        cache = scan_cache_dir(root)
    except CacheNotFound:
        return []
    found = []
    for repo in sorted(cache.repos, key=lambda repo: repo.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revision = max(repo.revisions, key=lambda rev: ("main" in rev.refs, bool(rev.refs), rev.last_modified))
        for file in sorted(revision.files, key=lambda file: file.file_path):
            if file.file_name.lower().endswith(".gguf"):
                relative = file.file_path.relative_to(revision.snapshot_path).as_posix()
                found.append((f"{repo.repo_id}/{relative}", file.file_path))
    return found


def find(text: str) -> Path:
    """The GGUF file of the cached model `text` (what follows `hf:`)."""
    wanted = text.strip("/")
    files = listing()
    exact = [path for name, path in files if name == wanted] or \
        [path for name, path in files if name.casefold() == wanted.casefold()]
    if exact:
        return exact[0]
    in_repo = [(name, path) for name, path in files
               if name.casefold().startswith(wanted.casefold() + "/") and not is_projector(path)]
    if len(in_repo) == 1:
        return in_repo[0][1]
    if in_repo:
        raise ModelError(f"hf:{text} holds {len(in_repo)} GGUF files; give one of: "
                         + ", ".join(f"hf:{name}" for name, _ in in_repo))
    root = hf_hub_cache_dir()
    if not files:
        raise ModelError(f"hf:{text}: no GGUF file in the Hugging Face cache {root} (models--ORG--NAME/snapshots/); "
                         "set HF_HUB_CACHE or HF_HOME to where the files were downloaded")
    repo = "--".join(("models", *wanted.split("/")[:2]))
    raise ModelError(f"hf:{text}: not in the Hugging Face cache (looked for {root / repo})"
                     + suggestion(wanted, [name for name, _ in files], prefix="hf:"))
