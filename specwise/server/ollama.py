"""Ollama's API beside the OpenAI one: POST /api/chat, /api/generate and /api/show, GET /api/tags.

Tools configured for Ollama (its own clients, editors, chat front ends) talk to specwise unchanged.
A generation request takes the OpenAI routes' path (app.py, `_Service.answer`): the same limits,
API keys, tenant scoping, scheduler admission and metrics; only its body (ollama_schemas.py) and its
answers are Ollama's. Streams, Ollama's default, are NDJSON: one JSON object a line, the last with
`done: true`, the done_reason, and the counts and durations (in nanoseconds) Ollama reports; a stream
that fails after it started ends with an `{"error": ...}` line. A refusal is `{"error": "..."}` with
its status. A model asked for with Ollama's default tag (NAME:latest) is the one served as NAME. The
last object also carries specwise's `speculative` object (τ, α, per-position acceptance), as the
OpenAI routes' answers do. No messages (chat) or an empty prompt (generate) is Ollama's way of
loading a model: answered at once, done_reason "load" (the served models are always loaded).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from specwise.config import SpecConfig
from specwise.engine import GenerationResult
from specwise.server.body import read_json
from specwise.server.dialect import speculative_summary
from specwise.server.errors import NOT_FOUND, APIError, quoted
from specwise.server.ollama_models import ModelFacts, now_rfc3339
from specwise.server.ollama_schemas import (OllamaChatRequest, OllamaGenerateRequest, OllamaShowRequest,
                                            in_ollama_terms)
from specwise.server.schemas import ChatCompletionRequest, parse_request
from specwise.server.sse import NDJSON, ndjson_line

if TYPE_CHECKING:
    from specwise.server.scheduler import Job

DEFAULT_TAG = ":latest"


def nanoseconds(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


def add_ollama_routes(app: FastAPI, service: Any) -> None:
    """Serve Ollama's endpoints from `service`, the app's generation service (app.py `_Service`)."""
    facts: dict[str, ModelFacts] = {}

    async def model_facts(name: str) -> ModelFacts:
        if name not in facts:  # a GGUF file is hashed once (remembered across runs): off the event loop
            facts[name] = await run_in_threadpool(ModelFacts.of, service.decoders[name], service.created)
        return facts[name]

    @app.get("/api/tags")
    async def tags() -> JSONResponse:
        return JSONResponse({"models": [(await model_facts(name)).listing(name) for name in service.decoders]})

    @app.post("/api/show")
    async def show(request: Request) -> Response:
        dialect = OllamaDialect("show", "")
        try:
            body = await read_json(request, service.limits.body_timeout)
            name = served_name(service.decoders, parse_request(OllamaShowRequest, body).asked)
        except APIError as err:
            return service.error_response(err, dialect)
        return JSONResponse((await model_facts(name)).show(name))

    @app.post("/api/chat")
    async def chat(request: Request) -> Response:
        return await _generate(service, request, "chat")

    @app.post("/api/generate")
    async def generate(request: Request) -> Response:
        return await _generate(service, request, "generate")


def served_name(decoders: dict[str, Any], asked: str) -> str:
    """The served model an Ollama request names (NAME:latest is NAME); a 404 in Ollama's words if none."""
    if asked in decoders:
        return asked
    if asked.endswith(DEFAULT_TAG) and asked.removesuffix(DEFAULT_TAG) in decoders:
        return asked.removesuffix(DEFAULT_TAG)
    raise APIError(404, f"model {quoted(asked)} not found; this server serves: {', '.join(decoders)}",
                   type=NOT_FOUND, param="model", code="model_not_found")


async def _generate(service: Any, request: Request, kind: str) -> Response:
    received = time.perf_counter()
    dialect = OllamaDialect(kind, "")
    try:
        body = await service.read_body(request)
        parsed = parse_request(OllamaChatRequest if kind == "chat" else OllamaGenerateRequest, body)
        dialect.model = parsed.model
        name = served_name(service.decoders, parsed.model)
        if parsed.loads_only:
            return JSONResponse(dialect.loaded())
        if isinstance(parsed, OllamaChatRequest):
            req = parsed.to_openai(name)
        else:
            req = parsed.to_openai(name, bool(getattr(service.decoders[name].tokenizer, "chat_template", None)))
    except APIError as err:
        return service.error_response(err, dialect)
    return await service.answer(request, req, chat=isinstance(req, ChatCompletionRequest), received=received,
                                dialect=dialect)


class OllamaDialect:
    """Ollama's answers and errors for one request to `kind` ("chat", "generate" or "show"), naming the
    model as the request did."""

    def __init__(self, kind: str, model: str) -> None:
        self.kind = kind
        self.model = model

    def endpoint(self, chat: bool) -> str:
        return f"ollama_{self.kind}"

    def reply(self, req: Any, job: "Job", spec: SpecConfig, verifier: str, chat: bool,
              received: float) -> "OllamaReply":
        return OllamaReply(self.kind, self.model, job, spec, verifier, received)

    def error_response(self, err: APIError) -> JSONResponse:
        return JSONResponse({"error": in_ollama_terms(err)}, status_code=err.status, headers=err.headers)

    def loaded(self) -> dict:
        """The answer to a request that only asks for the model to be loaded."""
        said = {"message": {"role": "assistant", "content": ""}} if self.kind == "chat" else {"response": ""}
        return {"model": self.model, "created_at": now_rfc3339(), **said, "done": True, "done_reason": "load"}


class OllamaReply:
    """The answers to one admitted Ollama request: NDJSON objects when streamed, one object when not."""

    media_type = NDJSON

    def __init__(self, kind: str, model: str, job: "Job", spec: SpecConfig, verifier: str, received: float) -> None:
        self.kind = kind
        self.model = model
        self.job = job
        self.spec = spec
        self.verifier = verifier
        self.received = received

    def _object(self, text: str, done: bool) -> dict:
        said = {"message": {"role": "assistant", "content": text}} if self.kind == "chat" else {"response": text}
        return {"model": self.model, "created_at": now_rfc3339(), **said, "done": done}

    def _last(self, result: GenerationResult, text: str) -> dict:
        stats = result.stats
        return {**self._object(text, True), "done_reason": result.finish_reason,
                "total_duration": nanoseconds(time.perf_counter() - self.received),
                "load_duration": 0,  # loaded when the server started
                "prompt_eval_count": len(result.prompt_ids),
                "prompt_eval_duration": nanoseconds(stats.prefill_seconds),
                "eval_count": len(result.token_ids),
                "eval_duration": nanoseconds(stats.total_seconds - stats.prefill_seconds),
                "speculative": speculative_summary(self.spec, self.verifier, self.job.sampling, result)}

    def body(self, result: GenerationResult) -> dict:
        return self._last(result, result.text)

    def opening(self) -> list[str]:
        return []

    def token(self, text: str) -> str:
        return ndjson_line(self._object(text, False))

    def closing(self, result: GenerationResult) -> list[str]:
        return [ndjson_line(self._last(result, ""))]

    def failure(self, err: APIError) -> str:
        return ndjson_line({"error": in_ollama_terms(err)})

    def ending(self) -> list[str]:
        return []
