"""What one request may ask and one client may hold, over real sockets with tiny random models.

- every setting a request may send is bounded: past its range, a 400 naming the param, before
  any SSE byte; a step's draft is capped by the operator (--max-draft-tokens);
- settings that choose weights are the operator's: a request asking for others is refused and
  nothing is loaded;
- drafters of distinct settings are pooled with a bound, and the suffix drafters of a batching
  decoder keep earlier requests in one store under one bound;
- messages show no server path; a prompt that cannot fit is refused before it is tokenized;
- a client's share of the KV budget, workers and line; a whole-body deadline; a connection limit;
  a client that goes away is a disconnect in /metrics, not a shutdown error.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from specwise import SpecConfig, SpecDecoder, register_drafter
from specwise.drafters.pool import DEFAULT_IDLE_DRAFTERS
from specwise.server import create_app
from specwise.server.limits import ServerLimits
from specwise.server.lifecycle import read_timeout_protocol
from specwise.testing import tiny_loaded
from server_helpers import (LiveServer, assert_error, gated_factory, loaded_and_saved_decoders, metric, never_ending,
                            wait_until)
from server_helpers import gate  # noqa: F401  (a fixture: pytest finds it by name)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The tiny model given loaded ("tiny") and from a directory ("dir"), default limits."""
    decoders = loaded_and_saved_decoders(tmp_path_factory.mktemp("dense"))
    server = LiveServer(create_app(decoders, max_queue=4))
    server.decoders = decoders
    yield server
    server.stop()


# --------------------------------------------------------------------------- bounded settings

@pytest.mark.parametrize("extra, param", [
    ({"speculative": {"ngram_max": 1_000_000}}, "speculative.ngram_max"),
    ({"speculative": {"ngram_min": 1000, "ngram_max": 1000}}, "speculative.ngram_min"),
    ({"stop": [str(i) for i in range(5)]}, "stop"),
    ({"stop": "x" * 1000}, "stop"),
    ({"stop": ["a", "y" * 1000]}, "stop"),
    ({"user": "u" * 10_000}, "user"),
    ({"speculative": {"k": 40}}, "speculative.k"),  # within k's range, beyond the operator's cap
    ({"speculative": {"adaptive": True, "k_max": 40}}, "speculative.k_max"),
    ({"speculative": {"k_max": 40}}, "speculative.k_max"),  # adaptive "auto": adaptive for greedy requests
    ({"speculative": {"adaptive": "sometimes"}}, "speculative.adaptive"),  # true, false or "auto"
    ({"speculative": {"adaptive": 1}}, "speculative.adaptive"),
    ({"speculative": {"drafter": "suffix", "tree_nodes": 100}}, "speculative.tree_nodes"),
    ({"speculative": {"tree_shape": [8, 4]}}, "speculative.tree_shape"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_an_unbounded_value_is_a_400_naming_the_param(served, extra, param, stream):
    body = {"model": "tiny", "prompt": "abc", "max_tokens": 4, "stream": stream, **extra}
    response = served.http.post("/v1/completions", json=body)
    assert response.headers["content-type"].startswith("application/json")  # before any SSE byte
    error = assert_error(response, 400, param)
    assert "xxxx" not in error["message"] and "yyyy" not in error["message"] and "uuuu" not in error["message"]


def test_the_operator_may_raise_the_draft_cap_and_must_respect_it():
    decoder = SpecDecoder(tiny_loaded(0), SpecConfig(drafter="ngram", k=40))
    with pytest.raises(ValueError, match="--max-draft-tokens"):
        create_app({"tiny": decoder})
    server = LiveServer(create_app({"tiny": decoder}, limits=ServerLimits(max_draft_tokens=48)))
    try:
        response = server.http.post("/v1/completions", json={"model": "tiny", "prompt": "abc", "max_tokens": 2,
                                                             "speculative": {"k": 48}})
        assert response.status_code == 200, response.text
        assert_error(server.http.post("/v1/completions", json={"model": "tiny", "prompt": "abc", "max_tokens": 2,
                                                               "speculative": {"k": 49}}), 400, "speculative.k",
                     "at most 48")
    finally:
        server.stop()


@pytest.mark.parametrize("speculative, param", [
    ({"target_format": "dense"}, "speculative.target_format"),
    ({"target_format": "gguf"}, "speculative.target_format"),
    ({"runner": "hf"}, "speculative.runner"),
    ({"drafter": "draft-model", "draft_quantize": "int8"}, "speculative.draft_quantize"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_a_request_cannot_choose_which_weights_are_loaded(served, speculative, param, stream):
    decoder = served.decoders["dir"]
    targets, runners, before = dict(decoder._targets), dict(decoder._runners), _rss_bytes()
    body = {"model": "dir", "prompt": "abc", "max_tokens": 2, "stream": stream, "speculative": speculative}
    response = served.http.post("/v1/completions", json=body)
    assert response.headers["content-type"].startswith("application/json")
    assert_error(response, 400, param, "operator's choice", "operator_setting")
    assert decoder._targets == targets and decoder._runners == runners  # nothing loaded or made
    assert _rss_bytes() - before < 32 << 20
    # The server's own value may be repeated.
    same = served.http.post("/v1/completions", json=body | {"model": "tiny", "stream": False,
                                                            "speculative": {"runner": "auto"}})
    assert same.status_code == 200, same.text


# --------------------------------------------------------------------------- pooled drafters

def test_distinct_settings_leave_the_drafters_bounded(served):
    decoder = served.decoders["tiny"]
    pairs = [(low, high) for high in range(1, 33) for low in range(1, high + 1)][:150]
    for low, high in pairs:
        response = served.http.post("/v1/completions", json={
            "model": "tiny", "prompt": "abcabc", "max_tokens": 1,
            "speculative": {"ngram_min": low, "ngram_max": high}})
        assert response.status_code == 200, response.text
    drafters = decoder.drafters()
    assert len(drafters) <= DEFAULT_IDLE_DRAFTERS
    # The most recent settings are still pooled: the next request of those reuses its drafter.
    last = next(d for d in drafters if (d.ngram_min, d.ngram_max) == pairs[-1])
    assert decoder.drafter_for(SpecConfig(drafter="ngram", ngram_min=pairs[-1][0], ngram_max=pairs[-1][1])) is last


def test_the_suffix_bound_holds_for_the_whole_batching_decoder():
    limit = 200
    decoder = SpecDecoder(never_ending(0), SpecConfig(drafter="suffix", k=4, suffix_cache_tokens=limit),
                          max_batch=8)
    server = LiveServer(create_app({"tiny": decoder}, max_queue=32))
    try:
        def post(i: int) -> None:
            prompt = [3 + (i * 7 + j) % 60 for j in range(30)]
            response = server.http.post("/v1/completions", json={
                "model": "tiny", "prompt": prompt, "max_tokens": 20, "temperature": 0, "user": f"u{i % 3}"})
            assert response.status_code == 200, response.text

        for wave in range(5):  # eight at once: each wave's generations borrow eight drafters
            threads = [threading.Thread(target=post, args=(wave * 8 + i,)) for i in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
        suffix = [d for d in decoder.drafters() if d.name == "suffix"]
        assert len(suffix) > 1 and len({id(d.store) for d in suffix}) == 1  # many drafters, one store
        samples = server.metrics()
        kept = metric(samples, "specwise_suffix_store_tokens", model="tiny")
        assert 0 < kept <= limit == metric(samples, "specwise_suffix_store_limit_tokens", model="tiny")
    finally:
        server.stop()


# --------------------------------------------------------------------------- errors

@pytest.mark.parametrize("stream", [False, True])
def test_the_eagle_drafter_without_a_head_names_the_param_and_no_server_path(served, tmp_path, monkeypatch,
                                                                              stream):
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path / "home"))
    response = served.http.post("/v1/completions", json={"model": "tiny", "prompt": "abc", "max_tokens": 2,
                                                         "stream": stream, "speculative": {"drafter": "eagle"}})
    assert response.headers["content-type"].startswith("application/json")  # a failure before the first token
    error = assert_error(response, 400, "speculative.drafter", "trained head")
    assert str(Path.home()) not in error["message"] and str(tmp_path) not in error["message"]


def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized(served, monkeypatch):
    decoder = served.decoders["tiny"]
    calls = []
    monkeypatch.setattr(decoder, "encode", lambda *args, **kwargs: calls.append(1) or [])
    huge = "a" * 4_000_000
    for path, body in [("/v1/completions", {"prompt": huge}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": huge}]})]:
        response = served.http.post(path, json={"model": "tiny", "max_tokens": 2, **body})
        assert_error(response, 400, "prompt" if "prompt" in body else "messages", "characters",
                     "context_length_exceeded")
    assert calls == []


# --------------------------------------------------------------------------- fairness and connections

@pytest.fixture
def shared_server(gate):
    """Two API keys, two workers, a budget of 100 tokens and a line of 4, gated generation."""
    register_drafter("test-gated", gated_factory)
    decoder = SpecDecoder(never_ending(0), SpecConfig(drafter="test-gated", k=1), max_batch=2)
    server = LiveServer(create_app({"tiny": decoder}, max_queue=4, kv_budget_tokens=100,
                                   api_key=["greedy-key", "small-key"]))
    yield server
    gate.open()
    server.stop()


def test_a_greedy_client_cannot_keep_another_keys_small_request_at_429(shared_server, gate):
    server = shared_server
    results: dict[str, int] = {}

    def post(name: str, key: str, max_tokens: int) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            response = client.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                                   json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": max_tokens})
        results[name] = response.status_code

    greedy = [threading.Thread(target=post, args=(f"greedy{i}", "greedy-key", 37)) for i in range(8)]
    for thread in greedy:
        thread.start()
    server.wait_for(lambda: len(results) >= 4, "the greedy client's requests past its share to be refused")
    assert server.health()["running"] == 2 and server.health()["waiting"] == 2  # its half of the line
    assert sorted(results.values()) == [429] * 4
    small = threading.Thread(target=post, args=("small", "small-key", 4))
    small.start()
    server.wait_for(lambda: server.health()["waiting"] == 3, "the small request to take a place in line")
    gate.open()
    small.join(120)
    for thread in greedy:
        thread.join(120)
    assert results["small"] == 200
    assert sorted(results[f"greedy{i}"] for i in range(8)) == [200] * 4 + [429] * 4


def test_a_body_trickled_in_time_is_still_timed_out_as_a_whole(served):
    app = create_app({"tiny": SpecDecoder(tiny_loaded(0), SpecConfig(drafter="ngram", k=2))},
                     limits=ServerLimits(body_timeout=1.5))
    server = LiveServer(app, http=read_timeout_protocol(30))
    try:
        port = int(server.url.rsplit(":", 1)[1])
        body = json.dumps({"model": "tiny", "prompt": "abc " * 50, "max_tokens": 2}).encode()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body))
            sock.setblocking(False)
            answer = b""
            sent = 0
            for byte in body:  # each byte well within the 30 s stall timeout
                try:
                    sock.sendall(bytes([byte]))
                    sent += 1
                    answer += sock.recv(4096)
                except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                    pass
                if answer:
                    break
                time.sleep(0.2)
            sock.setblocking(True)
            sock.settimeout(10)
            try:
                while chunk := sock.recv(4096):  # to the end: the server closes the connection
                    answer += chunk
            except (TimeoutError, ConnectionResetError):
                pass
        head, _, rest = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer[:200]
        assert json.loads(rest)["error"]["code"] == "body_timeout"
        assert sent < len(body)  # refused while the body was still arriving
    finally:
        server.stop()


def test_connections_past_the_limit_are_refused_with_a_json_503():
    app = create_app({"tiny": SpecDecoder(tiny_loaded(0), SpecConfig(drafter="ngram", k=2))})
    server = LiveServer(app, http=read_timeout_protocol(30, max_connections=2))
    port = int(server.url.rsplit(":", 1)[1])
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    try:
        with socket.create_connection(("127.0.0.1", port)) as extra:
            extra.settimeout(10)
            answer = b""
            while chunk := extra.recv(4096):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), answer[:200]
        assert json.loads(body)["error"]["code"] == "too_many_connections"
    finally:
        for sock in held:
            sock.close()
    # Once they are closed, the server takes connections again.
    wait_until(lambda: _health_ok(server), "the server to take a connection again")
    server.stop()


def _health_ok(server: LiveServer) -> bool:
    try:
        with httpx.Client(base_url=server.url, timeout=5) as client:
            return client.get("/health").status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def gated_server(gate):
    register_drafter("test-gated", gated_factory)
    server = LiveServer(create_app({"tiny": SpecDecoder(never_ending(0), SpecConfig(drafter="test-gated", k=1))}))
    yield server
    gate.open()
    server.stop()


def test_a_client_that_goes_away_is_a_disconnect_not_a_shutdown_error(gated_server, gate):
    server = gated_server
    with pytest.raises(httpx.ReadTimeout):
        with httpx.Client(base_url=server.url, timeout=httpx.Timeout(30, read=1.0)) as client:
            client.post("/v1/completions", json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 8})
    server.wait_for(lambda: metric(server.metrics(), "specwise_client_disconnects_total") == 1,
                    "the disconnect to be counted")
    gate.open()  # the step in progress ends, and with it the job
    server.wait_for(lambda: server.health()["running"] == 0, "the job to end")
    samples = server.metrics()
    assert not any(name == "specwise_errors_total" and dict(labels).get("code") == "server_shutting_down"
                   for name, labels in samples), samples
