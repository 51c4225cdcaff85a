"""Running the app under uvicorn: a graceful drain on SIGTERM, and a read timeout for slow clients.

uvicorn alone, on SIGTERM, stops listening, waits a fixed time, then cancels
the handlers (streams cut with no error event, waiting requests answered with
a plain-text 500) and re-raises the signal (exit status 143). Here the first
SIGTERM or SIGINT runs the app's `drain(grace)` while still listening (new
requests get a JSON 503), then uvicorn shuts down with nothing left in flight
and the process exits 0. A second signal stops at once, as uvicorn does.

uvicorn's keep-alive timeout only starts after a response; a connection that
sends nothing, or half a request, would be held forever. `ReadTimeoutH11`
closes it: the request line and headers must arrive within `read_timeout`
seconds of the connection (or of the first byte of a later request), and a
body must not stall for longer than that. It also bounds the connections open
at once: one past `max_connections` is answered with a JSON 503 and closed
before anything is read from it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from types import FrameType

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("specwise.server")


class ReadTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol, closing connections whose request does not arrive in time."""

    read_timeout: float  # set by read_timeout_protocol
    max_connections: int | None = None
    open_connections: list[int]  # one count shared by the connections of one server (a list: mutable)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._read_timer: asyncio.TimerHandle | None = None
        self._counted = False
        if self.max_connections is not None and self.open_connections[0] >= self.max_connections:
            transport.write(_TOO_MANY)
            transport.close()
            log.warning("refused a connection: %d open, the most allowed (--max-connections)",
                        self.open_connections[0])
            return
        self.open_connections[0] += 1
        self._counted = True
        super().connection_made(transport)
        self._arm()  # a fresh connection must send its request in time too

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.IDLE:  # headers incomplete: a deadline from their first byte, not reset
            if self._read_timer is None:
                self._arm()
        elif state is h11.SEND_BODY:  # the body: it may be slow, but must not stall
            self._arm()
        else:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._counted:  # refused in connection_made: uvicorn never saw it
            return
        self.open_connections[0] -= 1
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(self.read_timeout, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        log.info("closing the connection from %s: no complete request within %g s (--read-timeout)",
                 "%s:%d" % self.client if self.client else "a client", self.read_timeout)
        self.transport.close()


def _refusal_bytes() -> bytes:
    body = json.dumps({"error": {"message": "the server has as many connections open as it allows "
                                            "(--max-connections); retry later", "type": "server_error",
                                 "param": None, "code": "too_many_connections"}}).encode()
    head = ("HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
            f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n").encode()
    return head + body


_TOO_MANY = _refusal_bytes()


def read_timeout_protocol(seconds: float, max_connections: int | None = None) -> type[ReadTimeoutH11]:
    """ReadTimeoutH11 with its timeout and connection limit set (uvicorn builds protocols from a class);
    each call makes a class with a count of its own, for one server."""
    if not seconds > 0:
        raise ValueError(f"read_timeout must be a number of seconds > 0; got {seconds!r}")
    if max_connections is not None and (not isinstance(max_connections, int) or max_connections < 1):
        raise ValueError(f"max_connections must be an integer >= 1 or None; got {max_connections!r}")
    return type("ReadTimeoutH11", (ReadTimeoutH11,), {"read_timeout": float(seconds),
                                                      "max_connections": max_connections,
                                                      "open_connections": [0]})


class GracefulServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM/SIGINT drains the app before shutting down."""

    def __init__(self, config: uvicorn.Config, drain: Callable[[float], Awaitable[None]], grace: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.grace = grace
        self._drain_asked = False
        self._drain_task: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_asked:  # a second signal: stop now, as plain uvicorn does
            super().handle_exit(sig, frame)
            self.force_exit = True
            return
        # Not recorded as a captured signal: uvicorn would raise it again once shut down, and the
        # process would end with the signal's status instead of 0.
        self._drain_asked = True
        log.info("received %s: draining", signal.Signals(sig).name)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if sockets and self.started:  # uvicorn announces only the sockets it bound itself
            host, port = sockets[0].getsockname()[:2]
            logging.getLogger("uvicorn.error").info(
                "Uvicorn running on http://%s:%d (Press CTRL+C to quit)", f"[{host}]" if ":" in host else host, port)

    async def on_tick(self, counter: int) -> bool:
        if self._drain_asked and self._drain_task is None:
            self._drain_task = asyncio.create_task(self._drain())
        return await super().on_tick(counter)

    async def _drain(self) -> None:
        try:
            await self.drain(self.grace)
        except Exception:
            log.exception("draining failed; shutting down")
        finally:
            self.should_exit = True


def server_config(app, *, host: str, port: int, read_timeout: float, max_connections: int | None = None,
                  log_level: str = "info") -> uvicorn.Config:
    # The drain has already ended every generation; what remains is sending the last bytes.
    return uvicorn.Config(app, host=host, port=port, log_level=log_level,
                          http=read_timeout_protocol(read_timeout, max_connections), timeout_graceful_shutdown=5)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, made before the models load, so that a port in use is reported
    at once (OSError) rather than after minutes of loading."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's own bind
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def serve(app, *, host: str, port: int, shutdown_grace: float, read_timeout: float,
          max_connections: int | None = None, sock: socket.socket | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then drain (`app.state.drain`) and return; on `sock` when given
    (bound by `bind` before the app was built)."""
    config = server_config(app, host=host, port=port, read_timeout=read_timeout, max_connections=max_connections)
    GracefulServer(config, app.state.drain, shutdown_grace).run(sockets=[sock] if sock is not None else None)
