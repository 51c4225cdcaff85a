"""What preparing a model prints while it works: a line per stage and a byte bar, both on stderr."""

from __future__ import annotations

import sys
from typing import Any


def progress_bar(total: int, desc: str, enabled: bool) -> Any:
    """A tqdm bar counting bytes (a context manager with `update(n)`); silent when not `enabled`."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                disable=not enabled, leave=False, file=sys.stderr)


def stage(message: str, enabled: bool) -> None:
    """One line saying which stage starts, when progress is on."""
    if enabled:
        print(f"specwise: {message}", file=sys.stderr, flush=True)
