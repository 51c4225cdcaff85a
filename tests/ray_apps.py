"""The app each replica runs in the Ray Serve tests, and the same app for the single-process server they are
compared with. The replicas import this module by name (the tests put tests/ on their PYTHONPATH).

Two models: "tiny" (n-gram drafting, ends when it likes) and "endless" (a target that never emits EOS,
drafting with a drafter that waits STEP_SECONDS a step, so that a stream lasts long enough to be cut).
"""

from __future__ import annotations

import time

from specwise import DraftProposal, SpecConfig, SpecDecoder, register_drafter
from specwise.server import create_app
from specwise.testing import tiny_loaded

from server_helpers import never_ending

STEP_SECONDS = 0.05


class SlowDrafter:
    """Proposes nothing (plain decoding), a step every STEP_SECONDS."""

    name = "test-slow"

    def start(self, prompt_ids, sampling, generator) -> None:
        pass

    def propose(self, context, k: int) -> DraftProposal:
        time.sleep(STEP_SECONDS)
        return DraftProposal.empty()

    def observe(self, result) -> None:
        pass


def slow_factory(context) -> SlowDrafter:
    return SlowDrafter()


def tiny_app():
    register_drafter("test-slow", slow_factory)
    decoders = {"tiny": SpecDecoder(tiny_loaded(0), SpecConfig(drafter="ngram", k=3), max_batch=4),
                "endless": SpecDecoder(never_ending(0), SpecConfig(drafter="test-slow", k=1), max_batch=4)}
    return create_app(decoders, max_queue=16)
