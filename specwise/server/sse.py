"""Stream framing: server-sent events as OpenAI's API streams them (one `data: <JSON>` event per
chunk, then `data: [DONE]`) and NDJSON lines as Ollama's does (one object a line).

The JSON is compact and UTF-8, as OpenAI and Ollama send it: text outside ASCII stands as itself,
not as `\\u` escapes. The single server and the Ray Serve ingress frame their events here, so a
stream reads the same from either.
"""

from __future__ import annotations

import json

SSE_DONE = "data: [DONE]\n\n"
NDJSON = "application/x-ndjson"


def sse_event(payload: dict) -> str:
    """One event carrying `payload` as compact UTF-8 JSON."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def ndjson_line(payload: dict) -> str:
    """One object of an NDJSON stream: compact UTF-8 JSON and a newline."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")) + "\n"
