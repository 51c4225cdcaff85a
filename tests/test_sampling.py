"""logits_to_probs must be the distribution Hugging Face's plain sampling uses."""

import pytest
import torch
from transformers.generation.logits_process import (LogitsProcessorList, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from specwise.config import SamplingParams
from specwise.sampling import first_argmax, logits_to_probs, seen_token_mask


def hf_probs(logits, context, params):
    processors = LogitsProcessorList()
    if params.repetition_penalty != 1:
        processors.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    processors.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k:
        processors.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1:
        processors.append(TopPLogitsWarper(params.top_p))
    return processors(torch.tensor([context]), logits[None].clone())[0].softmax(-1)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.9, top_k=10, top_p=0.9, repetition_penalty=1.3),
])
def test_matches_hugging_face_processors(params):
    torch.manual_seed(0)
    vocab = 50
    context = [3, 7, 7, 20]
    block = [11, 3]
    logits = torch.randn(len(block) + 1, vocab) * 3
    probs = logits_to_probs(logits, params, seen_token_mask(context, block, vocab))
    for row in range(len(block) + 1):
        expected = hf_probs(logits[row], context + block[:row], params)
        torch.testing.assert_close(probs[row], expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(probs.sum(-1), torch.ones(len(block) + 1))


def test_greedy_is_one_hot_at_first_argmax_after_penalty():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0]])
    probs = logits_to_probs(logits, SamplingParams(temperature=0))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]
    seen = seen_token_mask([1], [], 4)
    penalized = logits_to_probs(logits, SamplingParams(temperature=0, repetition_penalty=2.0), seen)
    assert penalized.tolist() == [[0.0, 0.0, 1.0, 0.0]]


def test_seen_mask_rows_grow_with_the_block():
    mask = seen_token_mask([0], [2, 3], 5)
    assert mask.tolist() == [[True, False, False, False, False],
                             [True, False, True, False, False],
                             [True, False, True, True, False]]


def test_first_argmax_is_torch_argmax_with_ties_to_the_first_index():
    """The host-side argmax that greedy decoding commits (NumPy on the CPU) picks what torch.argmax picks:
    on random rows, exact ties, -inf masks, a row with NaN, strided views and a dtype NumPy lacks."""
    rng = torch.Generator().manual_seed(3)
    rows = torch.randn(6, 1000, generator=rng)
    rows[1, [17, 400, 999]] = rows[1].max() + 1  # three tied maxima
    rows[2, :500] = float("-inf")
    rows[3, 5] = float("nan")
    for x in (rows, rows[:, ::3], rows[0], rows.to(torch.bfloat16)):
        for keepdim in (False, True):
            got, want = first_argmax(x, keepdim), torch.argmax(x, dim=-1, keepdim=keepdim)
            assert got.dtype == want.dtype and torch.equal(got, want)
    assert first_argmax(rows)[1] == 17

