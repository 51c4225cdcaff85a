"""The block types added beside Q4_K, Q6_K, Q5_0 and Q8_0 (tests/test_gguf_kernel.py checks every type
against gguf's dequantizer on every path, for 1..32 rows, bitwise row independence included). Here:

- negative controls: a reference that decodes one field of the blocks wrong (one bit of a scale, a min,
  a code, a fifth or third bit, in every block of one row) fails the check that the kernel passes, for
  each field the kernel reads, so that check can tell a mis-decoded field;
- the avx512 path runs the types without AVX-512 tiles through their AVX2 tiles: bit-identical results;
- tiny models whose layers mix the new types run from their blocks: logits as the dequantized model's
  within activation rounding (and not another file's), the native pass as the layer-by-layer one on
  every path, a block of rows scored bitwise as one-token passes, greedy speculation equal to plain decoding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

from test_gguf_kernel import (  # noqa: E402
    _path_or_skip, activations, block_of, random_blocks, reference_for, weight_of)
from specwise.kernels import gguf as gk  # noqa: E402
from specwise.kernels.gguf import gguf_linear  # noqa: E402

NEW_TYPES = (T.Q4_0, T.Q4_1, T.Q5_1, T.IQ4_NL, T.Q2_K, T.Q3_K, T.Q5_K, T.IQ4_XS)
# The new types whose AVX-512 tiles are their AVX2 ones.
ON_AVX2_TILES = (T.Q4_1, T.Q5_1, T.IQ4_NL, T.Q2_K, T.Q3_K)


# (byte within the block, bit) of one field of each kind the kernel decodes.
FIELDS = {
    T.Q4_0: {"d": (1, 0), "low code": (7, 0), "high code": (7, 4)},
    T.Q4_1: {"d": (1, 0), "m": (3, 0), "code": (7, 4)},
    T.Q5_1: {"d": (1, 0), "m": (3, 0), "fifth bit": (5, 3), "code": (10, 0)},
    T.IQ4_NL: {"d": (1, 0), "code": (11, 5)},
    T.Q2_K: {"scale": (3, 0), "min": (3, 4), "code": (56, 2), "d": (81, 0), "dmin": (83, 0)},
    T.Q3_K: {"third bit": (7, 5), "code": (82, 6), "scale low bits": (98, 1), "scale high bits": (105, 3),
             "d": (109, 0)},
    T.Q5_K: {"d": (1, 0), "dmin": (3, 0), "scale": (4, 2), "min": (9, 2), "scale high bits": (13, 1),
             "fifth bit": (36, 6), "code": (148, 7)},
    T.IQ4_XS: {"d": (1, 0), "scale high bits": (3, 1), "scale low bits": (6, 6), "code": (68, 3)},
}


def shape_of(qtype: T) -> tuple[int, int]:
    return (5, 512) if block_of(qtype) == 256 else (5, 96)


@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda t: t.name)
def test_a_mis_decoded_field_fails_the_check(paths, qtype):
    rng = np.random.default_rng(23)
    out_features, in_features = shape_of(qtype)
    raw = random_blocks(qtype, out_features, in_features, rng)
    w, dense = weight_of(raw, qtype, out_features, in_features)
    x = activations(4, in_features, rng)
    y = gguf_linear(torch.from_numpy(x), w)
    reference_for(x, raw, qtype, out_features, in_features, dense).check(y)  # the right decoding passes
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    for field, (byte, bit) in FIELDS[qtype].items():
        assert byte < block_bytes
        wrong = raw.copy()
        wrong[0].reshape(-1, block_bytes)[:, byte] ^= np.uint8(1 << bit)  # in every block of row 0
        _, wrong_dense = weight_of(wrong, qtype, out_features, in_features)
        assert not np.array_equal(wrong_dense[0], dense[0]), field
        with pytest.raises(AssertionError):
            reference_for(x, wrong, qtype, out_features, in_features, wrong_dense).check(y)


@pytest.mark.parametrize("qtype", ON_AVX2_TILES, ids=lambda t: t.name)
def test_the_avx512_path_runs_the_new_types_through_their_avx2_tiles(paths, qtype):
    assert gk.type_path(int(qtype), "avx512") == "avx2"
    assert gk.type_path(int(qtype), "avx2") == "avx2" and gk.type_path(int(qtype), "scalar") == "scalar"
    path = _path_or_skip(paths, "avx512")
    rng = np.random.default_rng(29)
    out_features, in_features = shape_of(qtype)
    w, _ = weight_of(random_blocks(qtype, 37, in_features, rng), qtype, 37, in_features)
    x = torch.from_numpy(activations(20, in_features, rng))
    for n in (1, 2, 5, 8, 9, 20):
        assert torch.equal(gguf_linear(x[:n], w, path=path), gguf_linear(x[:n], w, path="avx2"))


def test_the_types_with_avx512_tiles_keep_them():
    for qtype in (T.Q4_0, T.Q4_K, T.Q5_K, T.Q6_K, T.Q5_0, T.Q8_0, T.IQ4_XS):
        assert gk.type_path(int(qtype), "avx512") == "avx512"
    with pytest.raises(ValueError, match="IQ2_XXS"):
        gk.type_path(int(T.IQ2_XXS), "avx2")


# ---------------------------------------------------------------------------------------------
# Tiny models of the new types, as stored.

MIXES = {  # each new type in two roles; the projections that share an input mix activation layouts
    "a": {"token_embd": "Q5_K", "attn_q": "Q2_K", "attn_k": "Q4_0", "attn_v": "Q3_K", "attn_output": "IQ4_XS",
          "ffn_gate": "Q4_1", "ffn_up": "Q5_1", "ffn_down": "IQ4_NL", "output": "Q5_K"},
    "b": {"token_embd": "IQ4_XS", "attn_q": "Q5_K", "attn_k": "IQ4_NL", "attn_v": "Q5_1", "attn_output": "Q4_1",
          "ffn_gate": "Q3_K", "ffn_up": "Q2_K", "ffn_down": "Q4_0", "output": "IQ4_NL"},
}


@pytest.fixture(scope="module", params=sorted(MIXES))
def mixed(request, tmp_path_factory):
    from specwise.testing import tiny_gguf_loaded

    directory = tmp_path_factory.mktemp(f"mix-{request.param}")
    return request.param, directory, tiny_gguf_loaded(directory, seed=5, types=MIXES[request.param])


def assert_logits_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """test_gguf_model's tolerance for int8 activations (mean difference under 4 % of the logits' spread,
    single logits within 25 %); the argmax must hold wherever the reference's top two logits lie more than
    twice the largest difference apart, so that no rounding could swap them (these random models have
    closer ties than that file's)."""
    spread, difference = want.std(), (got - want).abs()
    assert difference.mean() < 0.04 * spread
    assert difference.max() < 0.25 * spread
    top = want.topk(2, dim=-1).values
    clear = (top[:, 0] - top[:, 1]) > 2 * difference.max()
    assert clear.any()
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


def test_a_model_of_the_new_types_runs_from_its_blocks(mixed, tmp_path):
    from test_gguf_model import dequantized_reference

    from specwise.runners.gguf_layers import GGUFEmbedding, GGUFLinear
    from specwise.testing import write_tiny_gguf_model

    name, directory, loaded = mixed
    model = loaded.model
    types = {m.gguf_weight.type_name for m in model.modules() if isinstance(m, (GGUFLinear, GGUFEmbedding))}
    assert types == set(MIXES[name].values())
    assert not [p for p in model.parameters() if p.dim() > 1]  # no dense copy of any matrix
    ids = torch.tensor([[5, 9, 14, 5, 9, 30, 31, 2, 7]])
    with torch.inference_mode():
        got = model(ids).logits[0]
        assert_logits_close(got, dequantized_reference(directory / "model.gguf", directory)(ids).logits[0])
        other, other_dir = write_tiny_gguf_model(tmp_path, seed=6, types=MIXES[name])
        with pytest.raises(AssertionError):  # another file's weights are not close
            assert_logits_close(got, dequantized_reference(other, other_dir)(ids).logits[0])


def test_the_compiled_pass_runs_the_new_types_as_the_layer_by_layer_pass(mixed, kernel_path):
    from specwise.runners.lean import LeanRunner

    model = mixed[2].model
    compiled, layered = LeanRunner(model), LeanRunner(model)
    assert compiled.decoder_pass is not None
    layered.decoder_pass = None
    for runner in (compiled, layered):
        runner.forward([7, 8, 9, 10, 11], logits=False)
    block = [5, 9, 14, 5, 9, 30]
    assert_logits_close(compiled.forward(block), layered.forward(block))


def test_a_block_of_rows_scores_each_row_as_one_token_passes_do(mixed, kernel_path):
    from specwise.runners.lean import LeanRunner

    model = mixed[2].model
    block = [5, 9, 14, 5, 9, 30, 31, 2]
    runner, alone = LeanRunner(model), LeanRunner(model)
    assert runner.decoder_pass is not None
    runner.forward([7, 8, 9, 10], logits=False)
    alone.forward([7, 8, 9, 10], logits=False)
    together = runner.forward(block)
    one_by_one = torch.cat([alone.forward([token]) for token in block])
    assert torch.equal(together, one_by_one)


def test_greedy_speculation_equals_plain_decoding_on_the_new_types(mixed):
    from specwise import SamplingParams, SpecConfig, SpecDecoder

    decoder = SpecDecoder(mixed[2], SpecConfig(drafter="none"))
    sampling = SamplingParams(max_new_tokens=30, ignore_eos=True)
    for prompt in ([5, 9, 14, 5, 9, 14, 5, 9], [20, 21, 22, 23, 20, 21, 22, 23, 20, 21]):
        plain = decoder.generate(prompt, sampling).token_ids
        fast = decoder.generate(prompt, sampling, spec=SpecConfig(drafter="ngram", k=4))
        assert fast.token_ids == plain, prompt
