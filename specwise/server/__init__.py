"""specwise's OpenAI-compatible HTTP server (optional extra: `pip install specwise[server]`).

    from specwise.server import create_app
    app = create_app({"my-model": decoder}, max_queue=16)

`specwise serve` (specwise.server.cli) builds the decoder and runs the app with uvicorn.
"""

from specwise.server.app import create_app

__all__ = ["create_app"]
