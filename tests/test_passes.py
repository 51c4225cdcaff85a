"""Named pass kinds: which code runs each pass is chosen in one place, and the runners follow it.

- the selection table is pinned, row by row and against the rule the runners applied before the
  kinds had names, over every (rows, logits, chain, features, restricted) case: the same code runs
  every pass as before, so speed and outputs stay as they were;
- the lean runner, the torch.compile step and the ragged pass run the code the table names for each
  pass (spies on the decoder pass, the PyTorch layers and the compiled graph);
- the ragged pass reaches the runners through their public pass interface only, and that
  interface refuses a block laid out against another cache.

The numerics each kind claims are tested bitwise where they are claimed: tests/test_gguf_model.py
(score and prefill against one-token passes, the batched reading's weaker guarantees) and
tests/test_batching.py (ragged against each sequence alone).
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest
import torch

import specwise.runners.ragged as ragged
from specwise.kernels import gguf as gguf_kernels
from specwise.runners.torch_step import CompiledLeanRunner
from specwise.runners.lean import LeanRunner
from specwise.runners.passes import (DECODER_PASS_ROWS, MAX_COMPILED_BLOCK, Attention, Implementation, Pass,
                                    PassKind, PassMeans, choose_pass, choose_ragged, exact_prefill, pass_kind)
from specwise.runners.ragged import Block, ragged_pass, score_together
from specwise.testing import tiny_gguf_loaded, tiny_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SCORE, PREFILL, RAGGED = PassKind.SCORE, PassKind.PREFILL, PassKind.RAGGED
DECODER, LAYERS, COMPILED = Implementation.DECODER_PASS, Implementation.LAYERS, Implementation.COMPILED_STEP
ROW, BATCHED = Attention.ROW_BY_ROW, Attention.BATCHED

GGUF_CPU = PassMeans(decoder_pass=True, compiled_step=False, device="cpu")
DENSE_CPU = PassMeans(decoder_pass=False, compiled_step=False, device="cpu")
DENSE_GPU = PassMeans(decoder_pass=False, compiled_step=False, device="cuda")
COMPILED_CPU = PassMeans(decoder_pass=False, compiled_step=True, device="cpu")
COMPILED_GPU = PassMeans(decoder_pass=False, compiled_step=True, device="cuda")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_gguf_loaded(tmp_path_factory.mktemp("target"), seed=0)


# --------------------------------------------------------------------------- the table

TABLE = [  # means, rows, logits -> kind, implementation, attention, bf16 prefill route, row-independent
    (GGUF_CPU, 1, True, SCORE, DECODER, ROW, False, True),
    (GGUF_CPU, 5, True, SCORE, DECODER, ROW, False, True),
    (GGUF_CPU, 200, True, SCORE, DECODER, ROW, False, True),  # a prompt read with logits: still per row
    (GGUF_CPU, 1, False, PREFILL, DECODER, ROW, False, True),
    (GGUF_CPU, 16, False, PREFILL, DECODER, ROW, False, True),
    (GGUF_CPU, 17, False, PREFILL, DECODER, ROW, False, True),  # a prompt of any length: per row, exact
    (GGUF_CPU, 500, False, PREFILL, DECODER, ROW, False, True),
    (DENSE_CPU, 1, True, SCORE, LAYERS, ROW, False, False),
    (DENSE_CPU, 5, True, SCORE, LAYERS, ROW, False, False),
    (DENSE_CPU, 5, False, PREFILL, LAYERS, BATCHED, True, False),
    (DENSE_CPU, 500, False, PREFILL, LAYERS, BATCHED, True, False),
    (DENSE_GPU, 5, True, SCORE, LAYERS, BATCHED, False, False),
    (DENSE_GPU, 500, False, PREFILL, LAYERS, BATCHED, True, False),
    (COMPILED_GPU, 1, True, SCORE, COMPILED, BATCHED, False, False),
    (COMPILED_GPU, 64, True, SCORE, COMPILED, BATCHED, False, False),
    (COMPILED_GPU, 65, True, SCORE, LAYERS, BATCHED, False, False),
    (COMPILED_GPU, 3, False, PREFILL, LAYERS, BATCHED, True, False),
    (COMPILED_CPU, 5, True, SCORE, COMPILED, BATCHED, False, False),
    (COMPILED_CPU, 65, True, SCORE, LAYERS, ROW, False, False),
]


@pytest.mark.parametrize("means, rows, logits, kind, implementation, attention, bf16, independent", TABLE)
def test_each_pass_runs_where_the_table_says(means, rows, logits, kind, implementation, attention, bf16,
                                             independent):
    chosen = choose_pass(rows, logits, means)
    assert chosen == Pass(kind, implementation, attention, bf16_prefill=bf16)
    assert chosen.row_independent is independent
    assert pass_kind(rows, logits) is kind


def rule_before_the_kinds(rows: int, logits: bool, means: PassMeans, chain: bool, features: bool,
                          restricted: bool) -> tuple[Implementation, Attention, bool]:
    """The choice as the runners made it inline before passes.py: CompiledLeanRunner.forward took a
    chain scoring pass of 1..64 rows with neither features nor a restricted output; LeanRunner._run
    took the compiled GGUF pass when `logits or n <= 16`, else its layers, attending row by row when
    `logits` on the CPU and reading the prompt under `gguf.prefill()` when not `logits`."""
    if means.compiled_step and chain and logits and not features and not restricted and 0 < rows <= 64:
        return COMPILED, BATCHED, False
    if means.decoder_pass and (logits or rows <= 16):
        return DECODER, ROW, False
    return LAYERS, ROW if logits and means.device == "cpu" else BATCHED, not logits


def test_the_table_is_the_rule_the_runners_applied_before_but_for_long_gguf_prefills_in_every_case():
    """The one change since: a GGUF prompt of more than 16 rows takes the native pass too (the batched
    PyTorch reading made its entries depend on its chunking); every other case runs the code it ran."""
    cases = changed = 0
    # A torch.compile step needs dense layers, so no runner has both it and the GGUF pass.
    for means in (GGUF_CPU, DENSE_CPU, DENSE_GPU, COMPILED_CPU, COMPILED_GPU):
        for rows, logits, chain, features, restricted in itertools.product(
                (1, 2, 15, 16, 17, 63, 64, 65, 1000), (True, False), (True, False), (True, False), (True, False)):
            chosen = choose_pass(rows, logits, means, chain=chain, features=features, restricted=restricted)
            before = rule_before_the_kinds(rows, logits, means, chain, features, restricted)
            if means.decoder_pass and not logits and rows > 16:
                assert before == (LAYERS, BATCHED, True)
                assert (chosen.implementation, chosen.attention, chosen.bf16_prefill) == (DECODER, ROW, False)
                changed += 1
            else:
                assert (chosen.implementation, chosen.attention, chosen.bf16_prefill) == before, (
                    means, rows, logits, chain, features, restricted)
            cases += 1
    assert cases == 5 * 9 * 16 and changed == 5 * 8
    assert MAX_COMPILED_BLOCK == 64 and DECODER_PASS_ROWS == 256


def test_only_the_compiled_gguf_pass_reads_prompts_exactly_enough_to_reuse_them():
    assert exact_prefill(GGUF_CPU)
    assert not any(exact_prefill(means) for means in (DENSE_CPU, DENSE_GPU, COMPILED_CPU, COMPILED_GPU))
    every_prefill = [choose_pass(rows, False, GGUF_CPU) for rows in (1, 16, 17, 300, 5000)]
    assert all(p.row_independent and p.kind is PREFILL for p in every_prefill)


def test_the_ragged_pass_needs_one_model_in_the_compiled_gguf_pass():
    assert choose_ragged(GGUF_CPU, one_model=True, restricted=False) == Pass(
        RAGGED, Implementation.RAGGED_DECODER_PASS, ROW, bf16_prefill=False)
    assert choose_ragged(GGUF_CPU, one_model=True, restricted=False).row_independent
    assert choose_ragged(GGUF_CPU, one_model=False, restricted=False) is None
    assert choose_ragged(GGUF_CPU, one_model=True, restricted=True) is None
    for means in (DENSE_CPU, DENSE_GPU, COMPILED_GPU, PassMeans(decoder_pass=True, compiled_step=False,
                                                                device="cuda")):
        assert choose_ragged(means, one_model=True, restricted=False) is None


def test_a_pass_has_rows():
    with pytest.raises(ValueError, match="at least one row"):
        choose_pass(0, True, GGUF_CPU)


# --------------------------------------------------------------------------- the runners follow it

def spy(monkeypatch, runner) -> list[tuple]:
    """Record which code runs each pass of `runner`: ("decoder",) or ("layers", attention, prefill route)."""
    calls: list[tuple] = []
    if runner.decoder_pass is not None:
        run = runner.decoder_pass.run

        def decoder(*args, **kwargs):
            calls.append(("decoder",))
            return run(*args, **kwargs)

        monkeypatch.setattr(runner.decoder_pass, "run", decoder)
    layers = runner._layers

    def layered(hidden, cos, sin, layout, attention, *rest):  # rest: the captured layers and the layer range
        calls.append(("layers", attention, bool(getattr(gguf_kernels._PREFILL, "on", False))))
        return layers(hidden, cos, sin, layout, attention, *rest)

    monkeypatch.setattr(runner, "_layers", layered)
    return calls


def expected_call(chosen: Pass) -> tuple:
    if chosen.implementation is DECODER:
        return ("decoder",)
    return ("layers", chosen.attention, chosen.bf16_prefill)


@pytest.mark.parametrize("model", ["gguf", "dense"])
def test_the_lean_runner_runs_each_pass_with_the_code_the_table_names(target, model, monkeypatch):
    runner = LeanRunner(target.model if model == "gguf" else tiny_model(seed=0))
    assert (runner.decoder_pass is not None) is (model == "gguf")
    calls = spy(monkeypatch, runner)
    vocab = runner.embed_rows
    seen = set()
    for rows, logits in itertools.product((1, 2, 16, 17, 40), (True, False)):
        runner.reset()
        runner.forward([7, 8, 9], logits=False)
        calls.clear()
        out = runner.forward([(5 * i + 3) % vocab for i in range(rows)], logits=logits)
        chosen = choose_pass(rows, logits, runner.means)
        assert calls == [expected_call(chosen)], (rows, logits)
        assert (out is None) is (not logits) and runner.length == 3 + rows
        seen.add(chosen.implementation)
        calls.clear()
        runner.forward_tree([1, 2, 3][:rows], [-1, 0, 0][:rows])  # a tree: always a scoring pass
        assert calls == [expected_call(choose_pass(min(rows, 3), True, runner.means, chain=False))]
    assert seen == ({DECODER} if model == "gguf" else {LAYERS})


def test_the_compiled_step_takes_the_chain_scoring_passes_the_table_gives_it(monkeypatch):
    runner = CompiledLeanRunner(tiny_model(seed=0))  # torch.compile compiles on the first call only
    assert runner.means == COMPILED_CPU
    compiled: list[int] = []

    def graph(input_ids, positions, mask, keys, values):
        compiled.append(len(input_ids))
        return torch.zeros(len(input_ids), runner.vocab_size)

    monkeypatch.setattr(runner, "_compiled", graph)
    calls = spy(monkeypatch, runner)
    runner.reset()
    runner.forward([1, 2, 3], logits=False)
    assert compiled == [] and calls == [("layers", BATCHED, True)]
    runner.forward([4, 5])
    runner.forward([4] * MAX_COMPILED_BLOCK)
    assert compiled == [2, MAX_COMPILED_BLOCK] and runner.length == 5 + MAX_COMPILED_BLOCK
    calls.clear()
    runner.forward([4] * (MAX_COMPILED_BLOCK + 1))
    runner.forward([6], hidden_layers=[0])
    runner.forward_tree([1, 2], [-1, 0])
    runner.restrict_output([1, 2, 3])
    runner.forward([6])
    assert compiled == [2, MAX_COMPILED_BLOCK] and calls == [("layers", ROW, False)] * 4


def test_ragged_scoring_runs_in_one_pass_only_where_the_table_allows(target, tmp_path, monkeypatch):
    gguf = [LeanRunner(target.model) for _ in range(2)]
    assert ragged_pass(gguf) == choose_ragged(GGUF_CPU, one_model=True, restricted=False)
    assert ragged_pass([LeanRunner(tiny_model(seed=0)) for _ in range(2)]) is None
    other = LeanRunner(tiny_gguf_loaded(tmp_path, seed=1).model)
    assert ragged_pass([gguf[0], other]) is None  # two models: each block alone
    gguf[1].restrict_output([1, 2, 3])
    assert ragged_pass(gguf) is None  # each block alone: the pass would give it the whole output layer
    gguf[1].restrict_output(None)
    passes = []
    run_ragged = gguf[0].decoder_pass.run_ragged
    monkeypatch.setattr(gguf[0].decoder_pass, "run_ragged", lambda *a, **k: passes.append(1) or run_ragged(*a, **k))
    for runner in gguf:
        runner.forward([7, 8], logits=False)
    score_together(gguf, [Block([1, 2]), Block([3])])
    assert passes == [1]


# --------------------------------------------------------------------------- the pass interface

def private_uses(source: str) -> list[str]:
    """Private names reached on other objects (runner._keys) or imported from other modules."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specwise"):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_the_ragged_pass_uses_the_runners_public_pass_interface_only():
    assert sorted(private_uses("runner._keys\nfrom specwise.runners.lean import _apply\nself._own\nx.__class__\n")) == [
        "runner._keys", "specwise.runners.lean._apply"]  # the check can fail
    assert private_uses(Path(ragged.__file__).read_text()) == []


def test_a_block_laid_out_against_another_cache_is_refused(target):
    runner = LeanRunner(target.model)
    runner.forward([1, 2, 3], logits=False)
    layout = runner.layout([4, 5])
    assert layout.start == 3 and layout.rows == 2 and layout.visible is None and layout.tree is None
    runner.forward([6])
    with pytest.raises(ValueError, match="laid out at 3 does not fit a cache of 4"):
        runner.append(layout)
    runner.free_cache()
    with pytest.raises(ValueError, match="reserve room first"):
        runner.cache
    runner.reserve(40)
    keys, values = runner.cache
    assert keys.shape[2] >= 40 and runner.length == 0
