"""What the server tests share: a live server on a loopback port, a gate that holds a drafter until the
test lets it go on, a target that never ends early, and checks of error bodies, SSE streams and metrics.

Waits are for events (a condition polled until it holds), bounded generously so that a slow or busy
machine never fails a test that a fast one passes; what a test checks is the event, never its timing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import httpx
import openai
import pytest
import torch
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from specwise import DraftProposal, SamplingParams, SpecConfig, SpecDecoder
from specwise.testing import tiny_loaded

MAX_TOKENS = 24
WAIT_SECONDS = 60.0  # the bound on waiting for an event: a hang guard, not a speed requirement


def wait_until(condition: Callable[[], object], what: str, timeout: float = WAIT_SECONDS) -> None:
    """Poll `condition` until it is true; fail naming `what` if it is still false after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class LiveServer:
    """A uvicorn server for an app, in a background thread, on a free loopback port."""

    def __init__(self, app, **options) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=2,
                                **options)
        self.app = app
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive(), "the server to start")
        assert self.server.started, "the server's thread ended before it started"
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def openai(self, api_key: str = "unused") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=30)

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """Every sample of /metrics, keyed by (name, sorted labels)."""
        response = self.http.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(response.text) for s in family.samples}

    def health(self) -> dict:
        return self.http.get("/health").json()

    def wait_for(self, condition: Callable[[], object], what: str, timeout: float = WAIT_SECONDS) -> None:
        wait_until(condition, what, timeout)

    def stop(self) -> None:
        self.http.close()
        self.server.should_exit = True
        self.thread.join(10)


def metric(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


class Gate:
    """Holds the test drafter at every step until the test lets it go on."""

    def __init__(self) -> None:
        self._permits = threading.Semaphore(0)
        self._open = threading.Event()
        self.steps = 0

    def close(self) -> None:
        self._open.clear()
        self._permits = threading.Semaphore(0)

    def open(self) -> None:
        self._open.set()

    def allow(self, steps: int) -> None:
        for _ in range(steps):
            self._permits.release()

    def wait(self) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        while not self._open.is_set() and not self._permits.acquire(timeout=0.01):
            if time.monotonic() > deadline:
                raise TimeoutError("the test never opened the gate")
        self.steps += 1


GATE = Gate()


class GatedDrafter:
    """Proposes nothing (plain decoding), but only when the gate lets it."""

    name = "test-gated"

    def start(self, prompt_ids, sampling, generator) -> None:
        pass

    def propose(self, context, k: int) -> DraftProposal:
        GATE.wait()
        return DraftProposal.empty()

    def observe(self, result) -> None:
        pass


def gated_factory(context) -> GatedDrafter:
    return GatedDrafter()


def never_ending(seed: int = 0):
    """A tiny target whose EOS logit is pushed far down: generation always runs to max_tokens."""
    loaded = tiny_loaded(seed)
    head = loaded.model.lm_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    biased.weight = head.weight
    with torch.no_grad():
        biased.bias.zero_()
        biased.bias[0] = -1e4
    loaded.model.lm_head = biased
    return loaded


def loaded_and_saved_decoders(directory) -> dict[str, SpecDecoder]:
    """The dense tiny model given loaded ("tiny") and the same model saved to `directory` and read from there
    ("dir"), each drafting with n-grams."""
    saved = tiny_loaded(0)
    saved.model.save_pretrained(directory)
    saved.tokenizer.save_pretrained(directory)
    return {"tiny": SpecDecoder(tiny_loaded(0), SpecConfig(drafter="ngram", k=2)),
            "dir": SpecDecoder(str(directory), SpecConfig(drafter="ngram", k=2))}


def greedy(max_tokens: int = MAX_TOKENS, **options) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=max_tokens, **options)


def sse_chunks(response: httpx.Response) -> list[dict | str]:
    items: list[dict | str] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            items.append(data if data == "[DONE]" else json.loads(data))
    return items


def assert_error(response: httpx.Response, status: int, param: str | None = None, fragment: str = "",
                 code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert "Traceback" not in response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert fragment.lower() in error["message"].lower(), error
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


@pytest.fixture
def gate():
    """GATE closed for the test (the gated drafter takes only the steps the test allows), open after it."""
    GATE.close()
    yield GATE
    GATE.open()
