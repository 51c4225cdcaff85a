"""Coupled verification in the whole engine: seeded sampled output is plain decoding's, token for token.

A tiny random GGUF target (its passes keep rows independent bitwise, so a position's distribution is
the same in a block as alone) sampled at temperature 0.7 and 1.0 with top-p 0.9, three seeds:
plain decoding and every drafter (n-gram with adaptive k, suffix with k = 16, recycle, a draft model
with fixed and adaptive k, a draft tree, a draft model of another vocabulary) give identical token
ids, one at a time, four at once in one batch and from a cached prefix, through the library and
through the server, whose answers report the seed used (`speculative.seed`). Different seeds give
different outputs; rejection sampling at the same seed gives other tokens (the check has power); a
draft model identical to the target, drafting with the shared noise, is accepted almost always.
An EAGLE head (chains and trees) and layer-skip drafting on a dense tiny target commit plain
decoding's tokens too. An unseeded request draws a seed and reports it (library, CLI, server), and
that seed repeats its output.

The chi-square engine tests (slow): the coupled engine's output has the target's distribution at
temperature 1 with top-k and top-p, for plain decoding and with each kind of drafter, as
tests/test_engine_statistical.py checks the other verifiers. The real default target's version of
the identity is marked real_models.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import replace

import pytest
import torch

from specwise import SamplingParams, SpecConfig, SpecDecoder, SpeculativeEngine
from specwise.drafters import DraftModelDrafter, NgramDrafter
from specwise.drafters.ngram import NoDrafter
from specwise.k_policy import AdaptiveK, FixedK, PlannedK, choose_k_policy
from specwise.runners.hf import HFRunner
from specwise.stats import PhaseClock, SpecStats
from specwise.store.loading import LoadedModel
from specwise.testing import tiny_gguf_loaded, tiny_model, tiny_other_tokenizer

from helpers import ALPHA, LENGTH, PROMPT, SAMPLES, SAMPLING, p_value
from server_helpers import LiveServer

PROMPTS = ["the cat sat on the mat, the cat sat on the", "abcabcabcabc", "Why is the sky blue? Because"]
MAX_NEW = 32
SEEDS = (1, 2, 3)
SETTINGS = [dict(temperature=0.7, top_p=0.9), dict(temperature=1.0, top_p=0.9)]
PLAIN = SpecConfig(drafter="none")
# Every drafter, each as it would run: k adaptive where the verifier lets it, point masses under "auto".
SPECS = {
    "ngram-adaptive": SpecConfig(drafter="ngram"),
    "suffix-k16": SpecConfig(drafter="suffix", k=16, adaptive=False),
    "recycle": SpecConfig(drafter="recycle"),
    "draft-model-k4": SpecConfig(drafter="draft-model", k=4, adaptive=False, verifier="coupled"),
    "draft-model-adaptive": SpecConfig(drafter="draft-model", verifier="coupled", adaptive=True),
    "draft-model-tree": SpecConfig(drafter="draft-model", tree_nodes=10, tree_depth=4, tree_branching=3),
}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_gguf_loaded(tmp_path_factory.mktemp("target"), seed=0)


@pytest.fixture(scope="module")
def decoder(target):
    """The draft model is the target itself (another runner of it): with the shared noise its drafts
    are the target's own draws, so a misplaced position would show as rejections."""
    return SpecDecoder(target, PLAIN, drafter_model=target)


@pytest.fixture(scope="module")
def cross_decoder(target):
    """A draft model with another tokenizer (the cross-vocabulary drafter: TLI under sampling)."""
    tokenizer = tiny_other_tokenizer()
    other = LoadedModel("other", None, tiny_model(seed=1, vocab_size=len(tokenizer)), tokenizer)
    return SpecDecoder(target, PLAIN, drafter_model=other)


def sampling(seed: int | None, **settings) -> SamplingParams:
    return SamplingParams(max_new_tokens=MAX_NEW, seed=seed, ignore_eos=True, **settings)


@pytest.fixture(scope="module")
def plain(decoder):
    """Plain decoding's tokens by (prompt, settings index, seed)."""
    return {(prompt, i, seed): decoder.generate(prompt, sampling(seed, **settings), spec=PLAIN, chat=False).token_ids
            for prompt in PROMPTS for i, settings in enumerate(SETTINGS) for seed in SEEDS}


@pytest.mark.parametrize("name", list(SPECS))
def test_every_drafter_commits_plain_decodings_tokens(decoder, plain, name):
    spec = SPECS[name]
    assert spec.resolve_verifier(sampling(1, **SETTINGS[0])) == "coupled"
    proposed = accepted = 0
    for (prompt, i, seed), expected in plain.items():
        result = decoder.generate(prompt, sampling(seed, **SETTINGS[i]), spec=spec, chat=False)
        assert result.token_ids == expected, (name, prompt, SETTINGS[i], seed)
        assert result.seed == seed
        proposed, accepted = proposed + result.stats.proposed, accepted + result.stats.accepted
    assert accepted > 0, f"{name}: no draft accepted in {proposed} proposed; the identity is plain decoding's alone"
    if name.startswith("draft-model") and not name.endswith("tree"):
        # The twin draws what the target draws wherever the two passes agree: nearly every draft is kept.
        assert accepted / proposed > 0.9, f"{name}: alpha {accepted / proposed:.2f} with a drafter equal to its target"


def test_a_draft_model_of_another_vocabulary_commits_plain_decodings_tokens(cross_decoder, plain):
    spec = SpecConfig(drafter="draft-model", k=4, verifier="coupled")
    proposed = 0
    for (prompt, i, seed), expected in plain.items():
        result = cross_decoder.generate(prompt, sampling(seed, **SETTINGS[i]), spec=spec, chat=False)
        assert result.token_ids == expected, (prompt, SETTINGS[i], seed)
        proposed += result.stats.proposed
    assert proposed > 0


def test_eagle_and_layerskip_drafts_commit_plain_decodings_tokens():
    """The drafters that sample through the shared chain and tree code with a model of their own: an
    (untrained) EAGLE head, chains and trees, and layer-skip drafting with the target's first layer.
    Dense tiny targets in the lean runner (rows not bitwise independent: a near-tie of the race could
    differ, as greedy output's argmax could)."""
    from specwise.drafters.layerskip import LayerSkipDrafter
    from specwise.eagle import EagleDrafter, EagleHead, config_for_target
    from specwise.runners.lean import LeanRunner
    from specwise.testing import tiny_loaded

    target = tiny_loaded(seed=0, layers=4)
    torch.manual_seed(0)
    head = EagleHead(config_for_target(target.model, intermediate_size=64, feature_layers=(0, 1, 2)), None)
    head.init_from_target(target.model.get_output_embeddings().weight)
    embeddings = target.model.get_input_embeddings().weight
    runs = [(EagleDrafter(head.eval(), embeddings, target.model.config.vocab_size),
             SpecConfig(drafter="eagle", k=4, verifier="coupled")),
            (EagleDrafter(head.eval(), embeddings, target.model.config.vocab_size),
             SpecConfig(drafter="eagle", tree_nodes=8, tree_depth=3, tree_branching=3)),
            (LayerSkipDrafter(1, 4), SpecConfig(drafter="layerskip", k=4, verifier="coupled", runner="lean"))]
    runner = LeanRunner(target.model)
    prompts = [[5, 9, 14, 20, 33], [40, 41, 42, 40, 41, 42, 40, 41]]
    for seed in SEEDS:
        params = SamplingParams(temperature=1.0, top_p=0.9, seed=seed, max_new_tokens=MAX_NEW, ignore_eos=True)
        for prompt in prompts:
            expected = SpeculativeEngine(runner, NoDrafter(), PLAIN).generate(prompt, params).token_ids
            for drafter, spec in runs:
                result = SpeculativeEngine(runner, drafter, spec).generate(prompt, params)
                assert result.token_ids == expected, (spec.drafter, spec.tree, seed, prompt)
                assert result.stats.proposed > 0


def test_different_seeds_give_different_outputs(plain):
    for prompt in PROMPTS:
        for i in range(len(SETTINGS)):
            outputs = {tuple(plain[(prompt, i, seed)]) for seed in SEEDS}
            assert len(outputs) == len(SEEDS), (prompt, SETTINGS[i])


def test_negative_control_rejection_sampling_gives_other_tokens(decoder, plain):
    """Block verification is exact in distribution, but its random draws follow the blocks: at the
    same seeds its tokens are not plain decoding's."""
    spec = SpecConfig(drafter="draft-model", k=4, adaptive=False, verifier="block")
    differ = sum(decoder.generate(prompt, sampling(seed, **SETTINGS[i]), spec=spec, chat=False).token_ids != expected
                 for (prompt, i, seed), expected in plain.items())
    assert differ > len(plain) // 2


def test_four_requests_batched_commit_what_each_commits_alone(target, plain):
    """Four seeded sampled requests in one batch (ragged passes, the batch planning k), then again
    from the prefix cache: each one's tokens are plain decoding's."""
    batched = SpecDecoder(target, SpecConfig(drafter="ngram", k=3), max_batch=4, prefill_chunk=4)
    jobs = [(prompt, i, seed) for prompt in PROMPTS[:2] for i, seed in ((0, 1), (1, 2))]
    for round in ("alone in the cache", "from the prefix cache"):
        results: list = [None] * len(jobs)
        start = threading.Barrier(len(jobs))

        def run(j: int) -> None:
            prompt, i, seed = jobs[j]
            start.wait()
            results[j] = batched.generate(prompt, sampling(seed, **SETTINGS[i]), chat=False)

        threads = [threading.Thread(target=run, args=(j,)) for j in range(len(jobs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert [r.token_ids for r in results] == [plain[job] for job in jobs], round
    assert all(r.stats.cached_tokens > 0 for r in results)  # the second round read its prompts from the cache


def test_an_unseeded_request_reports_the_seed_that_repeats_it(decoder):
    first = decoder.generate(PROMPTS[0], sampling(None, **SETTINGS[0]), spec=SPECS["ngram-adaptive"], chat=False)
    assert isinstance(first.seed, int) and 0 <= first.seed < 2**63
    assert first.stats.to_dict()["seed"] == first.seed
    again = decoder.generate(PROMPTS[0], sampling(first.seed, **SETTINGS[0]), spec=PLAIN, chat=False)
    assert again.token_ids == first.token_ids
    other = decoder.generate(PROMPTS[0], sampling(None, **SETTINGS[0]), spec=PLAIN, chat=False)
    assert other.seed != first.seed
    greedy = decoder.generate(PROMPTS[0], SamplingParams(max_new_tokens=4), spec=PLAIN, chat=False)
    assert greedy.seed is None  # greedy decoding draws nothing


def test_the_cli_reports_the_seed_it_drew_and_that_seed_repeats_the_output(tmp_path, capsys):
    from specwise.cli import main
    from specwise.testing import tiny_loaded

    model = tiny_loaded(seed=0)
    model_dir = tmp_path / "tiny"
    model.model.save_pretrained(model_dir)
    model.tokenizer.save_pretrained(model_dir)
    command = ["generate", "--target", str(model_dir), "--raw", "--dtype", "float32", "--temperature", "0.9",
               "--max-new-tokens", "12", "--json", "--threads", "1", "abcabcabc"]
    assert main(command) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["verifier"] == "coupled" and isinstance(first["seed"], int)
    assert first["metrics"]["seed"] == first["seed"]
    assert main(command + ["--seed", str(first["seed"]), "--drafter", "none"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == first["token_ids"]


class _PlannedStub:
    """Just enough of a batch member for choose_k_policy: records the limit it is given."""

    vocab_size, max_context, length = 8, 64, 0
    limited: int | None = -1

    def reset(self) -> None: ...
    def forward(self, ids, *, logits=True): ...
    def rollback(self, n: int) -> None: ...
    def planned_k(self) -> int | None: return None
    def observe(self, proposed: int, accepted: int, draft_seconds: float) -> None: ...

    def limit(self, k_max: int | None) -> None:
        self.limited = k_max


def test_auto_adapts_and_batches_plan_seeded_sampled_requests_only_when_coupled():
    seeded = SamplingParams(temperature=0.8, seed=5)
    clock = PhaseClock(SpecStats())
    drafter = NgramDrafter(1, 2)
    spec = SpecConfig(drafter="ngram", k=3)
    assert isinstance(choose_k_policy(spec, seeded, drafter, _PlannedStub(), clock), PlannedK)
    plain_runner = HFRunner(tiny_model(seed=0))
    assert isinstance(choose_k_policy(spec, seeded, drafter, plain_runner, clock), AdaptiveK)
    assert isinstance(choose_k_policy(spec, seeded, drafter, plain_runner, clock, verifier="token"), FixedK)
    stub = _PlannedStub()
    fixed = replace(spec, adaptive=False)
    assert isinstance(choose_k_policy(fixed, seeded, drafter, stub, clock), PlannedK) and stub.limited == 3
    stub = _PlannedStub()  # rejection sampling with a fixed k: the batch must not change its k
    assert isinstance(choose_k_policy(fixed, seeded, drafter, stub, clock, verifier="token"), FixedK)
    assert stub.limited is None


# ----------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def server(target):
    from specwise.server import create_app

    decoder = SpecDecoder(target, SpecConfig(drafter="ngram", k=3), max_batch=4, prefill_chunk=4)
    live = LiveServer(create_app({"tiny": decoder}, max_queue=16))
    yield live
    live.stop()


def _complete(server: LiveServer, prompt: str, seed: int | None, settings: dict, into: dict,
              start: threading.Barrier | None = None) -> None:
    if start is not None:
        start.wait()
    body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_NEW, "seed": seed, **settings}
    reply = server.http.post("/v1/completions", json=body).json()
    into[(prompt, seed)] = reply


def test_the_server_answers_seeded_requests_alone_batched_and_cached_with_plain_decodings_text(server, decoder):
    jobs = [(prompt, i, seed) for prompt in PROMPTS[:2] for i, seed in ((0, 1), (1, 2))]
    expected = {(prompt, seed): decoder.generate(prompt, SamplingParams(max_new_tokens=MAX_NEW, seed=seed,
                                                                        **SETTINGS[i]), spec=PLAIN, chat=False).text
                for prompt, i, seed in jobs}
    alone: dict = {}
    for prompt, i, seed in jobs:
        _complete(server, prompt, seed, SETTINGS[i], alone)
    together: dict = {}
    start = threading.Barrier(len(jobs))
    threads = [threading.Thread(target=_complete, args=(server, prompt, seed, SETTINGS[i], together, start))
               for prompt, i, seed in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for replies in (alone, together):  # the second round reads every prompt from the prefix cache
        assert {key: r["choices"][0]["text"] for key, r in replies.items()} == expected
        assert all(r["speculative"]["seed"] == seed and r["speculative"]["verifier"] == "coupled"
                   for (_, seed), r in replies.items())
    assert all(r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 for r in together.values())


def test_the_server_reports_the_seed_it_drew_and_that_seed_repeats_the_answer(server):
    settings = SETTINGS[1]
    first: dict = {}
    _complete(server, PROMPTS[2], None, settings, first)
    reply = first[(PROMPTS[2], None)]
    seed = reply["speculative"]["seed"]
    assert isinstance(seed, int)
    again: dict = {}
    _complete(server, PROMPTS[2], seed, settings, again)
    assert again[(PROMPTS[2], seed)]["choices"][0]["text"] == reply["choices"][0]["text"]
    # Streamed: the seed arrives with the last chunk's `speculative` object.
    body = {"model": "tiny", "prompt": PROMPTS[2], "max_tokens": MAX_NEW, "seed": seed, "stream": True, **settings}
    with server.http.stream("POST", "/v1/completions", json=body) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == reply["choices"][0]["text"]
    assert chunks[-1]["speculative"]["seed"] == seed


# ----------------------------------------------------------------------------- the distribution (slow)


@pytest.fixture(scope="module")
def hf_target():
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def exact(hf_target):
    from helpers import exact_distribution

    return exact_distribution(hf_target)


def _counts(engine: SpeculativeEngine) -> dict:
    counts: dict = {}
    for seed in range(SAMPLES):
        tokens = tuple(engine.generate(PROMPT, replace(SAMPLING, seed=seed)).token_ids)
        counts[tokens] = counts.get(tokens, 0) + 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "ngram", "draft-model", "draft-model-tree"])
def test_coupled_engine_output_has_the_targets_distribution(hf_target, exact, kind):
    if kind == "plain":
        drafter, spec = NoDrafter(), SpecConfig(drafter="none")
    elif kind == "ngram":
        drafter, spec = NgramDrafter(1, 2), SpecConfig(drafter="ngram", k=LENGTH - 1, verifier="coupled")
    else:
        drafter = DraftModelDrafter(HFRunner(tiny_model(seed=1)), hf_target.config.vocab_size)
        spec = (SpecConfig(drafter="draft-model", tree_nodes=6, tree_depth=2, tree_branching=3) if kind.endswith("tree")
                else SpecConfig(drafter="draft-model", k=LENGTH - 1, verifier="coupled"))
    engine = SpeculativeEngine(HFRunner(hf_target), drafter, spec)
    p = p_value(_counts(engine), exact)
    assert p > ALPHA, f"{kind}/coupled: chi-square p = {p:.2e}"


@pytest.mark.slow
def test_negative_control_keying_the_noise_by_step_fails_the_same_check(hf_target, exact, monkeypatch):
    """Noise keyed by a row's place in its step instead of its position: plain decoding's every token
    is then drawn with the same noise, no longer independently, and the check catches it."""
    from specwise.noise import StepNoise

    monkeypatch.setattr(StepNoise, "rows", lambda self, offsets, vocab: self.noise.rows(list(offsets), vocab))
    engine = SpeculativeEngine(HFRunner(hf_target), NoDrafter(), SpecConfig(drafter="none"))
    assert p_value(_counts(engine), exact) < ALPHA


def _perturbed_copy(model, scale: float, seed: int = 7):
    """The model with noise of `scale` times each tensor's spread added to every weight: a draft model
    close to its target, but not equal."""
    import copy

    drafted = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in drafted.parameters():
            weight.add_(torch.randn(weight.shape, generator=generator) * weight.std() * scale)
    return drafted


@pytest.mark.slow
def test_acceptance_of_coupled_token_and_block_verification_for_a_sampled_draft_model(hf_target):
    """docs/DESIGN.md, "Coupled", one row of its table again (fewer seeds): for a draft model's chains,
    coupled verification keeps fewer tokens per step than rejection sampling, block verification more."""
    draft = _perturbed_copy(hf_target, 0.05)
    prompts = [[5, 9, 14, 20, 33], [40, 41, 42, 40, 41, 42, 40, 41], [7], [3, 60, 22, 18]]
    tau = {}
    for verifier in ("coupled", "token", "block"):
        engine = SpeculativeEngine(HFRunner(hf_target), DraftModelDrafter(HFRunner(draft), hf_target.config.vocab_size),
                                   SpecConfig(drafter="draft-model", k=4, adaptive=False, verifier=verifier))
        runs = [engine.generate(prompt, SamplingParams(temperature=1.0, seed=seed, max_new_tokens=32, ignore_eos=True))
                for seed in range(15) for prompt in prompts]
        merged = SpecStats.combine([run.stats for run in runs])
        tau[verifier] = merged.acceptance_length
    print({name: round(value, 3) for name, value in tau.items()})
    assert tau["coupled"] + 0.1 < tau["token"] < tau["block"], tau


# ----------------------------------------------------------------------------- the real default target


def _dev_prompts(count: int) -> list[str]:
    """The first question of the dev split's first `count` categories (specwise/data, from ../shared/data)."""
    from specwise.bench.prompts import DEFAULT_QUESTIONS

    chosen: dict[str, str] = {}
    for line in DEFAULT_QUESTIONS.read_text().splitlines():
        question = json.loads(line)
        chosen.setdefault(question["category"], question["turns"][0])
    return list(chosen.values())[:count]


@pytest.mark.real_models
def test_real_default_target_sampled_output_is_plain_decodings_with_every_drafter():
    """The default target as stored (GGUF blocks, rows independent bitwise) and its draft model, 32
    tokens of two dev-split prompts at temperature 0.7, top-p 0.9: plain decoding and every drafter
    give the same tokens."""
    from specwise.store.catalog import DEFAULT_DRAFTER, DEFAULT_TARGET
    from specwise.store.prepare import resolve_model
    from specwise.errors import ModelError

    for name in (DEFAULT_TARGET, DEFAULT_DRAFTER):
        try:
            resolve_model(name)
        except ModelError as error:
            if os.environ.get("SPECWISE_REQUIRE_REAL_MODELS") == "1":
                pytest.fail(f"real models required here but not ready: {error}")
            pytest.skip(str(error))
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        decoder = SpecDecoder(DEFAULT_TARGET, SpecConfig(drafter="none", target_format="gguf"),
                              drafter_model=DEFAULT_DRAFTER)
        specs = [SpecConfig(drafter="ngram", target_format="gguf"),
                 SpecConfig(drafter="suffix", k=16, adaptive=False, target_format="gguf"),
                 SpecConfig(drafter="recycle", target_format="gguf"),
                 SpecConfig(drafter="draft-model", verifier="coupled", draft_quantize="gguf", target_format="gguf"),
                 SpecConfig(drafter="draft-model", tree_nodes=8, tree_depth=4, tree_branching=2,
                            draft_quantize="gguf", target_format="gguf")]
        accepted = 0
        for prompt in _dev_prompts(2):
            params = SamplingParams(max_new_tokens=MAX_NEW, temperature=0.7, top_p=0.9, seed=7)
            expected = decoder.generate(prompt, params).token_ids
            for spec in specs:
                result = decoder.generate(prompt, params, spec=spec)
                assert result.token_ids == expected, (spec.drafter, prompt[:40])
                accepted += result.stats.accepted
        assert accepted > 0
    finally:
        torch.set_num_threads(1)
