"""Which earlier requests a generation may draft from: its sharing scope.

Drafters that remember earlier requests (the suffix drafter) keep that memory per
scope and read only the current generation's own. The scope is ambient, like a
logging context, because it belongs to the caller (a server knows its tenants, a
benchmark its methods) and not to the drafter protocol: whoever runs a generation
sets it around the run with `sharing_scope`, in the thread that runs it.

A scope is a tuple of names; `sharing_scope` nests (a name is added to the scope
around it). The default, (), is one scope for everything: a library user's
generations share what they learn. `sharing_scope(None)` isolates a generation: it
neither reads nor adds to any shared memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

Scope = tuple[str, ...] | None

_SCOPE: ContextVar[Scope] = ContextVar("specwise_sharing_scope", default=())


def current_scope() -> Scope:
    """The scope generations started now belong to (None: share nothing)."""
    return _SCOPE.get()


@contextmanager
def sharing_scope(name: str | None) -> Iterator[Scope]:
    """Run the enclosed generations in the scope `name` inside the current one; None: share nothing."""
    outer = _SCOPE.get()
    with in_scope(None if name is None or outer is None else outer + (str(name),)) as scope:
        yield scope


@contextmanager
def in_scope(scope: Scope) -> Iterator[Scope]:
    """Run the enclosed generations in exactly this scope (a server sets its tenant's)."""
    if scope is not None and not (isinstance(scope, tuple) and all(isinstance(n, str) for n in scope)):
        raise TypeError(f"a sharing scope is a tuple of strings or None; got {scope!r}")
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)
