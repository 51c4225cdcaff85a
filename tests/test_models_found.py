"""GGUF files other tools keep, found where they are: Ollama's store (manifest to blob), LM Studio's
models folder and the Hugging Face hub cache, each built here in a temporary folder in its real
layout from a tiny random GGUF file (tests/gguf_files.py)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from gguf_files import write_model_gguf
from specwise.errors import ModelError
from specwise.store.commands import add_models_parser, cmd_models_inspect
from specwise.store.dense import read_marker
from specwise.store.found import found_gguf, found_models, is_found_name
from specwise.store.loading import has_gguf_source
from specwise.store.ollama import MODEL_MEDIA_TYPE, OllamaName
from specwise.store.prepare import gguf_file, resolve_model

SOURCE_VARIABLES = ("OLLAMA_MODELS", "LMSTUDIO_MODELS", "HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


@pytest.fixture
def user_home(tmp_path, monkeypatch) -> Path:
    """A home folder of its own, with none of the sources' variables set: each store is found at its default."""
    home = tmp_path / "user"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in SOURCE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_model_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _add_blob(root: Path, data: bytes) -> str:
    digest = _digest(data)
    blob = root / "blobs" / digest.replace(":", "-")
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    return digest


def add_ollama_model(root: Path, name: str, gguf: Path, *, link: bool = False) -> Path:
    """A model as `ollama pull` leaves it: the GGUF file, a template, params and config as blobs named
    by digest, and a manifest naming them. `link`: the model blob is a symbolic link to `gguf`."""
    parsed = OllamaName.parse(name)
    data = gguf.read_bytes() if not link else b""
    model_digest = _digest(data) if not link else "sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest()
    blob = root / "blobs" / model_digest.replace(":", "-")
    blob.parent.mkdir(parents=True, exist_ok=True)
    if link:
        blob.unlink(missing_ok=True)
        blob.symlink_to(gguf)
    else:
        blob.write_bytes(data)
    template = b"{{ .Prompt }}"
    params = json.dumps({"stop": ["<|im_end|>"]}).encode()
    config = json.dumps({"model_format": "gguf", "model_family": "llama", "model_type": "tiny",
                         "file_type": "Q8_0", "architecture": "amd64", "os": "linux"}).encode()
    layers = [{"mediaType": MODEL_MEDIA_TYPE, "digest": model_digest, "size": gguf.stat().st_size},
              {"mediaType": "application/vnd.ollama.image.template", "digest": _add_blob(root, template),
               "size": len(template)},
              {"mediaType": "application/vnd.ollama.image.params", "digest": _add_blob(root, params),
               "size": len(params)}]
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                           "digest": _add_blob(root, config), "size": len(config)},
                "layers": layers}
    path = parsed.manifest(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return blob


def add_hf_snapshot(cache: Path, repo_id: str, files: dict[str, bytes], *, revision: str = "a1" * 20,
                    main: bool = True) -> Path:
    """A repository as huggingface_hub downloads it: blobs by hash, the snapshot's files linked to them."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if main:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    return snapshot


def _one_line_error(call, *args) -> str:
    with pytest.raises(ModelError) as caught:
        call(*args)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- Ollama


def test_every_ollama_name_form_resolves_to_its_blob(user_home, tiny_gguf):
    root = user_home / ".ollama" / "models"  # the default store
    library = add_ollama_model(root, "smollm2", tiny_gguf)
    tagged = add_ollama_model(root, "smollm2:test", write_model_gguf(user_home / "b.gguf", seed=1))
    user = add_ollama_model(root, "someone/coder:q4", write_model_gguf(user_home / "c.gguf", seed=2))
    hub = add_ollama_model(root, "hf.co/org/Repo-GGUF:Q8_0", write_model_gguf(user_home / "d.gguf", seed=3))
    assert len({library, tagged, user, hub}) == 4
    expected = {
        "smollm2": library, "smollm2:latest": library, "library/smollm2": library,
        "registry.ollama.ai/library/smollm2:latest": library, "SmolLM2": library,  # names ignore case
        "smollm2:test": tagged, "someone/coder:q4": user, "registry.ollama.ai/someone/coder:q4": user,
        "hf.co/org/Repo-GGUF:Q8_0": hub,
    }
    for name, blob in expected.items():
        assert gguf_file(f"ollama:{name}") == blob, name
    assert gguf_file("ollama:smollm2:test").read_bytes() != tiny_gguf.read_bytes()  # the tag chose the file
    with pytest.raises(ModelError, match="no manifest at .*someone/coder/latest"):
        gguf_file("ollama:someone/coder")  # the tag is latest unless given


def test_ollama_models_comes_before_the_home_folder(user_home, tiny_gguf, monkeypatch, tmp_path):
    add_ollama_model(user_home / ".ollama" / "models", "smollm2", tiny_gguf)
    elsewhere = tmp_path / "models-elsewhere"
    blob = add_ollama_model(elsewhere, "other", tiny_gguf)
    monkeypatch.setenv("OLLAMA_MODELS", str(elsewhere))
    assert gguf_file("ollama:other") == blob
    message = _one_line_error(gguf_file, "ollama:smollm2")
    assert str(elsewhere / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "latest") in message


def test_an_unknown_ollama_model_names_the_manifest_and_close_names(user_home, tiny_gguf):
    root = user_home / ".ollama" / "models"
    message = _one_line_error(gguf_file, "ollama:smollm2")
    assert f"there is no Ollama models folder at {root}" in message and "OLLAMA_MODELS" in message
    add_ollama_model(root, "smollm2:135m", tiny_gguf)
    add_ollama_model(root, "qwen2.5-coder:1.5b", tiny_gguf)
    message = _one_line_error(gguf_file, "ollama:smolm2:135m")
    assert str(root / "manifests" / "registry.ollama.ai" / "library" / "smolm2" / "135m") in message
    assert "close names: ollama:smollm2:135m" in message and "qwen" not in message
    message = _one_line_error(gguf_file, "ollama:zzzz")  # nothing close: what the store holds
    assert "it holds: ollama:qwen2.5-coder:1.5b, ollama:smollm2:135m" in message


def test_a_damaged_ollama_model_is_one_line_naming_the_file(user_home, tiny_gguf):
    root = user_home / ".ollama" / "models"
    blob = add_ollama_model(root, "gone", tiny_gguf)
    blob.unlink()
    message = _one_line_error(gguf_file, "ollama:gone")
    assert f"the model blob {blob}" in message and "is missing" in message and "ollama pull gone:latest" in message

    add_ollama_model(root, "garbled", tiny_gguf)
    manifest = OllamaName.parse("garbled").manifest(root)
    manifest.write_text('{"layers": [')
    message = _one_line_error(gguf_file, "ollama:garbled")
    assert f"the manifest {manifest} is not a JSON manifest" in message

    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64}]}))
    assert f"has no layer of type {MODEL_MEDIA_TYPE}" in _one_line_error(gguf_file, "ollama:garbled")
    manifest.write_text(json.dumps({"layers": [{"mediaType": MODEL_MEDIA_TYPE, "digest": "sha256:../../x"}]}))
    assert "not sha256:<64 hex digits>" in _one_line_error(gguf_file, "ollama:garbled")
    manifest.write_text("[]")
    assert "is not a JSON manifest (a JSON list, not an object)" in _one_line_error(gguf_file, "ollama:garbled")
    manifest.write_text('{"layers": {}}')
    assert "has no layer" in _one_line_error(gguf_file, "ollama:garbled")


@pytest.mark.parametrize("name", ["../../etc/passwd", "a/b/c/d", "a:b:c", "lib.rary/x", "x:..", ""])
def test_what_is_not_an_ollama_name_is_refused_before_any_file_is_read(user_home, name):
    assert "ollama:" in _one_line_error(gguf_file, f"ollama:{name}")


def test_a_model_from_ollama_runs_as_stored_as_its_file_does(user_home, tiny_gguf):
    from specwise import SamplingParams, SpecConfig, SpecDecoder

    add_ollama_model(user_home / ".ollama" / "models", "tiny:q8", tiny_gguf, link=True)
    assert is_found_name("ollama:tiny:q8") and has_gguf_source("ollama:tiny:q8")
    assert not is_found_name(str(tiny_gguf)) and not is_found_name("ollamas:tiny")  # negative controls
    sampling = SamplingParams(max_new_tokens=8)
    runs = {}
    for name in ("ollama:tiny:q8", str(tiny_gguf)):
        decoder = SpecDecoder(name, SpecConfig(drafter="ngram", k=3))
        assert decoder.target.format == "gguf"  # auto: the file as stored, nothing converted
        assert decoder.target.tokenizer.chat_template is not None  # the template comes from the file
        runs[name] = decoder.generate([{"role": "user", "content": "the hat the hat"}], sampling).token_ids
    assert runs["ollama:tiny:q8"] == runs[str(tiny_gguf)] and len(runs[str(tiny_gguf)]) == 8
    # As a draft model too: the same file drafts for itself, so every draft is taken and the tokens stay.
    drafted = SpecDecoder(str(tiny_gguf), SpecConfig(drafter="draft-model", k=3, adaptive=False),
                          drafter_model="ollama:tiny:q8")
    result = drafted.generate([{"role": "user", "content": "the hat the hat"}], sampling)
    assert result.token_ids == runs[str(tiny_gguf)] and result.stats.accepted > 0


def test_the_dense_format_converts_a_found_file_once(user_home, tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path / "home"))  # the dense copy lands here, not in a shared cache
    blob = add_ollama_model(user_home / ".ollama" / "models", "tiny", tiny_gguf)
    directory = resolve_model("ollama:tiny")
    assert read_marker(directory)["source"]["path"] == str(blob.resolve())
    assert resolve_model("ollama:tiny") == directory == resolve_model(str(tiny_gguf))  # same content, one copy


# --------------------------------------------------------------------------- LM Studio


def test_lm_studio_models_are_found_by_path_repository_and_file_name(user_home, tiny_gguf, monkeypatch, tmp_path):
    root = user_home / ".lmstudio" / "models"
    repo = root / "lmstudio-community" / "Tiny-GGUF"
    repo.mkdir(parents=True)
    model = repo / "Tiny-Q8_0.gguf"
    shutil.copyfile(tiny_gguf, model)
    shutil.copyfile(tiny_gguf, repo / "mmproj-Tiny-F16.gguf")  # a projector beside it is not the model
    older = user_home / ".cache" / "lm-studio" / "models" / "someone" / "Old-GGUF" / "old-q4.gguf"
    older.parent.mkdir(parents=True)
    shutil.copyfile(tiny_gguf, older)
    for name in ("lmstudio-community/Tiny-GGUF/Tiny-Q8_0.gguf", "lmstudio-community/Tiny-GGUF/Tiny-Q8_0",
                 "lmstudio-community/Tiny-GGUF", "Tiny-Q8_0.gguf", "tiny-q8_0"):
        assert gguf_file(f"lmstudio:{name}") == model, name
    assert gguf_file("lmstudio:someone/Old-GGUF") == older  # the older folder is looked in too
    assert gguf_file("lmstudio:lmstudio-community/Tiny-GGUF/mmproj-Tiny-F16.gguf").name.startswith("mmproj")

    shutil.copyfile(tiny_gguf, repo / "Tiny-Q4_K_M.gguf")
    message = _one_line_error(gguf_file, "lmstudio:lmstudio-community/Tiny-GGUF")
    assert "names 2 files" in message and "lmstudio:lmstudio-community/Tiny-GGUF/Tiny-Q4_K_M.gguf" in message
    message = _one_line_error(gguf_file, "lmstudio:Tiny-Q5")
    assert str(root) in message and "close names: lmstudio:lmstudio-community/Tiny-GGUF/Tiny-Q" in message

    monkeypatch.setenv("LMSTUDIO_MODELS", str(tmp_path / "empty"))  # the variable alone is looked in
    message = _one_line_error(gguf_file, "lmstudio:Tiny-Q8_0")
    assert f"no GGUF file in LM Studio's models folder ({tmp_path / 'empty'})" in message


# --------------------------------------------------------------------------- the Hugging Face cache


def test_hugging_face_cache_snapshots_are_found_through_their_links(user_home, tiny_gguf, monkeypatch, tmp_path):
    data = tiny_gguf.read_bytes()
    cache = user_home / ".cache" / "huggingface" / "hub"  # the default
    add_hf_snapshot(cache, "org/Tiny-GGUF", {"tiny-q8_0.gguf": data + b"old"}, revision="0" * 40, main=False)
    snapshot = add_hf_snapshot(cache, "org/Tiny-GGUF", {"tiny-q8_0.gguf": data, "README.md": b"# tiny"})
    add_hf_snapshot(cache, "org/Multi-GGUF", {"q4/multi-q4.gguf": data, "multi-q8.gguf": data})
    found = gguf_file("hf:org/Tiny-GGUF")
    assert found == snapshot / "tiny-q8_0.gguf" and found.is_symlink()  # the revision main points to
    assert found.read_bytes() == data
    assert gguf_file("hf:org/Tiny-GGUF/tiny-q8_0.gguf") == found == gguf_file("hf:ORG/tiny-gguf")
    assert gguf_file("hf:org/Multi-GGUF/q4/multi-q4.gguf").name == "multi-q4.gguf"
    message = _one_line_error(gguf_file, "hf:org/Multi-GGUF")
    assert "holds 2 GGUF files" in message and "hf:org/Multi-GGUF/q4/multi-q4.gguf" in message
    message = _one_line_error(gguf_file, "hf:org/Tiny-GUF")
    assert str(cache / "models--org--Tiny-GUF") in message and "close names: hf:org/Tiny-GGUF" in message

    moved = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(moved))  # HF_HOME/hub, then HF_HUB_CACHE over it
    assert "no GGUF file in the Hugging Face cache" in _one_line_error(gguf_file, "hf:org/Tiny-GGUF")
    other = add_hf_snapshot(moved / "hub", "org/Tiny-GGUF", {"t.gguf": data})
    assert gguf_file("hf:org/Tiny-GGUF") == other / "t.gguf"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert gguf_file("hf:org/Tiny-GGUF") == found


# --------------------------------------------------------------------------- models list --found


def _models(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="specwise")
    add_models_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["models", *argv])
    return args.func(args)


def test_models_list_found_lists_every_source_with_its_header(user_home, tiny_gguf, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # the table's cells on one line each
    blob = add_ollama_model(user_home / ".ollama" / "models", "tiny:q8", tiny_gguf)
    studio = user_home / ".lmstudio" / "models" / "pub" / "Tiny-GGUF"
    studio.mkdir(parents=True)
    shutil.copyfile(tiny_gguf, studio / "tiny.gguf")
    (studio / "broken.gguf").write_bytes(b"not a gguf file at all")
    mamba = write_model_gguf(studio / "mamba.gguf", "mamba")
    add_hf_snapshot(user_home / ".cache" / "huggingface" / "hub", "org/Tiny-GGUF", {"t.gguf": tiny_gguf.read_bytes()})

    assert _models(["list", "--found", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    rows = {row["name"]: row for row in listing["found"]}
    assert set(rows) == {"ollama:tiny:q8", "lmstudio:pub/Tiny-GGUF/tiny.gguf", "lmstudio:pub/Tiny-GGUF/broken.gguf",
                         "lmstudio:pub/Tiny-GGUF/mamba.gguf", "hf:org/Tiny-GGUF/t.gguf"}
    tiny = rows["ollama:tiny:q8"]
    assert tiny == {"source": "ollama", "name": "ollama:tiny:q8", "path": str(blob), "size": tiny_gguf.stat().st_size,
                    "architecture": "llama", "block_types": "Q8_0, F32", "runs_as_stored": True, "problem": None}
    broken = rows["lmstudio:pub/Tiny-GGUF/broken.gguf"]
    assert broken["architecture"] is None and not broken["runs_as_stored"] and "broken.gguf" in broken["problem"]
    assert rows["lmstudio:pub/Tiny-GGUF/mamba.gguf"]["architecture"] == "mamba"
    assert not rows["lmstudio:pub/Tiny-GGUF/mamba.gguf"]["runs_as_stored"]
    assert [item["source"] for item in listing["looked_in"]] == ["ollama", "lmstudio", "lmstudio", "hf"]
    assert [item["exists"] for item in listing["looked_in"]] == [True, True, False, True]
    assert mamba.is_file()

    assert _models(["list", "--found"]) == 0
    text = capsys.readouterr().out
    line = next(line for line in text.splitlines() if "ollama:tiny:q8" in line)
    for cell in ("ollama", str(blob), "llama", "Q8_0, F32", "yes"):
        assert cell in line, cell
    broken_line = next(line for line in text.splitlines() if "broken.gguf" in line)
    assert "no: " in broken_line
    assert "(absent)" in text and str(user_home / ".cache" / "lm-studio" / "models") in text


def test_models_list_found_on_a_machine_without_any_says_where_it_looked(user_home, capsys):
    assert _models(["list", "--found"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "No GGUF files found" in text and f"ollama: {user_home / '.ollama' / 'models'} (absent)" in text
    assert found_models() == []
    assert _models(["list"]) == 0  # without --found: the known models, as before
    assert "qwen2.5-coder-1.5b" in capsys.readouterr().out


def test_inspect_takes_a_found_name(user_home, tiny_gguf, capsys):
    add_ollama_model(user_home / ".ollama" / "models", "tiny", tiny_gguf)
    assert cmd_models_inspect("ollama:tiny", as_json=True) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["architecture"] == "llama" and report["runs_as_stored"] and report["chat_template"]
    with pytest.raises(ModelError, match="ollama:nothing: no manifest"):
        cmd_models_inspect("ollama:nothing")


def test_a_found_name_needs_a_name_after_its_prefix(user_home):
    for prefix in ("ollama", "lmstudio", "hf"):
        assert f"{prefix}: needs a model name" in _one_line_error(found_gguf, f"{prefix}:")


# --------------------------------------------------------------------------- the real SmolLM2 file


@pytest.mark.real_models
def test_the_real_smollm2_file_through_ollama_generates_what_its_path_does(user_home, tmp_path, capsys):
    """The pinned SmolLM2 GGUF file, linked as the blob of a fake Ollama store, generates the same greedy
    tokens through `--target ollama:smollm2:test` as through its path."""
    from specwise.cli import main

    try:
        path = gguf_file("smollm2-135m", progress=False)
    except ModelError as error:
        if os.environ.get("SPECWISE_REQUIRE_REAL_MODELS") == "1":
            pytest.fail(f"real models required here but not ready: {error}")
        pytest.skip(str(error))
    blob = add_ollama_model(user_home / ".ollama" / "models", "smollm2:test", path, link=True)
    assert blob.is_symlink() and blob.resolve() == path.resolve()  # linked, never copied
    runs = {}
    for target in ("ollama:smollm2:test", str(path)):
        assert main(["generate", "--target", target, "--max-new-tokens", "24", "--json",
                     "Write a haiku about the sea."]) == 0
        result = json.loads(capsys.readouterr().out)
        runs[target] = result["token_ids"]
    assert runs["ollama:smollm2:test"] == runs[str(path)] and len(runs[str(path)]) > 0


def test_models_list_found_never_builds_the_kernel(user_home, tiny_gguf, capsys, monkeypatch):
    """A listing reads headers only: whether a file runs needs its block types, not the compiled kernel
    (which a fresh machine would first spend a minute building)."""
    from specwise.kernels import gguf as gk

    def no_kernel():
        raise AssertionError("the listing asked the compiled kernel")

    monkeypatch.setattr(gk, "gguf_kernel_module", no_kernel)
    monkeypatch.setattr(gk, "kernel_path", no_kernel)
    add_ollama_model(user_home / ".ollama" / "models", "tiny:q8", tiny_gguf)
    assert _models(["list", "--found", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["found"]
    assert [(row["name"], row["runs_as_stored"], row["problem"]) for row in rows] == [("ollama:tiny:q8", True, None)]
