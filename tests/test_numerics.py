import torch

import specwise.numerics as numerics
from specwise.numerics import classify_divergence, first_divergence
from specwise.testing import tiny_model

from helpers import hf_greedy


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3, 4]) is None
    assert first_divergence([1, 5, 3], [1, 2, 3]) == 1


def test_real_difference_is_a_failure_and_a_tie_is_numerical(monkeypatch):
    model = tiny_model(seed=0, dtype=torch.bfloat16)
    prompt = [5, 9, 14]
    reference = hf_greedy(model, prompt, 6, eos=False)
    logits = model(torch.tensor([prompt + reference[:2]])).logits[0, -1].float()
    worst = int(logits.argmin())  # far below the argmax: no rounding explains choosing it
    ours = reference[:2] + [worst] + reference[3:]
    divergence = classify_divergence(model, prompt, ours, reference)
    assert divergence.position == 2 and not divergence.numerical
    assert "FAILURE" in divergence.describe()
    assert classify_divergence(model, prompt, reference, reference) is None
    monkeypatch.setattr(numerics, "TIE_ULPS", 1e6)  # a tolerance wide enough to call it a tie
    assert classify_divergence(model, prompt, ours, reference).numerical
