"""ASGI middleware in front of the app: the API key check, counting requests, knowing which are open.

Plain ASGI rather than BaseHTTPMiddleware, which would get between a streaming
response and the client's disconnect.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Sequence

from starlette.routing import BaseRoute, Match

from specwise.server.errors import AUTHENTICATION, APIError
from specwise.server.metrics import ServerMetrics

TENANT_KEY = "specwise.tenant"  # the ASGI scope entry where the gatekeeper notes which API key was shown
OPEN_PATHS = ("/health",)  # reachable without the API key


def endpoint_of(routes: Sequence[BaseRoute], scope) -> str:
    """The route a request's path takes, as its template ("/v1/models/{model}"), or "other": the metrics'
    label, bounded by the app's own routes. The app's router notes the route it matched in the scope
    (Starlette's scope["route"]); only a request the app did not route (refused here, no such path, or an
    older Starlette) is matched here."""
    route = scope.get("route")
    if route is None:
        route = next((r for r in routes if r.matches(scope)[0] != Match.NONE), None)
    if route is None:
        return "other"
    return re.sub(r":\w+}", "}", getattr(route, "path", "other"))  # {model:path} -> {model}


class Gatekeeper:
    """The API key check, counting every request by endpoint and status, and the open ones."""

    def __init__(self, app, *, api_keys: Sequence[str], metrics: ServerMetrics,
                 open_requests: "OpenRequests", routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = routes  # the app's routes, those added after the middleware included
        self.api_keys = [key.encode() for key in api_keys]
        self.metrics = metrics
        self.open_requests = open_requests

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_and_note(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        path = scope["path"]
        self.open_requests.count += 1
        try:
            refusal = self._refusal(scope) if path not in OPEN_PATHS else None
            if refusal is not None:
                self.metrics.error(refusal.type, refusal.code)
                await refusal.response_for(path)(scope, receive, send_and_note)
            else:
                await self.app(scope, receive, send_and_note)
        finally:
            self.open_requests.count -= 1
            self.metrics.requests.labels(endpoint_of(self.routes, scope), str(status)).inc()

    def _refusal(self, scope) -> APIError | None:
        return key_refusal(scope, self.api_keys)


def key_refusal(scope, api_keys: Sequence[bytes]) -> APIError | None:
    """None when the request may pass (noting which key it showed in scope[TENANT_KEY]); no keys: all pass."""
    if not api_keys:
        return None
    header = dict(scope["headers"]).get(b"authorization", b"")
    scheme, _, token = header.partition(b" ")
    if scheme.lower() == b"bearer":
        # Every key is compared, so the time taken does not say which one nearly matched.
        matches = [hmac.compare_digest(token.strip(), key) for key in api_keys]
        if any(matches):
            scope[TENANT_KEY] = f"key:{matches.index(True)}"
            return None
    message = ("incorrect API key provided" if header else
               "missing API key: send the header 'Authorization: Bearer <key>'")
    return APIError(401, message, type=AUTHENTICATION, code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"})


class OpenRequests:
    """HTTP requests being answered (only touched in the event loop): draining waits for them."""

    def __init__(self) -> None:
        self.count = 0
