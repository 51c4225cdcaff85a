"""The server batching requests (--max-batch), over real sockets with tiny GGUF models.

- eight concurrent greedy streams, through the official OpenAI client, each equal to the same
  request served alone, and to the library's generate;
- the KV budget with batching: requests that fit run together, the next waits, past the queue 429;
- /metrics reports the batch (members, rows per pass, the goodput rule's k);
- sampled requests served beside a busy stream keep the target's exact distribution (chi-square).
"""

from __future__ import annotations

import threading

import pytest

from specwise import SamplingParams, SpecConfig, SpecDecoder
from specwise.server import create_app
from specwise.testing import tiny_gguf_loaded

from server_helpers import MAX_TOKENS, LiveServer, assert_error, metric

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PROMPTS = ["abc", "Hello there", "def f(x):", "The quick brown fox", "1, 2, 3,", "Why?", "ZZZ top", "q"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_gguf_loaded(tmp_path_factory.mktemp("target"), seed=0)


@pytest.fixture(scope="module")
def batched(target):
    decoder = SpecDecoder(target, SpecConfig(drafter="ngram", k=3), max_batch=8, prefill_chunk=4)
    server = LiveServer(create_app({"tiny": decoder}, max_queue=16))
    yield server
    server.stop()


def _complete(server: LiveServer, prompt: str, into: dict, start: threading.Barrier | None = None) -> None:
    api = server.openai()
    if start is not None:
        start.wait()
    stream = api.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True)
    into[prompt] = "".join(c.choices[0].text for c in stream if c.choices)


def test_eight_concurrent_greedy_streams_each_equal_it_served_alone(batched, target):
    alone: dict = {}
    for prompt in PROMPTS:  # one at a time: each request alone in its passes
        _complete(batched, prompt, alone)
    reference = SpecDecoder(target, SpecConfig(drafter="ngram", k=3))
    sampling = SamplingParams(max_new_tokens=MAX_TOKENS, temperature=0)
    assert alone == {p: reference.generate(p, sampling, chat=False).text for p in PROMPTS}
    assert len(set(alone.values())) == len(PROMPTS), "prompts must give different outputs"

    together: dict = {}
    start = threading.Barrier(len(PROMPTS))
    threads = [threading.Thread(target=_complete, args=(batched, p, together, start)) for p in PROMPTS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert together == alone
    samples = batched.metrics()
    assert metric(samples, "specwise_batch_passes_total", model="tiny") > 0
    assert metric(samples, "specwise_batch_scored_rows_total", model="tiny") > 0
    assert metric(samples, "specwise_batch_members", model="tiny") == 0  # all left
    assert ("specwise_batch_planned_k", (("model", "tiny"),)) in samples
    # A job leaves the scheduler just after its client has the last bytes.
    batched.wait_for(lambda: batched.app.state.scheduler.running == 0, "every job to leave the scheduler")


def test_kv_budget_with_batching_runs_what_fits_together_queues_the_rest_then_429(target):
    decoder = SpecDecoder(target, SpecConfig(drafter="ngram", k=2), max_batch=4)
    server = LiveServer(create_app({"tiny": decoder}, max_queue=1, kv_budget_tokens=100))
    try:
        gate = threading.Event()
        original = decoder.batcher_for(decoder.spec)._round

        def gated(requests):  # every pass waits for the test, so the requests stay in flight
            gate.wait(30)
            original(requests)

        decoder.batcher_for(decoder.spec)._round = gated
        body = {"model": "tiny", "prompt": [5, 6, 7], "temperature": 0}
        results: dict = {}

        def post(key: str, max_tokens: int) -> None:
            results[key] = server.http.post("/v1/completions", json=body | {"max_tokens": max_tokens})

        threads = [threading.Thread(target=post, args=(key, 37)) for key in ("a", "b")]  # 40 each: both fit
        for thread in threads:
            thread.start()
        server.wait_for(lambda: server.health()["running"] == 2, "two requests to run together")
        threads.append(threading.Thread(target=post, args=("c", 37)))  # 40 more would pass 100: it waits
        threads[-1].start()
        server.wait_for(lambda: server.health()["waiting"] == 1, "the third to wait")
        assert_error(server.http.post("/v1/completions", json=body | {"max_tokens": 4}), 429, code="queue_full")
        gate.set()
        for thread in threads:
            thread.join(60)
        texts = {key: r.json()["choices"][0]["text"] for key, r in results.items()}
        assert all(r.status_code == 200 for r in results.values())
        assert texts["a"] == texts["b"] == texts["c"]  # the same request, whoever it ran beside
    finally:
        server.stop()


def test_a_client_leaving_mid_stream_frees_its_place_and_the_others_go_on(tmp_path):
    long_running = tiny_gguf_loaded(tmp_path, seed=0)
    long_running.tokenizer.eos_token = "<unk>"  # an end it does not reach from this prompt
    long_running.model.generation_config.eos_token_id = long_running.tokenizer.eos_token_id
    decoder = SpecDecoder(long_running, SpecConfig(drafter="ngram", k=2), max_batch=4)
    prompt = [5, 6, 7]
    assert decoder.generate(prompt, SamplingParams(max_new_tokens=400)).finish_reason == "length"
    server = LiveServer(create_app({"tiny": decoder}, max_queue=4, kv_budget_tokens=2048))
    try:
        body = {"model": "tiny", "prompt": prompt, "temperature": 0, "stream": True, "max_tokens": 400}
        kept: dict = {}

        def stay() -> None:
            with server.http.stream("POST", "/v1/completions", json=body) as response:
                kept["chunks"] = [line for line in response.iter_lines() if line.startswith("data: ")]

        staying = threading.Thread(target=stay)
        staying.start()
        server.wait_for(lambda: decoder.batcher_for(decoder.spec).members == 1, "the first stream to start")
        with server.http.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            for _ in range(3):  # a few tokens, then the client goes away
                next(lines)
        staying.join(60)
        assert kept["chunks"][-1] == "data: [DONE]"
        batcher = decoder.batcher_for(decoder.spec)
        server.wait_for(lambda: batcher.members == 0 and server.health()["running"] == 0, "the places to be freed")
        assert batcher.stats.most_members == 2
    finally:
        server.stop()


@pytest.mark.slow
def test_sampled_requests_beside_a_busy_stream_keep_the_targets_distribution(target):
    """Over HTTP: four clients sample with their own seeds while a fifth keeps a long greedy stream in
    every pass; the texts drawn follow the target's exact distribution (chi-square)."""
    import httpx
    from helpers import ALPHA, LENGTH, PROMPT, SAMPLES, SAMPLING, exact_distribution, p_value

    decoder = SpecDecoder(target, SpecConfig(drafter="ngram", k=2), max_batch=5)
    server = LiveServer(create_app({"tiny": decoder}, max_queue=16))
    tokenizer = decoder.tokenizer
    exact: dict = {}
    for tokens, p in exact_distribution(target.model).items():  # by text, as the server answers
        text = tokenizer.decode(list(tokens), skip_special_tokens=True)
        exact[text] = exact.get(text, 0.0) + p
    counts: dict = {}
    lock = threading.Lock()
    errors: list = []

    def sample(seeds: range) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            for seed in seeds:
                body = {"model": "tiny", "prompt": PROMPT, "max_tokens": LENGTH, "seed": seed,
                        "temperature": SAMPLING.temperature, "top_k": SAMPLING.top_k, "top_p": SAMPLING.top_p}
                reply = http.post("/v1/completions", json=body)
                if reply.status_code != 200:
                    errors.append(reply.text)
                    return
                text = reply.json()["choices"][0]["text"]
                with lock:
                    counts[text] = counts.get(text, 0) + 1

    def busy() -> None:
        api = server.openai()
        stream = api.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=400,
                                        temperature=0, stream=True)
        for _ in stream:
            pass

    try:
        streaming = threading.Thread(target=busy)
        streaming.start()
        quarter = SAMPLES // 4
        threads = [threading.Thread(target=sample, args=(range(i * quarter, (i + 1) * quarter),)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
        streaming.join(600)
    finally:
        server.stop()
    assert not errors, errors[:3]
    assert sum(counts.values()) == 4 * quarter
    assert decoder.batcher_for(decoder.spec).stats.most_members >= 2  # they were sampled side by side
    p = p_value(counts, exact)
    assert p > ALPHA, f"chi-square p = {p:.2e}"
