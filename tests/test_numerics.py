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


def test_rounding_sensitivity_tells_rounding_from_a_changed_model():
    """One input rounding moves a float32 model's logits by about its grid; the same model with one
    weight changed by 1 % lies far beyond that, the model itself at zero."""
    import copy

    from specwise.numerics import rms_difference, rounding_sensitivity, sequence_logits

    model = tiny_model(seed=0, dtype=torch.float32)
    ids = [5, 9, 14, 3, 7, 21]
    reference = sequence_logits(model, ids)
    floor = rounding_sensitivity(model, ids)
    assert 0 < floor < 1e-4 * float(reference.abs().max())
    assert rms_difference(sequence_logits(model, ids), reference) == 0.0
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.lm_head.weight.mul_(1.01)
    assert rms_difference(sequence_logits(changed, ids), reference) > 100 * floor
