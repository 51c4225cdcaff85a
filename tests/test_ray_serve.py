"""specwise on Ray Serve (specwise.server.ray): two replicas on a local Ray, over real sockets on loopback.

The test starts Ray itself (2 CPUs, no dashboard, a small object store, on 127.0.0.1) and shuts it down.
Each replica runs tests/ray_apps.py's app with one thread; answers are compared with the same app served
by a single process (create_app + LiveServer). Which replica answered is read from the ingress's
`x-specwise-replica` header and from the per-replica counters of the ingress's /metrics.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

BOUND = 60.0  # seconds: the bound on any event awaited here (a hang guard, not a speed requirement)
# Read by Ray when imported: nothing leaves the machine, and Ray binds its own servers to 127.0.0.1.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
pytest.importorskip("ray", reason="Ray Serve is not installed: pip install specwise[ray]")
from ray import serve  # noqa: E402

from specwise.server.affinity import affinity_key, rendezvous_order  # noqa: E402
from specwise.server.ray.deploy import APP_NAME, ENGINE, ReplicaSettings, application  # noqa: E402
from specwise.server.errors import APIError  # noqa: E402
from specwise.server.ray.ingress import REPLICA_HEADER, _Relayed  # noqa: E402

from ray_apps import tiny_app  # noqa: E402
from ray_cluster import deploy_patiently, health, local_ray, wait_for_replicas  # noqa: E402
from server_helpers import LiveServer, metric, wait_until  # noqa: E402


class Cluster:
    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=BOUND)
        self.handle = serve.get_deployment_handle(ENGINE, APP_NAME)

    def metrics(self) -> dict[tuple[str, tuple], float]:
        from prometheus_client.parser import text_string_to_metric_families

        response = self.http.get("/metrics")
        assert response.status_code == 200, response.text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(response.text) for s in family.samples}

    def replicas(self) -> list[str]:
        return sorted(health(self.http))

    def pid(self, replica: str) -> int:
        return self.handle.info.remote(replica=replica).result(timeout_s=BOUND)["pid"]


@pytest.fixture(scope="module")
def cluster():
    with local_ray():
        settings = ReplicaSettings(replicas=2, threads_per_replica=1, overflow_at=4, health_check_period_s=1.0,
                                   graceful_shutdown_timeout_s=2.0)
        url = deploy_patiently(application(tiny_app, settings))
        wait_for_replicas(url, 2)
        cluster = Cluster(url)
        yield cluster
        cluster.http.close()


@pytest.fixture(scope="module")
def single():
    server = LiveServer(tiny_app())
    yield server
    server.stop()


def _users_by_replica(replicas: list[str], per_replica: int) -> dict[str, list[str]]:
    """Users whose requests (no API key) have each replica as their home."""
    homes: dict[str, list[str]] = {replica: [] for replica in replicas}
    for i in range(1000):
        user = f"user-{i}"
        body = json.dumps({"user": user}).encode()
        home = rendezvous_order(affinity_key(None, body), replicas)[0]
        if len(homes[home]) < per_replica:
            homes[home].append(user)
        if all(len(users) == per_replica for users in homes.values()):
            return homes
    raise AssertionError("rendezvous hashing left a replica without users")


def _stream(url: str, path: str, body: dict, events: list, started: threading.Event | None = None) -> str | None:
    """POST a stream; append its events (parsed JSON, or "[DONE]") to `events`; the replica that answered."""
    with httpx.Client(base_url=url, timeout=BOUND) as http, http.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                events.append(data if data == "[DONE]" else json.loads(data))
                if started is not None and len(events) >= 3:
                    started.set()
        return response.headers.get(REPLICA_HEADER)


def _texts(events: list) -> list[str]:
    """What a completion stream's chunks carry, in order (ids and times aside)."""
    return [choice["text"] for event in events if isinstance(event, dict) for choice in event.get("choices", [])]


def test_concurrent_streams_match_a_single_process(cluster, single):
    users = _users_by_replica(cluster.replicas(), 4)
    requests = [{"model": "tiny", "prompt": f"Question {i}: why?", "max_tokens": 24, "temperature": 0,
                 "stream": True, "user": user}
                for i, user in enumerate(u for group in users.values() for u in group)]
    events: list[list] = [[] for _ in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        served = list(pool.map(lambda i: _stream(cluster.url, "/v1/completions", requests[i], events[i]),
                               range(len(requests))))
    assert set(served) == set(users), "each replica should have served its users' streams"
    for request, got in zip(requests, events):
        expected: list = []
        _stream(single.url, "/v1/completions", request, expected)
        assert got[-1] == "[DONE]"
        assert _texts(got) == _texts(expected)
        # Steps may differ: under batching the goodput rule picks draft lengths by what else is in the batch.
        assert got[-2]["choices"][0]["finish_reason"] == expected[-2]["choices"][0]["finish_reason"]


def test_a_conversation_stays_on_one_replica(cluster, single):
    before = cluster.metrics()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    served = []
    for turn in range(3):
        body = {"model": "tiny", "messages": messages, "max_tokens": 12, "temperature": 0}
        response = cluster.http.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"] == single.http.post(
            "/v1/chat/completions", json=body).json()["choices"][0]["message"]
        served.append(response.headers[REPLICA_HEADER])
        messages = messages + [response.json()["choices"][0]["message"], {"role": "user", "content": f"And {turn}?"}]
    assert len(set(served)) == 1
    after = cluster.metrics()
    home = served[0]
    for replica in cluster.replicas():
        grew = sum(value - before.get(key, 0.0) for key, value in after.items()
                   if key[0] == "specwise_generations_total" and ("replica", replica) in key[1]
                   and ("model", "tiny") in key[1])
        assert grew == (3 if replica == home else 0), (replica, grew)
    tenant = {"Authorization": "Bearer tenant-a"}
    keyed = {cluster.http.post("/v1/completions", headers=tenant, json={"model": "tiny", "prompt": prompt,
                                                                        "max_tokens": 4}).headers[REPLICA_HEADER]
             for prompt in ("one", "two", "three")}
    assert len(keyed) == 1, "one tenant's requests should share a replica"


def test_errors_and_refusals_are_the_single_processs(cluster, single):
    for body in ({"model": "tiny", "prompt": "x", "max_tokens": -5},
                 {"model": "nope", "prompt": "x"},
                 {"model": "tiny", "prompt": "x", "speculative": {"k": 1000}}):
        got, expected = (server.post("/v1/completions", json=body) for server in (cluster.http, single.http))
        assert (got.status_code, got.json()) == (expected.status_code, expected.json())
    got = cluster.http.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert got.status_code == 400 and got.json()["error"]["type"] == "invalid_request_error"


def _ndjson(response: httpx.Response) -> list[dict]:
    assert response.headers["content-type"].startswith("application/x-ndjson"), response.headers
    return [json.loads(line) for line in response.text.splitlines() if line]


def test_ollama_routes_are_the_single_processs(cluster, single):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hello there"}],
            "options": {"temperature": 0, "num_predict": 12}}  # streamed: Ollama's default
    got, expected = (_ndjson(server.post("/api/chat", json=body)) for server in (cluster.http, single.http))
    assert [line["message"]["content"] for line in got] == [line["message"]["content"] for line in expected]
    assert got[-1]["done"] and got[-1]["done_reason"] == expected[-1]["done_reason"]
    got, expected = (server.post("/api/chat", json={**body, "model": "nope"}) for server in (cluster.http, single.http))
    assert (got.status_code, got.json()) == (expected.status_code, expected.json())
    assert isinstance(got.json()["error"], str)  # Ollama's shape, not OpenAI's


def test_a_cut_stream_ends_in_its_own_dialect():
    relayed = _Relayed(None, "r", None, "/api/chat")
    lost = APIError(503, "the replica went away", code="replica_lost")
    for content_type, tail in ((b"text/event-stream; charset=utf-8",
                                'data: {"error":{"message":"the replica went away","type":'
                                '"invalid_request_error","param":null,"code":"replica_lost"}}\n\ndata: [DONE]\n\n'),
                               (b"application/x-ndjson", '{"error":"the replica went away"}\n'),
                               (b"application/json", "")):
        relayed.content_type = content_type
        assert relayed._tail(lost).decode() == tail


def test_metrics_show_each_replica_and_the_total(cluster):
    replicas = cluster.replicas()
    cluster.http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
    samples = cluster.metrics()
    for replica in replicas:
        assert ("specwise_queue_waiting", (("replica", replica),)) in samples
        assert ("specwise_kv_budget_tokens", (("replica", replica),)) in samples
    total = metric(samples, "specwise_generations_total", finish_reason="length", model="tiny", replica="all")
    assert total == sum(metric(samples, "specwise_generations_total", finish_reason="length", model="tiny",
                               replica=replica) for replica in replicas) > 0
    assert metric(samples, "specwise_kv_budget_tokens", replica="all") == sum(
        metric(samples, "specwise_kv_budget_tokens", replica=replica) for replica in replicas)
    assert ("specwise_spec_steps_total", (("drafter", "ngram"), ("model", "tiny"), ("replica", "all"))) in samples


def _disconnects(cluster, replica: str) -> float:
    return metric(cluster.metrics(), "specwise_client_disconnects_total", replica=replica)


def test_a_disconnect_cancels_the_generation_on_its_replica(cluster):
    replicas = cluster.replicas()
    before = {replica: _disconnects(cluster, replica) for replica in replicas}
    body = {"model": "endless", "prompt": "abc", "max_tokens": 400, "temperature": 0, "stream": True,
            "user": "leaver"}
    with httpx.Client(base_url=cluster.url, timeout=BOUND) as http:
        with http.stream("POST", "/v1/completions", json=body) as response:
            replica = response.headers[REPLICA_HEADER]
            lines = response.iter_lines()
            for _ in range(3):
                next(lines)
    wait_until(lambda: _disconnects(cluster, replica) == before[replica] + 1, "the disconnect counted", BOUND)
    # The generation ends (and is counted) when its worker next looks, a moment after the disconnect.
    wait_until(lambda: metric(cluster.metrics(), "specwise_generations_total", finish_reason="cancelled",
                              model="endless", replica=replica) >= 1, "the cancelled generation counted", BOUND)
    assert all(_disconnects(cluster, other) == before[other] for other in replicas if other != replica)


@pytest.mark.slow
def test_a_killed_replica_ends_its_streams_and_comes_back(cluster, single):
    replicas = cluster.replicas()
    users = _users_by_replica(replicas, 2)
    victim, survivor = replicas
    long = {"model": "endless", "prompt": "abc", "max_tokens": 400, "temperature": 0, "stream": True}
    short = {"model": "endless", "prompt": "abc", "max_tokens": 40, "temperature": 0, "stream": True}
    jobs = [(victim, {**long, "user": user}) for user in users[victim]] + \
           [(survivor, {**short, "user": user}) for user in users[survivor]]
    events: list[list] = [[] for _ in jobs]
    started = [threading.Event() for _ in jobs]
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(_stream, cluster.url, "/v1/completions", body, events[i], started[i])
                   for i, (_, body) in enumerate(jobs)]
        for event in started:
            assert event.wait(BOUND), "a stream never started"
        os.kill(cluster.pid(victim), signal.SIGKILL)
        killed = time.monotonic()
        served = [future.result(timeout=BOUND) for future in futures]
    assert served == [replica for replica, _ in jobs]
    assert time.monotonic() - killed < BOUND
    expected: list = []
    _stream(single.url, "/v1/completions", short, expected)
    for (replica, _), got in zip(jobs, events):
        assert got[-1] == "[DONE]"
        if replica == victim:
            assert got[-2]["error"]["code"] == "replica_lost", got[-2]
        else:
            assert _texts(got) == _texts(expected)
            assert got[-2]["choices"][0]["finish_reason"] == "length"
    # A request whose home was the dead replica is served elsewhere, never lost.
    orphan = {"model": "tiny", "prompt": "orphan", "max_tokens": 8, "temperature": 0, "user": users[victim][0]}
    response = cluster.http.post("/v1/completions", json=orphan)
    assert response.status_code == 200 and response.headers[REPLICA_HEADER] != victim
    wait_until(lambda: len(cluster.replicas()) == 2 and victim not in cluster.replicas(), "a new replica",
               2 * BOUND)
    newcomer = next(replica for replica in cluster.replicas() if replica != survivor)
    user = _users_by_replica([survivor, newcomer], 1)[newcomer][0]
    body = {"model": "tiny", "prompt": "again", "max_tokens": 8, "temperature": 0, "user": user}
    response = cluster.http.post("/v1/completions", json=body)
    assert response.status_code == 200 and response.headers[REPLICA_HEADER] == newcomer
    assert response.json()["choices"][0]["text"] == single.http.post(
        "/v1/completions", json=body).json()["choices"][0]["text"]
