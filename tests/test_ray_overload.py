"""Overload with replicas on Ray Serve: a request beyond Ray Serve's line in front of the replicas gets 429
`queue_full` with Retry-After and an OpenAI-style body (the ingress maps Serve's BackPressureError to the
single server's answer to a full queue).

Two replicas on a local Ray started here (2 CPUs, 127.0.0.1), each serving tests/ray_apps.py's held_app:
one request generated at a time, one more waiting, and generations held by a file (HOLD) until the test
removes it, so that what is running and waiting is known exactly, however fast or slow the machine.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import httpx
import pytest

BOUND = 60.0  # seconds: the bound on any event awaited here (a hang guard, not a speed requirement)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
pytest.importorskip("ray", reason="Ray Serve is not installed: pip install specwise[ray]")
from ray import serve  # noqa: E402

from specwise.server.ray.deploy import APP_NAME, ReplicaSettings, application  # noqa: E402
from specwise.server.ray.ingress import REPLICA_HEADER  # noqa: E402

from ray_apps import HOLD_ENV, held_app  # noqa: E402
from ray_cluster import deploy_patiently, free_port, local_ray, wait_for_replicas  # noqa: E402
from server_helpers import assert_error, wait_until  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_local(tmp_path_factory):
    hold = tmp_path_factory.mktemp("hold") / "hold"
    try:
        with local_ray(**{HOLD_ENV: str(hold)}):  # set before Ray starts: every replica inherits it
            yield hold, free_port()
    finally:
        hold.unlink(missing_ok=True)


class Held:
    """Two replicas of held_app, deployed for one test; requests sent in threads and their answers."""

    def __init__(self, hold: Path, port: int, max_ongoing_requests: int) -> None:
        self.hold = hold
        hold.touch()
        settings = ReplicaSettings(replicas=2, threads_per_replica=1, max_ongoing_requests=max_ongoing_requests,
                                   overflow_at=1, health_check_period_s=1.0, graceful_shutdown_timeout_s=2.0)
        self.url = deploy_patiently(application(held_app, settings), port=port)
        wait_for_replicas(self.url, 2)
        self.http = httpx.Client(base_url=self.url, timeout=BOUND)
        self.threads: list[threading.Thread] = []
        self.answers: list[httpx.Response] = []

    def send(self, user: str, stream: bool = False) -> threading.Event:
        """POST a request in a thread; the event is set once its answer's headers are in."""
        body = {"model": "held", "prompt": "abc", "max_tokens": 6, "temperature": 0, "user": user, "stream": stream}
        started = threading.Event()

        def post() -> None:
            with httpx.Client(base_url=self.url, timeout=BOUND) as http:
                with http.stream("POST", "/v1/completions", json=body) as response:
                    started.set()
                    response.read()
                self.answers.append(response)

        thread = threading.Thread(target=post, daemon=True)
        thread.start()
        self.threads.append(thread)
        return started

    def release(self) -> list[httpx.Response]:
        """Let the held generations go on; every answer, once all are in."""
        self.hold.unlink(missing_ok=True)
        for thread in self.threads:
            thread.join(BOUND)
        assert not any(thread.is_alive() for thread in self.threads), "a request never ended"
        return self.answers

    def close(self) -> None:
        self.hold.unlink(missing_ok=True)
        for thread in self.threads:
            thread.join(BOUND)
        self.http.close()
        serve.delete(APP_NAME)


def _assert_queue_full(response: httpx.Response, fragment: str) -> None:
    error = assert_error(response, 429, fragment=fragment, code="queue_full")
    assert error["type"] == "rate_limit_error"
    assert response.headers["retry-after"] == "1"
    assert response.headers["content-type"].startswith("application/json")


def test_a_full_serve_line_answers_429_from_the_ingress(ray_local):
    hold, port = ray_local
    # Each replica takes 1 (below its engine's 2): the rest wait in Serve's line, max_queued_requests = 4 x 1.
    held = Held(hold, port, max_ongoing_requests=1)
    try:
        # Nothing may ask the replicas anything while they are full (a /health scrape would wait in Serve's
        # line too): two streams, each started on its own replica, show that both are taken.
        for user in ("first", "second"):
            assert held.send(user, stream=True).wait(BOUND), "a stream never started"
        extra = 7
        for i in range(extra):
            held.send(f"extra-{i}")
        # Serve's line holds 4; every request beyond it is refused at once, whatever the order they came in.
        wait_until(lambda: len(held.answers) == extra - 4, "the requests beyond Serve's line to be refused", BOUND)
        for response in list(held.answers):
            _assert_queue_full(response, "every replica is busy")
            assert REPLICA_HEADER not in response.headers  # no replica took it
        answers = held.release()
        assert sorted(r.status_code for r in answers) == [200] * 6 + [429] * (extra - 4)
        assert sum(r.text.endswith("data: [DONE]\n\n") for r in answers) == 2  # the two streams, whole
    finally:
        held.close()
