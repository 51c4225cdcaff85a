"""One HTTP request answered by an ASGI app in this process, its response messages handed out as they come.

A replica of the Ray Serve deployment (specwise.server.ray) receives a request from the
ingress as plain data (`ForwardedRequest`) and runs it through the app of a single server, so
that every endpoint, check and error is exactly the single process's. Closing the iterator (the
ingress went away: its client disconnected, or the ingress died) tells the app that its client
disconnected and cancels the handler, which cancels the generation (create_app's handlers cancel
their job when cancelled).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

# ASGI 2.3: Starlette's streaming responses then watch `receive` for the client's disconnect.
_ASGI = {"version": "3.0", "spec_version": "2.3"}


@dataclass(frozen=True)
class ForwardedRequest:
    """What the ingress passes on of an HTTP request: all the app reads of it."""

    method: str
    path: str
    query: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    client: tuple[str, int] | None = None

    def scope(self) -> dict[str, Any]:
        return {"type": "http", "asgi": dict(_ASGI), "http_version": "1.1", "method": self.method,
                "scheme": "http", "path": self.path, "raw_path": self.path.encode(), "root_path": "",
                "query_string": self.query, "headers": list(self.headers), "client": self.client,
                "server": None, "state": {}}


async def relay(app, request: ForwardedRequest) -> AsyncIterator[dict[str, Any]]:
    """The app's ASGI messages for `request` (http.response.start, then body parts) as it sends them."""
    sent: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    disconnected = asyncio.Event()
    body_given = False

    async def receive() -> dict[str, Any]:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await sent.put(message)

    handler = asyncio.create_task(app(request.scope(), receive, send))
    handler.add_done_callback(lambda _: sent.put_nowait(None))
    try:
        while (message := await sent.get()) is not None:
            yield message
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                break
        await handler  # raises what the app raised, if it ended without answering
    finally:
        disconnected.set()
        if not handler.done():
            handler.cancel()
