"""layerskip: drafting with the target's own first layers, and the scoring pass reusing that work.

- Layer ranges: layers [0, E) then [E, L) over a block give bitwise what one pass over all layers
  gives, hidden states and cache entries, on each GGUF kernel path and on the dense (float32) path.
- Reuse: the states drafting stashes after layer E - 1 and the entries it writes are bitwise those
  the target computes itself in a full scoring pass (compiled GGUF pass, each kernel path); on the
  dense path, where no row independence is claimed, they are bitwise those of one-token passes (what
  plain decoding computes). The scoring pass runs layers [0, E) for the uncovered rows only.
- Negative controls: a stash holding another token at a row is reused up to that row only, and the
  pass then equals a full pass; forcing the wrong stash in changes the logits (the check can fail).
- Greedy identity: engine output equals plain decoding on tiny random models (GGUF exactly; dense
  float32), several E (0: chosen by measurement) and k, adaptive k included.
- Distribution: the engine at temperature 1 with top-k / top-p, token and block verification,
  chi-square against the exact distribution (tests/helpers.py: p < 1e-3 fails, so a correct engine
  raises a false alarm once in a thousand configurations; fixed seeds). Marked slow.
- Settings, the bench key, refusals (hf runner, trees, an exit past the layers), exit choice.
- Real default target (GGUF, marked real_models): output equals its plain decoding exactly at
  E = 7, 14, 21 and chosen; α and τ printed.
"""

from __future__ import annotations

import os

import pytest
import torch

from helpers import ALPHA, LENGTH, PROMPT, SAMPLES, SAMPLING, p_value
from specwise import SamplingParams, SpecConfig, SpeculativeEngine
from specwise.bench.methods import parse_specwise_method
from specwise.drafters import DrafterContext, NgramDrafter, available_drafters, create_drafter
from specwise.drafters.exit_choice import candidate_exits, choose_exit, expected_speedup
from specwise.drafters.layerskip import LayerSkipDrafter
from specwise.runners.early_exit import EarlyExit
from specwise.runners.lean import LeanRunner
from specwise.runners.passes import choose_pass
from specwise.runners.hf import HFRunner
from specwise.testing import tiny_gguf_loaded, tiny_loaded, tiny_model

LAYERS = 4
CONTEXT = [5, 9, 11, 20, 7, 3, 5, 9, 11, 14]
BLOCK = [4, 8, 15, 16]
LONG_BLOCK = list(range(20, 37))  # a scoring pass of 18 rows: the amx path's tiles take 16 rows or more


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    return tiny_gguf_loaded(tmp_path_factory.mktemp("target"), seed=0, layers=LAYERS).model


@pytest.fixture(scope="module")
def dense_model():
    return tiny_model(seed=0, layers=LAYERS)


def entries(runner: LeanRunner, end: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    keys, values = runner.cache
    end = runner.length if end is None else end
    return keys[:, :, :end].clone(), values[:, :, :end].clone()


def prefilled(model, context=CONTEXT) -> LeanRunner:
    runner = LeanRunner(model)
    runner.reset()
    runner.forward(context[:-1], logits=False)
    return runner


def full_pass(runner: LeanRunner, ids: list[int], exit_layer: int) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """The target's own scoring pass: logits [n, V], states after layer E - 1 [n, H], entries; rolled back."""
    logits = runner.forward(ids, hidden_layers=[exit_layer - 1])
    states, cache = runner.last_hidden[:, 0].clone(), entries(runner)
    runner.rollback(len(ids))
    return logits, states, cache


def draft_rows(runner: LeanRunner, exit_layer: int, tokens: list[int]) -> EarlyExit:
    early = EarlyExit(runner, exit_layer)
    early.begin()
    for token in tokens:
        early.row(token)
    return early


# --------------------------------------------------------------------------- layer ranges


def split_equals_full(model, exit_layer: int) -> None:
    runner = prefilled(model)
    ids = [CONTEXT[-1]] + BLOCK
    layout = runner.layout(ids)
    plan = choose_pass(len(ids), True, runner.means)
    runner.reserve(layout.start + layout.rows)
    hidden, cos, sin = runner.embed(ids, layout.positions)
    whole, _ = runner.run_layers(plan, hidden.clone(), cos, sin, layout, range(LAYERS))
    want = entries(runner, layout.start + layout.rows)
    runner.cache[0][:, :, layout.start:].fill_(float("nan"))  # nothing of the first pass is left to read
    runner.cache[1][:, :, layout.start:].fill_(float("nan"))
    part, _ = runner.run_layers(plan, hidden.clone(), cos, sin, layout, range(exit_layer))
    part, _ = runner.run_layers(plan, part, cos, sin, layout, range(exit_layer, LAYERS))
    assert torch.equal(part, whole)
    got = entries(runner, layout.start + layout.rows)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("exit_layer", [1, 2, 3])
def test_a_layer_range_then_the_rest_equals_the_full_pass_gguf(gguf_model, kernel_path, exit_layer):
    split_equals_full(gguf_model, exit_layer)


@pytest.mark.parametrize("exit_layer", [1, 3])
def test_a_layer_range_then_the_rest_equals_the_full_pass_dense(dense_model, exit_layer):
    split_equals_full(dense_model, exit_layer)


def test_the_compiled_pass_refuses_a_range_outside_its_layers(gguf_model):
    runner = prefilled(gguf_model)
    layout = runner.layout([3])
    runner.reserve(layout.start + 1)
    hidden, cos, sin = runner.embed([3], layout.positions)
    with pytest.raises(RuntimeError, match=r"layers \[2, 9\) are not within \[0, 4\)"):
        runner.run_layers(choose_pass(1, True, runner.means), hidden, cos, sin, layout, range(2, 9))


# --------------------------------------------------------------------------- reuse


@pytest.mark.parametrize("exit_layer, block", [(1, BLOCK), (2, BLOCK), (3, BLOCK), (2, LONG_BLOCK)])
def test_reused_states_and_entries_equal_the_targets_own_bitwise_gguf(gguf_model, kernel_path, exit_layer, block):
    runner = prefilled(gguf_model)
    ids = [CONTEXT[-1]] + block
    want_logits, want_states, want_entries = full_pass(runner, ids, exit_layer)
    draft_rows(runner, exit_layer, ids[:-1])
    assert torch.equal(runner.stash.states(len(block)), want_states[:len(block)])
    drafted = entries(runner, runner.length + len(block))  # layers [0, E) of the drafted rows
    assert torch.equal(drafted[0][:exit_layer], want_entries[0][:exit_layer, :, :drafted[0].shape[2]])
    assert torch.equal(drafted[1][:exit_layer], want_entries[1][:exit_layer, :, :drafted[1].shape[2]])
    got = runner.forward(ids)
    assert torch.equal(got, want_logits)
    cache = entries(runner)
    assert torch.equal(cache[0], want_entries[0]) and torch.equal(cache[1], want_entries[1])


def test_on_the_dense_path_reused_states_are_those_of_one_token_passes(dense_model):
    exit_layer = 2
    ids = [CONTEXT[-1]] + BLOCK
    plain = prefilled(dense_model)
    one_by_one = []
    for token in ids[:-1]:  # plain decoding: one row per pass
        plain.forward([token], hidden_layers=[exit_layer - 1])
        one_by_one.append(plain.last_hidden[0, 0])
    runner = prefilled(dense_model)
    want_logits, _, _ = full_pass(runner, ids, exit_layer)
    draft_rows(runner, exit_layer, ids[:-1])
    assert torch.equal(runner.stash.states(len(BLOCK)), torch.stack(one_by_one))
    # The scoring pass's own rows differ in the last bits only, as any two dense passes' rows may.
    torch.testing.assert_close(runner.forward(ids), want_logits, rtol=1e-4, atol=1e-4)


def test_the_scoring_pass_runs_the_first_layers_for_the_uncovered_rows_only(gguf_model, monkeypatch):
    runner, exit_layer = prefilled(gguf_model), 2
    draft_rows(runner, exit_layer, [CONTEXT[-1]] + BLOCK[:-1])
    calls = []
    real = runner.run_layers

    def recorded(plan, hidden, cos, sin, layout, layers, order=()):
        calls.append((layers, layout.start, hidden.shape[0]))
        return real(plan, hidden, cos, sin, layout, layers, order)

    monkeypatch.setattr(runner, "run_layers", recorded)
    start = runner.length
    runner.forward([CONTEXT[-1]] + BLOCK)
    assert calls == [(range(exit_layer), start + len(BLOCK), 1), (range(exit_layer, LAYERS), start, len(BLOCK) + 1)]
    assert runner.stash is None  # a pass ends the stash


def test_a_stash_of_another_token_is_reused_only_before_it(gguf_model):
    runner, exit_layer = prefilled(gguf_model), 2
    ids = [CONTEXT[-1]] + BLOCK
    want_logits, _, want_entries = full_pass(runner, ids, exit_layer)
    draft_rows(runner, exit_layer, [ids[0], ids[1] + 1, ids[2]])  # row 1 drafted another token
    assert runner.stash.covered(runner.layout(ids), ids) == 1
    assert torch.equal(runner.forward(ids), want_logits)
    assert all(torch.equal(a, b) for a, b in zip(entries(runner), want_entries))


def test_a_block_the_stash_covers_whole_runs_the_last_layers_only(gguf_model):
    runner, exit_layer = prefilled(gguf_model), 2
    ids = [CONTEXT[-1]] + BLOCK[:2]
    want_logits, _, want_entries = full_pass(runner, ids, exit_layer)
    draft_rows(runner, exit_layer, ids + [BLOCK[2]])
    assert torch.equal(runner.forward(ids), want_logits)
    assert all(torch.equal(a, b) for a, b in zip(entries(runner), want_entries))


def test_negative_control_forcing_a_stash_of_another_token_changes_the_logits(gguf_model):
    runner, exit_layer = prefilled(gguf_model), 2
    ids = [CONTEXT[-1]] + BLOCK
    want_logits, _, _ = full_pass(runner, ids, exit_layer)
    draft_rows(runner, exit_layer, [ids[0], ids[1] + 1, ids[2]])
    runner.stash.tokens[1] = ids[1]  # claims the row it did not compute: what covered() exists to refuse
    assert not torch.equal(runner.forward(ids), want_logits)


def test_anything_that_changes_the_cache_voids_the_stash(gguf_model):
    runner = prefilled(gguf_model)
    for change in (lambda: runner.rollback(1), runner.reset, lambda: runner.forward([3], logits=False)):
        draft_rows(runner, 2, [CONTEXT[-1]])
        change()
        assert runner.stash is None


# --------------------------------------------------------------------------- the engine, greedy


def greedy(runner, drafter, spec, prompt=CONTEXT, new=24):
    return SpeculativeEngine(runner, drafter, spec).generate(prompt, SamplingParams(max_new_tokens=new,
                                                                                    ignore_eos=True))


@pytest.mark.parametrize("kind", ["gguf", "dense"])
@pytest.mark.parametrize("exit_layer, k, adaptive", [(0, 3, False), (1, 1, False), (2, 4, False), (3, 5, False),
                                                     (3, 2, True)])
def test_greedy_output_equals_plain_decoding(gguf_model, dense_model, kind, exit_layer, k, adaptive):
    model = gguf_model if kind == "gguf" else dense_model
    plain = greedy(LeanRunner(model), NgramDrafter(1, 1), SpecConfig(drafter="none")).token_ids
    spec = SpecConfig(drafter="layerskip", k=k, layerskip_exit=exit_layer, adaptive=adaptive, k_min=1, k_max=4)
    drafter = LayerSkipDrafter(exit_layer, k)
    result = greedy(LeanRunner(model), drafter, spec)
    assert result.token_ids == plain
    assert result.stats.proposed > 0 and drafter.exit_layer in range(1, LAYERS)


def test_the_decoder_finds_it_by_name_and_reports_its_exit(tmp_path):
    from specwise import SpecDecoder

    decoder = SpecDecoder(tiny_loaded(seed=0, layers=LAYERS), SpecConfig(drafter="layerskip", k=3, runner="lean"))
    plain = decoder.generate(CONTEXT, SamplingParams(max_new_tokens=16, ignore_eos=True),
                             spec=SpecConfig(drafter="none", runner="lean")).token_ids
    result = decoder.generate(CONTEXT, SamplingParams(max_new_tokens=16, ignore_eos=True))
    assert result.token_ids == plain
    drafter = decoder.drafter_for(decoder.spec)
    assert isinstance(drafter, LayerSkipDrafter) and set(drafter.choice.agreement) == {1, 2, 3}


# --------------------------------------------------------------------------- the engine, sampling


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0)  # 2 layers: the exit is layer 1


@pytest.mark.slow
@pytest.mark.parametrize("verifier", ["token", "block"])
def test_engine_output_has_target_distribution(target, exact, verifier):
    engine = SpeculativeEngine(LeanRunner(target), LayerSkipDrafter(1, LENGTH - 1),
                               SpecConfig(drafter="layerskip", k=LENGTH - 1, verifier=verifier))
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(SAMPLES):
        tokens = tuple(engine.generate(PROMPT, SamplingParams(**{**SAMPLING.__dict__, "seed": seed})).token_ids)
        counts[tokens] = counts.get(tokens, 0) + 1
    p = p_value(counts, exact)
    assert p > ALPHA, f"layerskip/{verifier}: chi-square p = {p:.2e}"


def test_draft_probs_are_the_processed_exit_distribution(target):
    from specwise.sampling import logits_to_probs

    runner = LeanRunner(target)
    runner.reset()
    runner.forward(PROMPT[:-1], logits=False)
    drafter = LayerSkipDrafter(1, 2)
    drafter.bind(runner)
    drafter.start(PROMPT, SAMPLING, torch.Generator().manual_seed(0))
    proposal = drafter.propose(PROMPT, 1)
    check = EarlyExit(runner, 1)
    check.begin()
    want = logits_to_probs(check.row(PROMPT[-1])[None], SAMPLING)[0]
    assert torch.equal(proposal.probs[0], want) and int((want > 0).sum()) <= SAMPLING.top_k


# --------------------------------------------------------------------------- settings and refusals


def test_it_is_registered_and_its_exit_is_a_declared_setting():
    assert "layerskip" in available_drafters()
    spec, _, _ = parse_specwise_method("specwise:drafter=layerskip,exit=7,k=3", SpecConfig())
    assert (spec.drafter, spec.layerskip_exit, spec.k) == ("layerskip", 7, 3)
    from specwise.settings import method_label

    assert method_label(spec, SpecConfig()) == "specwise-layerskip-k3-auto1-12-exit7"


def test_the_hf_runner_and_trees_are_refused_naming_the_fix(target):
    with pytest.raises(ValueError, match="runner 'lean'"):
        SpeculativeEngine(HFRunner(target), LayerSkipDrafter(1), SpecConfig(drafter="layerskip"))
    with pytest.raises(ValueError, match="use tree_nodes=0"):  # no propose_tree: the engine refuses trees
        SpeculativeEngine(LeanRunner(target), LayerSkipDrafter(1), SpecConfig(drafter="layerskip", tree_nodes=4))
    with pytest.raises(ValueError, match="runner 'lean'"):
        create_drafter("layerskip", DrafterContext(tiny_loaded(seed=0), SpecConfig(drafter="layerskip", runner="hf"),
                                                   64, {}))


def test_batched_decoding_is_refused_naming_the_fix():
    from specwise import SpecDecoder

    decoder = SpecDecoder(tiny_loaded(seed=0), SpecConfig(drafter="layerskip", runner="lean"), max_batch=2)
    with pytest.raises(ValueError, match="max_batch 1"):
        decoder.stream(CONTEXT, SamplingParams(max_new_tokens=4))


def test_an_exit_past_the_last_layer_is_refused(target):
    with pytest.raises(ValueError, match="layerskip_exit must be below the target's 2 decoder layers"):
        SpeculativeEngine(LeanRunner(target), LayerSkipDrafter(2), SpecConfig(drafter="layerskip"))


# --------------------------------------------------------------------------- choosing the exit


def test_candidate_exits_and_the_cost_model():
    assert candidate_exits(28) == [7, 14, 21]
    assert candidate_exits(2) == [1]
    # Same agreement: the shallower exit drafts cheaper; no agreement never pays.
    assert expected_speedup(0.6, 4, 7, 28, 5.0) > expected_speedup(0.6, 4, 21, 28, 5.0)
    assert expected_speedup(0.0, 4, 7, 28, 5.0) < 1


def test_measuring_the_exit_leaves_the_cache_as_it_was(gguf_model):
    runner = prefilled(gguf_model)
    before = entries(runner)
    choice = choose_exit(runner, CONTEXT, 4)
    assert runner.length == len(CONTEXT) - 1
    assert all(torch.equal(a, b) for a, b in zip(entries(runner), before))
    assert choice.exit_layer in choice.speedup and max(choice.speedup.values()) == choice.speedup[choice.exit_layer]


# --------------------------------------------------------------------------- the real default target


REAL_PROMPTS = ["Write a Python function that returns the n-th Fibonacci number iteratively.",
                "Explain in two sentences what a hash table is."]


@pytest.mark.real_models
def test_real_default_target_gguf_equals_its_plain_decoding_exactly():
    from specwise import SpecDecoder
    from specwise.store.catalog import DEFAULT_TARGET
    from specwise.errors import ModelError
    from specwise.store.prepare import resolve_model

    try:
        resolve_model(DEFAULT_TARGET)
    except ModelError as error:
        if os.environ.get("SPECWISE_REQUIRE_REAL_MODELS") == "1":
            pytest.fail(f"real models required here but not ready: {error}")
        pytest.skip(str(error))
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        decoder = SpecDecoder(DEFAULT_TARGET, SpecConfig(drafter="none", target_format="gguf"))
        sampling = SamplingParams(max_new_tokens=32)
        for prompt in REAL_PROMPTS:
            plain = decoder.generate(prompt, sampling)
            for exit_layer in (7, 14, 21, 0):
                spec = SpecConfig(drafter="layerskip", k=3, layerskip_exit=exit_layer, target_format="gguf")
                fast = decoder.generate(prompt, sampling, spec=spec)
                assert fast.token_ids == plain.token_ids, (prompt, exit_layer)
                s = fast.stats
                print(f"E={exit_layer} {prompt[:30]!r}: alpha {s.acceptance_rate:.2f} tau {s.acceptance_length:.2f}")
    finally:
        torch.set_num_threads(1)
