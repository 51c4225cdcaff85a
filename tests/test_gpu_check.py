"""scripts/gpu_check.py runs end to end on tiny shapes on the CPU, so the GPU check cannot rot."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_tiny_shapes_on_cpu_print_one_table_with_every_row(gpu_check, capsys):
    code = gpu_check.main(["--device", "cpu", "--shapes", "tiny", "--dtype", "float32", "--max-n", "3",
                           "--new-tokens", "12", "--ks", "2,4", "--repeats", "1", "--context", "32"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = [line for line in out.splitlines() if line.startswith("| tiny")]
    measures = [line.split("|")[2].strip() for line in lines]
    assert measures.count("T(n)") == 3
    for what in ("plain decoding", "replay", "corrupt α=0.7", "draft model = target", "ngram, repeating prompt"):
        assert what in measures
    assert "floor" in out and "of the bandwidth" in out
    # Replay and the target as draft model accept every draft token: τ = k + 1 up to the length cut.
    replay = [line for line in lines if "| replay" in line]
    assert all("| 1.00 |" in line and "identical" in line for line in replay), replay
    assert all("FAILURE" not in line for line in lines)


def test_a_failing_identity_check_exits_nonzero(gpu_check, monkeypatch, capsys):
    """The negative control: a drafter whose proposals the engine keeps although they are wrong
    (a broken verifier accepting everything) is reported as a FAILURE."""
    from specwise.verify import VERIFIERS, VerifyResult

    def accept_all(draft_tokens, draft_probs, target_probs, generator=None):
        k = len(draft_tokens)
        return VerifyResult(draft_tokens.tolist() + [int(target_probs[k].argmax())], k, k)

    monkeypatch.setitem(VERIFIERS, "greedy", accept_all)
    code = gpu_check.main(["--device", "cpu", "--shapes", "tiny", "--dtype", "float32", "--max-n", "1",
                           "--new-tokens", "12", "--ks", "4", "--repeats", "1", "--context", "32",
                           "--alphas", "0.5", "--no-draft-model"])
    captured = capsys.readouterr()
    assert code == 1 and "FAILURE" in captured.err
