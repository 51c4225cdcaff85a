"""The int8 weight-only drafter: close to its float model, and the engine stays lossless with it."""

import copy

import pytest
import torch
from torch import nn

from specwise import SamplingParams, SpecConfig, SpeculativeEngine
from specwise.drafters import DraftModelDrafter
from specwise.runners.int8 import Int8WeightOnlyLinear, quantize_int8
from specwise.runners.hf import HFRunner
from specwise.testing import tiny_model

from helpers import hf_greedy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_linear_is_close_to_the_float_layer(dtype):
    torch.manual_seed(0)
    layer = nn.Linear(64, 48).to(dtype)
    x = torch.randn(5, 7, 64, dtype=dtype)
    expected = layer(x).float()
    got = Int8WeightOnlyLinear(layer)(x).float()
    assert got.shape == expected.shape
    assert (got - expected).abs().max() / expected.abs().max() < 0.02


def test_quantize_replaces_every_linear_including_the_output_layer():
    model = quantize_int8(tiny_model(seed=0))
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert isinstance(model.get_output_embeddings(), Int8WeightOnlyLinear)
    assert HFRunner(model).vocab_size == model.config.vocab_size


def test_greedy_identity_with_an_int8_drafter():
    target = tiny_model(seed=0)
    drafter_model = quantize_int8(copy.deepcopy(target))  # the target's own weights, in int8
    drafter = DraftModelDrafter(HFRunner(drafter_model), target.config.vocab_size)
    engine = SpeculativeEngine(HFRunner(target), drafter, SpecConfig(k=4))
    for prompt in ([5, 9, 14, 20, 33], [40, 41, 42, 40, 41]):
        result = engine.generate(prompt, SamplingParams(max_new_tokens=40))
        assert result.token_ids == hf_greedy(target, prompt, 40, eos=False)
        assert result.stats.acceptance_rate > 0.5  # int8 copy of the target mostly agrees with it


def test_bad_quantize_value_is_refused():
    from specwise.config import SpecConfig as Config

    with pytest.raises(ValueError, match="draft_quantize must be one of None, int8, gguf"):
        Config(draft_quantize="int3")
