"""Set-up shared by the Ray Serve tests: a local Ray for a test module, the application deployed patiently,
and a bounded wait until Serve's HTTP proxy answers with every replica (a busy machine brings it up late).

Import it after `pytest.importorskip("ray")`, and set Ray's environment (RAY_USAGE_STATS_ENABLED, ...)
before that: Ray reads it when imported.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import ray
from ray import serve

from specwise.server.ray.deploy import deploy
from server_helpers import wait_until

ROOT = Path(__file__).resolve().parent.parent
BOUND = 60.0  # seconds: the bound on any set-up step awaited here (a hang guard, not a speed requirement)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def local_ray(**env: str) -> Iterator[None]:
    """A local Ray (2 CPUs, no dashboard, a small object store, on 127.0.0.1) whose workers import this
    checkout and the tests' modules, with `env` set for it and them; Serve and Ray shut down at the end and
    the environment restored."""
    paths = [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    env = {"PYTHONPATH": os.pathsep.join(p for p in paths if p), **env}  # the replicas inherit it
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 << 20, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    try:
        yield
    finally:
        serve.shutdown()
        ray.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def deploy_patiently(app, port: int | None = None, attempts: int = 3) -> str:
    """Serve's proxy and the application, started again (bounded) when a busy machine kills an actor
    before it is up: the set-up's failure, not a finding of these tests. port: a free one when None
    (a proxy already running keeps its own)."""
    for _ in range(attempts - 1):
        try:
            return deploy(app, host="127.0.0.1", port=port or free_port())
        except Exception:  # noqa: BLE001: Ray's actor and start-up errors have no common base class
            serve.shutdown()
            time.sleep(2.0)
    return deploy(app, host="127.0.0.1", port=port or free_port())  # the last attempt's error is the test's


def health(http: httpx.Client) -> dict[str, dict]:
    """The replicas the ingress's /health names ({} while the proxy refuses connections, or answers
    otherwise than the ingress would: Serve's proxy comes up after serve.run returns, and says 503 in
    plain text until its routes are in)."""
    try:
        response = http.get("/health")
        return response.json()["replicas"] if response.status_code == 200 else {}
    except (httpx.TransportError, ValueError, KeyError):
        return {}


def wait_for_replicas(url: str, count: int, bound: float = BOUND) -> list[str]:
    """Wait (at most `bound` seconds) until Serve's proxy at `url` answers /health with `count` replicas."""
    with httpx.Client(base_url=url, timeout=bound) as http:
        wait_until(lambda: len(health(http)) == count, f"the proxy at {url} to answer with {count} replicas",
                   bound)
        return sorted(health(http))
