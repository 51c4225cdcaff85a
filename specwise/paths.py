"""Where specwise keeps what it makes on disk: one cache home, a folder per kind under it.

`specwise_home()`: `$SPECWISE_HOME`, else `$XDG_CACHE_HOME/specwise`, else `~/.cache/specwise`.
Under it: `models/<name>/` (dense bfloat16 copies; `models/gguf-<sha256[:16]>/` from a local
.gguf file), `gguf/` (assembled GGUF files), `tokenizers/<key>/` (tokenizers built from GGUF
metadata), `heads/<target name>/` (trained EAGLE heads), `cost/` (measured cost tables) and
`kernels/` (compiled CPU kernels).
"""

from __future__ import annotations

import os
from pathlib import Path


def specwise_home() -> Path:
    """`$SPECWISE_HOME`, else `$XDG_CACHE_HOME/specwise`, else `~/.cache/specwise`."""
    home = os.environ.get("SPECWISE_HOME")
    if home:
        return Path(home).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache).expanduser() if cache else Path.home() / ".cache") / "specwise"


def models_dir() -> Path:
    """Dense (bfloat16) copies of models, one directory each."""
    return specwise_home() / "models"


def prepared_path(name: str) -> Path:
    """Where the model called `name` is (or would be) prepared."""
    return models_dir() / name


def gguf_dir() -> Path:
    """Assembled GGUF files."""
    return specwise_home() / "gguf"


def tokenizers_dir() -> Path:
    """Tokenizers built from GGUF files' metadata, one directory per file header."""
    return specwise_home() / "tokenizers"


def heads_dir() -> Path:
    """Trained EAGLE heads, one directory per target."""
    return specwise_home() / "heads"


def cost_dir() -> Path:
    """Measured cost tables of targets."""
    return specwise_home() / "cost"


def kernels_dir() -> Path:
    """Compiled CPU kernels."""
    return specwise_home() / "kernels"


def disk_usage(path: Path) -> int:
    """Bytes of a file, or of every file under a directory; 0 if absent."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0
