"""Ollama's API on the server, over real sockets on loopback, through the official `ollama` client.

Answers are compared with the OpenAI routes' answers from the same server and with SpecDecoder.generate
on a separate decoder built from the same seeds; NDJSON framing is read raw with httpx.
"""

from __future__ import annotations

import hashlib
import json
import threading

import httpx
import ollama
import pytest

from specwise import SpecConfig, SpecDecoder, register_drafter
from specwise.server import create_app
from specwise.server.ollama_models import ModelFacts, parameter_size
from specwise.testing import tiny_loaded

from server_helpers import GATE, MAX_TOKENS, LiveServer, gated_factory, greedy, metric, never_ending
from server_helpers import gate  # noqa: F401  (a fixture: pytest finds it by name)

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]
GREEDY = {"temperature": 0, "num_predict": MAX_TOKENS}
FINAL_FIELDS = {"done_reason", "total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
                "eval_count", "eval_duration"}


def _decoder() -> SpecDecoder:
    # A fixed k, so that the served generation's step counts equal the reference's.
    return SpecDecoder(tiny_loaded(0), SpecConfig(drafter="ngram", k=2, adaptive=False))


@pytest.fixture(scope="module")
def reference() -> SpecDecoder:
    return _decoder()


@pytest.fixture(scope="module")
def live():
    server = LiveServer(create_app({"tiny": _decoder()}))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(live) -> ollama.Client:
    return ollama.Client(host=live.url, timeout=30)


def _raw(live, path: str, body: dict) -> list[dict]:
    """The objects of an NDJSON answer, read line by line as they arrive."""
    with httpx.stream("POST", live.url + path, json=body, timeout=30) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"] == "application/x-ndjson"
        text = response.read().decode()
    assert text.endswith("\n") and "\n\n" not in text
    return [json.loads(line) for line in text.splitlines()]


# --------------------------------------------------------------------------- chat and generate

def test_chat_is_the_openai_routes_answer(live, client, reference):
    expected = reference.generate(MESSAGES, greedy())
    answer = client.chat(model="tiny", messages=MESSAGES, options=GREEDY)
    openai = live.openai().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                                   temperature=0)
    assert answer.message.role == "assistant"
    assert answer.message.content == openai.choices[0].message.content == expected.text
    assert answer.done and answer.done_reason == openai.choices[0].finish_reason == expected.finish_reason
    assert answer.prompt_eval_count == openai.usage.prompt_tokens == len(expected.prompt_ids)
    assert answer.eval_count == openai.usage.completion_tokens == len(expected.token_ids)
    assert answer.total_duration >= answer.prompt_eval_duration > 0 and answer.eval_duration > 0
    assert answer.load_duration == 0  # loaded when the server started


def test_streaming_chat_adds_up_to_the_whole_answer(client, reference):
    expected = reference.generate(MESSAGES, greedy())
    parts = list(client.chat(model="tiny", messages=MESSAGES, options=GREEDY, stream=True))
    assert [part.done for part in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(part.message.content for part in parts) == expected.text
    assert parts[-1].message.content == "" and parts[-1].done_reason == expected.finish_reason
    assert parts[-1].eval_count == len(expected.token_ids)
    assert all(part.done_reason is None and part.eval_count is None for part in parts[:-1])


def test_generate_raw_is_the_completions_answer_and_templated_is_the_chat_answer(live, client, reference):
    raw = client.generate(model="tiny", prompt="abc", raw=True, options=GREEDY)
    completion = live.openai().completions.create(model="tiny", prompt="abc", max_tokens=MAX_TOKENS, temperature=0)
    assert raw.response == completion.choices[0].text == reference.generate("abc", greedy(), chat=False).text
    assert raw.prompt_eval_count == completion.usage.prompt_tokens
    templated = client.generate(model="tiny", prompt="hi there", system="Be brief.", options=GREEDY)
    assert templated.response == client.chat(model="tiny", messages=MESSAGES, options=GREEDY).message.content
    assert templated.response != raw.response  # negative control: the template made a difference
    streamed = list(client.generate(model="tiny", prompt="abc", raw=True, options=GREEDY, stream=True))
    assert "".join(part.response for part in streamed) == raw.response and streamed[-1].done


def test_ndjson_framing_read_raw(live, reference):
    expected = reference.generate(MESSAGES, greedy())
    # No "stream" field: Ollama's default is to stream.
    objects = _raw(live, "/api/chat", {"model": "tiny", "messages": MESSAGES, "options": GREEDY})
    *pieces, last = objects
    assert pieces and all(set(o) == {"model", "created_at", "message", "done"} and not o["done"] for o in pieces)
    assert "".join(o["message"]["content"] for o in pieces) == expected.text
    assert last["done"] is True and FINAL_FIELDS <= set(last)
    assert all(isinstance(last[field], int) for field in FINAL_FIELDS - {"done_reason"})
    assert last["created_at"].endswith("Z") and last["model"] == "tiny"
    assert last["speculative"]["drafter"] == "ngram" and last["speculative"]["steps"] == expected.stats.steps
    generated = _raw(live, "/api/generate", {"model": "tiny", "prompt": "abc", "raw": True, "options": GREEDY})
    assert "".join(o["response"] for o in generated[:-1]) == reference.generate("abc", greedy(), chat=False).text
    whole = httpx.post(live.url + "/api/chat", json={"model": "tiny", "messages": MESSAGES, "options": GREEDY,
                                                     "stream": False}, timeout=30)
    assert whole.headers["content-type"] == "application/json" and whole.text.count("\n") == 0
    assert whole.json()["message"]["content"] == expected.text


def test_load_requests_are_answered_at_once(client):
    assert client.chat(model="tiny", messages=[]).done_reason == "load"
    loaded = client.generate(model="tiny", prompt="")
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    assert client.chat(model="tiny:latest", messages=[{"role": "user", "content": "hi"}],
                       options={"num_predict": 2}).model == "tiny:latest"  # Ollama's default tag finds it


# --------------------------------------------------------------------------- options

def test_the_same_seed_gives_the_same_answer(live, client):
    def sampled(seed: int) -> str:
        return client.chat(model="tiny", messages=MESSAGES,
                           options={"temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": seed,
                                    "num_predict": MAX_TOKENS}).message.content

    first = sampled(7)
    assert sampled(7) == first
    # The seed reaches the sampler: other seeds give other answers (negative control).
    assert any(sampled(seed) != first for seed in (8, 9, 10))
    openai = live.openai().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                                   temperature=1.0, top_p=1.0, seed=7)
    assert openai.choices[0].message.content == first


def test_options_map_to_the_openai_routes_sampling(live, client, reference):
    def ollama_text(**options) -> str:
        return client.generate(model="tiny", prompt="abc", raw=True, options=options).response

    def openai_text(**fields) -> str:
        body = {"model": "tiny", "prompt": "abc", **fields}
        response = live.http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]

    # Unset options are Ollama's defaults: temperature 0.8, top_k 40, top_p 0.9.
    assert ollama_text(seed=3, num_predict=MAX_TOKENS) == openai_text(
        seed=3, max_tokens=MAX_TOKENS, temperature=0.8, top_k=40, top_p=0.9)
    assert ollama_text(seed=3, num_predict=MAX_TOKENS) != openai_text(seed=3, max_tokens=MAX_TOKENS)  # OpenAI's
    assert ollama_text(temperature=0, num_predict=MAX_TOKENS, repeat_penalty=1.5) == openai_text(
        temperature=0, max_tokens=MAX_TOKENS, repetition_penalty=1.5) == reference.generate(
        "abc", greedy(repetition_penalty=1.5), chat=False).text
    assert ollama_text(temperature=1.0, top_k=1, seed=5, num_predict=MAX_TOKENS) == ollama_text(
        temperature=0, num_predict=MAX_TOKENS)  # top_k 1 leaves only the greedy token
    short = client.generate(model="tiny", prompt="abc", raw=True, options={"temperature": 0, "num_predict": 3})
    assert short.eval_count == 3 and short.done_reason == "length"
    full = ollama_text(temperature=0, num_predict=MAX_TOKENS)
    stop = full[3:5]
    stopped = ollama_text(temperature=0, num_predict=MAX_TOKENS, stop=[stop])
    assert stopped == openai_text(temperature=0, max_tokens=MAX_TOKENS, stop=[stop]) and stop not in stopped
    # Unknown options and the operator's loading options are ignored, whole numbers may come as floats.
    assert ollama_text(temperature=0, num_predict=float(MAX_TOKENS), num_ctx=8192, num_thread=4, mirostat=2,
                       min_p=0.0, seed=-1) == full
    unlimited = ollama_text(temperature=0, num_predict=-1)  # Ollama's "no limit": the server's default limit
    assert unlimited.startswith(full) and len(unlimited) >= len(full)


@pytest.mark.parametrize("options, fragment", [
    ({"temperature": "hot"}, "options.temperature must be a number; got a string of 3 characters"),
    ({"num_predict": 2.5}, "options.num_predict must be an integer"),
    ({"top_k": True}, "options.top_k must be an integer"),
    ({"stop": "x"}, "options.stop must be a list of strings"),
    ({"use_mmap": 1}, "options.use_mmap must be true or false"),
    ({"temperature": -1}, "options.temperature must be"),
    ({"num_predict": 10**6}, "options.num_predict asks for"),
    ({"min_p": 0.1}, "options.min_p is not supported"),
    ({"repeat_penalty": 1.2, "repeat_last_n": 64}, "options.repeat_last_n"),
    ({"speculative": {"k": 1000}}, "options.speculative.k must be"),
    ({"speculative": {"drafter": "nothing-like-it"}}, "unknown drafter"),
])
def test_bad_options_are_refused_naming_them(client, options, fragment):
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model="tiny", messages=MESSAGES, options=options)
    assert refused.value.status_code == 400 and fragment in refused.value.error, refused.value.error


def test_the_speculative_option(live, reference):
    spec = SpecConfig(drafter="none")
    expected = reference.generate(MESSAGES, greedy(), spec=spec)
    options = {**GREEDY, "speculative": {"drafter": "none"}}
    answer = live.http.post("/api/chat", json={"model": "tiny", "messages": MESSAGES, "stream": False,
                                               "options": options})
    body = answer.json()
    assert body["message"]["content"] == expected.text
    assert body["speculative"]["drafter"] == "none" and body["speculative"]["proposed"] == 0


def test_what_specwise_cannot_honour_is_refused(live):
    for path, body, fragment in [
        ("/api/chat", {"format": "json"}, "format"),
        ("/api/chat", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ("/api/chat", {"think": True}, "think"),
        ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "images"),
        ("/api/generate", {"prompt": "x", "suffix": "y"}, "suffix"),
        ("/api/generate", {"prompt": "x", "template": "{{ .Prompt }}"}, "template"),
        ("/api/generate", {"prompt": "x", "context": [1, 2]}, "context"),
        ("/api/generate", {"prompt": "x", "raw": True, "system": "s"}, "system"),
        ("/api/chat", {"messages": "hi"}, "messages"),
        ("/api/chat", {"stream": "yes"}, "stream"),
    ]:
        full = {"model": "tiny", "messages": MESSAGES} if path == "/api/chat" else {"model": "tiny"}
        response = live.http.post(path, json=full | body)
        assert response.status_code == 400, (body, response.text)
        assert set(response.json()) == {"error"} and fragment in response.json()["error"], response.text
        assert "Traceback" not in response.text
    # Fields Ollama does not know are ignored, as Ollama ignores them.
    ok = live.http.post("/api/chat", json={"model": "tiny", "messages": MESSAGES, "stream": False,
                                           "options": {"num_predict": 2}, "keep_alive": "5m", "shift": True})
    assert ok.status_code == 200, ok.text


# --------------------------------------------------------------------------- models

def test_unknown_model_is_404_in_ollamas_shape(live, client):
    for call in (lambda: client.chat(model="nope", messages=MESSAGES),
                 lambda: client.generate(model="nope", prompt="x"), lambda: client.show("nope"),
                 lambda: list(client.chat(model="nope", messages=MESSAGES, stream=True))):
        with pytest.raises(ollama.ResponseError) as missing:
            call()
        assert missing.value.status_code == 404
        assert missing.value.error.startswith("model 'nope' not found") and "tiny" in missing.value.error
    response = live.http.post("/api/chat", json={"model": "nope", "messages": MESSAGES})
    assert response.status_code == 404 and set(response.json()) == {"error"}


def test_tags_and_show(live, client, reference):
    (entry,) = client.list().models
    assert entry.model == "tiny" and entry.size == sum(p.numel() * p.element_size()
                                                       for p in reference.target.model.parameters())
    assert entry.details.family == "qwen2" and entry.details.quantization_level == "F32"
    assert entry.details.parameter_size == parameter_size(sum(p.numel() for p in reference.target.model.parameters()))
    assert live.http.get("/api/tags").json()["models"][0]["name"] == "tiny"
    shown = client.show("tiny")
    assert shown.template == reference.tokenizer.chat_template and shown.capabilities == ["completion"]
    assert shown.modelinfo["general.architecture"] == "qwen2"
    assert shown.modelinfo["qwen2.context_length"] == reference.runner.max_context
    assert "num_ctx" in shown.parameters and "temperature" in shown.parameters
    assert live.http.post("/api/show", json={"name": "tiny:latest"}).json()["details"]["family"] == "qwen2"
    assert live.http.post("/api/show", json={}).status_code == 400


def test_a_gguf_files_facts_come_from_its_header(tmp_path):
    from gguf_files import CHAT_TEMPLATE, write_model_gguf

    path = write_model_gguf(tmp_path / "model.gguf", "llama")
    facts = ModelFacts.from_gguf(path, CHAT_TEMPLATE, 128)
    listing = facts.listing("file")
    assert listing["digest"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert listing["size"] == path.stat().st_size
    assert listing["details"] == {"parent_model": "", "format": "gguf", "family": "llama", "families": ["llama"],
                                  "parameter_size": parameter_size(facts.parameters), "quantization_level": "Q8_0"}
    shown = facts.show("file")
    assert shown["model_info"]["llama.block_count"] == 2 and shown["model_info"]["tokenizer.ggml.tokens"] == []
    assert "tokenizer.chat_template" not in shown["model_info"] and shown["template"] == CHAT_TEMPLATE
    json.dumps(shown)  # every value is JSON
    other = ModelFacts.from_gguf(write_model_gguf(tmp_path / "q.gguf", "llama", seed=1, metadata={}), "", 128)
    assert other.digest != facts.digest  # negative control: another file, another digest


@pytest.mark.parametrize("count, shown", [(7_615_616_512, "7.6B"), (8_000_000_000, "8B"), (494_032_768, "494.03M"),
                                          (135_000_000, "135M"), (23_776, "24K"), (999, "999")])
def test_parameter_sizes_read_as_ollama_writes_them(count, shown):
    assert parameter_size(count) == shown


# --------------------------------------------------------------------------- keys, tenants, queue, metrics

def test_api_key(reference):
    server = LiveServer(create_app({"tiny": _decoder()}, api_key="sesame"))
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            with pytest.raises(ollama.ResponseError) as refused:
                ollama.Client(host=server.url, headers=headers).chat(model="tiny", messages=MESSAGES)
            assert refused.value.status_code == 401
            assert "API key" in refused.value.error  # Ollama's {"error": "<message>"}, read by its client
        raw = server.http.post("/api/chat", json={"model": "tiny", "messages": MESSAGES})
        assert raw.status_code == 401 and isinstance(raw.json()["error"], str), raw.text
        assert server.http.post("/v1/completions", json={}).json()["error"]["code"] == "invalid_api_key"
        with pytest.raises(ollama.ResponseError):
            ollama.Client(host=server.url).list()
        keyed = ollama.Client(host=server.url, headers={"Authorization": "Bearer sesame"}, timeout=30)
        assert keyed.chat(model="tiny", messages=MESSAGES, options=GREEDY).message.content == \
            reference.generate(MESSAGES, greedy()).text
        assert [m.model for m in keyed.list().models] == ["tiny"]
    finally:
        server.stop()


def test_suffix_drafts_only_from_the_same_tenant():
    server = LiveServer(create_app({"tiny": SpecDecoder(never_ending(0), SpecConfig(drafter="ngram"))},
                                   api_key=["alice", "bob"]))
    body = {"model": "tiny", "prompt": "abcabcabcab", "raw": True, "stream": False,
            "options": {"temperature": 0, "num_predict": 40,
                        "speculative": {"drafter": "suffix", "k": 8, "adaptive": False}}}

    def tau(key: str) -> float:
        response = server.http.post("/api/generate", json=body, headers={"Authorization": f"Bearer {key}"})
        assert response.status_code == 200, response.text
        return response.json()["speculative"]["acceptance_length"]

    try:
        first = tau("alice")
        assert tau("alice") > first  # alice's first answer is now hers to draft from
        assert tau("bob") == first  # bob sees only his own requests
    finally:
        server.stop()


@pytest.fixture(scope="module")
def slow():
    """workers=1, max_queue=0, and a decoder that advances only when GATE allows."""
    register_drafter("test-gated", gated_factory)
    GATE.open()
    server = LiveServer(create_app({"slow": SpecDecoder(never_ending(0), SpecConfig(drafter="test-gated", k=1))},
                                   max_queue=0, workers=1))
    yield server
    GATE.open()
    server.stop()


def test_a_full_server_answers_429_in_ollamas_shape(slow, gate):
    body = {"model": "slow", "prompt": "abc", "raw": True, "options": {"temperature": 0, "num_predict": 4}}
    results: dict[str, list[dict]] = {}

    def streaming() -> None:
        results["first"] = _raw(slow, "/api/generate", body)

    holder = threading.Thread(target=streaming)
    holder.start()
    slow.wait_for(lambda: slow.health()["running"] == 1, "the first request to run")
    response = slow.http.post("/api/generate", json=body)
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    assert set(response.json()) == {"error"} and "server is busy" in response.json()["error"]
    with pytest.raises(ollama.ResponseError) as busy:
        ollama.Client(host=slow.url).chat(model="slow", messages=MESSAGES)
    assert busy.value.status_code == 429
    gate.open()
    holder.join(30)
    assert results["first"][-1]["done"] and results["first"][-1]["eval_count"] == 4


def test_metrics_count_ollama_requests(live, client):
    before = live.metrics()
    chat = client.chat(model="tiny", messages=MESSAGES, options=GREEDY)
    generated = list(client.generate(model="tiny", prompt="abc", raw=True, options=GREEDY, stream=True))[-1]
    with pytest.raises(ollama.ResponseError):
        client.chat(model="nope", messages=MESSAGES)
    after = live.metrics()

    def grew(name: str, **labels) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert grew("specwise_request_latency_seconds_count", endpoint="ollama_chat") == 1
    assert grew("specwise_request_latency_seconds_count", endpoint="ollama_generate") == 1
    assert grew("specwise_time_to_first_token_seconds_count", endpoint="ollama_generate") == 1
    for reason in ("stop", "length"):
        assert grew("specwise_generations_total", model="tiny", finish_reason=reason) == \
            [chat.done_reason, generated.done_reason].count(reason)
    assert grew("specwise_generated_tokens_total", model="tiny") == chat.eval_count + generated.eval_count
    assert grew("specwise_errors_total", type="not_found_error", code="model_not_found") == 1
    # counted under their own routes, not as "other"
    assert grew("specwise_requests_total", endpoint="/api/chat", status="200") == 1
    assert grew("specwise_requests_total", endpoint="/api/chat", status="404") == 1
    assert grew("specwise_requests_total", endpoint="/api/generate", status="200") == 1
    assert grew("specwise_spec_steps_total", model="tiny", drafter="ngram") > 0


def test_sampling_defaults_are_ollamas():
    from specwise.server.ollama_schemas import sampling_fields

    assert sampling_fields({}) == {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
    assert sampling_fields({"seed": -1, "num_predict": -2, "temperature": 0}) == {
        "temperature": 0, "top_k": 40, "top_p": 0.9, "seed": None, "max_tokens": None}
    assert sampling_fields({"num_predict": 5, "repeat_penalty": 1.1, "seed": 3}) == {
        "temperature": 0.8, "top_k": 40, "top_p": 0.9, "max_tokens": 5, "repetition_penalty": 1.1, "seed": 3}
