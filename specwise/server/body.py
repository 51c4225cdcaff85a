"""Reading a request body: bounded in size and in time, valid JSON, shallow enough, valid Unicode.

Each problem becomes a 400 (413 for size) with a message naming it, never a
500: Python's JSON decoder accepts lone surrogate escapes (`"\\ud800"`), which
no tokenizer can encode, and recurses once per nesting level, so a deeply
nested body would otherwise surface as a UnicodeEncodeError or RecursionError
somewhere downstream.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import ClientDisconnect, Request

from specwise.server.errors import APIError, bad_request

MAX_BODY_BYTES = 4 << 20
MAX_DEPTH = 32  # a request nests a few levels (messages -> content parts); far more is an attack or a bug


async def read_json(request: Request, timeout: float | None = None) -> Any:
    """The request's decoded JSON body, checked (raises APIError); the whole body must arrive
    within `timeout` seconds (None: no deadline), however steadily it trickles in."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
    raw = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for piece in request.stream():
                raw += piece
                if len(raw) > MAX_BODY_BYTES:
                    raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
    except ClientDisconnect:  # it went away (or was timed out) mid-body: nobody reads this answer
        raise bad_request("the client closed the connection before sending the whole body") from None
    except TimeoutError:
        # Connection: close, as the rest of the body may still be on its way.
        raise APIError(408, f"the request body did not arrive within {timeout:g} s (--body-timeout); send it "
                            "at once", code="body_timeout", headers={"Connection": "close"}) from None
    if not raw:
        raise bad_request("the request body is empty; send a JSON object")
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise bad_request(f"the request body nests JSON arrays or objects more than {MAX_DEPTH} levels "
                          "deep; flatten it") from None
    check_json(value)
    return value


def check_json(value: Any) -> None:
    """Refuse nesting deeper than MAX_DEPTH and strings that are not valid Unicode (lone surrogates)."""
    pending: list[tuple[Any, str, int]] = [(value, "", 0)]  # iterative: no recursion to exhaust
    while pending:
        item, path, depth = pending.pop()
        if isinstance(item, str):
            _check_text(item, path)
        elif isinstance(item, (dict, list)):
            if depth >= MAX_DEPTH:
                raise bad_request(f"the request body nests JSON arrays or objects more than {MAX_DEPTH} levels "
                                  "deep; flatten it", path or None)
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str):  # an invalid key is named by where it is, never by itself
                    _check_text(key, path, key=True)
                name = f"{path}.{key}" if path else str(key)
                pending.append((child, name, depth + 1))


def _check_text(text: str, param: str, key: bool = False) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        where = f"a key of {param or 'the request body'}" if key else param or "the request body"
        raise bad_request(f"{where} holds a lone surrogate escape (\\u{code:04x}) at character {exc.start}, "
                          "which is not valid Unicode; send the character itself or a complete surrogate pair",
                          param or None) from None
