"""A bounded fuzzing run over the request schema (hypothesis), on loopback with a tiny model:
whatever a client sends, the server answers below 500, never with a traceback, and logs none.

Bodies are built from the request fields with values of every JSON type (valid ones often,
out-of-range ones, wrong types, unknown keys), plus raw bytes. Slow: out of the quick run.
"""

from __future__ import annotations

import json
import logging

import pytest

from specwise import SpecConfig, SpecDecoder
from specwise.server import create_app
from specwise.server.schemas import SpeculativeOptions
from specwise.testing import tiny_loaded
from server_helpers import LiveServer

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

EXAMPLES = 200

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 40), st.integers(), st.floats(allow_nan=True),
                     st.text(max_size=12), st.sampled_from(["ngram", "suffix", "none", "eagle", "draft-model",
                                                            "auto", "gguf", "dense", "hf", "token", "block"]))
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=6), inner, max_size=4), max_leaves=12)
_prompt = st.one_of(st.text(max_size=40), st.lists(st.integers(-2, 90), max_size=12), _json)
_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "robot"]),
                                  "content": st.one_of(st.text(max_size=30), _json)})
_speculative = st.dictionaries(st.sampled_from(sorted(SpeculativeOptions.model_fields) + ["device", "foo"]),
                               _json, max_size=4)
_fields = {
    "model": st.one_of(st.just("tiny"), _json),
    "max_tokens": st.one_of(st.integers(-2, 12), _json),
    "temperature": st.one_of(st.floats(0, 3), _json),
    "top_p": _json, "top_k": _json, "repetition_penalty": _json, "seed": _json, "n": _json,
    "stop": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=6), _json),
    "stream": st.one_of(st.booleans(), _json),
    "stream_options": _json, "user": _json, "logprobs": _json, "logit_bias": _json,
    "speculative": st.one_of(_speculative, _json),
}


@st.composite
def _bodies(draw, chat: bool) -> dict:
    body = {"model": "tiny", "max_tokens": 4}
    body["messages" if chat else "prompt"] = draw(st.lists(_message, max_size=3) if chat else _prompt)
    for name, values in _fields.items():
        if draw(st.booleans()):
            body[name] = draw(values)
    if draw(st.integers(0, 9)) == 0:
        body[draw(st.text(max_size=8))] = draw(_json)
    return body


@pytest.fixture(scope="module")
def fuzzed():
    decoder = SpecDecoder(tiny_loaded(0), SpecConfig(drafter="ngram", k=2), max_batch=2)
    server = LiveServer(create_app({"tiny": decoder}, max_queue=4))
    yield server
    server.stop()


def _check(server: LiveServer, path: str, content: bytes, caplog) -> None:
    caplog.clear()
    response = server.http.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code < 500, (content[:300], response.text[:300])
    assert "Traceback" not in response.text
    records = [r for r in caplog.records if r.name.startswith("specwise") and
               (r.exc_info is not None or r.levelno >= logging.ERROR)]
    assert not records, [r.getMessage() for r in records]


_settings = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@_settings
@given(body=st.one_of(_bodies(chat=False), _bodies(chat=True).map(lambda b: ("chat", b))))
def test_no_request_body_gets_a_500_or_a_traceback(fuzzed, caplog, body):
    path = "/v1/completions"
    if isinstance(body, tuple):
        path, body = "/v1/chat/completions", body[1]
    _check(fuzzed, path, json.dumps(body).encode(), caplog)


@_settings
@given(raw=st.binary(max_size=200))
def test_no_raw_body_gets_a_500_or_a_traceback(fuzzed, caplog, raw):
    _check(fuzzed, "/v1/completions", raw, caplog)
