"""Rollback: generate, roll back n tokens, regenerate: identical."""

import pytest
import torch

from specwise import SamplingParams, SpecConfig, SpeculativeEngine
from specwise.drafters import DraftModelDrafter
from specwise.runners.protocols import RollbackError
from specwise.runners.hf import HFRunner
from specwise.testing import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=0)


def test_rollback_then_refeed_gives_same_logits():
    model = tiny_model(seed=0, dtype=torch.float64)  # float64: kernel blocking differences vanish
    runner = HFRunner(model)
    runner.reset()
    runner.forward([1, 2, 3, 4, 5], logits=False)
    first = runner.forward([6, 7, 8, 9])
    for n in (1, 2, 4):
        runner.rollback(n)
        assert runner.length == 9 - n
        again = runner.forward([6, 7, 8, 9][4 - n:])
        torch.testing.assert_close(again, first[4 - n:], rtol=0, atol=1e-10)
    runner.rollback(3)
    different = runner.forward([20, 21, 22])
    fresh = HFRunner(model)
    fresh.reset()
    fresh.forward([1, 2, 3, 4, 5, 6], logits=False)
    torch.testing.assert_close(different, fresh.forward([20, 21, 22]), rtol=0, atol=1e-10)


def test_block_logits_equal_one_token_passes(model):
    runner = HFRunner(model)
    runner.reset()
    runner.forward([3, 1, 4], logits=False)
    block = runner.forward([1, 5, 9, 2])
    single = HFRunner(model)
    single.reset()
    single.forward([3, 1, 4], logits=False)
    rows = [single.forward([t])[0] for t in [1, 5, 9, 2]]
    torch.testing.assert_close(block, torch.stack(rows), rtol=1e-5, atol=1e-5)


def test_generate_roll_back_regenerate_identical(model):
    drafter = DraftModelDrafter(HFRunner(tiny_model(seed=1)), model.config.vocab_size)
    engine = SpeculativeEngine(HFRunner(model), drafter, SpecConfig(k=3))
    prompt = [5, 9, 14, 20]
    full = engine.generate(prompt, SamplingParams(max_new_tokens=24)).token_ids
    for n in (1, 5, 11):
        keep = full[:len(full) - n]
        again = engine.generate(prompt + keep, SamplingParams(max_new_tokens=n)).token_ids
        assert keep + again == full
    # Sampling: same seed, same output, whatever ran before.
    sampling = SamplingParams(temperature=1.0, top_k=8, seed=7, max_new_tokens=24)
    first = engine.generate(prompt, sampling).token_ids
    engine.generate([9, 9, 9], SamplingParams(max_new_tokens=5))
    assert engine.generate(prompt, sampling).token_ids == first


def test_bad_rollback_is_refused(model):
    runner = HFRunner(model)
    runner.reset()
    runner.forward([1, 2], logits=False)
    with pytest.raises(ValueError, match="cannot roll back 3 tokens from a cache of 2"):
        runner.rollback(3)


def test_uncroppable_cache_is_refused_before_decoding(model, monkeypatch):
    from transformers.cache_utils import DynamicLayer

    monkeypatch.setattr(DynamicLayer, "is_croppable", False)  # as for quantized or recurrent caches
    with pytest.raises(RollbackError, match="DynamicCache with DynamicLayer layers.*cannot be cropped"):
        HFRunner(model)


def test_sliding_window_model_rolls_back_past_its_window():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True,
                         sliding_window=4, max_window_layers=0, layer_types=["sliding_attention"] * 2)
    model = Qwen2ForCausalLM(config).to(torch.float64).eval()
    runner = HFRunner(model)
    runner.reset()
    runner.forward([1, 2, 3, 4, 5, 6], logits=False)
    first = runner.forward([7, 8, 9])
    runner.rollback(2)
    torch.testing.assert_close(runner.forward([8, 9]), first[1:], rtol=0, atol=1e-10)
