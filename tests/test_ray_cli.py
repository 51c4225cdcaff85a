"""`specwise serve --replicas 2` as a subprocess (its own local Ray), on a tiny model saved to disk: it serves
over loopback, and SIGTERM stops it cleanly (exit 0, no traceback) within a bounded time."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray", reason="Ray Serve is not installed: pip install specwise[ray]")

from specwise.server.ray_serve import REPLICA_HEADER  # noqa: E402
from specwise.testing import tiny_loaded  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BOUND = 120.0  # seconds for the server to come up or to stop (a hang guard)


@pytest.mark.slow
def test_serve_with_replicas_answers_and_stops_on_sigterm(tmp_path):
    model = tiny_loaded(0)
    model.model.save_pretrained(tmp_path)
    model.tokenizer.save_pretrained(tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    server = subprocess.Popen([sys.executable, "-m", "specwise.cli", "serve", "--target", str(tmp_path),
                               "--drafter", "ngram", "--replicas", "2", "--threads-per-replica", "1",
                               "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in server.stdout:
            lines.append(line)
            if "serving on Ray Serve" in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(BOUND), "the server did not come up:\n" + "".join(lines[-30:])
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
