"""`specwise models inspect FILE.gguf` and `specwise models list`: what a file holds, read from its
header, and what the cache holds, with sizes."""

from __future__ import annotations

import json
import math

import gguf
import pytest

from gguf_files import write_model_gguf
from specwise.cli import main
from specwise.gguf.describe import AS_FLOAT, RUNS, KernelAnswer, block_type_path, inspect_gguf
from specwise.gguf.model import load_gguf_model
from specwise.kernels import gguf as kernels
from specwise.kernels.gguf import SUPPORTED_TYPES


def _uses(report) -> dict[tuple[str, str], object]:
    return {(group.name, use.type): use for group in report.groups for use in group.types}


def test_a_file_that_runs_is_described_group_by_group(tmp_path, paths):
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
    assert uses[("ffn", "Q4_K")].path.startswith(RUNS + ": ") and uses[("ffn", "Q4_K")].runs
    assert uses[("norms", "F32")].path == AS_FLOAT and uses[("norms", "F32")].tiles is None
    assert report.kernel_path == kernels.kernel_path() in paths
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
    assert block_type_path(unsupported.value, KernelAnswer("avx2")) == ("not supported: use --target-format dense",
                                                                        False, None)
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


# Block types of every tile family, in a file whose matrices are all 256 wide (a K-quant block's width).
MIXED_TYPES = {"token_embd": "Q8_0", "attn_q": "Q4_K", "attn_k": "Q5_K", "attn_v": "Q6_K", "attn_output": "Q4_1",
               "ffn_gate": "Q5_0", "ffn_up": "IQ4_NL", "ffn_down": "Q2_K"}


def _ggml_type(name: str) -> int:
    return gguf.GGMLQuantizationType[name].value


def test_each_block_types_path_is_the_compiled_kernels(tmp_path, kernel_path):
    """Forced onto each path this CPU runs (SPECWISE_GGUF_KERNEL), the report names that path and, for every
    block type, the tiles the compiled kernel's own dispatch names (type_path); what is known of that
    dispatch independently holds too: the scalar and avx2 paths run their own tiles only, AVX-512 has Q4_K
    tiles, and a type without AVX-512 tiles runs its AVX2 ones there."""
    path = write_model_gguf(tmp_path / "mixed.gguf", "qwen2", layers=1, types=MIXED_TYPES, hidden=256, ffn=256)
    report = inspect_gguf(path)
    assert report.runs_as_stored and report.kernel_path == kernel_path
    blocks = [use for group in report.groups for use in group.types if use.type != "F32"]
    assert {use.type for use in blocks} == set(MIXED_TYPES.values())
    for use in blocks:
        assert use.tiles == kernels.type_path(_ggml_type(use.type), kernel_path), use
        assert use.path == f"{RUNS}: {use.tiles} tiles on the {kernel_path} path"
    tiles = {use.type: use.tiles for use in blocks}
    if kernel_path in ("scalar", "avx2"):
        assert set(tiles.values()) == {kernel_path}, tiles
    else:  # amx is the avx512 path outside its AMX tiles, which take prompts, not calls of few rows
        assert tiles["Q4_K"] == "avx512" and set(tiles.values()) <= {"avx512", "avx2"}, tiles


def test_the_path_reported_is_the_kernels_answer_at_report_time(tmp_path, monkeypatch, paths):
    """A report that named tiles from anything but the kernel's dispatch fails here: the dispatch is replaced
    by one naming tiles no real kernel has, and the report follows it; the kernel unavailable, the file
    still runs as stored and the report says why the path is unknown."""
    path = write_model_gguf(tmp_path / "mixed.gguf", "qwen2", layers=1, types=MIXED_TYPES, hidden=256, ffn=256)
    monkeypatch.setattr(kernels, "type_path", lambda ggml_type, path=None: f"made-up-{ggml_type}")
    for group in inspect_gguf(path).groups:
        for use in group.types:
            if use.type != "F32":
                assert use.tiles == f"made-up-{_ggml_type(use.type)}", use
    monkeypatch.undo()

    def unavailable() -> str:
        raise RuntimeError("the GGUF linear kernel is unavailable: no C++ compiler on PATH (install g++)")

    monkeypatch.setattr(kernels, "kernel_path", unavailable)
    report = inspect_gguf(path)
    assert report.runs_as_stored and report.kernel_path is None
    q4k = next(use for group in report.groups for use in group.types if use.type == "Q4_K")
    assert q4k.tiles is None and q4k.path.startswith(RUNS) and "no C++ compiler" in q4k.path


@pytest.mark.parametrize("metadata, first", [
    # the feed-forward width the metadata gives is not the tensors' (128)
    ({"feed_forward_length": 96}, "tensor 'blk.0.ffn_gate.weight' is [64, 128], the config gives "
                                  "model.layers.0.mlp.gate_proj.weight [64, 96]"),
    # four kv heads of 16 where the tensors hold two
    ({"attention.head_count_kv": 4}, "tensor 'blk.0.attn_k.weight' is [64, 32], the config gives "
                                     "model.layers.0.self_attn.k_proj.weight [64, 64]"),
])
def test_a_tensor_that_does_not_fit_its_role_is_named_and_does_not_run(tmp_path, metadata, first):
    path = write_model_gguf(tmp_path / "odd.gguf", "llama", layers=2, metadata=metadata)
    report = inspect_gguf(path)
    assert not report.runs_as_stored
    assert first in report.problems[0] and "download it again" in report.problems[0]
    # inspect and the loader give the same reason, before any weight is read
    with pytest.raises(ValueError) as refused:
        load_gguf_model(path)
    assert str(refused.value) == report.problems[0]
    # six mismatched tensors (three a layer): three named, the rest counted
    if "feed_forward_length" in metadata:
        assert len(report.problems) == 4 and report.problems[3] == "and 3 more tensor(s) that do not fit the config"
    # negative control: the same file with the metadata that matches its tensors runs
    assert inspect_gguf(write_model_gguf(tmp_path / "even.gguf", "llama", layers=2)).runs_as_stored


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
