"""`specwise serve --replicas 2` as a subprocess (its own local Ray), on a tiny model saved to disk: it serves
over loopback, and SIGTERM stops it cleanly (exit 0, no traceback) within a bounded time, draining first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray", reason="Ray Serve is not installed: pip install specwise[ray]")

from specwise import SpecConfig, SpecDecoder  # noqa: E402
from specwise.server.ray.ingress import REPLICA_HEADER  # noqa: E402
from specwise.testing import tiny_loaded  # noqa: E402

from ray_apps import HOLD_ENV  # noqa: E402
from ray_cluster import free_port, wait_for_replicas  # noqa: E402
from server_helpers import assert_error, greedy, wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BOUND = 300.0  # seconds for the server to come up or to stop (a hang guard: Ray schedules slowly on a busy machine)

def _read_until_serving(server: subprocess.Popen) -> tuple[list[str], threading.Event, threading.Thread]:
    """Collect the server's output lines in a thread (returned); the event is set once it says it is serving."""
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in server.stdout:
            lines.append(line)
            if "serving on Ray Serve" in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, ready, reader



@pytest.mark.slow
def test_serve_with_replicas_answers_and_stops_on_sigterm(tmp_path):
    model = tiny_loaded(0)
    model.model.save_pretrained(tmp_path)
    model.tokenizer.save_pretrained(tmp_path)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    server = subprocess.Popen([sys.executable, "-m", "specwise.cli", "serve", "--target", str(tmp_path),
                               "--drafter", "ngram", "--replicas", "2", "--threads-per-replica", "1",
                               "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    lines, ready, reader = _read_until_serving(server)
    try:
        assert ready.wait(BOUND), "the server did not come up:\n" + "".join(lines[-30:])
        wait_for_replicas(f"http://127.0.0.1:{port}", 2, BOUND)  # Serve's proxy comes up after it says so
        body = {"model": str(tmp_path), "prompt": "abc", "max_tokens": 8, "temperature": 0}
        response = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=BOUND)
        assert response.status_code == 200, response.text
        assert response.headers[REPLICA_HEADER]
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=BOUND).json()
        assert health["status"] == "ok" and len(health["replicas"]) == 2
        server.send_signal(signal.SIGTERM)
        assert server.wait(BOUND) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(BOUND)
        reader.join(BOUND)
    assert not any("Traceback" in line for line in lines), "".join(lines[-40:])


@pytest.mark.slow
def test_sigterm_lets_a_stream_finish_refuses_new_requests_and_exits_0(tmp_path):
    """The drain (specwise.server.ray.ingress.Ingress.drain): a stream in flight at SIGTERM runs to its end, one
    still running when the grace period is over ends with an error event, new requests get 503."""
    model = tiny_loaded(0)
    model.model.save_pretrained(tmp_path / "model")
    model.tokenizer.save_pretrained(tmp_path / "model")
    decoder = SpecDecoder(tiny_loaded(0), SpecConfig(drafter="none"))
    # A prompt whose greedy answer runs to 300 tokens (a random model may emit EOS): both streams are in
    # flight at SIGTERM, and the long one runs past the grace period (300 steps of 0.05 s).
    prompt = next(p for p in ([i, i + 1, i + 2] for i in range(5, 40))
                  if decoder.generate(p, greedy(300)).finish_reason == "length")
    hold = tmp_path / "hold"  # generations stop at their third step until the test removes it (ray_apps)
    hold.touch()
    port = free_port()
    paths = (str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), HOLD_ENV: str(hold)}
    grace = 8
    server = subprocess.Popen([sys.executable, "-c", "import sys, ray_apps; sys.exit(ray_apps.cli_main(sys.argv[1:]))",
                               "serve", "--target", str(tmp_path / "model"), "--drafter", "test-held",
                               "--dtype", "float32", "--replicas", "2", "--threads-per-replica", "1",
                               "--max-batch", "2", "--port", str(port), "--shutdown-grace", str(grace)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, ready, reader = _read_until_serving(server)
    url = f"http://127.0.0.1:{port}"
    results: dict[str, list] = {}
    started = {name: threading.Event() for name in ("short", "long")}

    def stream(name: str, max_tokens: int) -> None:
        body = {"model": str(tmp_path / "model"), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "stream": True, "user": name}
        with httpx.Client(base_url=url, timeout=BOUND) as http, http.stream("POST", "/v1/completions",
                                                                             json=body) as response:
            assert response.status_code == 200
            events: list = []
            results[name] = events
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
                    started[name].set()

    threads = [threading.Thread(target=stream, args=("short", 12), daemon=True),
               threading.Thread(target=stream, args=("long", 300), daemon=True)]
    try:
        assert ready.wait(BOUND), "the server did not come up:\n" + "".join(lines[-30:])
        wait_for_replicas(url, 2, BOUND)
        for thread in threads:
            thread.start()
        for name, event in started.items():
            assert event.wait(BOUND), f"the {name} stream never started"
        server.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        with httpx.Client(base_url=url, timeout=BOUND) as http:
            wait_until(lambda: http.get("/health").status_code == 503, "the server to start draining", BOUND)
            refused = http.post("/v1/completions", json={"model": str(tmp_path / "model"), "prompt": "x",
                                                         "max_tokens": 2})
        assert_error(refused, 503, fragment="shutting down", code="server_shutting_down")
        hold.unlink()  # the short stream finishes; the long one is still going when the grace period ends
        assert server.wait(BOUND) == 0
        assert time.monotonic() - signalled < grace + BOUND / 2
        for thread in threads:
            thread.join(BOUND)
    finally:
        hold.unlink(missing_ok=True)
        if server.poll() is None:
            server.kill()
            server.wait(BOUND)
        reader.join(BOUND)
    short, long = results["short"], results["long"]
    assert short[-1] == "[DONE]" and not any("error" in event for event in short[:-1]), short[-3:]
    expected = decoder.generate(prompt, greedy(12))
    assert "".join(c["choices"][0]["text"] for c in short[:-1] if c.get("choices")) == expected.text
    assert short[-2]["choices"][0]["finish_reason"] == expected.finish_reason
    assert long[-1] == "[DONE]" and long[-2]["error"]["code"] == "server_shutting_down", long[-3:]
    with pytest.raises(httpx.TransportError):  # the port is closed
        httpx.get(url + "/health", timeout=5)
    assert not any("Traceback" in line for line in lines), "".join(lines[-40:])
