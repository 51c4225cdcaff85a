"""A decoder's drafters, by configuration key, with a bound on the idle ones.

A drafter holds one generation's state, so a generation borrows one for itself
(`borrowed`) and gives it back for the next generation of the same key; the
one-at-a-time path (`shared`) keeps one per key and uses it under the decoder's
lock. Every distinct key makes a drafter, and a server's clients choose keys, so
the pool keeps at most `idle_limit` drafters that nobody is using, dropping the
least recently used first; a drafter in use is never dropped. What drafters
share (the suffix drafter's store of earlier requests) lives beside the pool,
not in the drafters, so dropping one loses nothing but its own state.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager

from specwise.drafters.base import Drafter

DEFAULT_IDLE_DRAFTERS = 16


class DrafterPool:
    """Drafters made by `make(key)`, at most `idle_limit` of them idle at a time."""

    def __init__(self, idle_limit: int = DEFAULT_IDLE_DRAFTERS) -> None:
        if not isinstance(idle_limit, int) or idle_limit < 1:
            raise ValueError(f"idle_limit must be an integer >= 1; got {idle_limit!r}")
        self.idle_limit = idle_limit
        # (key, serial) -> drafter, least recently used first; the shared ones under (key, "shared").
        self._idle: OrderedDict[tuple[Hashable, object], Drafter] = OrderedDict()
        self._lent: dict[int, Drafter] = {}  # by id(): borrowed and not given back yet
        self._serial = 0
        self._lock = threading.Lock()

    def shared(self, key: Hashable, make: Callable[[], Drafter]) -> Drafter:
        """The one drafter of this key that callers use in turn (the one-at-a-time path)."""
        with self._lock:
            drafter = self._idle.get((key, "shared"))
            if drafter is not None:
                self._idle.move_to_end((key, "shared"))
                return drafter
        drafter = make()  # outside the lock: making a drafter may load a model
        with self._lock:
            drafter = self._idle.setdefault((key, "shared"), drafter)
            self._trim()
            return drafter

    @contextmanager
    def borrowed(self, key: Hashable, make: Callable[[], Drafter]) -> Iterator[Drafter]:
        """A drafter of this key for one generation alone, given back (idle) afterwards."""
        with self._lock:
            slot = next((s for s in reversed(self._idle) if s[0] == key and s[1] != "shared"), None)
            drafter = self._idle.pop(slot) if slot is not None else None
        if drafter is None:
            drafter = make()
        with self._lock:
            self._lent[id(drafter)] = drafter
        try:
            yield drafter
        finally:
            with self._lock:
                del self._lent[id(drafter)]
                self._serial += 1
                self._idle[(key, self._serial)] = drafter
                self._trim()

    def drafters(self) -> list[Drafter]:
        """Every drafter the pool holds now: idle ones and those lent out."""
        with self._lock:
            return list(self._idle.values()) + list(self._lent.values())

    @property
    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def _trim(self) -> None:
        while len(self._idle) > self.idle_limit:
            self._idle.popitem(last=False)
