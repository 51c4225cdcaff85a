"""The HTTP entry of the Ray Serve deployment: forwards each request to its replica and relays the answer.

Behind Ray Serve's HTTP proxy, the ingress reads a request's affinity key (specwise.server.affinity)
and hands the request to the engine deployment, whose request router (router.py) picks the replica;
it relays the answer as it comes (streams included) with the header `x-specwise-replica`, and
`/metrics` and `/health` gather every replica's.

Faults: a replica that dies is restarted by Ray Serve (its health checks). A request it had taken
ends with an OpenAI-style 503 `replica_lost` (a stream: an error event and `data: [DONE]`); one it
had not taken yet is sent to another replica (up to RETRIES times). A gap of `stall_timeout`
seconds between a replica's messages ends the request the same way, so nothing waits forever. A
client that disconnects cancels the forwarded call, which cancels the generation on its replica.
Overload is the engines' own 429 with Retry-After (each replica takes up to max_ongoing_requests,
more than its engine's batch and queue), or the same 429 when Serve's own line to them is full.
Shutdown drains as a single server does (`Ingress.drain`, called by deploy.run_cli before Serve
stops): new requests get 503 `server_shutting_down`, those in flight finish for up to the grace
period, and any still running then end with that error (a stream: an error event and `data: [DONE]`).
Ray Serve's own shutdown could not do this: `serve.shutdown()` kills the HTTP proxy at once (its
graceful shutdown is a no-op in Ray Serve 2.60), cutting every open connection, whatever the
replicas' graceful_shutdown_timeout_s.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle

from specwise.server.affinity import affinity_key
from specwise.server.body import MAX_BODY_BYTES
from specwise.server.errors import OLLAMA_PREFIX, RATE_LIMIT, SERVER, APIError, shutting_down
from specwise.server.gatekeeper import key_refusal
from specwise.server.metrics_merge import merge_metrics
from specwise.server.ray.router import replica_ids
from specwise.server.relay import ForwardedRequest
from specwise.server.sse import NDJSON, SSE_DONE, ndjson_line, sse_event

log = logging.getLogger("specwise.server")

REPLICA_HEADER = "x-specwise-replica"
RETRIES = 3  # sends of a request whose replica died before taking it
START_TIMEOUT = 120.0  # seconds for some replica to take a request (a restart fits in it)
STALL_TIMEOUT = 300.0  # seconds between a replica's messages (a long prompt's first token fits in it)
SCRAPE_TIMEOUT = 5.0  # seconds for a replica's /metrics or /health
_GONE = (RayActorError, ActorUnavailableError)


class Ingress:
    """The HTTP entry: forwards each request to its replica and relays the answer (see the module).

    Its FastAPI app is built in the replica (`__serve_build_asgi_app__`, Ray Serve's late-bound ingress),
    so that its routes are this class's methods as imported there, not copies pickled with the app."""

    def __init__(self, engine: DeploymentHandle, api_keys: list[str] | None = None,
                 stall_timeout: float = STALL_TIMEOUT) -> None:
        self.engine = engine
        self.api_keys = [key.encode() for key in api_keys or []]
        self.stall_timeout = stall_timeout
        self.registry = CollectorRegistry()
        self.failures = Counter("specwise_ingress_replica_failures", "Requests whose replica died or stalled: "
                                "before taking them (sent again elsewhere) or in flight (ended with an error)",
                                ["when"], registry=self.registry)
        self.scrape_failures = Counter("specwise_ingress_scrape_failures",
                                       "Replicas that did not answer a /metrics or /health in time",
                                       registry=self.registry)
        self.open = 0  # HTTP requests forwarded and not yet answered in full
        self.draining = False  # new requests get 503 (drain)
        self.cut = asyncio.Event()  # the grace period is over: requests still open end with an error

    def __serve_build_asgi_app__(self) -> FastAPI:
        api = FastAPI(title="specwise", docs_url=None, redoc_url=None, openapi_url=None)
        api.add_api_route("/metrics", self.metrics, methods=["GET"])
        api.add_api_route("/health", self.health, methods=["GET"])
        api.add_api_route("/{path:path}", self.forward, methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD",
                                                                  "OPTIONS"])
        return api

    async def metrics(self, request: Request) -> Response:
        refusal = key_refusal(request.scope, self.api_keys)
        if refusal is not None:
            return refusal.response()
        texts = {replica: text for replica, text in await self._gather("metrics") if text is not None}
        return Response(merge_metrics(texts) + generate_latest(self.registry).decode(), media_type=CONTENT_TYPE_LATEST)

    async def health(self) -> JSONResponse:
        if self.draining:
            return JSONResponse({"status": "draining", "open": self.open}, status_code=503)
        replicas = {replica: answer for replica, answer in await self._gather("health") if answer is not None}
        ok = any(status == 200 for status, _ in replicas.values())
        body = {"status": "ok" if ok else "unavailable", "replicas": {r: body for r, (_, body) in replicas.items()}}
        return JSONResponse(body, status_code=200 if ok else 503)

    async def forward(self, request: Request) -> Response:
        if self.draining:
            return shutting_down("the server is shutting down and accepts no new requests").response_for(
                request.url.path)
        self.open += 1
        response: Response | None = None
        try:
            response = await self._forward(request)
            return response
        finally:
            if not isinstance(response, _Relayed):  # a relayed answer counts itself closed once sent
                self.open -= 1

    async def drain(self, grace: float) -> int:
        """Refuse new requests (503 server_shutting_down); let those open finish for up to `grace` seconds;
        end the rest with that error (a stream: an error event and [DONE]). The number ended so."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        log.info("draining: %d requests open; up to %g s to finish", self.open, grace)
        while self.open and loop.time() < deadline:
            await asyncio.sleep(0.05)
        left = self.open
        if left:
            log.warning("grace period over: ending %d open requests", left)
            self.cut.set()
            deadline = loop.time() + 5.0  # they only have to send what they hold
            while self.open and loop.time() < deadline:
                await asyncio.sleep(0.02)
        return left

    async def _forward(self, request: Request) -> Response:
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > MAX_BODY_BYTES:  # the replicas refuse it too; no need to carry it there first
                return APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes").response_for(
                    request.url.path)
        key = affinity_key(request.headers.get("authorization"), bytes(body)) if request.method == "POST" else None
        client = (request.client.host, request.client.port) if request.client else None
        forwarded = ForwardedRequest(request.method, request.url.path, request.url.query.encode(),
                                     list(request.headers.raw), bytes(body), client)
        return await self._send(forwarded, key)

    async def _send(self, forwarded: ForwardedRequest, key: str | None) -> Response:
        """Hand the request to a replica: another one when its replica dies before taking it."""
        for _ in range(RETRIES + 1):
            stream = self.engine.options(stream=True).http.remote(forwarded, affinity=key)
            try:
                accepted = await self._first(stream)
            except _Cut:
                stream.cancel()
                return shutting_down("the server is shutting down and ended this request before it started; "
                                     "send it again").response_for(forwarded.path)
            except BackPressureError:
                return _busy().response_for(forwarded.path)
            except _GONE:
                self.failures.labels("before_start").inc()
                continue
            except TimeoutError:
                stream.cancel()
                break
            return _Relayed(stream, accepted["replica"], self, forwarded.path)
        return APIError(503, "no replica could take the request now; retry later", type=SERVER,
                        code="no_replica", headers={"Retry-After": "5"}).response_for(forwarded.path)

    async def _first(self, stream) -> dict[str, Any]:
        """A replica's first message (it took the request); _Cut when the grace period ends first."""
        first = _next_part(stream)
        cut = asyncio.ensure_future(self.cut.wait())
        try:
            done, _ = await asyncio.wait({first, cut}, timeout=START_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cut.cancel()
        if first in done:
            return first.result()
        first.cancel()
        raise _Cut if cut in done else TimeoutError

    async def _gather(self, method: str) -> list[tuple[str, Any]]:
        """Each replica's answer to `method` (None where it did not answer in time)."""
        replicas = replica_ids(self.engine)
        if not replicas:  # this process has not routed anything yet: one call makes its router
            await self._call("info", None)
            replicas = replica_ids(self.engine)
        # One call at a time: Serve gives the calls made while serving one HTTP request that request's id,
        # and its router matches a routed replica to a waiting call by that id.
        return [(replica, await self._call(method, replica)) for replica in replicas]

    async def _call(self, method: str, replica: str | None) -> Any:
        response = getattr(self.engine, method).remote(replica=replica)
        try:
            return await asyncio.wait_for(_result(response), SCRAPE_TIMEOUT)
        except (TimeoutError, *_GONE):
            response.cancel()
            self.scrape_failures.inc()
            return None


async def _result(response) -> Any:
    return await response


class _Cut(Exception):
    """The grace period of a drain is over."""


class _Relayed(Response):
    """A replica's answer, relayed as it comes; the replica's call is cancelled if the client leaves."""

    def __init__(self, stream, replica: str, ingress: Ingress, path: str) -> None:
        super().__init__()
        self.stream = stream
        self.replica = replica
        self.ingress = ingress
        self.path = path
        self.finished = False
        self.started = False  # the answer's start is sent
        self.content_type = b""  # of the answer, once started

    async def __call__(self, scope, receive, send) -> None:
        pump = asyncio.create_task(self._pump(send))
        watcher = asyncio.create_task(_disconnected(receive))
        cut = asyncio.create_task(self.ingress.cut.wait())
        try:
            done, _ = await asyncio.wait({pump, watcher, cut}, return_when=asyncio.FIRST_COMPLETED)
            if pump in done:
                pump.result()
            elif cut in done:
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
                await self._end_cut(send)
        finally:
            pump.cancel()
            watcher.cancel()
            cut.cancel()
            if not self.finished:
                self.stream.cancel()
            self.ingress.open -= 1

    async def _end_cut(self, send) -> None:
        """End the answer as a draining single server does when its grace period is over."""
        err = shutting_down("the server is shutting down and ended this request before it finished; send it "
                            "again")
        if not self.started:
            await _send_json(send, err, self.path)
        else:
            await send({"type": "http.response.body", "body": self._tail(err), "more_body": False})

    async def _pump(self, send) -> None:
        start = await self._next()
        if start is None or start["type"] != "http.response.start":
            await _send_json(send, _lost(), self.path)
            return
        headers = {name.lower(): value for name, value in start["headers"]}
        self.content_type = headers.get(b"content-type", b"")
        self.started = True
        await send({**start, "headers": [*start["headers"], (REPLICA_HEADER.encode(), self.replica.encode())]})
        while True:
            message = await self._next()
            if message is None:  # the replica is gone mid-answer: end the stream as the single server would
                await send({"type": "http.response.body", "body": self._tail(_lost()), "more_body": False})
                return
            await send(message)
            if not message.get("more_body", False):
                await self._end()
                return

    def _tail(self, err: APIError) -> bytes:
        """What ends a started answer cut short, as the single server ends its streams: an SSE error
        event and [DONE], an NDJSON error line (Ollama's); a whole answer cut short just ends."""
        if self.content_type.startswith(b"text/event-stream"):
            return (sse_event(err.body()) + SSE_DONE).encode()
        if self.content_type.startswith(NDJSON.encode()):
            return ndjson_line(err.body_for(OLLAMA_PREFIX)).encode()
        return b""

    async def _end(self) -> None:
        """Read the replica's call to its end, so that Serve counts it finished there."""
        try:
            await asyncio.wait_for(_next_part(self.stream), SCRAPE_TIMEOUT)
        except (StopAsyncIteration, TimeoutError, *_GONE):
            pass
        self.finished = True

    async def _next(self) -> dict[str, Any] | None:
        """The replica's next message; None when it died, stalled or ended too soon."""
        try:
            return await asyncio.wait_for(_next_part(self.stream), self.ingress.stall_timeout)
        except StopAsyncIteration:
            log.warning("replica %s ended a response before its last part", self.replica)
        except TimeoutError:
            log.warning("replica %s sent nothing for %g s; ending the request", self.replica,
                        self.ingress.stall_timeout)
        except Exception as exc:  # the replica died (or its call failed): the request cannot go on
            log.warning("replica %s failed mid-request: %s", self.replica, type(exc).__name__)
        self.ingress.failures.labels("in_flight").inc()
        return None


def _next_part(stream) -> asyncio.Future:
    """The replica stream's next part, as a task whose error is always read. A client that closes its
    connection after the last part, while the ingress still reads the call to its end, cancels that read;
    Serve then ends the task with RequestCancelledError, which asyncio would log as never retrieved."""
    task = asyncio.ensure_future(anext(stream))
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    return task


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _lost() -> APIError:
    return APIError(503, "the replica generating this request stopped (it is being restarted); send the request "
                    "again", type=SERVER, code="replica_lost", headers={"Retry-After": "1"})


def _busy() -> APIError:
    # As a single server's full queue: 429 with Retry-After.
    return APIError(429, "every replica is busy and the line to them is full; retry later", type=RATE_LIMIT,
                    code="queue_full", headers={"Retry-After": "1"})


async def _send_json(send, err: APIError, path: str) -> None:
    body = json.dumps(err.body_for(path)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *((name.lower().encode(), value.encode()) for name, value in err.headers.items())]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
