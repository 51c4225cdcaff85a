"""The server's limits over real sockets, with tiny random models: the KV budget and the queue,
the read timeout for stalled clients, and the drain on SIGTERM (`specwise serve` as a subprocess)."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

import specwise

from specwise import SpecConfig, SpecDecoder, register_drafter
from specwise.server import create_app
from specwise.server.lifecycle import read_timeout_protocol
from specwise.testing import tiny_loaded

from server_helpers import (WAIT_SECONDS, LiveServer, assert_error, gated_factory, greedy, metric, never_ending,
                            sse_chunks, wait_until)
from server_helpers import gate  # noqa: F401  (a fixture: pytest finds it by name)

PROMPT = [5, 6, 7]  # token ids: the KV each request reserves is exact


# --------------------------------------------------------------------------- KV budget and queue

@pytest.fixture
def budgeted(gate):
    """Two gated models, two workers, a budget of 60 tokens and a queue of 1."""
    register_drafter("test-gated", gated_factory)
    decoders = {name: SpecDecoder(never_ending(0), SpecConfig(drafter="test-gated", k=1)) for name in "ab"}
    server = LiveServer(create_app(decoders, workers=2, max_queue=1, kv_budget_tokens=60))
    yield server
    gate.open()
    server.stop()


def _stream_text(url: str, body: dict, into: dict, key: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        with client.stream("POST", "/v1/completions", json=body | {"stream": True}) as response:
            chunks = sse_chunks(response)
    into[key] = ("".join(c["choices"][0]["text"] for c in chunks if isinstance(c, dict) and c["choices"]),
                 chunks[-2]["choices"][0]["finish_reason"], chunks[-1])


def test_kv_budget_queues_then_429_and_refuses_what_never_fits(budgeted, gate):
    server = budgeted
    first = {"model": "a", "prompt": PROMPT, "max_tokens": 37, "temperature": 0}  # reserves 40 of 60
    second = {"model": "b", "prompt": PROMPT, "max_tokens": 27, "temperature": 0}  # 30: does not fit beside it
    results: dict = {}
    threads = [threading.Thread(target=_stream_text, args=(server.url, first, results, "first"))]
    threads[0].start()
    server.wait_for(lambda: server.health()["kv_used_tokens"] == 40, "the first stream to be admitted")
    threads.append(threading.Thread(target=_stream_text, args=(server.url, second, results, "second")))
    threads[1].start()
    # Model b and a worker are free, but the budget is not: the second stream waits.
    server.wait_for(lambda: server.health()["waiting"] == 1, "the second stream to wait")
    samples = server.metrics()
    assert metric(samples, "specwise_kv_budget_tokens") == 60
    assert metric(samples, "specwise_kv_used_tokens") == 40
    assert metric(samples, "specwise_kv_queued_tokens") == 30
    assert metric(samples, "specwise_queue_waiting") == 1
    assert metric(samples, "specwise_requests_running") == 1

    busy = server.http.post("/v1/completions", json={"model": "b", "prompt": PROMPT, "max_tokens": 4})
    assert_error(busy, 429, fragment="max_queue=1", code="queue_full")
    assert busy.headers["retry-after"] == "1"

    # Larger than the whole budget: refused at once, never cut short; the prompt alone too.
    oversize = server.http.post("/v1/completions", json={"model": "a", "prompt": PROMPT, "max_tokens": 58})
    error = assert_error(oversize, 400, "max_tokens", "needs 61 tokens of KV cache", "kv_budget_exceeded")
    assert "budget of 60 tokens" in error["message"] and "--kv-budget-tokens" in error["message"]
    assert_error(server.http.post("/v1/completions", json={"model": "a", "prompt": [5] * 70}), 400,
                 code="kv_budget_exceeded")

    gate.open()
    for thread in threads:
        thread.join(30)
    reference = SpecDecoder(never_ending(0), SpecConfig(drafter="none"))
    for key, body in (("first", first), ("second", second)):
        text, finish_reason, done = results[key]
        assert text == reference.generate(PROMPT, greedy(body["max_tokens"])).text, key
        assert finish_reason == "length" and done == "[DONE]"
    server.wait_for(lambda: server.health()["kv_used_tokens"] == 0, "the budget to be free again")


def test_default_budget_lets_every_request_the_context_allows_run():
    decoder = SpecDecoder(tiny_loaded(0), SpecConfig(drafter="ngram"))
    app = create_app({"tiny": decoder}, workers=2)
    assert app.state.scheduler.kv_budget_tokens == 2 * decoder.runner.max_context


# --------------------------------------------------------------------------- read timeout

READ_TIMEOUT = 0.5


@pytest.fixture(scope="module")
def timed():
    server = LiveServer(create_app({"tiny": SpecDecoder(tiny_loaded(0), SpecConfig(drafter="ngram"))}),
                        http=read_timeout_protocol(READ_TIMEOUT))
    yield server
    server.stop()


# asyncio runs a timer up to its clock resolution early (BaseEventLoop._run_once)
TIMER_SLACK = 0.01


def _stalled(port: int, sent: bytes) -> tuple[socket.socket, float]:
    """A connection that sends `sent` (perhaps nothing) and then nothing more, with the time before it
    connected: the server's deadline runs from the connection while the request line is incomplete."""
    started = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port))
    if sent:
        sock.sendall(sent)
    return sock, started


def _closed_without_answer(sock: socket.socket) -> float:
    """When the server closed the connection (time.monotonic()), having sent nothing on it. The wait is
    bounded only as a hang guard: how soon the close comes depends on the machine, so it is not checked."""
    sock.settimeout(WAIT_SECONDS)
    try:
        received = sock.recv(4096)
    except TimeoutError:
        raise AssertionError(f"a stalled connection was still open after {WAIT_SECONDS} s") from None
    assert received == b"", f"a stalled client got an answer: {received[:200]!r}"
    return time.monotonic()


def test_stalled_clients_are_closed_while_others_are_served(timed, caplog):
    caplog.set_level(logging.INFO, logger="specwise.server")
    port = int(timed.url.rsplit(":", 1)[1])
    stalled = [_stalled(port, b"POST /v1/comple"),  # in the request line
               _stalled(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"),  # in the headers
               _stalled(port, b""),  # silent from the start
               _stalled(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              b"Content-Length: 200\r\n\r\n{\"model\": \"tiny\", ")]  # in the body
    # Meanwhile another client is served normally.
    response = timed.http.post("/v1/completions", json={"model": "tiny", "prompt": "abc", "max_tokens": 4})
    assert response.status_code == 200
    for sock, started in stalled:
        with sock:
            # Closed by the read timeout: never before it has run out, and with its log line, not by an error.
            assert _closed_without_answer(sock) - started >= READ_TIMEOUT - TIMER_SLACK
    closings = [r.getMessage() for r in caplog.records if "--read-timeout" in r.getMessage()]
    assert len(closings) == len(stalled), closings
    assert all(f"no complete request within {READ_TIMEOUT:g} s" in message for message in closings), closings
    # A client that sends its request in pieces, each in time, is served.
    with socket.create_connection(("127.0.0.1", port)) as slow:
        body = json.dumps({"model": "tiny", "prompt": "abc", "max_tokens": 2}).encode()
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body))
        for piece in (head[:20], head[20:], body[:10], body[10:]):
            slow.sendall(piece)
            time.sleep(0.1)
        slow.settimeout(10)
        answer = b""
        while chunk := slow.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert timed.health()["status"] == "ok"


# --------------------------------------------------------------------------- SIGTERM

LAUNCHER = """
import os, sys, time
from specwise import DraftProposal, register_drafter
from specwise.cli import main

HOLD = os.environ["TEST_HOLD_FILE"]


class Slow:  # plain decoding at about 20 tokens/s; from a generation's third step on, held while HOLD exists
    name = "test-slow"

    def start(self, prompt_ids, sampling, generator):
        self.steps = 0

    def propose(self, context, k):
        self.steps += 1
        while self.steps > 2 and os.path.exists(HOLD):
            time.sleep(0.01)
        time.sleep(0.05)
        return DraftProposal.empty()

    def observe(self, result):
        pass


register_drafter("test-slow", lambda context: Slow())
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "target"
    loaded = tiny_loaded(0)
    loaded.model.save_pretrained(path)
    loaded.tokenizer.save_pretrained(path)
    return path


def _prompt_that_runs_long(max_tokens: int) -> list[int]:
    """A prompt whose greedy output does not end before max_tokens (a random model may emit EOS)."""
    decoder = SpecDecoder(tiny_loaded(0), SpecConfig(drafter="none"))
    for first in range(5, 40):
        prompt = [first, first + 1, first + 2]
        if decoder.generate(prompt, greedy(max_tokens)).finish_reason == "length":
            return prompt
    raise AssertionError("no prompt runs to max_tokens")


def test_sigterm_drains_then_ends_what_is_left_and_exits_0(tmp_path, model_dir):
    prompt = _prompt_that_runs_long(300)
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    # Every generation stops at its third step until the test removes this file: the short stream is then
    # certainly still running when the others are queued and SIGTERM comes, however fast the machine is.
    hold = tmp_path / "hold"
    hold.touch()
    process = subprocess.Popen(
        [sys.executable, str(launcher), "serve", "--target", str(model_dir), "--drafter", "test-slow",
         "--dtype", "float32", "--threads", "1", "--port", "0", "--shutdown-grace", "3",
         "--max-batch", "1"],  # one request at a time, so that the others wait
        stderr=subprocess.PIPE, text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(Path(specwise.__file__).parents[1]),
                          "TEST_HOLD_FILE": str(hold)})
    log_lines: list[str] = []
    try:
        port = None
        deadline = time.monotonic() + 120
        while port is None:
            assert time.monotonic() < deadline and process.poll() is None, "".join(log_lines)
            line = process.stderr.readline()
            log_lines.append(line)
            if found := re.search(r"running on http://127\.0\.0\.1:(\d+)", line):
                port = int(found.group(1))
        reader = threading.Thread(target=lambda: log_lines.extend(process.stderr), daemon=True)
        reader.start()
        url = f"http://127.0.0.1:{port}"
        model = str(model_dir)
        body = {"model": model, "prompt": prompt, "temperature": 0}
        results: dict = {}

        def stream(key: str, max_tokens: int) -> None:
            with httpx.Client(base_url=url, timeout=60) as client:
                with client.stream("POST", "/v1/completions", json=body | {"max_tokens": max_tokens,
                                                                           "stream": True}) as response:
                    results[key] = []
                    for line in response.iter_lines():
                        if line.startswith("data: "):
                            data = line[6:]
                            results[key].append(data if data == "[DONE]" else json.loads(data))

        def waiting() -> None:
            with httpx.Client(base_url=url, timeout=60) as client:
                results["waiting"] = client.post("/v1/completions", json=body | {"max_tokens": 300})

        http = httpx.Client(base_url=url, timeout=30)
        short = threading.Thread(target=stream, args=("short", 10))  # held, then finishes within the grace period
        short.start()
        wait_until(lambda: results.get("short"), "the short stream's first token")
        cut = threading.Thread(target=stream, args=("cut", 300))  # runs past the grace period
        cut.start()
        wait_until(lambda: http.get("/health").json()["waiting"] == 1, "the long stream to wait")
        queued = threading.Thread(target=waiting)  # still waiting when the grace period ends
        queued.start()
        wait_until(lambda: http.get("/health").json()["waiting"] == 2, "the non-streaming request to wait")

        process.send_signal(signal.SIGTERM)
        wait_until(lambda: http.get("/health").status_code == 503, "the server to start draining")
        assert http.get("/health").json()["status"] == "draining"
        refused = httpx.post(url + "/v1/completions", json=body | {"max_tokens": 4}, timeout=30)
        assert_error(refused, 503, fragment="shutting down", code="server_shutting_down")
        hold.unlink()  # the short stream finishes; the long one starts and is still running when the grace ends
        http.close()

        assert process.wait(timeout=30) == 0
        for thread in (short, cut, queued):
            thread.join(10)
    finally:
        if process.poll() is None:
            process.kill()
    short_chunks, cut_chunks = results["short"], results["cut"]
    assert short_chunks[-1] == "[DONE]" and short_chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert not any("error" in c for c in short_chunks[:-1])
    assert cut_chunks[-1] == "[DONE]"
    assert cut_chunks[-2]["error"]["code"] == "server_shutting_down", cut_chunks[-2]
    assert any(c.get("choices") and c["choices"][0]["text"] for c in cut_chunks[:-2])  # it was mid-stream
    assert_error(results["waiting"], 503, fragment="shutting down", code="server_shutting_down")
    log = "".join(log_lines)
    assert "Traceback" not in log, log
