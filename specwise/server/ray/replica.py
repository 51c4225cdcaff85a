"""One replica of the Ray Serve deployment: the app of a single server, answering what the ingress forwards."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import torch
from fastapi import FastAPI
from ray import serve

from specwise.server.relay import ForwardedRequest, relay

ACCEPTED = "specwise.accepted"  # a replica's first message: it has taken the request


class Engine:
    """One replica: the app of a single server, answering the requests the ingress forwards."""

    def __init__(self, app_factory: Callable[[], FastAPI], threads: int) -> None:
        torch.set_num_threads(threads)  # before loading: replicas sharing a machine must not share cores
        self.app = app_factory()
        self.replica = serve.get_replica_context().replica_id.unique_id
        self._lifespan: Any = None
        self._startup: asyncio.Future | None = None

    async def _ready(self) -> None:
        """The app's lifespan started (its scheduler's workers), once, by the first call."""
        if self._startup is None:
            self._lifespan = self.app.router.lifespan_context(self.app)
            self._startup = asyncio.ensure_future(self._lifespan.__aenter__())
        await asyncio.shield(self._startup)

    async def http(self, request: ForwardedRequest, affinity: str | None = None,
                   replica: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """The app's ASGI messages for the request, after a first one saying this replica took it.
        `affinity` and `replica` are for AffinityRouter, which reads a call's arguments."""
        await self._ready()
        yield {"type": ACCEPTED, "replica": self.replica}
        async for message in relay(self.app, request):
            yield message

    async def metrics(self, replica: str | None = None) -> str:
        await self._ready()
        return self.app.state.metrics.render().decode()

    async def health(self, replica: str | None = None) -> tuple[int, dict]:
        await self._ready()
        messages = [message async for message in relay(self.app, ForwardedRequest("GET", "/health"))]
        return messages[0]["status"], json.loads(b"".join(m.get("body", b"") for m in messages[1:]))

    async def info(self, replica: str | None = None) -> dict[str, Any]:
        return {"replica": self.replica, "pid": os.getpid()}

    def __del__(self) -> None:
        # Ray Serve calls this once the replica's requests are done or its grace period is over.
        app = getattr(self, "app", None)
        if app is not None and getattr(app.state, "scheduler", None) is not None:
            app.state.scheduler.stop()
