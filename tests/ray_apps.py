"""The app each replica runs in the Ray Serve tests, and the same app for the single-process server they are
compared with. The replicas import this module by name (the tests put tests/ on their PYTHONPATH).

Two models: "tiny" (n-gram drafting, ends when it likes) and "endless" (a target that never emits EOS,
drafting with a drafter that waits STEP_SECONDS a step, so that a stream lasts long enough to be cut).

For overload and drain, a gate that works across processes (a replica is one): the "test-held" drafter
holds every generation from its third step on while the file named by $SPECWISE_TEST_HOLD exists
(the tests set it before Ray starts, so that every replica inherits it). `held_app` serves it on a
never-ending target, one request at a time; `cli_main` is `specwise` with it registered in each replica.
"""

from __future__ import annotations

import os
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


HOLD_ENV = "SPECWISE_TEST_HOLD"


class HeldDrafter:
    """Proposes nothing (plain decoding, a step every STEP_SECONDS); from the third step on, waits while the
    hold file exists."""

    name = "test-held"

    def start(self, prompt_ids, sampling, generator) -> None:
        self.steps = 0

    def propose(self, context, k: int) -> DraftProposal:
        self.steps += 1
        hold = os.environ.get(HOLD_ENV)
        while self.steps > 2 and hold and os.path.exists(hold):
            time.sleep(0.01)
        time.sleep(STEP_SECONDS)
        return DraftProposal.empty()

    def observe(self, result) -> None:
        pass


def held_factory(context) -> HeldDrafter:
    return HeldDrafter()


def held_app(max_queue: int = 1):
    """One never-ending model, "held", generating one request at a time with max_queue more waiting."""
    register_drafter("test-held", held_factory)
    decoder = SpecDecoder(never_ending(0), SpecConfig(drafter="test-held", k=1), max_batch=1)
    return create_app({"held": decoder}, max_queue=max_queue)


def held_build_app(args):
    """specwise.server.cli's build_app with the test-held drafter registered (it runs in each replica)."""
    from specwise.server import cli

    register_drafter("test-held", held_factory)
    return getattr(cli, "original_build_app", cli.build_app)(args)


def cli_main(argv: list[str]) -> int:
    """`specwise ARGV` whose replicas build their app with held_build_app (run it as `python -c "import sys,
    ray_apps; sys.exit(ray_apps.cli_main(sys.argv[1:]))" ...` with tests/ on PYTHONPATH, so that the replicas
    import this module by name)."""
    from specwise.cli import main
    from specwise.server import cli

    register_drafter("test-held", held_factory)
    cli.original_build_app = cli.build_app
    cli.build_app = held_build_app
    return main(argv)
