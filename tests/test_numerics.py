import torch

from specwise.numerics import FAILURE, NUMERICAL, check_identity, first_divergence
from specwise.testing import tiny_model

from helpers import hf_greedy


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2  # one stopped where the other did not


def test_real_difference_is_a_failure_and_a_tie_is_numerical():
    model = tiny_model(seed=0, dtype=torch.bfloat16)
    prompt = [5, 9, 14]
    reference = hf_greedy(model, prompt, 6, eos=False)
    logits = model(torch.tensor([prompt + reference[:2]])).logits[0, -1].float()
    worst = int(logits.argmin())  # far below the argmax: no rounding explains choosing it
    ours = reference[:2] + [worst] + reference[3:]
    mismatch = check_identity(model, prompt, reference, ours)
    assert mismatch.position == 2 and mismatch.classification == FAILURE and not mismatch.numerical
    assert "FAILURE" in mismatch.describe()
    assert check_identity(model, prompt, reference, reference) is None
    assert check_identity(model, prompt, reference, ours, ulps=1e6).classification == NUMERICAL
