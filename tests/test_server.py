"""The OpenAI-compatible server over real sockets on loopback, with tiny random models.

Outputs are compared with SpecDecoder.generate on a separate decoder built from
the same seeds, so the server is checked against the library, not against itself.
Queueing and disconnects are made deterministic with a drafter that waits at a
gate the test opens, on a target that cannot emit EOS (so it never ends early).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import sys
import threading
from pathlib import Path

import httpx
import openai
import pytest
import torch

from specwise import SamplingParams, SpecConfig, SpecDecoder, register_drafter
from specwise.server import create_app
from specwise.server import cli as server_cli
from specwise.server import lifecycle
from specwise.testing import tiny_loaded

from server_helpers import (GATE, MAX_TOKENS, LiveServer, assert_error, gated_factory, greedy, metric, never_ending,
                            sse_chunks)
from server_helpers import gate  # noqa: F401  (a fixture: pytest finds it by name)

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- fixtures

def _decoder() -> SpecDecoder:
    # A fixed k: the served generation's step counts equal the reference's (adaptive k follows timings).
    return SpecDecoder(tiny_loaded(0), SpecConfig(drafter="draft-model", k=3, adaptive=False),
                       drafter_model=tiny_loaded(1))


@pytest.fixture(scope="module")
def reference() -> SpecDecoder:
    """Same weights and settings as the served decoder, but never touched by the server."""
    return _decoder()


@pytest.fixture(scope="module")
def live():
    server = LiveServer(create_app({"tiny": _decoder()}, max_queue=16))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def slow():
    """workers=1, max_queue=1, and a decoder that advances only when GATE allows."""
    register_drafter("test-gated", gated_factory)  # idempotent: the same factory every time
    GATE.open()
    decoder = SpecDecoder(never_ending(0), SpecConfig(drafter="test-gated", k=1))
    server = LiveServer(create_app({"slow": decoder}, max_queue=1, workers=1))
    yield server
    GATE.open()
    server.stop()


@pytest.fixture(scope="module")
def slow_reference() -> SpecDecoder:
    return SpecDecoder(never_ending(0), SpecConfig(drafter="none"))


PROMPTS = ["abc", "Hello there", "def f(x):", "The quick brown fox", "1, 2, 3,", "Why?", "ZZZ top", "q"]


# --------------------------------------------------------------------------- endpoints and outputs

def test_models_health_and_unknown_route(live):
    assert live.health()["status"] == "ok"
    models = live.openai().models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert live.http.get("/v1/models/tiny").json()["id"] == "tiny"
    assert_error(live.http.get("/v1/models/nope"), 404, "model", "does not exist", "model_not_found")
    assert_error(live.http.get("/v1/nothing-here"), 404, fragment="no such endpoint")
    assert_error(live.http.get("/v1/completions"), 405, fragment="not allowed")


def test_completions_match_generate(live, reference):
    client = live.openai()
    for prompt in PROMPTS[:3]:
        expected = reference.generate(prompt, greedy(), chat=False)
        plain = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        assert plain.choices[0].text == expected.text
        assert plain.choices[0].finish_reason == expected.finish_reason
        assert plain.usage.prompt_tokens == len(expected.prompt_ids)
        assert plain.usage.completion_tokens == len(expected.token_ids)
        speculative = plain.model_extra["speculative"]
        assert speculative["steps"] == expected.stats.steps
        assert speculative["accepted"] == expected.stats.accepted
        assert speculative["acceptance_length"] == pytest.approx(expected.stats.acceptance_length, abs=1e-6)
        assert speculative["acceptance_rate"] == pytest.approx(expected.stats.acceptance_rate, abs=1e-6)
        assert len(speculative["per_position_acceptance"]) == len(expected.stats.per_position_acceptance)

        chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS,
                                                temperature=0, stream=True))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
        assert chunks[-1].choices[0].finish_reason == expected.finish_reason
        assert chunks[-1].model_extra["speculative"]["steps"] == expected.stats.steps

        chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
        assert all(c.usage is None for c in chunks[:-1])
        last = chunks[-1]
        assert last.choices == [] and last.usage.completion_tokens == len(expected.token_ids)
        assert last.model_extra["speculative"]["acceptance_length"] == pytest.approx(
            expected.stats.acceptance_length, abs=1e-6)


def test_token_id_prompt(live, reference):
    ids = reference.encode("abc", chat=False)
    expected = reference.generate(ids, greedy())
    response = live.http.post("/v1/completions", json={"model": "tiny", "prompt": ids, "max_tokens": MAX_TOKENS,
                                                       "temperature": 0})
    assert response.status_code == 200
    assert response.json()["choices"][0]["text"] == expected.text


def test_chat_matches_generate(live, reference):
    client = live.openai()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]
    expected = reference.generate(messages, greedy())
    plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=MAX_TOKENS, temperature=0)
    assert plain.choices[0].message.role == "assistant"
    assert plain.choices[0].message.content == expected.text
    assert plain.choices[0].finish_reason == expected.finish_reason
    assert plain.usage.prompt_tokens == len(expected.prompt_ids)

    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=MAX_TOKENS,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == expected.finish_reason
    assert chunks[-1].usage.total_tokens == len(expected.prompt_ids) + len(expected.token_ids)
    assert chunks[-1].model_extra["speculative"]["drafter"] == "draft-model"

    parts = [{"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}]
    response = client.chat.completions.create(model="tiny", messages=parts, max_tokens=MAX_TOKENS, temperature=0)
    assert response.choices[0].message.content == reference.generate(
        [{"role": "user", "content": "hi there"}], greedy()).text


def test_speculative_override_per_request(live, reference):
    client = live.openai()
    for options, spec in [({"drafter": "ngram", "k": 4}, SpecConfig(drafter="ngram", k=4, adaptive=False)),
                          ({"k": 2, "adaptive": True}, SpecConfig(drafter="draft-model", k=2, adaptive=True)),
                          ({"k": 2, "adaptive": "auto"}, SpecConfig(drafter="draft-model", k=2)),
                          ({"drafter": "draft-model", "verifier": "token", "k": 5},
                           SpecConfig(drafter="draft-model", verifier="token", k=5, adaptive=False))]:
        expected = reference.generate("abc", greedy(), spec=spec, chat=False)
        response = client.completions.create(model="tiny", prompt="abc", max_tokens=MAX_TOKENS, temperature=0,
                                             extra_body={"speculative": options})
        assert response.choices[0].text == expected.text
        speculative = response.model_extra["speculative"]
        assert speculative["drafter"] == spec.drafter and speculative["k"] == spec.k
        assert speculative["adaptive"] is spec.resolve_adaptive(greedy())  # "auto": adaptive at temperature 0
        assert speculative["verifier"] == "greedy"  # temperature 0 always verifies greedily
        if not speculative["adaptive"]:  # adaptive k's steps follow measured times; a fixed k's are the same
            assert speculative["steps"] == expected.stats.steps


def test_seeded_sampling_is_reproducible(live, reference):
    client = live.openai()
    settings = dict(temperature=0.9, top_p=0.95, seed=1234)
    expected = reference.generate("abc", SamplingParams(max_new_tokens=MAX_TOKENS, top_k=20, **settings),
                                  chat=False)
    texts = [client.completions.create(model="tiny", prompt="abc", max_tokens=MAX_TOKENS,
                                       extra_body={"top_k": 20}, **settings).choices[0].text for _ in range(2)]
    streamed = client.completions.create(model="tiny", prompt="abc", max_tokens=MAX_TOKENS, stream=True,
                                         extra_body={"top_k": 20}, **settings)
    texts.append("".join(c.choices[0].text for c in streamed if c.choices))
    assert texts == [expected.text] * 3
    # The default, adaptive "auto", keeps k fixed for a seeded sampled request: the seed repeats the output.
    body = {"model": "tiny", "prompt": "abc", "max_tokens": MAX_TOKENS, "top_k": 20, **settings,
            "speculative": {"adaptive": "auto"}}
    replies = [live.http.post("/v1/completions", json=body).json() for _ in range(2)]
    assert [r["choices"][0]["text"] for r in replies] == [expected.text] * 2
    assert [r["speculative"]["adaptive"] for r in replies] == [False, False]
    other = client.completions.create(model="tiny", prompt="abc", max_tokens=MAX_TOKENS, temperature=0.9,
                                      top_p=0.95, seed=99, extra_body={"top_k": 20})
    assert other.choices[0].text == reference.generate(
        "abc", SamplingParams(max_new_tokens=MAX_TOKENS, temperature=0.9, top_p=0.95, top_k=20, seed=99),
        chat=False).text


def test_stop_strings(live, reference):
    full = reference.generate("abc", greedy(), chat=False).text
    stop = full[len(full) // 2]
    expected = reference.generate("abc", greedy(stop_strings=(stop,)), chat=False)
    assert expected.finish_reason == "stop" and stop not in expected.text
    response = live.openai().completions.create(model="tiny", prompt="abc", max_tokens=MAX_TOKENS,
                                                temperature=0, stop=[stop])
    assert response.choices[0].text == expected.text
    assert response.choices[0].finish_reason == "stop"


def test_concurrent_streams_never_mix(live, reference):
    expected = {p: reference.generate(p, greedy(), chat=False).text for p in PROMPTS}
    assert len(set(expected.values())) == len(PROMPTS), "prompts must give different outputs"
    received: dict[str, str] = {}
    failures: list[BaseException] = []
    start = threading.Barrier(len(PROMPTS))

    def client(prompt: str) -> None:
        try:
            api = live.openai()
            start.wait()
            stream = api.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                            stream=True)
            received[prompt] = "".join(c.choices[0].text for c in stream if c.choices)
        except BaseException as exc:  # reported in the main thread
            failures.append(exc)

    threads = [threading.Thread(target=client, args=(p,)) for p in PROMPTS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    assert received == expected


# --------------------------------------------------------------------------- bad input

def _nested(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


BAD_REQUESTS = [
    # (path, body: bytes or JSON-able, status, param, message fragment, code)
    ("/v1/completions", b'{"model": "tiny", "prompt": ', 400, None, "not valid JSON", None),
    ("/v1/completions", b"", 400, None, "empty", None),
    ("/v1/completions", [1, 2], 400, None, "JSON object", None),
    ("/v1/completions", {"prompt": "abc"}, 400, "model", "missing required parameter", None),
    ("/v1/completions", {"model": "nope", "prompt": "abc"}, 404, "model", "does not exist", "model_not_found"),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "max_tokens": "ten"}, 400, "max_tokens",
     "valid integer", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "max_tokens": 2.5}, 400, "max_tokens",
     "valid integer", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "temperature": "hot"}, 400, "temperature",
     "valid number", None),
    ("/v1/completions", {"model": "tiny", "prompt": 42}, 400, "prompt", "must be a string", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "stream": "yes"}, 400, "stream", "boolean", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "temperature": -1}, 400, "temperature",
     "temperature must be a finite number >= 0", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "top_p": 0}, 400, "top_p", "top_p must be", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "top_k": -3}, 400, "top_k", "top_k must be", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "seed": -1}, 400, "seed", "seed must be", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "max_tokens": 0}, 400, "max_tokens",
     "max_tokens must be an integer >= 1", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "stop": [""]}, 400, "stop", "non-empty", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "max_tokens": 600}, 400, "max_tokens",
     "context window is 512 tokens", "context_length_exceeded"),
    ("/v1/completions", {"model": "tiny", "prompt": "x" * 600}, 400, "prompt", "context window",
     "context_length_exceeded"),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "n": 2}, 400, "n", "n must be 1", None),
    ("/v1/completions", {"model": "tiny", "prompt": ["a", "b"]}, 400, "prompt", "one prompt", None),
    ("/v1/completions", {"model": "tiny", "prompt": ""}, 400, "prompt", "empty", None),
    ("/v1/completions", {"model": "tiny", "prompt": [5, 100000]}, 400, "prompt", "token ids must be in", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "logprobs": 3}, 400, "logprobs", "not supported", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "frobnicate": 1}, 400, "frobnicate",
     "unrecognized request argument", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "stream_options": {"include_usage": True}}, 400,
     "stream_options", "only allowed when stream", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "speculative": {"k": 0}}, 400, "speculative.k",
     "k must be an integer in [1, 64]", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "speculative": {"drafter": "psychic"}}, 400,
     "speculative.drafter", "unknown drafter", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "speculative": {"verifier": "magic"}}, 400,
     "speculative.verifier", "verifier must be one of", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "temperature": 1,
                         "speculative": {"verifier": "greedy"}}, 400, "speculative.verifier", "needs temperature 0",
     None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "speculative": {"k": "many"}}, 400, "speculative.k",
     "valid integer", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "speculative": {"foo": 1}}, 400, "speculative.foo",
     "unrecognized request argument supplied: speculative.foo", None),
    ("/v1/completions", b'{"model": "tiny", "prompt": "hi \\ud800 there"}', 400, "prompt",
     "lone surrogate escape (\\ud800) at character 3", None),
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udfff"}]}', 400,
     "messages.0.content", "lone surrogate", None),
    ("/v1/completions", b"[" * 100_000 + b"]" * 100_000, 400, None, "more than 32 levels deep", None),
    ("/v1/completions", {"model": "tiny", "prompt": "abc", "logit_bias": {"a": _nested(40)}}, 400,
     None, "more than 32 levels deep", None),
    ("/v1/chat/completions", {"model": "tiny", "messages": []}, 400, "messages", "at least 1", None),
    ("/v1/chat/completions", {"model": "tiny"}, 400, "messages", "missing required parameter", None),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": 7}]}, 400,
     "messages.0.content", "must be a string", None),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}, 400,
     "messages.0.role", "role", None),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 3}, 400, "n",
     "n must be 1", None),
    ("/v1/chat/completions", {"model": "tiny", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                             "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"}]}, 400, "messages",
     "messages[1].tool_calls: tool calls are not supported", None),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "tool", "content": "sunny",
                                                             "tool_call_id": "c1"}]}, 400, "messages",
     "messages[0].tool_call_id", None),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                              "max_completion_tokens": 1000}, 400, "max_tokens", "context window",
     "context_length_exceeded"),
]


@pytest.mark.parametrize("path, body, status, param, fragment, code", BAD_REQUESTS,
                         ids=[f"{i}-{row[3] or 'body'}" for i, row in enumerate(BAD_REQUESTS)])
def test_bad_input_is_refused_clearly(live, path, body, status, param, fragment, code):
    if isinstance(body, bytes):
        response = live.http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        response = live.http.post(path, json=body)
    error = assert_error(response, status, param, fragment, code)
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")


def test_hostile_bodies_log_no_traceback(live, reference):
    """Lone surrogates and deep nesting are refused as 400 (above) without an error in the logs."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    loggers = [logging.getLogger(name) for name in ("", "uvicorn", "specwise")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        for body in (b'{"model": "tiny", "prompt": "hi \\ud800 there"}', b"[" * 100_000 + b"]" * 100_000,
                     b'{"model": "tiny", "prompt": "' + b"\\ud800" * 5000 + b'"}'):
            assert_error(live.http.post("/v1/completions", content=body), 400)
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    assert not [r for r in records if r.levelno >= logging.WARNING or r.exc_info], records
    # A complete surrogate pair is a character like any other.
    pair = live.http.post("/v1/completions", content=b'{"model": "tiny", "prompt": "hi \\ud83d\\ude00", '
                                                     b'"max_tokens": 4, "temperature": 0}')
    assert pair.status_code == 200
    assert pair.json()["choices"][0]["text"] == reference.generate("hi \U0001F600", greedy(4), chat=False).text


def test_bad_input_in_a_stream_request_is_refused_before_streaming(live):
    response = live.http.post("/v1/completions", json={"model": "tiny", "prompt": "abc", "stream": True,
                                                       "temperature": -2})
    assert_error(response, 400, "temperature", "temperature must be")
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        live.openai().completions.create(model="tiny", prompt="abc", n=2, stream=True)
    with pytest.raises(openai.NotFoundError):
        live.openai().chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])


def test_server_keeps_serving_after_bad_input(live, reference):
    for path, body, *_ in BAD_REQUESTS[:5]:
        live.http.post(path, content=body if isinstance(body, bytes) else json.dumps(body).encode())
    response = live.openai().completions.create(model="tiny", prompt="abc", max_tokens=MAX_TOKENS, temperature=0)
    assert response.choices[0].text == reference.generate("abc", greedy(), chat=False).text


# --------------------------------------------------------------------------- metrics

def test_requests_are_counted_under_their_route_template(live):
    """The endpoint label is the route a path takes (the app's own routes, Ollama's too), or "other"."""
    before = live.metrics()
    assert live.http.get("/v1/models/tiny").status_code == 200
    assert live.http.get("/api/tags").status_code == 200
    assert live.http.get("/no/such/route").status_code == 404
    after = live.metrics()
    for endpoint, status in (("/v1/models/{model}", "200"), ("/api/tags", "200"), ("other", "404")):
        grew = metric(after, "specwise_requests_total", endpoint=endpoint, status=status) - \
            metric(before, "specwise_requests_total", endpoint=endpoint, status=status)
        assert grew == 1, endpoint


def test_metrics_parse_and_count(live, reference):
    before = live.metrics()
    expected = reference.generate("Hello there", greedy(), chat=False)
    stats = expected.stats
    live.openai().completions.create(model="tiny", prompt="Hello there", max_tokens=MAX_TOKENS, temperature=0)
    live.http.post("/v1/completions", json={"model": "tiny", "prompt": "abc", "n": 2})
    # A worker leaves the running set just after the client has its answer.
    live.wait_for(lambda: live.health()["running"] == 0, "the worker to finish")
    after = live.metrics()

    def delta(name: str, **labels) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    spec_labels = {"model": "tiny", "drafter": "draft-model"}
    assert delta("specwise_requests_total", endpoint="/v1/completions", status="200") == 1
    assert delta("specwise_requests_total", endpoint="/v1/completions", status="400") == 1
    assert delta("specwise_errors_total", type="invalid_request_error", code="") == 1
    assert delta("specwise_generations_total", model="tiny", finish_reason=expected.finish_reason) == 1
    assert delta("specwise_generated_tokens_total", model="tiny") == len(expected.token_ids)
    assert delta("specwise_prompt_tokens_total", model="tiny") == len(expected.prompt_ids)
    assert delta("specwise_spec_steps_total", **spec_labels) == stats.steps
    assert delta("specwise_spec_draft_tokens_proposed_total", **spec_labels) == stats.proposed
    assert delta("specwise_spec_draft_tokens_accepted_total", **spec_labels) == stats.accepted
    assert stats.proposed_at  # else the per-position checks below check nothing
    for i, (proposed, accepted) in enumerate(zip(stats.proposed_at, stats.accepted_at), start=1):
        assert delta("specwise_spec_proposed_at_position_total", position=str(i), **spec_labels) == proposed
        assert delta("specwise_spec_accepted_at_position_total", position=str(i), **spec_labels) == accepted
    assert delta("specwise_request_latency_seconds_count", endpoint="completions") == 1
    assert delta("specwise_time_to_first_token_seconds_count", endpoint="completions") == 1
    assert metric(after, "specwise_queue_waiting") == 0
    assert metric(after, "specwise_requests_running") == 0


def test_apps_have_their_own_registries(reference):
    first, second = create_app({"a": reference}), create_app({"b": reference})
    assert first.state.metrics.registry is not second.state.metrics.registry
    with pytest.raises(ValueError, match="at least one model"):
        create_app({})


# --------------------------------------------------------------------------- api key

def test_api_key(reference):
    server = LiveServer(create_app({"tiny": _decoder()}, api_key="sesame"))
    try:
        http = server.http
        assert http.get("/health").status_code == 200
        for path in ("/v1/models", "/metrics"):
            assert_error(http.get(path), 401, fragment="missing API key", code="invalid_api_key")
            assert_error(http.get(path, headers={"Authorization": "Bearer wrong"}), 401,
                         fragment="incorrect API key")
            assert http.get(path, headers={"Authorization": "Bearer sesame"}).status_code == 200
        body = {"model": "tiny", "prompt": "abc", "max_tokens": 4}
        assert_error(http.post("/v1/completions", json=body), 401)
        assert_error(http.post("/v1/completions", json=body, headers={"Authorization": "sesame"}), 401)
        with pytest.raises(openai.AuthenticationError):
            server.openai("wrong").completions.create(model="tiny", prompt="abc", max_tokens=4)
        response = server.openai("sesame").completions.create(model="tiny", prompt="abc", max_tokens=MAX_TOKENS,
                                                              temperature=0)
        assert response.choices[0].text == reference.generate("abc", greedy(), chat=False).text
    finally:
        server.stop()


# --------------------------------------------------------------------------- sharing (suffix and recycle drafters)

REPEATING = [40, 41, 42, 40, 41, 42, 40, 41]
# What each drafter that remembers earlier requests is asked for (recycle: its table alone).
# A fixed k, so that equal stores give equal step counts (adaptive k follows timings).
REMEMBERING = {"suffix": {"drafter": "suffix", "k": 8, "adaptive": False},
               "recycle": {"drafter": "recycle", "recycle_with": "none", "k": 8, "adaptive": False}}


def _suffix_stats(server: LiveServer, key: str, user: str | None = None, drafter: str = "suffix") -> dict:
    body = {"model": "tiny", "prompt": REPEATING, "max_tokens": 40, "temperature": 0,
            "speculative": REMEMBERING[drafter]} | ({"user": user} if user else {})
    response = server.http.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    stats = response.json()["speculative"]
    return {name: stats[name] for name in ("steps", "proposed", "accepted", "acceptance_length", "accepted_at")}


@pytest.mark.parametrize("drafter", list(REMEMBERING))
@pytest.mark.parametrize("keys", [["alice", "bob"], None], ids=["api-keys", "bearer-tokens"])
def test_suffix_drafts_only_from_the_same_tenant(keys, drafter):
    decoder = SpecDecoder(never_ending(0), SpecConfig(drafter="ngram"))
    server = LiveServer(create_app({"tiny": decoder}, api_key=keys))
    try:
        first = _suffix_stats(server, "alice", drafter=drafter)
        again = _suffix_stats(server, "alice", drafter=drafter)  # alice's first answer is now hers to draft from
        assert again["acceptance_length"] > first["acceptance_length"]
        # Bob, and alice's user "u2", only ever see their own requests: they draft exactly as
        # alice did with nothing stored.
        assert _suffix_stats(server, "bob", drafter=drafter) == first
        assert _suffix_stats(server, "alice", user="u2", drafter=drafter) == first
        assert _suffix_stats(server, "bob", drafter=drafter) == again  # bob's own first request is his to draft from
        if drafter != "suffix":
            return
        server.http.headers["Authorization"] = "Bearer alice"
        samples = server.metrics()
        assert metric(samples, "specwise_suffix_store_scopes", model="tiny") == 3
        assert 0 < metric(samples, "specwise_suffix_store_tokens", model="tiny") <= metric(
            samples, "specwise_suffix_store_limit_tokens", model="tiny") == SpecConfig().suffix_cache_tokens
    finally:
        server.stop()


def test_sharing_off_and_global():
    for sharing, gains in (("off", False), ("global", True)):
        server = LiveServer(create_app({"tiny": SpecDecoder(never_ending(0), SpecConfig())}, sharing=sharing))
        try:
            first = _suffix_stats(server, "alice")
            other = _suffix_stats(server, "bob")
            assert (other["acceptance_length"] > first["acceptance_length"]) == gains, sharing
        finally:
            server.stop()
    with pytest.raises(ValueError, match="sharing must be one of tenant, global, off"):
        create_app({"tiny": _decoder()}, sharing="everyone")


# --------------------------------------------------------------------------- queue and disconnects

def _slow_body(max_tokens: int, stream: bool = False) -> dict:
    return {"model": "slow", "prompt": "abc", "max_tokens": max_tokens, "temperature": 0, "stream": stream}


def test_full_queue_answers_429(slow, slow_reference, gate):
    expected = slow_reference.generate("abc", greedy(8), chat=False).text
    results: dict[str, object] = {}
    before = slow.metrics()

    def streaming() -> None:
        with httpx.Client(base_url=slow.url, timeout=30) as client:
            with client.stream("POST", "/v1/completions", json=_slow_body(8, stream=True)) as response:
                results["first"] = "".join(c["choices"][0]["text"] for c in sse_chunks(response)
                                           if isinstance(c, dict) and c["choices"])

    def queued() -> None:
        with httpx.Client(base_url=slow.url, timeout=30) as client:
            results["second"] = client.post("/v1/completions", json=_slow_body(8)).json()["choices"][0]["text"]

    first = threading.Thread(target=streaming)
    first.start()
    slow.wait_for(lambda: slow.health()["running"] == 1, "the first request to run")
    second = threading.Thread(target=queued)
    second.start()
    slow.wait_for(lambda: slow.health()["waiting"] == 1, "the second request to wait")

    for stream in (False, True, False):
        response = slow.http.post("/v1/completions", json=_slow_body(4, stream=stream))
        assert_error(response, 429, fragment="server is busy", code="queue_full")
        assert response.json()["error"]["type"] == "rate_limit_error"
        assert response.headers["retry-after"] == "1"
    with pytest.raises(openai.RateLimitError, match="max_queue=1"):
        slow.openai().chat.completions.create(model="slow", messages=[{"role": "user", "content": "hi"}])
    assert slow.http.get("/v1/models").status_code == 200  # everything else still answers

    gate.open()
    first.join(30)
    second.join(30)
    assert results == {"first": expected, "second": expected}
    after = slow.metrics()
    assert metric(after, "specwise_errors_total", type="rate_limit_error", code="queue_full") - metric(
        before, "specwise_errors_total", type="rate_limit_error", code="queue_full") == 4
    # A worker leaves the running set just after the client has its answer.
    slow.wait_for(lambda: slow.health()["running"] == 0 and slow.health()["waiting"] == 0, "both requests to end")


def test_disconnect_mid_stream_stops_generation(slow, slow_reference, gate):
    before = slow.metrics()
    steps_before = gate.steps
    gate.allow(3)
    with httpx.Client(base_url=slow.url, timeout=30) as client:
        with client.stream("POST", "/v1/completions", json=_slow_body(400, stream=True)) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                    break  # got some text: now hang up
    slow.wait_for(lambda: metric(slow.metrics(), "specwise_client_disconnects_total")
                  > metric(before, "specwise_client_disconnects_total"), "the server to notice the disconnect")
    gate.open()
    slow.wait_for(lambda: slow.health()["running"] == 0, "the cancelled generation to stop")
    assert gate.steps - steps_before < 10  # stopped after a few of the 400 steps

    after = slow.metrics()
    assert metric(after, "specwise_generations_total", model="slow", finish_reason="cancelled") - metric(
        before, "specwise_generations_total", model="slow", finish_reason="cancelled") == 1
    cancelled_tokens = metric(after, "specwise_generated_tokens_total", model="slow") - metric(
        before, "specwise_generated_tokens_total", model="slow")
    assert 1 <= cancelled_tokens < 10

    # Its place is free: the next request is served in full.
    response = slow.http.post("/v1/completions", json=_slow_body(6))
    assert response.status_code == 200
    assert response.json()["choices"][0]["text"] == slow_reference.generate("abc", greedy(6), chat=False).text


def test_disconnect_while_waiting_frees_the_place(slow, gate):
    done = threading.Event()

    def running() -> None:
        with httpx.Client(base_url=slow.url, timeout=30) as client:
            client.post("/v1/completions", json=_slow_body(4))
        done.set()

    holder = threading.Thread(target=running)
    holder.start()
    slow.wait_for(lambda: slow.health()["running"] == 1, "a request to run")
    with httpx.Client(base_url=slow.url, timeout=0.5) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            impatient.post("/v1/completions", json=_slow_body(4))  # waits in line, then hangs up
    slow.wait_for(lambda: slow.health()["waiting"] == 0, "the abandoned request to leave the line")
    assert slow.health()["running"] == 1
    gate.open()
    holder.join(30)
    assert done.is_set()


# --------------------------------------------------------------------------- load script and CLI

def _load_script(name: str = "load_test"):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_load_script(live, capsys):
    load_test = _load_script()
    summary = load_test.run(["--url", live.url, "--requests", "6", "--concurrency", "3", "--max-tokens", "12",
                             "--time-limit", "60"])
    assert summary["completed"] == 6 and summary["failed"] == 0 and summary["unfinished"] == 0
    assert summary["requests_per_second"] > 0 and summary["tokens_per_second"] > 0
    assert summary["completion_tokens"] > 0
    for key in ("latency_seconds", "ttft_seconds"):
        assert set(summary[key]) == {"p50", "p90", "p99"}
        assert 0 < summary[key]["p50"] <= summary[key]["p90"] <= summary[key]["p99"]
    assert summary["mean_acceptance_length"] >= 1

    assert load_test.main(["--url", live.url, "--requests", "2", "--concurrency", "2", "--max-tokens", "4",
                           "--endpoint", "chat"]) == 0
    out = capsys.readouterr().out
    assert "requests/s" in out and "p99" in out
    assert load_test.percentiles([1.0, 2.0, 3.0, 4.0]) == {"p50": 2.5, "p90": 3.7, "p99": 3.97}
    with pytest.raises(SystemExit):
        load_test.parse_args(["--url", "http://192.0.2.1:8000"])


def test_server_compare_sessions_over_a_live_server(live):
    compare = _load_script("server_compare")
    rag = compare.sessions("rag", 2, compare.DEFAULT_QUESTIONS, 300)
    assert [len(s.turns) for s in rag] == [3, 3] and rag[0].turns[0] != rag[1].turns[0]
    document = rag[0].turns[0].rsplit("\n\n", 1)[0]
    assert len(document) <= 300 and all(t.startswith(document + "\n\n") for t in rag[0].turns)
    chat = compare.sessions("multi-turn", 1, compare.DEFAULT_QUESTIONS, 300)[0]
    assert len(chat.turns) == 4 and chat.chained
    messages = compare.messages_for(chat, 2, ["first answer", "second answer"])
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[1]["content"] == "first answer" and messages[4]["content"] == chat.turns[2]
    cold = compare.messages_for(chat, 2, ["first answer", "second answer"], marker="cold")
    assert cold[0]["content"] == f"[cold] {chat.turns[0]}" and cold[1:] == messages[1:]
    assert [m["content"] for m in compare.messages_for(rag[0], 1, [])] == [rag[0].turns[1]]  # not chained

    plan = compare.sessions("multi-turn", 2, compare.DEFAULT_QUESTIONS, 300)
    records, seconds = asyncio.run(compare.run_workload(live.url, plan, 4, 60))
    assert len(records) == 8 and seconds > 0 and not [r.error for r in records if r.error]
    assert all(r.completion_tokens > 0 and r.ttft is not None and r.latency >= r.ttft for r in records)
    again = asyncio.run(compare.run_cold(live.url, plan, records, 4, 60))
    assert sorted((r.session, r.turn) for r in again) == [(s, t) for s in (0, 1) for t in (1, 2, 3)]
    row = compare.summarize("specwise", "multi-turn", 2, records, seconds, again)
    assert row["requests"] == 8 and row["failed"] == 0 and row["later_over_cold"]["n"] == 6
    assert row["ttft_p50"] <= row["ttft_p99"] and row["tokens_per_second"] > 0

    def entry(concurrency: int, text: str) -> dict:
        return {"server": "specwise", "cold": False, "error": None, "workload": "rag", "session": 0, "turn": 0,
                "concurrency": concurrency, "text": text}

    same = compare.identity([entry(1, "a"), entry(2, "a"), entry(4, "b")])
    assert (same["compared"], same["identical"]) == (2, 1) and "concurrency 4" in same["differ"][0]


def test_cli_options_and_serve(monkeypatch):
    parser = argparse.ArgumentParser()
    server_cli.add_serve_parser(parser.add_subparsers(dest="command"))
    defaults = parser.parse_args(["serve"])
    assert (defaults.host, defaults.port, defaults.max_queue, defaults.drafter) == ("127.0.0.1", 8000, 16,
                                                                                    SpecConfig().drafter)
    assert defaults.func is server_cli.cmd_serve
    args = parser.parse_args(["serve", "--host", "127.0.0.2", "--port", "0", "--target", "t", "--drafter-model",
                              "d", "--drafter", "draft-model", "--k", "7", "--adaptive", "--verifier", "block",
                              "--dtype", "float32", "--max-queue", "3", "--api-key", "key", "--threads", "1"])
    assert (args.target, args.drafter_model, args.k, args.adaptive, args.verifier, args.dtype, args.max_queue,
            args.api_key, args.threads) == ("t", "d", 7, True, "block", "float32", 3, ["key"], 1)
    assert args.sharing == "tenant" and parser.parse_args(["serve", "--sharing", "off"]).sharing == "off"
    assert (defaults.kv_budget_tokens, defaults.shutdown_grace, defaults.read_timeout) == (None, 25.0, 30.0)
    limits = parser.parse_args(["serve", "--kv-budget-tokens", "4096", "--shutdown-grace", "0",
                                "--read-timeout", "2.5"])
    assert (limits.kv_budget_tokens, limits.shutdown_grace, limits.read_timeout) == (4096, 0.0, 2.5)

    ran = {}
    monkeypatch.setattr(server_cli, "build_app", lambda a: "app")
    monkeypatch.setattr(lifecycle, "serve", lambda app, **options: ran.update(app=app, **options))
    assert server_cli.cmd_serve(args) == 0
    sock = ran.pop("sock")  # bound before the app was built
    assert sock.getsockname()[0] == "127.0.0.2"
    sock.close()
    assert ran == {"app": "app", "host": "127.0.0.2", "port": 0, "shutdown_grace": 25.0, "read_timeout": 30.0,
                   "max_connections": 256}
    for option, value in (("--max-queue", "-1"), ("--kv-budget-tokens", "0"), ("--shutdown-grace", "-1"),
                          ("--read-timeout", "0"), ("--read-timeout", "nan"), ("--max-draft-tokens", "0"),
                          ("--client-share", "0"), ("--client-share", "1.5"), ("--body-timeout", "0"),
                          ("--body-timeout", "inf"), ("--max-connections", "0")):
        assert server_cli.cmd_serve(parser.parse_args(["serve", option, value])) == 2, option
    assert (defaults.max_draft_tokens, defaults.client_share, defaults.body_timeout, defaults.max_connections) \
        == (32, 0.5, 60.0, 256)

    def refuse(a):
        raise ValueError("k must be an integer in [1, 64]; got 99")

    monkeypatch.setattr(server_cli, "build_app", refuse)
    assert server_cli.cmd_serve(args) == 2  # a user error at start-up: one line, exit 2


def test_cli_build_app_serves_models_from_directories(tmp_path, reference, capsys):
    for seed, name in ((0, "target"), (1, "drafter")):
        loaded = tiny_loaded(seed)
        loaded.model.save_pretrained(tmp_path / name)
        loaded.tokenizer.save_pretrained(tmp_path / name)
    parser = argparse.ArgumentParser()
    server_cli.add_serve_parser(parser.add_subparsers(dest="command"))
    target = str(tmp_path / "target")
    args = parser.parse_args(["serve", "--target", target, "--drafter-model", str(tmp_path / "drafter"),
                              "--dtype", "float32", "--k", "3", "--api-key", "key", "--threads",
                              str(torch.get_num_threads())])
    server = LiveServer(server_cli.build_app(args))
    try:
        assert [m.id for m in server.openai("key").models.list().data] == [target]
        response = server.openai("key").completions.create(model=target, prompt="abc", max_tokens=MAX_TOKENS,
                                                           temperature=0)
        assert response.choices[0].text == reference.generate("abc", greedy(), chat=False).text
        assert response.model_extra["speculative"]["k"] == 3
    finally:
        server.stop()

    missing = parser.parse_args(["serve", "--target", str(tmp_path / "nowhere"), "--drafter", "ngram", "--port", "0"])
    assert server_cli.cmd_serve(missing) == 2
    assert "error:" in capsys.readouterr().err
