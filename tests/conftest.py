import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

from helpers import exact_distribution

# Tiny test models run fastest on one thread, and the suite then leaves a core free.
torch.set_num_threads(1)

FULL_TESTS = "SPECWISE_FULL_TESTS"
OUT_OF_QUICK_RUN = ("slow", "real_models")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A plain `pytest` is the quick run: tests marked slow or real_models are skipped unless
    SPECWISE_FULL_TESTS=1. An explicit -m chooses the tests itself, so then nothing is skipped here."""
    if os.environ.get(FULL_TESTS) == "1" or config.getoption("markexpr"):
        return
    for item in items:
        marks = [name for name in OUT_OF_QUICK_RUN if item.get_closest_marker(name)]
        if marks:
            item.add_marker(pytest.mark.skip(
                reason=f"{' and '.join(marks)}: left out of the quick run; {FULL_TESTS}=1 runs it"))


@pytest.fixture(scope="module")
def exact(target):
    """The statistical check's exact distribution (tests/helpers.py) for the module's `target`, a
    Hugging Face model."""
    return exact_distribution(target)
