"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

Every refusal the server makes goes through APIError, so that clients always get
this shape (never a traceback) and the metrics count each error by type and code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from fastapi.responses import JSONResponse

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
RATE_LIMIT = "rate_limit_error"
SERVER = "server_error"
OLLAMA_PREFIX = "/api/"  # Ollama's routes


class APIError(Exception):
    """A request the server refuses or could not serve, as the client will see it."""

    def __init__(self, status: int, message: str, *, type: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    def body_for(self, path: str) -> dict:
        """The refusal as the route's clients read it: under Ollama's routes (/api/) Ollama's
        `{"error": "<message>"}`, elsewhere OpenAI's object. For refusals made before a route's
        own code runs (the key check, a full server, a lost replica)."""
        return {"error": self.message} if path.startswith(OLLAMA_PREFIX) else self.body()

    def response_for(self, path: str) -> JSONResponse:
        return JSONResponse(self.body_for(path), status_code=self.status, headers=self.headers)


def shown(value: object) -> str:
    """A request's value as a message may show it: numbers, booleans and null as they are, other
    values by their kind and size only, so that no client text (markup, control characters, a
    megabyte) is echoed back or into the log."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    if isinstance(value, (int, float)):
        text = repr(value)
        return text if len(text) <= 32 else f"an integer of {len(text)} digits"
    if isinstance(value, str):
        return f"a string of {len(value)} characters"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        return f"an object with {len(value)} keys"
    return type(value).__name__


_NAME = re.compile(r"[A-Za-z0-9_.:/-]{0,64}")


def plain_name(text: object) -> bool:
    """Whether a name from a request (a key, a drafter, a model) is safe to echo: short, plain characters."""
    return isinstance(text, str) and _NAME.fullmatch(text) is not None


def quoted(text: object) -> str:
    """A name from a request quoted when it is plain (plain_name), else described by its size only (shown)."""
    return repr(text) if plain_name(text) else shown(text)


# An absolute path (POSIX or Windows) in a library's message: the server's own, never the client's business.
_PATH = re.compile(r"(?<![\w.~])(?:[A-Za-z]:\\|~?/)[^\s'\"]*[/\\][^\s'\",;)]*")


def without_paths(message: str) -> str:
    """A library's error message with the server's file paths taken out, as a client may read it."""
    return _PATH.sub("<a path on the server>", message)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def shutting_down(message: str) -> APIError:
    """A draining server's refusal: 503 server_shutting_down, with Connection: close, so that the client's
    next request opens a connection to another server."""
    return APIError(503, message, type=SERVER, code="server_shutting_down", headers={"Connection": "close"})
