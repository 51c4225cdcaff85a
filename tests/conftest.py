import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

from helpers import exact_distribution

# Tiny test models run fastest on one thread, and the suite then leaves a core free.
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def exact(target):
    """The statistical check's exact distribution (tests/helpers.py) for the module's `target`, a
    Hugging Face model."""
    return exact_distribution(target)
