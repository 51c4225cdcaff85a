"""One request cannot break the server, over real sockets with tiny random models.

- a draft tree near the end of the context window completes (its size is capped by the places
  left), and a stream batched beside it is untouched;
- a member whose block cannot be scored, or whose drafter raises, fails alone: its neighbour's
  output equals that neighbour's output alone (dense and gguf targets);
- settings a verifier cannot use (denormal temperatures and penalties), a lone surrogate in a JSON
  key and a target format the model lacks are refused with a 400 naming the param, before any
  SSE byte, and the log holds one line for them, no traceback.
"""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from specwise import DraftProposal, SpecConfig, SpecDecoder, register_drafter
from specwise.drafters.base import TreeProposal
from specwise.config import MAX_TREE_NODES
from specwise.server import create_app
from specwise.server.limits import ServerLimits
from specwise.testing import tiny_gguf_loaded, tiny_loaded
from server_helpers import LiveServer, assert_error, loaded_and_saved_decoders, sse_chunks

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

WINDOW = 128
NEIGHBOUR = {"prompt": [5, 6, 7], "max_tokens": 100, "temperature": 0, "stream": True}


class _TreeDrafter:
    """Proposes the fullest tree it is allowed: every level as wide as branching and nodes let it."""

    name = "test-full-tree"

    def start(self, prompt_ids, sampling, generator) -> None:
        pass

    def propose(self, context, k: int) -> DraftProposal:
        return DraftProposal.empty()

    def propose_tree(self, context, nodes: int, depth: int, branching: int, shape=None) -> TreeProposal:
        parents: list[int] = []
        level = [-1]
        for _ in range(depth):
            below = []
            for parent in level:
                for _ in range(branching):
                    if len(parents) == nodes:
                        break
                    parents.append(parent)
                    below.append(len(parents) - 1)
            level = below
        tokens = [3 + i % 20 for i in range(len(parents))]
        return TreeProposal(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))

    def observe(self, result) -> None:
        pass


class _ShortParentsDrafter(_TreeDrafter):
    """Misbehaves: its tree has one parent fewer than it has tokens (the engine does not look)."""

    name = "test-short-parents"

    def propose_tree(self, context, nodes: int, depth: int, branching: int, shape=None) -> TreeProposal:
        return TreeProposal(torch.tensor([3, 4, 5]), torch.tensor([-1, 0]))


class _RaisingDrafter(_TreeDrafter):
    """Misbehaves: raises at every step."""

    name = "test-raising"

    def propose(self, context, k: int) -> DraftProposal:
        raise RuntimeError("this drafter always fails")


def _full_tree(context) -> _TreeDrafter:
    return _TreeDrafter()


def _short_parents(context) -> _ShortParentsDrafter:
    return _ShortParentsDrafter()


def _raising(context) -> _RaisingDrafter:
    return _RaisingDrafter()


def _long_running(loaded):
    loaded.tokenizer.eos_token = "<unk>"  # an end it does not reach from these prompts
    loaded.model.generation_config.eos_token_id = loaded.tokenizer.eos_token_id
    return loaded


@pytest.fixture(scope="module", params=["gguf", "dense"])
def served(request, tmp_path_factory):
    """A batching server (max_batch 4, a window of 128 tokens) and the greedy text of the
    neighbour's request served alone."""
    for name, factory in [("test-full-tree", _full_tree), ("test-short-parents", _short_parents),
                          ("test-raising", _raising)]:
        register_drafter(name, factory)  # idempotent: the same factory every time
    if request.param == "gguf":
        target = tiny_gguf_loaded(tmp_path_factory.mktemp("target"), seed=0, max_positions=WINDOW)
    else:
        target = tiny_loaded(0, max_positions=WINDOW)
    decoder = SpecDecoder(_long_running(target), SpecConfig(drafter="ngram", k=2), max_batch=4)
    assert decoder.runner.max_context == WINDOW
    # Trees up to the declared maximum: the operator's cap on draft tokens is raised for the test.
    server = LiveServer(create_app({"tiny": decoder}, max_queue=8, kv_budget_tokens=4 * WINDOW,
                                   limits=ServerLimits(max_draft_tokens=MAX_TREE_NODES)))
    server.decoder = decoder
    server.alone = _stream_text(server, NEIGHBOUR)
    yield server
    server.stop()


def _stream_text(server: LiveServer, body: dict) -> str:
    with server.http.stream("POST", "/v1/completions", json={"model": "tiny", **body}) as response:
        assert response.status_code == 200
        chunks = sse_chunks(response)
    assert chunks[-1] == "[DONE]"
    errors = [c for c in chunks[:-1] if "error" in c]
    assert not errors, errors
    return "".join(c["choices"][0]["text"] for c in chunks[:-1] if c.get("choices"))


def _beside_a_neighbour(server: LiveServer, body: dict, shared: bool = True):
    """Post `body` while the neighbour streams; return (its response, the neighbour's text).

    The batcher's rounds wait until both have joined, so that they share rounds."""
    neighbour: dict = {}

    def stream() -> None:
        try:
            neighbour["text"] = _stream_text(server, NEIGHBOUR)
        except AssertionError as error:
            neighbour["error"] = error

    batcher = server.decoder.batcher_for(server.decoder.spec)
    original, joined = batcher._round, threading.Event()

    def held(requests) -> None:
        while not joined.is_set() and batcher.members < 2:
            joined.wait(0.005)
        joined.set()
        original(requests)

    batcher._round = held
    batcher.stats.most_members = 0
    thread = threading.Thread(target=stream)
    try:
        thread.start()
        server.wait_for(lambda: batcher.members == 1, "the neighbour to join")
        response = server.http.post("/v1/completions", json={"model": "tiny", "temperature": 0, **body})
        thread.join(120)
    finally:
        joined.set()
        batcher._round = original
    assert "error" not in neighbour, neighbour["error"]
    if shared:  # a request failing at its first draft may leave before sharing a round
        assert batcher.stats.most_members == 2  # they shared rounds
    return response, neighbour["text"]


def test_a_tree_near_the_end_of_the_window_completes_and_its_neighbour_is_untouched(served):
    prompt = [3 + i % 20 for i in range(WINDOW - 32)]
    speculative = {"drafter": "test-full-tree", "tree_nodes": 200, "tree_branching": 26, "tree_depth": 3}
    body = {"prompt": prompt, "max_tokens": 32, "speculative": speculative}  # prompt + max_tokens = the window
    response, neighbour = _beside_a_neighbour(served, body)
    assert response.status_code == 200, response.text
    assert neighbour == served.alone
    plain = served.http.post("/v1/completions", json={"model": "tiny", "temperature": 0, "prompt": prompt,
                                                      "max_tokens": 32, "speculative": {"drafter": "none"}})
    assert response.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]  # lossless
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")  # the second reads its prompt from the cache
    assert {k: response.json()["usage"][k] for k in counts} == {k: plain.json()["usage"][k] for k in counts}


def test_a_block_that_cannot_be_scored_fails_its_member_alone(served, caplog):
    speculative = {"drafter": "test-short-parents", "tree_nodes": 3, "tree_depth": 2}
    response, neighbour = _beside_a_neighbour(served, {"prompt": [8, 9], "max_tokens": 8,
                                                       "speculative": speculative})
    assert_error(response, 400, fragment="parents")
    assert neighbour == served.alone
    _no_traceback_logged(caplog)  # a user error: one line in the log
    assert len([r for r in caplog.records if "generation refused" in r.getMessage()]) == 1


def test_a_drafter_that_raises_fails_its_member_alone(served):
    response, neighbour = _beside_a_neighbour(served, {"prompt": [8, 9], "max_tokens": 8,
                                                       "speculative": {"drafter": "test-raising", "k": 2}},
                                            shared=False)
    assert_error(response, 500, fragment="RuntimeError")
    assert neighbour == served.alone


# --------------------------------------------------------------------------- refused up front

@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A dense tiny model given loaded ("tiny") and the same model from a directory ("dir")."""
    decoders = loaded_and_saved_decoders(tmp_path_factory.mktemp("dense"))
    server = LiveServer(create_app(decoders, max_queue=4))
    yield server
    server.stop()


def _no_traceback_logged(caplog) -> None:
    records = [r for r in caplog.records if r.name.startswith("specwise")]
    assert all(r.exc_info is None and "Traceback" not in r.getMessage() for r in records), records


@pytest.mark.parametrize("field", ["temperature", "repetition_penalty"])
@pytest.mark.parametrize("value", [1e-300, 5e-324, 1e300])
@pytest.mark.parametrize("stream", [False, True])
def test_denormal_and_absurd_scales_are_refused_naming_the_param(plain, caplog, field, value, stream):
    body = {"model": "tiny", "prompt": "abc", "max_tokens": 4, "temperature": 1, field: value, "stream": stream}
    response = plain.http.post("/v1/completions", json=body)
    assert response.headers["content-type"].startswith("application/json")  # before any SSE byte
    assert_error(response, 400, field, f"{field} must be")
    _no_traceback_logged(caplog)


@pytest.mark.parametrize("body, param, where", [
    (b'{"model": "tiny", "prompt": "abc", "\\ud800": 1}', None, "a key of the request body"),
    (b'{"model": "tiny", "prompt": "abc", "speculative": {"k\\udc00": 1}}', "speculative", "a key of speculative"),
])
def test_a_lone_surrogate_in_a_key_is_a_400_that_does_not_echo_it(plain, caplog, body, param, where):
    response = plain.http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    error = assert_error(response, 400, param, where)
    assert "lone surrogate" in error["message"]
    assert not any(0xD800 <= ord(c) <= 0xDFFF for c in response.text)
    _no_traceback_logged(caplog)


@pytest.mark.parametrize("model", ["tiny", "dir"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_target_format_the_model_lacks_is_a_400_before_streaming(plain, caplog, model, stream):
    body = {"model": model, "prompt": "abc", "max_tokens": 4, "stream": stream,
            "speculative": {"target_format": "gguf"}}
    response = plain.http.post("/v1/completions", json=body)
    assert response.headers["content-type"].startswith("application/json")
    error = assert_error(response, 400, "speculative.target_format", "target_format 'auto'")
    assert "/" not in error["message"]  # no path of the server's
    _no_traceback_logged(caplog)
    if model == "tiny":  # the same request in the format it has is served
        served = plain.http.post("/v1/completions", json=body | {"speculative": {"target_format": "auto"},
                                                                 "stream": False})
        assert served.status_code == 200, served.text
