"""The server's prefix cache, over real sockets with a tiny GGUF model.

- a request repeating an earlier one's prompt reads only what the cache lacks, and says so
  (usage.prompt_tokens_details.cached_tokens, and llama.cpp's `timings` when asked), with the cold
  request's tokens;
- caches are scoped like the suffix store: another API key, or another `user` under the same key,
  never hits (a hit is faster: the timing would tell);
- the cache stays inside the KV budget: its bytes never pass its bound, which the budget sets, and
  blocks are evicted to admit a request;
- /metrics: the prefix cache's counters and the gauges routers read under vLLM's names.
"""

from __future__ import annotations

import pytest

from specwise import SpecConfig, SpecDecoder
from specwise.server import create_app
from specwise.server.cache_budget import entry_bytes
from specwise.testing import tiny_gguf_loaded

from helpers import long_prompt
from server_helpers import LiveServer, metric

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

KEYS = ["key-a", "key-b"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_gguf_loaded(tmp_path_factory.mktemp("target"), seed=0)


def complete(server: LiveServer, prompt: list[int], key: str = KEYS[0], **fields) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0, **fields}
    response = server.http.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    return response.json()


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.fixture(scope="module")
def server(target):
    decoder = SpecDecoder(target, SpecConfig(drafter="ngram", k=2), max_batch=2, prefill_chunk=16)
    live = LiveServer(create_app({"tiny": decoder}, api_key=KEYS))
    live.http.headers["Authorization"] = f"Bearer {KEYS[0]}"  # /metrics needs a key too
    yield live
    live.stop()


def test_a_repeated_prompt_is_read_from_the_cache_with_the_same_tokens(server):
    prompt = long_prompt(70, seed=1)
    cold = complete(server, prompt, timings=True)
    assert cached(cold) == 0
    assert cold["timings"]["cache_n"] == 0 and cold["timings"]["prompt_n"] == 70
    assert cold["timings"]["predicted_n"] == cold["usage"]["completion_tokens"]
    warm = complete(server, prompt, timings=True)
    assert warm["choices"][0]["text"] == cold["choices"][0]["text"]
    assert cached(warm) == 69 and warm["timings"]["cache_n"] == 69 and warm["timings"]["prompt_n"] == 1
    assert {"draft_n", "draft_n_accepted", "prompt_ms", "predicted_ms"} <= set(warm["timings"])
    assert "timings" not in complete(server, prompt)  # only when asked for
    samples = server.metrics()
    assert metric(samples, "specwise_prefix_cache_hits_total", model="tiny") >= 2
    assert metric(samples, "specwise_prefix_cache_hit_tokens_total", model="tiny") >= 128
    assert metric(samples, "specwise_prefix_cache_bytes", model="tiny") > 0


def test_a_tenant_never_hits_another_tenants_cache(server):
    prompt = long_prompt(50, seed=2)
    first = complete(server, prompt, KEYS[0], user="alice")
    assert cached(first) == 0
    assert cached(complete(server, prompt, KEYS[1], user="alice")) == 0  # another key
    assert cached(complete(server, prompt, KEYS[0], user="bob")) == 0  # another user under the key
    assert cached(complete(server, prompt, KEYS[0])) == 0  # no user
    again = complete(server, prompt, KEYS[0], user="alice")
    assert cached(again) == 49 and again["choices"] == first["choices"]
    assert cached(complete(server, prompt, KEYS[1], user="alice")) == 49  # key-b's own entry, from above


def test_the_cache_stays_inside_the_kv_budget_and_is_evicted_to_admit(target):
    decoder = SpecDecoder(target, SpecConfig(drafter="ngram", k=2), max_batch=2)
    budget = 160
    live = LiveServer(create_app({"tiny": decoder}, kv_budget_tokens=budget))
    try:
        limit = budget * entry_bytes(decoder.runner)
        assert decoder.prefix_cache.max_bytes == limit
        for seed in range(6):  # 6 different prompts of 70 tokens: 4 blocks each would be 384 tokens
            complete(live, long_prompt(70, seed=10 + seed))
            samples = live.metrics()
            assert metric(samples, "specwise_prefix_cache_bytes", model="tiny") <= limit
            assert decoder.prefix_cache.tokens <= budget
        samples = live.metrics()
        assert metric(samples, "specwise_prefix_cache_evictions_total", model="tiny") > 0
        assert metric(samples, "specwise_prefix_cache_limit_bytes", model="tiny") == limit
        # A request needing nearly the whole budget is admitted: cached blocks make room.
        assert decoder.prefix_cache.tokens > 0
        reply = complete(live, long_prompt(100, seed=99), max_tokens=budget - 100)
        assert reply["usage"]["completion_tokens"] >= 1
        # The worker releases the job just after the reply is sent: the gauge falls back to 0 then.
        live.wait_for(lambda: metric(live.metrics(), "vllm:num_requests_running", model_name="tiny") == 0,
                      "no request running once the reply is in")
    finally:
        live.stop()


def test_routers_read_vllm_named_gauges(server):
    samples = server.metrics()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:gpu_cache_usage_perc"):
        assert (name, (("model_name", "tiny"),)) in samples, name
    assert 0 <= metric(samples, "vllm:kv_cache_usage_perc", model_name="tiny") <= 1
