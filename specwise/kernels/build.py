"""Compile one of specwise's C++ kernels once per machine into `$SPECWISE_HOME/kernels/`."""

from __future__ import annotations

import fcntl
import hashlib
import logging
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger("specwise")


def build_kernel(source: Path, what: str, cflags: list[str], extra_sources: tuple[Path, ...] = ()) -> ModuleType:
    """The compiled module of `source` (and `extra_sources`), built on first use and kept per source text
    (headers beside it included), source folder, PyTorch version and flags."""
    from torch.utils.cpp_extension import load

    from specwise.paths import kernels_dir

    sources = [source, *extra_sources]
    headers = sorted(source.parent.glob("*.h"))
    text = b"".join(path.read_bytes() for path in [*sources, *headers])
    # The folder too: PyTorch's build file records the sources' paths, so two checkouts of one text sharing a
    # build would each find it stale and rebuild it in turn.
    origin = str(source.parent.resolve()).encode()
    # The flags too: a cache shared by machines of two CPU vendors holds a build for each.
    digest = hashlib.sha256(text + origin + torch.__version__.encode() + " ".join(cflags).encode()).hexdigest()[:12]
    build_dir = kernels_dir() / f"{source.stem}-{digest}"
    build_dir.mkdir(parents=True, exist_ok=True)
    # PyTorch's own build lock is a file that a build killed midway (Ctrl-C, a killed server) leaves behind,
    # and every later load then waits for it forever. So builds take this lock first, which the system
    # releases with its process: whoever holds it knows that any PyTorch lock file left there is stale.
    with open(build_dir / "specwise.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        (build_dir / "lock").unlink(missing_ok=True)
        if not any(build_dir.glob("*.so")):
            log.warning("specwise: compiling the %s into %s (once, about a minute)", what, build_dir)
        return load(name=f"specwise_{source.stem}_{digest}", sources=[str(path) for path in sources],
                    build_directory=str(build_dir), extra_cflags=cflags, extra_ldflags=["-fopenmp"], verbose=False)
