"""What an API dialect gives the generation path that every dialect shares.

A request is checked, encoded, admitted, generated and counted the same way whichever API it
came through (specwise/server/app.py, `_Service.answer`); a dialect only reads its own bodies into
that path's request objects (specwise/server/schemas.py) and writes the answers, streamed or whole,
and the errors in its own shapes: OpenAI's (app.py) and Ollama's (specwise/server/ollama.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from fastapi.responses import JSONResponse

from specwise.config import SamplingParams, SpecConfig
from specwise.engine import GenerationResult
from specwise.server.errors import APIError

if TYPE_CHECKING:
    from specwise.server.scheduler import Job


class Reply(Protocol):
    """The answers to one admitted request; a stream's events come framed (SSE, NDJSON)."""

    media_type: str  # of a streamed answer

    def body(self, result: GenerationResult) -> dict:
        """The whole answer, when the request does not stream."""

    def opening(self) -> list[str]:
        """The events a stream starts with, before its first text."""

    def token(self, text: str) -> str:
        """The event carrying a piece of text."""

    def closing(self, result: GenerationResult) -> list[str]:
        """The events after the last text: the finish reason, usage, timings."""

    def failure(self, err: APIError) -> str:
        """The event that ends a stream which failed after it started (its HTTP status is sent already)."""

    def ending(self) -> list[str]:
        """What every stream ends with, however it ended."""


class Dialect(Protocol):
    def endpoint(self, chat: bool) -> str:
        """The endpoint label of the latency metrics."""

    def reply(self, req: Any, job: "Job", spec: SpecConfig, verifier: str, chat: bool, received: float) -> Reply:
        """The answers to an admitted request (received: when it arrived, by time.perf_counter())."""

    def error_response(self, err: APIError) -> JSONResponse:
        """A refusal in the dialect's error shape, with the error's status and headers."""


def speculative_summary(spec: SpecConfig, verifier: str, sampling: SamplingParams, result: GenerationResult) -> dict:
    """The `speculative` object of an answer: how it was speculated and what that gave (τ, α, per position)."""
    return {"drafter": spec.drafter, "verifier": verifier, "k": spec.k, "adaptive": spec.resolve_adaptive(sampling),
            **result.stats.to_dict()}
