import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

from helpers import exact_distribution
from specwise.kernels.gguf import PATHS as GGUF_KERNEL_PATHS
from specwise.kernels.gguf import available_paths
from specwise.paths import specwise_home

# Tiny test models run fastest on one thread, and the suite then leaves a core free.
torch.set_num_threads(1)

# What the test home shares with the real one: the prepared models and their GGUF files (read by the
# real-model tests; preparing them takes minutes and gigabytes) and the compiled kernels (a minute to
# build). Everything else a test writes (cost tables, EAGLE heads, locks, hash indexes) stays in the test home.
SHARED = ("models", "gguf", "kernels")
GGUF_INDEX = "gguf-index.json"  # copied, not linked: hashes of the shared GGUF files, rewritten as files are hashed
# The test home, and SPECWISE_HOME as it was before the run (None: unset).
TEST_HOME = pytest.StashKey[tuple[Path, str | None]]()


def pytest_configure(config: pytest.Config) -> None:
    """The whole run gets a SPECWISE_HOME of its own (subprocesses inherit it), set before any test module
    is imported, so that no test writes into the user's cache."""
    real = specwise_home().resolve()
    home = Path(tempfile.mkdtemp(prefix="specwise-test-home-"))
    try:
        (real / "kernels").mkdir(parents=True, exist_ok=True)  # compiled once, then reused by every run
    except OSError:  # a read-only real home: the kernels are compiled into the test home instead
        pass
    for name in SHARED:
        if (real / name).is_dir():
            (home / name).symlink_to(real / name, target_is_directory=True)
    if (real / GGUF_INDEX).is_file():
        shutil.copyfile(real / GGUF_INDEX, home / GGUF_INDEX)
    config.stash[TEST_HOME] = (home, os.environ.get("SPECWISE_HOME"))
    os.environ["SPECWISE_HOME"] = str(home)


def pytest_unconfigure(config: pytest.Config) -> None:
    if TEST_HOME not in config.stash:
        return
    home, before = config.stash[TEST_HOME]
    if before is None:
        os.environ.pop("SPECWISE_HOME", None)
    else:
        os.environ["SPECWISE_HOME"] = before
    shutil.rmtree(home, ignore_errors=True)  # removes the links, never what they point to


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


@pytest.fixture(scope="module")
def paths() -> list[str]:
    """The GGUF kernel paths this CPU can run; skipped where no C++ compiler exists."""
    try:
        return available_paths()
    except RuntimeError as exc:
        if "no C++ compiler" in str(exc):
            pytest.skip(str(exc))
        raise  # a machine with a compiler must build it


@pytest.fixture(params=GGUF_KERNEL_PATHS)
def kernel_path(request, monkeypatch):
    """Each GGUF kernel path this CPU can run, set through SPECWISE_GGUF_KERNEL (which gguf_linear, the
    native pass and the ragged pass all follow); the others are skipped."""
    if request.param not in available_paths():
        pytest.skip(f"this CPU cannot run the {request.param} path")
    monkeypatch.setenv("SPECWISE_GGUF_KERNEL", request.param)
    return request.param
