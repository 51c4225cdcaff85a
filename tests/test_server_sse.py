"""The stream framing the single server and the Ray Serve ingress share."""

from __future__ import annotations

import json

from specwise.server.errors import shutting_down
from specwise.server.sse import SSE_DONE, sse_event


def test_an_event_is_compact_utf8_json_as_openai_sends():
    event = sse_event({"text": "héllo 世界 😀", "n": [1, 2]})
    assert event == 'data: {"text":"héllo 世界 😀","n":[1,2]}\n\n'  # no \u escapes, no spaces
    assert json.loads(event.removeprefix("data: ")) == {"text": "héllo 世界 😀", "n": [1, 2]}
    assert SSE_DONE == "data: [DONE]\n\n"


def test_a_draining_server_refuses_with_503_and_closes_the_connection():
    err = shutting_down("the server is shutting down")
    assert (err.status, err.code, err.type, err.headers) == (503, "server_shutting_down", "server_error",
                                                             {"Connection": "close"})
    assert sse_event(err.body()).startswith('data: {"error":{"message":"the server is shutting down"')
