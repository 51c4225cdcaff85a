"""specwise's OpenAI-compatible HTTP server (optional extra: `pip install specwise[server]`).

    from specwise.server import ServerLimits, create_app
    app = create_app({"my-model": decoder}, max_queue=16, limits=ServerLimits(max_draft_tokens=16))

`specwise serve` (specwise.server.cli) builds the decoder and runs the app with uvicorn.
FastAPI is imported only when create_app is first used, so the CLI can add the
`serve` subcommand without the server extra installed.
"""

from __future__ import annotations

__all__ = ["ServerLimits", "create_app"]


def __getattr__(name: str):
    if name == "create_app":
        from specwise.server.app import create_app

        return create_app
    if name == "ServerLimits":
        from specwise.server.limits import ServerLimits

        return ServerLimits
    raise AttributeError(f"module 'specwise.server' has no attribute {name!r}")
