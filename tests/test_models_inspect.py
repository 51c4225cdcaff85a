"""`specwise models inspect FILE.gguf` and `specwise models list`: what a file holds, read from its
header, and what the cache holds, with sizes."""

from __future__ import annotations

import json
import math

import gguf
import pytest

from gguf_files import write_model_gguf
from specwise.cli import main
from specwise.kernels.gguf import SUPPORTED_TYPES
from specwise.gguf.describe import AS_FLOAT, RUNS, inspect_gguf, kernel_path


def _uses(report) -> dict[tuple[str, str], object]:
    return {(group.name, use.type): use for group in report.groups for use in group.types}


def test_a_file_that_runs_is_described_group_by_group(tmp_path):
    path = write_model_gguf(tmp_path / "model.gguf", "qwen2", layers=3, types={"ffn_down": "Q4_K"},
                           hidden=256, ffn=256)
    report = inspect_gguf(path)
    assert report.runs_as_stored and report.problems == ()
    assert (report.architecture, report.name, report.context_length) == ("qwen2", "tiny test qwen2", 128)
    assert report.vocab_size == report.tokenizer_tokens == 262 and report.tokenizer == "gpt2"
    assert report.chat_template and report.tied_embeddings
    uses = _uses(report)
    assert uses[("attention", "Q8_0")].tensors == 3 * 4 and uses[("attention", "F32")].tensors == 3 * 3  # biases
    assert uses[("ffn", "Q8_0")].tensors == 3 * 2 and uses[("ffn", "Q4_K")].tensors == 3
    assert uses[("embeddings", "Q8_0")].tensors == 1 and uses[("norms", "F32")].tensors == 2 * 3 + 1
    assert uses[("ffn", "Q4_K")].path == RUNS and uses[("norms", "F32")].path == AS_FLOAT
    output = next(group for group in report.groups if group.name == "output")
    assert output.types == () and "token embedding" in output.note
    tensors = gguf.GGUFReader(path).tensors  # the gguf package's own reading of the same file
    assert report.parameters == sum(math.prod(int(d) for d in t.shape) for t in tensors)
    assert sum(use.bytes for use in uses.values()) == sum(int(t.n_bytes) for t in tensors)
    assert uses[("ffn", "Q4_K")].parameters == 3 * 256 * 256
    assert report.hyperparameters["hidden_size"] == 256 and report.hyperparameters["num_hidden_layers"] == 3


def test_what_does_not_run_is_named_with_its_fix(tmp_path):
    unsupported = next(t for t in gguf.GGMLQuantizationType
                       if t.name == "Q8_1" and t.value not in SUPPORTED_TYPES)  # llama.cpp never stores Q8_1
    assert kernel_path(unsupported.value) == ("not supported: use --target-format dense", False)
    path = write_model_gguf(tmp_path / "model.gguf", "llama", types={"ffn_down": "Q8_1"}, tied=False,
                           chat_template=False)
    report = inspect_gguf(path)
    assert not report.runs_as_stored and not report.chat_template and not report.tied_embeddings
    assert _uses(report)[("ffn", "Q8_1")].runs is False
    assert report.problems == ("2 ffn tensor(s) stored as Q8_1, which the GGUF kernel does not run; "
                               "use --target-format dense",)
    assert [use.type for use in next(g for g in report.groups if g.name == "output").types] == ["Q8_0"]

    gemma = inspect_gguf(write_model_gguf(tmp_path / "gemma.gguf", "gemma3"))
    assert gemma.architecture == "gemma3" and gemma.runs_as_stored and not gemma.problems
    assert _uses(gemma)[("norms", "F32")].tensors == 2 * 6 + 1  # q/k norms and Gemma's extra norms too
    assert gemma.hyperparameters["head_dim"] == 16 and gemma.hyperparameters["sliding_window"] == 16
    mamba = inspect_gguf(write_model_gguf(tmp_path / "mamba.gguf", "mamba"))
    assert mamba.architecture == "mamba" and not mamba.runs_as_stored
    assert mamba.problems[0].startswith("mamba.gguf: GGUF architecture 'mamba' is not one specwise reads")


def test_inspect_prints_a_report_and_json(tmp_path, capsys):
    path = write_model_gguf(tmp_path / "model.gguf", "mamba")
    assert main(["models", "inspect", str(path)]) == 0
    text = capsys.readouterr().out
    for expected in ("mamba", "kernel path", "runs as stored", "chat template", "is not one specwise reads",
                     "embeddings", "attention", "ffn", "Q8_0"):
        assert expected in text, expected
    assert main(["models", "inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["architecture"] == "mamba" and report["runs_as_stored"] is False
    assert {group["name"] for group in report["groups"]} == {"embeddings", "attention", "ffn", "output", "norms"}
    assert main(["models", "inspect", str(tmp_path / "missing.gguf")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "text.gguf").write_text("not a model, only some text that is long enough")
    assert main(["models", "inspect", str(tmp_path / "text.gguf")]) == 2
    assert "not a GGUF file" in capsys.readouterr().err


def test_list_shows_the_catalog_and_the_cache_with_sizes(tmp_path, monkeypatch, capsys):
    from specwise.store.catalog import KNOWN_MODELS
    from specwise.gguf.tokenizer import gguf_tokenizer

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path / "home"))
    gguf_tokenizer(write_model_gguf(tmp_path / "model.gguf"))
    (tmp_path / "home" / "gguf").mkdir()
    (tmp_path / "home" / "gguf" / "own.gguf").write_bytes(b"x" * 2048)
    assert main(["models", "list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [model["name"] for model in listing["known"]] == list(KNOWN_MODELS)
    gemma = next(model for model in listing["known"] if model["name"] == "gemma3-270m")
    assert gemma["architecture"] == "gemma3" and gemma["file_size"] == 253_113_024
    kinds = {item["kind"]: item for item in listing["cache"]}
    assert kinds["tokenizer"]["source"] == str((tmp_path / "model.gguf").resolve()) and kinds["tokenizer"]["size"] > 0
    assert kinds["gguf"]["name"] == "own.gguf" and kinds["gguf"]["size"] == 2048
    assert listing["cache_size"] == sum(item["size"] for item in listing["cache"])
    assert main(["models", "list"]) == 0
    text = capsys.readouterr().out
    assert "gemma3-270m" in text and "in the cache" in text and "2.0 KB" in text


@pytest.mark.real_models
@pytest.mark.parametrize("name, architecture, template", [("qwen2.5-coder-1.5b", "qwen2", True),
                                                          ("smollm2-135m", "llama", True),
                                                          ("gemma3-270m", "gemma3", False)])
def test_inspect_on_the_real_files(name, architecture, template):
    import os

    from specwise.store.catalog import KNOWN_MODELS
    from specwise.errors import ModelError
    from specwise.store.prepare import gguf_file

    try:
        path = gguf_file(name, progress=False)
    except ModelError as error:
        if os.environ.get("SPECWISE_REQUIRE_REAL_MODELS") == "1":
            pytest.fail(f"real models required here but not ready: {error}")
        pytest.skip(str(error))
    report = inspect_gguf(path)
    assert (report.architecture, report.chat_template, report.file_size) == (architecture, template,
                                                                             KNOWN_MODELS[name].size)
    assert report.context_length and report.vocab_size >= report.tokenizer_tokens > 0
    if name == "qwen2.5-coder-1.5b":
        assert report.runs_as_stored and 1.4e9 < report.parameters < 1.8e9
    if name == "gemma3-270m":  # Gemma 3 runs as stored; the file carries no chat template (a base model)
        assert report.runs_as_stored and not report.problems and 2.4e8 < report.parameters < 3e8
