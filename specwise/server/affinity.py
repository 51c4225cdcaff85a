"""Which replica a request belongs to, so that its tenant's or its conversation's caches stay warm.

The key (`affinity_key`): the tenant, a hash of the bearer token shown together with the `user`
field; else the `user` field; else the conversation, a hash of its opening (the messages up to
and including the first user message, which every later turn repeats, or a completion prompt's
first characters). A key is a hash: no token or text is kept.

The home (`rendezvous_order`): rendezvous (highest random weight) hashing over the replicas'
ids. Each key has one home replica; a replica that joins or leaves moves only the keys whose
home it becomes or was, where hashing modulo the number of replicas would move nearly all of
them and cool every cache at once.

No ray import here: the ingress, the request router and the tests share these pure functions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

OPENING_CHARS = 512  # of a completion prompt: what a continued text repeats
OPENING_TOKENS = 128  # of a prompt given as token ids


def affinity_key(authorization: str | None, body: bytes) -> str | None:
    """The routing key of a generation request (None: no key; any replica will do)."""
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None  # a replica answers it with a 400 naming the problem
    if not isinstance(request, dict):
        return None
    user = request.get("user") if isinstance(request.get("user"), str) else ""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else ""
    if token:
        return _digest("tenant", token, user)
    if user:
        return _digest("user", user)
    opening = _opening(request)
    return None if opening is None else _digest("conversation", opening)


def _opening(request: dict[str, Any]) -> str | None:
    """What every turn of the request's conversation starts with, as text (None: nothing usable)."""
    messages = request.get("messages")
    if isinstance(messages, list) and messages:
        first_user = next((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"),
                          len(messages) - 1)
        return json.dumps(messages[:first_user + 1], sort_keys=True, ensure_ascii=False)
    prompt = request.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return prompt[:OPENING_CHARS]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return json.dumps(prompt[:OPENING_TOKENS])
    return None


def rendezvous_order(key: str, replicas: Iterable[str]) -> list[str]:
    """The replicas in the order this key prefers them: its home first."""
    return sorted(replicas, key=lambda replica: _digest(key, replica), reverse=True)


def _digest(*parts: str) -> str:
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()
