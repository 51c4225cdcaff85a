"""The OpenAI-compatible HTTP API: `create_app(decoders, ...)` returns a FastAPI app.

Endpoints: POST /v1/completions and /v1/chat/completions (streaming or not),
GET /v1/models, /health and /metrics; Ollama's /api/chat, /api/generate,
/api/tags and /api/show (specwise/server/ollama.py), whose requests take the
same path as OpenAI's (`_Service.answer`). A request is checked completely in the
event loop (JSON, field types, ranges, model, context window), then handed to
the scheduler's worker threads; generation never runs on the event loop.
Unset fields take OpenAI's defaults (temperature 1, top_p 1); an unset
max_tokens means min(256, what fits in the context window and the KV budget).

Shutting down (`drain`, which `specwise serve` runs on SIGTERM): new generation
requests get 503, those admitted may finish within a grace period, then each
remaining stream ends with an error event and `data: [DONE]` and each request
still waiting gets a JSON 503. A stream's response starts with its first
message, so that a request failing before its first token (a drafter that
cannot run) gets a JSON error, not a stream that ends in one.

Extensions to OpenAI's API: the request fields `top_k`, `repetition_penalty`
and `speculative` (drafter, verifier, k, adaptive, ... for this request), and a
`speculative` object in responses with τ (acceptance_length), α
(acceptance_rate) and per-position acceptance for the request. In a stream it
comes in the last chunk before `data: [DONE]`: the usage chunk when
`stream_options.include_usage` is set, else the chunk with the finish_reason.
`usage.prompt_tokens_details.cached_tokens` (OpenAI's field) counts the prompt
tokens taken from the prefix cache; a request with `"timings": true` also gets
llama.cpp's `timings` object there (cache_n, prompt_n, prompt_ms, predicted_n,
predicted_ms, draft_n, draft_n_accepted).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from specwise.config import SamplingParams, SpecConfig, spec_settings
from specwise.drafters import available_drafters
from specwise.drafters.scope import Scope
from specwise.engine import GenerationResult
from specwise.errors import USER_ERRORS
from specwise.server.body import read_json
from specwise.server.cache_budget import budget_prefix_caches
from specwise.server.dialect import Dialect, Reply, speculative_summary
from specwise.server.errors import (NOT_FOUND, RATE_LIMIT, SERVER, APIError, bad_request, quoted, shutting_down,
                                    without_paths)
from specwise.server.gatekeeper import TENANT_KEY, Gatekeeper, OpenRequests
from specwise.server.limits import (ClientShare, ServerLimits, check_operator_spec, check_speculation,
                                    longest_token_chars, prompt_chars_limit)
from specwise.server.metrics import ServerMetrics
from specwise.server.ollama import add_ollama_routes
from specwise.server.scheduler import Job, Message, QueueFull, Scheduler, ShuttingDown, TooLarge
from specwise.server.schemas import (DEFAULT_MAX_TOKENS, ChatCompletionRequest, CompletionRequest,
                                     parse_request)
from specwise.server.sse import SSE_DONE, sse_event

if TYPE_CHECKING:
    from specwise.api import SpecDecoder

try:
    from jinja2 import TemplateError  # what a chat template raises on messages it refuses
except ImportError:  # without jinja2 there are no chat templates to refuse anything
    class TemplateError(Exception):
        pass

log = logging.getLogger("specwise.server")

SHARING = ("tenant", "global", "off")
RETRY_AFTER_SECONDS = "1"  # what a 429 suggests; generations take seconds, so a second is a fair first wait


def create_app(decoders: Mapping[str, "SpecDecoder"], *, default_spec: SpecConfig | None = None,
               max_queue: int = 16, api_key: str | Sequence[str] | None = None, workers: int | None = None,
               sharing: str = "tenant", kv_budget_tokens: int | None = None,
               limits: ServerLimits | None = None) -> FastAPI:
    """An app serving each SpecDecoder under its name (the `model` field of requests).

    default_spec: how to speculate when a request has no `speculative` object
        (None: each decoder's own `.spec`); a request's fields override it.
    max_queue: requests allowed to wait beyond those being generated; more get 429.
    api_key: a key, or several (one per tenant); when set, every endpoint but /health needs
        `Authorization: Bearer <key>` with one of them.
    workers: generation threads (None: every decoder's max_batch added up). A decoder
        runs up to its max_batch generations at once, batching their target passes.
    sharing: whose earlier requests a drafter that remembers them (suffix) may draft from:
        "tenant" (default) the requests of the same API key, and of the same `user` field
        within it (without API keys: of the same bearer token and `user`, which clients
        choose themselves); "global" every request; "off" none.
    kv_budget_tokens: the KV cache the admitted requests may hold together, in tokens; a
        request reserves its prompt plus max_tokens. None: room for every request the context
        window allows: workers x the largest window when every decoder takes one request at a
        time, else one window per decoder (a batching decoder runs one full-window request, or
        several smaller ones together). The decoders' prefix caches live inside it too: they
        hold what the admitted requests leave, and admitting a request evicts what it needs
        (specwise/server/cache_budget.py).
    limits: what one request may ask and one client may hold (specwise.server.limits; None:
        ServerLimits' defaults).

    `app.state.drain(grace)` stops the server gracefully (see the module docstring).
    """
    if not decoders:
        raise ValueError("decoders must map at least one model name to a SpecDecoder")
    keys = [api_key] if isinstance(api_key, str) else list(api_key or [])
    if any(not isinstance(key, str) or not key for key in keys) or (api_key is not None and not keys):
        raise ValueError("api_key must be a non-empty string, a list of them, or None")
    if sharing not in SHARING:
        raise ValueError(f"sharing must be one of {', '.join(SHARING)}; got {sharing!r}")
    if workers is None:
        workers = sum(getattr(decoder, "max_batch", 1) for decoder in decoders.values())
    if kv_budget_tokens is None:
        if all(getattr(decoder, "max_batch", 1) == 1 for decoder in decoders.values()):
            kv_budget_tokens = workers * max(decoder.runner.max_context for decoder in decoders.values())
        else:
            kv_budget_tokens = sum(decoder.runner.max_context for decoder in decoders.values())
    limits = limits or ServerLimits()
    for name, decoder in decoders.items():
        check_operator_spec(default_spec or decoder.spec, limits, f"the speculation served for {name!r}")
    metrics = ServerMetrics()
    caches = budget_prefix_caches(decoders, kv_budget_tokens)
    scheduler = Scheduler(workers, max_queue, kv_budget_tokens, on_finish=metrics.record_finish,
                          share=ClientShare(limits.client_share, workers, max_queue, kv_budget_tokens),
                          caches=caches)
    metrics.watch(scheduler)
    metrics.watch_drafters(decoders)
    metrics.watch_vllm_names(scheduler, list(decoders))
    service = _Service(dict(decoders), default_spec, scheduler, metrics, sharing, limits)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        scheduler.start()
        yield
        await run_in_threadpool(scheduler.stop)

    app = FastAPI(title="specwise", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.scheduler = scheduler
    app.state.metrics = metrics
    app.state.drain = service.drain
    app.add_middleware(Gatekeeper, api_keys=keys, metrics=metrics, open_requests=service.open_requests,
                       routes=app.router.routes)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = NOT_FOUND if exc.status_code == 404 else "invalid_request_error"
        message = (f"no such endpoint: {request.method} {request.url.path}" if exc.status_code == 404
                   else f"{exc.detail}: {request.method} {request.url.path}")
        return service.error_response(APIError(exc.status_code, message, type=kind))

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error serving %s %s", request.method, request.url.path)
        return service.error_response(APIError(500, "internal server error; see the server log", type=SERVER))

    @app.get("/health")
    async def health() -> JSONResponse:
        # Open even with an API key, so it says nothing about models or prompts. 503 while
        # draining, so that load balancers send new requests elsewhere.
        body = {"status": "draining" if scheduler.draining else "ok", "running": scheduler.running,
                "waiting": scheduler.waiting, "max_queue": scheduler.max_queue,
                "kv_budget_tokens": scheduler.kv_budget_tokens, "kv_used_tokens": scheduler.kv_used_tokens}
        return JSONResponse(body, status_code=503 if scheduler.draining else 200)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [service.model_card(name) for name in service.decoders]}

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str) -> JSONResponse:
        try:
            service.decoder(model)
        except APIError as err:
            return service.error_response(err)
        return JSONResponse(service.model_card(model))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await service.generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await service.generate(request, chat=True)

    add_ollama_routes(app, service)
    return app


class _Service:
    """The generation endpoints' logic: check, encode, queue, answer."""

    def __init__(self, decoders: dict[str, "SpecDecoder"], default_spec: SpecConfig | None, scheduler: Scheduler,
                 metrics: ServerMetrics, sharing: str = "tenant", limits: ServerLimits | None = None) -> None:
        self.sharing = sharing
        self.limits = limits or ServerLimits()
        self._chars_limits: dict[int, int | None] = {}  # by id(decoder): what its window can hold
        self.decoders = decoders
        self.default_spec = default_spec
        self.scheduler = scheduler
        self.metrics = metrics
        self.created = int(time.time())
        self.open_requests = OpenRequests()

    def model_card(self, name: str) -> dict:
        return {"id": name, "object": "model", "created": self.created, "owned_by": "specwise"}

    def decoder(self, name: str) -> "SpecDecoder":
        if name not in self.decoders:
            raise APIError(404, f"the model {quoted(name)} does not exist; this server has: "
                           f"{', '.join(self.decoders)}", type=NOT_FOUND, param="model", code="model_not_found")
        return self.decoders[name]

    def error_response(self, err: APIError, dialect: Dialect | None = None) -> JSONResponse:
        self.metrics.error(err.type, err.code)
        return (dialect or OPENAI).error_response(err)

    async def read_body(self, request: Request):
        """A generation request's JSON body (APIError while draining, or for a body that is not JSON)."""
        if self.scheduler.draining:
            raise shutting_down("the server is shutting down and accepts no new requests")
        return await read_json(request, self.limits.body_timeout)

    async def generate(self, request: Request, *, chat: bool) -> Response:
        received = time.perf_counter()
        try:
            body = await self.read_body(request)
            req = parse_request(ChatCompletionRequest if chat else CompletionRequest, body)
        except APIError as err:
            return self.error_response(err)
        return await self.answer(request, req, chat=chat, received=received)

    async def answer(self, request: Request, req, *, chat: bool, received: float,
                     dialect: Dialect | None = None) -> Response:
        """Check, encode and admit a parsed request (a ChatCompletionRequest when chat, else a
        CompletionRequest, whichever API it came through), then answer it in the dialect's shapes."""
        dialect = dialect or OPENAI
        endpoint = dialect.endpoint(chat)
        try:
            decoder = self.decoder(req.model)
            req.check_supported()
            spec = self._spec(decoder, req)
            self._check_prompt_chars(decoder, req, chat)
            prompt_ids = await run_in_threadpool(_encode, decoder, req, chat)
            sampling = req.sampling_params(_max_tokens(decoder, req, len(prompt_ids),
                                                       self.scheduler.kv_budget_tokens))
            verifier = _verifier(spec, sampling)
            job = Job(req.model, decoder, prompt_ids, sampling, spec, asyncio.get_running_loop(),
                      sharing=self._sharing_scope(request, req), client=self._client(request, req))
            try:
                self.scheduler.submit(job)
            except QueueFull as exc:
                raise APIError(429, f"the server is busy: {exc}; retry later", type=RATE_LIMIT,
                               code="queue_full", headers={"Retry-After": RETRY_AFTER_SECONDS}) from None
            except ShuttingDown:
                raise shutting_down("the server is shutting down and accepts no new requests") from None
            except TooLarge as exc:
                raise bad_request(f"this request needs {exc.tokens} tokens of KV cache (a prompt of "
                                  f"{len(prompt_ids)} tokens plus max_tokens {sampling.max_new_tokens}), more "
                                  f"than the server's whole KV budget of {exc.budget} tokens; lower max_tokens "
                                  "or shorten the prompt, or start the server with a larger --kv-budget-tokens",
                                  "max_tokens", "kv_budget_exceeded") from None
        except APIError as err:
            return self.error_response(err, dialect)
        reply = dialect.reply(req, job, spec, verifier, chat, received)
        if req.stream:
            return await self._stream(request, reply, job, dialect, endpoint, received)
        return await self._complete(request, reply, job, dialect, endpoint, received)

    def _sharing_scope(self, request: Request, req) -> Scope:
        """The request's sharing scope: its tenant (API key, else bearer token) and `user`, hashed,
        so that the server keeps no key in its drafters' tables."""
        if self.sharing == "off":
            return None
        if self.sharing == "global":
            return ("server",)
        return ("tenant", _digest(_tenant(request), req.user or ""))

    def _check_prompt_chars(self, decoder, req, chat: bool) -> None:
        """Refuse text that cannot fit in the context window before spending CPU to tokenize it."""
        if id(decoder) not in self._chars_limits:
            self._chars_limits[id(decoder)] = prompt_chars_limit(decoder.runner.max_context,
                                                                 longest_token_chars(decoder.tokenizer))
        limit = self._chars_limits[id(decoder)]
        if chat:
            chars = sum(len(m.content) if isinstance(m.content, str) else sum(len(p.text) for p in m.content)
                        for m in req.messages)
        else:
            prompt = req.single_prompt()
            chars = len(prompt) if isinstance(prompt, str) else 0
        if limit is not None and chars > limit:
            param = "messages" if chat else "prompt"
            raise bad_request(f"the {param} has {chars} characters, more than can fit in this model's context window "
                              f"of {decoder.runner.max_context} tokens; shorten it", param, "context_length_exceeded")

    def _client(self, request: Request, req) -> str:
        """Whose share of the server a request counts against: its API key where the server has keys
        (a client cannot pick another), else its bearer token and `user`, which clients choose."""
        tenant = request.scope.get(TENANT_KEY)
        return _digest(tenant) if tenant is not None else _digest(_tenant(request), req.user or "")

    def _spec(self, decoder, req) -> SpecConfig:
        spec = self.default_spec or decoder.spec
        if req.speculative is not None:
            spec = req.speculative.apply(spec)
        if spec.drafter not in available_drafters():
            raise bad_request(f"unknown drafter {quoted(spec.drafter)}; available: "
                              f"{', '.join(available_drafters())}", "speculative.drafter")
        check_speculation(spec, self.limits)
        # A decoder built without a draft model would load the default one from disk in the
        # middle of a request; refuse instead.
        if (spec.drafter == "draft-model" and getattr(decoder, "drafter_model", None) is None
                and decoder.spec.drafter != "draft-model"):
            raise bad_request(f"model {req.model!r} is served without a draft model; choose another drafter",
                              "speculative.drafter")
        check_format = getattr(decoder, "check_format", None)
        if check_format is not None:
            try:
                check_format(spec.target_format, spec.device)
            except USER_ERRORS as exc:
                raise bad_request(without_paths(str(exc)), "speculative.target_format") from None
        return spec

    async def _complete(self, request: Request, reply: Reply, job: Job, dialect: Dialect, endpoint: str,
                        received: float) -> Response:
        watcher = asyncio.create_task(self._watch_disconnect(request, job))
        first_token = None
        try:
            async for message in job.messages():
                if message.kind == "token" and first_token is None:
                    first_token = time.perf_counter()
                final = message
        finally:
            watcher.cancel()
            job.cancel()  # no-op once finished; stops the job if this handler is cancelled
        if final.kind == "done":
            self._observe(endpoint, received, first_token)
            return JSONResponse(reply.body(final.value))
        if final.kind == "failed":
            return self.error_response(_failure(final.value), dialect)
        refusal = shutting_down("the server is shutting down and ended this request before it finished; send it "
                                "again")
        if not self.scheduler.draining:  # the client is gone (counted as a disconnect): nobody reads this
            return dialect.error_response(refusal)
        return self.error_response(refusal, dialect)

    async def _watch_disconnect(self, request: Request, job: Job) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        if job.cancel():
            self.metrics.disconnects.inc()

    async def _stream(self, request: Request, reply: Reply, job: Job, dialect: Dialect, endpoint: str,
                      received: float) -> Response:
        """The events of a stream, once its first message is in: a request that fails before its
        first token (a drafter that cannot run) gets a JSON error instead of a stream."""
        messages = job.messages()
        watcher = asyncio.create_task(self._watch_disconnect(request, job))
        try:
            first = await anext(messages)
        except BaseException:  # this handler was cancelled: nobody will read the stream
            job.cancel()
            raise
        finally:
            watcher.cancel()
        if first.kind == "failed":
            return self.error_response(_failure(first.value), dialect)
        if first.kind == "cancelled":
            refusal = shutting_down("the server is shutting down and ended this request before it started; "
                                    "send it again")
            return self.error_response(refusal, dialect) if self.scheduler.draining else \
                dialect.error_response(refusal)
        return _JobStream(self._events(reply, endpoint, received, _prepend(first, messages)), job, self.metrics,
                          reply.media_type)

    async def _events(self, reply: Reply, endpoint: str, received: float,
                      messages: AsyncIterator[Message]) -> AsyncIterator[str]:
        first_token = None
        for event in reply.opening():
            yield event
        async for message in messages:
            if message.kind == "token":
                first_token = first_token or time.perf_counter()
                if message.value.text:
                    yield reply.token(message.value.text)
            elif message.kind == "done":
                self._observe(endpoint, received, first_token)
                for event in reply.closing(message.value):
                    yield event
            else:
                err = (_failure(message.value) if message.kind == "failed" else
                       shutting_down("the server is shutting down and ended this stream before it "
                                     "finished; send the request again"))
                self.metrics.error(err.type, err.code)
                yield reply.failure(err)
        for event in reply.ending():
            yield event

    async def drain(self, grace: float) -> None:
        """Refuse new requests (503); let the admitted ones run for up to `grace` seconds; end the rest
        with an error (stream) or a 503 (waiting request); return once every answer is sent."""
        loop = asyncio.get_running_loop()
        self.scheduler.drain()
        deadline = loop.time() + grace
        log.info("draining: %d generating, %d waiting; up to %.1f s to finish", self.scheduler.running,
                 self.scheduler.waiting, grace)
        while not self.scheduler.idle and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if not self.scheduler.idle:
            log.warning("grace period over: ending %d generating and %d waiting requests",
                        self.scheduler.running, self.scheduler.waiting)
        await run_in_threadpool(self.scheduler.stop)
        deadline = loop.time() + 5.0  # the handlers only have to send what they already hold
        while self.open_requests.count and loop.time() < deadline:
            await asyncio.sleep(0.02)

    def _observe(self, endpoint: str, received: float, first_token: float | None) -> None:
        now = time.perf_counter()
        self.metrics.latency.labels(endpoint).observe(now - received)
        if first_token is not None:
            self.metrics.ttft.labels(endpoint).observe(first_token - received)


class _OpenAI:
    """OpenAI's dialect: its request objects are the shared path's own (schemas.py)."""

    def endpoint(self, chat: bool) -> str:
        return "chat" if chat else "completions"

    def reply(self, req, job: Job, spec: SpecConfig, verifier: str, chat: bool, received: float) -> "_Reply":
        return _Reply(req, job, spec, verifier, chat)

    def error_response(self, err: APIError) -> JSONResponse:
        return err.response()


OPENAI = _OpenAI()


class _Reply:
    """The response bodies of one request, in OpenAI's formats, streamed as server-sent events."""

    media_type = "text/event-stream"

    def __init__(self, req, job: Job, spec: SpecConfig, verifier: str, chat: bool) -> None:
        self.req = req
        self.job = job
        self.spec = spec
        self.verifier = verifier
        self.chat = chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _envelope(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.req.model}

    def usage(self, result: GenerationResult) -> dict:
        prompt, completion = len(result.prompt_ids), len(result.token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": result.stats.cached_tokens}}

    def timings(self, result: GenerationResult) -> dict:
        """llama.cpp's server's `timings` object, where the request asked for it (`"timings": true`)."""
        stats = result.stats
        prompt_ms, total_ms = 1000 * stats.prefill_seconds, 1000 * stats.total_seconds
        return {"cache_n": stats.cached_tokens, "prompt_n": len(result.prompt_ids) - stats.cached_tokens,
                "prompt_ms": round(prompt_ms, 3), "predicted_n": len(result.token_ids),
                "predicted_ms": round(max(0.0, total_ms - prompt_ms), 3), "draft_n": stats.proposed,
                "draft_n_accepted": stats.accepted}

    def speculative(self, result: GenerationResult) -> dict:
        return speculative_summary(self.spec, self.verifier, self.job.sampling, result)

    def body(self, result: GenerationResult) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text},
                      "logprobs": None, "finish_reason": result.finish_reason}
        else:
            choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": result.finish_reason}
        body = {**self._envelope(chunk=False), "choices": [choice], "usage": self.usage(result),
                "speculative": self.speculative(result)}
        if self.req.timings:
            body["timings"] = self.timings(result)
        return body

    def chunk(self, content: str | dict, finish_reason: str | None = None) -> dict:
        if self.chat:
            delta = content if isinstance(content, dict) else {"content": content}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": finish_reason}
        chunk = {**self._envelope(chunk=True), "choices": [choice]}
        if self.req.include_usage:
            chunk["usage"] = None  # as OpenAI: null in every chunk but the last
        return chunk

    def final_chunks(self, result: GenerationResult) -> list[dict]:
        last = self.chunk({} if self.chat else "", result.finish_reason)
        extra = {"speculative": self.speculative(result)}
        if self.req.timings:
            extra["timings"] = self.timings(result)
        if not self.req.include_usage:
            return [{**last, **extra}]
        usage = {**self._envelope(chunk=True), "choices": [], "usage": self.usage(result), **extra}
        return [last, usage]

    def opening(self) -> list[str]:
        return [sse_event(self.chunk({"role": "assistant", "content": ""}))] if self.chat else []

    def token(self, text: str) -> str:
        return sse_event(self.chunk(text))

    def closing(self, result: GenerationResult) -> list[str]:
        return [sse_event(chunk) for chunk in self.final_chunks(result)]

    def failure(self, err: APIError) -> str:
        return sse_event(err.body())

    def ending(self) -> list[str]:
        return [SSE_DONE]


class _JobStream(StreamingResponse):
    """The streamed events of one job; the job is cancelled if the response ends before it does."""

    def __init__(self, content: AsyncIterator[str], job: Job, metrics: ServerMetrics, media_type: str) -> None:
        super().__init__(content, media_type=media_type,
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.job.cancel():  # the client went away mid-stream: stop generating for it
                self.metrics.disconnects.inc()


async def _prepend(first: Message, rest: AsyncIterator[Message]) -> AsyncIterator[Message]:
    yield first
    async for message in rest:
        yield message


def _tenant(request: Request) -> str:
    """The API key shown (by its index), else the bearer token sent, else "anonymous"."""
    tenant = request.scope.get(TENANT_KEY)
    if tenant is None:  # no API keys: the token the client sends, if any, names its tenant
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        tenant = "token:" + token.strip() if scheme.lower() == "bearer" and token.strip() else "anonymous"
    return tenant


def _digest(*names: str) -> str:
    """A hash of names, so that the server's tables hold no key or token."""
    return hashlib.sha256(json.dumps(list(names)).encode()).hexdigest()[:32]


def _encode(decoder, req, chat: bool) -> list[int]:
    """Token ids of the prompt or messages (runs in a thread: chat templates can be slow)."""
    param = "messages" if chat else "prompt"
    try:
        if chat:
            ids = decoder.encode([m.as_template_message() for m in req.messages])
        else:
            prompt = req.single_prompt()
            if isinstance(prompt, str):
                ids = decoder.encode(prompt, chat=False)
            else:
                vocab = decoder.runner.vocab_size
                bad = [t for t in prompt if not 0 <= t < vocab]
                if bad:
                    raise bad_request(f"prompt token ids must be in [0, {vocab}); got {bad[:5]}", param)
                ids = list(prompt)
    except TemplateError as exc:
        raise bad_request(f"the model's chat template rejected these messages: {exc}", param) from None
    except ValueError as exc:
        raise bad_request(without_paths(str(exc)), param) from None
    if not ids:
        raise bad_request(f"the {param} encodes to no tokens", param)
    return ids


def _max_tokens(decoder, req, prompt_tokens: int, kv_budget: int | None) -> int:
    """The request's max_tokens (or the default), refused when it cannot fit in the context window.

    The default also stays within the KV budget (at least 1, so that a prompt alone past the
    budget is refused by the scheduler, naming the budget); a max_tokens asked for is never lowered."""
    context = decoder.runner.max_context
    room = context - prompt_tokens
    requested = req.requested_max_tokens
    if requested is None:
        if room < 1:
            raise bad_request(f"the prompt has {prompt_tokens} tokens, which leaves no room in this model's "
                              f"context window of {context} tokens; shorten the prompt",
                              "messages" if isinstance(req, ChatCompletionRequest) else "prompt",
                              "context_length_exceeded")
        default = min(DEFAULT_MAX_TOKENS, room)
        return default if kv_budget is None else max(1, min(default, kv_budget - prompt_tokens))
    if requested >= 1 and prompt_tokens + requested > context:
        raise bad_request(f"this model's context window is {context} tokens, but the prompt has {prompt_tokens} "
                          f"tokens and max_tokens asks for {requested} more ({prompt_tokens + requested} in "
                          "all); shorten the prompt or lower max_tokens", "max_tokens", "context_length_exceeded")
    return requested


def _verifier(spec: SpecConfig, sampling: SamplingParams) -> str:
    try:
        return spec.resolve_verifier(sampling)
    except ValueError as exc:
        raise bad_request(str(exc), "speculative.verifier") from None


def _failure(exc: BaseException) -> APIError:
    """What a client hears about a generation that raised (the traceback stays in the log)."""
    if isinstance(exc, USER_ERRORS):  # a setting's own error names it (ConfigError.field)
        field = getattr(exc, "field", None)
        param = f"speculative.{field}" if field in {info.name for info in spec_settings()} else field
        return bad_request(without_paths(str(exc)), param)
    return APIError(500, f"generation failed ({type(exc).__name__}); see the server log", type=SERVER)

