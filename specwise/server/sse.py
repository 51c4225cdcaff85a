"""Server-sent events as OpenAI's API streams them: one `data: <JSON>` event per chunk, then `data: [DONE]`.

The JSON is compact and UTF-8, as OpenAI sends it: text outside ASCII stands as itself, not as
`\\u` escapes. The single server and the Ray Serve ingress frame their events here, so a stream reads
the same from either.
"""

from __future__ import annotations

import json

SSE_DONE = "data: [DONE]\n\n"


def sse_event(payload: dict) -> str:
    """One event carrying `payload` as compact UTF-8 JSON."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"
