"""The pieces of the Ray Serve deployment that need no Ray: affinity keys, rendezvous hashing, merging the
replicas' metrics, relaying an app's answer, and the replica options of `specwise serve`."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specwise.cli import build_parser
from specwise.server import cli as server_cli
from specwise.server.affinity import affinity_key, rendezvous_order
from specwise.server.metrics_merge import merge_metrics
from specwise.server.relay import ForwardedRequest, relay


def _key(body: dict, authorization: str | None = None) -> str | None:
    return affinity_key(authorization, json.dumps(body).encode())


def test_affinity_key_prefers_tenant_then_user_then_conversation():
    turn1 = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]}
    turn2 = {"messages": turn1["messages"] + [{"role": "assistant", "content": "yo"},
                                              {"role": "user", "content": "more"}]}
    assert _key(turn1) == _key(turn2) is not None  # a conversation's turns share its opening
    assert _key(turn1) != _key({"messages": [{"role": "user", "content": "other"}]})
    assert _key({**turn1, "user": "u"}) == _key({**turn2, "user": "u"}) != _key(turn1)
    assert _key(turn1, "Bearer k1") == _key({"prompt": "x"}, "Bearer k1") != _key(turn1, "Bearer k2")
    assert _key({"prompt": "x", "user": "a"}, "Bearer k1") != _key({"prompt": "x", "user": "b"}, "Bearer k1")
    assert "k1" not in (_key(turn1, "Bearer k1") or "")
    assert _key({"prompt": "abc" * 1000}) == _key({"prompt": "abc" * 1000 + "more"})
    assert affinity_key(None, b"not json") is None and _key({"prompt": ""}) is None


def test_rendezvous_hashing_moves_only_the_keys_of_the_replicas_lost_and_gained():
    keys = [f"key-{i}" for i in range(300)]
    before = {key: rendezvous_order(key, ["a", "b", "c"])[0] for key in keys}
    assert set(before.values()) == {"a", "b", "c"}
    lost = {key: rendezvous_order(key, ["a", "b"])[0] for key in keys}
    assert all(lost[key] == home for key, home in before.items() if home != "c")
    gained = {key: rendezvous_order(key, ["a", "b", "c", "d"])[0] for key in keys}
    assert all(gained[key] in (home, "d") for key, home in before.items())
    assert 0 < sum(gained[key] == "d" for key in keys) < len(keys) / 2


def test_merged_metrics_label_each_replica_and_add_the_total():
    def text(generations: float, usage: float) -> str:
        return ("# HELP specwise_generations Generations ended\n# TYPE specwise_generations counter\n"
                f'specwise_generations_total{{model="m",finish_reason="stop"}} {generations}\n'
                f'specwise_generations_created{{model="m",finish_reason="stop"}} 1.7e9\n'
                "# HELP vllm:kv_cache_usage_perc KV usage\n# TYPE vllm:kv_cache_usage_perc gauge\n"
                f'vllm:kv_cache_usage_perc{{model_name="m"}} {usage}\n'
                "# HELP specwise_request_latency_seconds Latency\n# TYPE specwise_request_latency_seconds histogram\n"
                f'specwise_request_latency_seconds_bucket{{endpoint="chat",le="1.0"}} {generations}\n'
                f'specwise_request_latency_seconds_bucket{{endpoint="chat",le="+Inf"}} {generations}\n'
                f'specwise_request_latency_seconds_count{{endpoint="chat"}} {generations}\n'
                f'specwise_request_latency_seconds_sum{{endpoint="chat"}} 0.5\n')

    merged = merge_metrics({"r1": text(2, 0.25), "r2": text(3, 0.5)})
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(merged) for s in family.samples}
    labels = (("finish_reason", "stop"), ("model", "m"))
    assert samples[("specwise_generations_total", labels + (("replica", "r1"),))] == 2
    assert samples[("specwise_generations_total", labels + (("replica", "all"),))] == 5
    assert samples[("vllm:kv_cache_usage_perc", (("model_name", "m"), ("replica", "r2")))] == 0.5
    assert not any(name == "vllm:kv_cache_usage_perc" and ("replica", "all") in labels
                   for name, labels in samples)  # a share does not add up
    assert samples[("specwise_request_latency_seconds_count", (("endpoint", "chat"), ("replica", "all")))] == 5
    assert not any(name.endswith("_created") for name, _ in samples)


def test_relay_hands_out_the_apps_messages_and_cancels_on_close():
    cancelled = asyncio.Event()

    async def app(scope, receive, send):
        body = (await receive())["body"]
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-path", scope["path"].encode())]})
        await send({"type": "http.response.body", "body": body.upper(), "more_body": True})
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def run() -> list[dict]:
        messages = relay(app, ForwardedRequest("POST", "/v1/x", body=b"hello"))
        got = [await anext(messages), await anext(messages)]
        await messages.aclose()  # the caller went away
        await asyncio.wait_for(cancelled.wait(), 5)
        return got

    start, part = asyncio.run(run())
    assert start["status"] == 200 and start["headers"] == [(b"x-path", b"/v1/x")]
    assert part["body"] == b"HELLO"


def _serve_args(*options: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *options])


@pytest.mark.parametrize("options, fragment", [
    (["--replicas", "0"], "--replicas must be >= 1"),
    (["--min-replicas", "3", "--max-replicas", "2"], "must not exceed --max-replicas"),
    (["--replicas", "5", "--max-replicas", "2"], "must lie between"),
    (["--threads-per-replica", "0"], "--threads-per-replica must be >= 1"),
    (["--target-ongoing-requests", "4"], "give --min-replicas or --max-replicas"),
])
def test_replica_options_are_checked(options, fragment):
    problems = server_cli.option_problems(_serve_args(*options))
    assert any(fragment in problem for problem in problems), problems


def test_replicas_without_ray_name_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    for name in [name for name in sys.modules if name.startswith("specwise.server.ray.")]:
        monkeypatch.delitem(sys.modules, name)  # as if never imported
    args = _serve_args("--replicas", "2")
    assert server_cli.uses_ray(args) and not server_cli.uses_ray(_serve_args())
    assert args.func(args) == 2
    assert "pip install specwise[ray]" in capsys.readouterr().err
