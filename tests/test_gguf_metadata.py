"""A GGUF file alone is a model: config, tokenizer and chat template come from its metadata.

- the config read from the metadata equals the one transformers derives from the same file
  (its own, slower parse), for every architecture and both tied and untied embeddings;
- the tokenizer built from the file encodes, decodes and applies the chat template like the
  tokenizer transformers builds on its own; it is built once, kept in the cache under a key
  of the file's header, and read back from there;
- loading a .gguf file in the gguf format writes no bfloat16 copy (no safetensors anywhere in
  the cache), and the dense format writes one, once;
- what the gguf format cannot run is refused by name before anything is built.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_files import write_model_gguf
from specwise.gguf.config import ARCHITECTURE_KEYS, config_values, gguf_config
from specwise.gguf.file import GGUFFormatError, read_header

SAMPLES = ["the hat <|im_end|>", " the the  thethe", "héllo wörld\n\tdef f(x):\n    return x",
           "<|im_start|>user\nhi<|im_end|>", ""]
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the hat"}]
NAMES = ("_name_or_path", "_model_name_or_path")  # where transformers read the file from, and general.name


def transformers_config(path: Path) -> dict:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_dict()
    return {key: value for key, value in config.items() if key not in NAMES}


def our_config(path: Path) -> dict:
    return {key: value for key, value in gguf_config(path).to_dict().items() if key not in NAMES}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """A fresh cache home per test, once the GGUF kernel is built in the usual one (a minute, once)."""
    from specwise.kernels.gguf import gguf_kernel_module

    gguf_kernel_module()
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_config_from_metadata_equals_transformers_own(tmp_path, architecture, tied):
    path = write_model_gguf(tmp_path / "model.gguf", architecture, tied=tied)
    ours, theirs = our_config(path), transformers_config(path)
    if architecture == "gemma3":
        # A Gemma file holds no attention scale: transformers keeps its config's default (256), llama.cpp
        # takes the file's head size, as Gemma's own configs do (256 where the head is 256 wide).
        assert ours["query_pre_attn_scalar"] == ours["head_dim"] == 16 and theirs["query_pre_attn_scalar"] == 256
        theirs["query_pre_attn_scalar"] = ours["query_pre_attn_scalar"]
    assert ours == theirs
    assert ours["tie_word_embeddings"] is tied and ours["num_hidden_layers"] == 2
    assert ours["model_type"] == ARCHITECTURE_KEYS[architecture].model_type


def test_a_config_field_the_file_changes_changes_the_config(tmp_path):
    """Negative control: the comparison above sees a difference in any field the metadata gives."""
    plain = our_config(write_model_gguf(tmp_path / "a.gguf"))
    longer = our_config(write_model_gguf(tmp_path / "b.gguf", metadata={"context_length": 256}))
    assert {k for k in plain if plain[k] != longer.get(k)} == {"max_position_embeddings"}


def test_rope_scaling_and_head_size_come_from_the_metadata(tmp_path):
    linear = gguf_config(write_model_gguf(tmp_path / "linear.gguf", metadata={
        "rope.scaling.type": "linear", "rope.scaling.factor": 4.0, "rope.freq_base": 500000.0}))
    assert linear.rope_parameters == {"rope_type": "linear", "factor": 4.0, "rope_theta": 500000.0}
    yarn = gguf_config(write_model_gguf(tmp_path / "yarn.gguf", "qwen2", metadata={
        "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 32}))
    assert yarn.rope_parameters["rope_type"] == "yarn" and yarn.rope_parameters["factor"] == 4.0
    assert yarn.rope_parameters["original_max_position_embeddings"] == 32
    wide = gguf_config(write_model_gguf(tmp_path / "wide.gguf", "qwen2", metadata={"attention.key_length": 32}))
    assert wide.head_dim == 32  # not hidden / heads = 16
    with pytest.raises(GGUFFormatError, match="rope scaling 'longrope' is not one specwise reads"):
        gguf_config(write_model_gguf(tmp_path / "long.gguf", metadata={
            "rope.scaling.type": "longrope", "rope.scaling.factor": 4.0}))


def test_what_the_config_cannot_hold_is_named(tmp_path):
    per_layer = write_model_gguf(tmp_path / "per-layer.gguf", metadata={"attention.head_count_kv": [2, 1]})
    with pytest.raises(GGUFFormatError, match="head_count_kv holds one value per layer"):
        gguf_config(per_layer)
    other = write_model_gguf(tmp_path / "mamba.gguf", "mamba")
    with pytest.raises(GGUFFormatError, match="GGUF architecture 'mamba' is not one specwise reads"):
        config_values(read_header(other), other)


def test_the_tokenizer_from_the_file_tokenizes_as_transformers_own(tmp_path, home):
    from transformers import AutoTokenizer

    from specwise.gguf.tokenizer import cached_tokenizer_dir, gguf_tokenizer

    for architecture in ("llama", "qwen2"):
        path = write_model_gguf(tmp_path / f"{architecture}.gguf", architecture, padding=3)
        ours = gguf_tokenizer(path)
        reference = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)  # what prepare used
        assert ours.get_vocab() == reference.get_vocab() and len(ours) == len(reference) == 265
        for text in SAMPLES:
            ids = ours(text).input_ids
            assert ids == reference(text).input_ids, text
            assert ours.decode(ids) == reference.decode(ids) == text
        for generation_prompt in (False, True):
            chat = ours.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=generation_prompt)
            assert chat == reference.apply_chat_template(MESSAGES, tokenize=False,
                                                         add_generation_prompt=generation_prompt)
        assert chat.endswith("<|im_start|>assistant\n")
        assert (ours.eos_token, ours.bos_token, ours.pad_token) == ("<|im_end|>", "<|endoftext|>", "<|endoftext|>")
        assert cached_tokenizer_dir(path).parent == home / "tokenizers"


def test_the_tokenizer_is_built_once_and_keyed_by_the_header(tmp_path, monkeypatch):
    from specwise.gguf import tokenizer as module

    path = write_model_gguf(tmp_path / "model.gguf")
    first = module.gguf_tokenizer(path)
    monkeypatch.setattr(module, "_build", lambda *args: pytest.fail("built again"))
    again = module.gguf_tokenizer(path)
    assert again.get_vocab() == first.get_vocab()
    other = write_model_gguf(tmp_path / "other.gguf", chat_template=False)  # another header
    assert module.cached_tokenizer_dir(other) != module.cached_tokenizer_dir(path)
    with pytest.raises(pytest.fail.Exception, match="built again"):
        module.gguf_tokenizer(other)


def test_a_gguf_file_loads_in_the_gguf_format_without_a_dense_copy(tmp_path, home):
    from specwise import SamplingParams, SpecConfig, SpecDecoder
    from specwise.store.loading import load_model

    path = write_model_gguf(tmp_path / "model.gguf", "qwen2", tied=False)
    decoder = SpecDecoder(str(path), SpecConfig(drafter="ngram", k=3))
    result = decoder.generate("the hat the hat", SamplingParams(max_new_tokens=6), chat=False)
    assert decoder.target.format == "gguf" and len(result.token_ids) == 6  # auto: the file as stored
    assert decoder.target.model.config.to_dict() == gguf_config(path).to_dict() | {"dtype": "float32"}
    assert decoder.target.tokenizer.chat_template is not None
    assert not list(home.rglob("*.safetensors")) and not (home / "models").exists()
    loaded = load_model(str(path), format="gguf")
    assert loaded.path == path and loaded.model.generation_config.eos_token_id == 261


def test_the_dense_format_writes_its_copy_once(tmp_path, home, monkeypatch):
    from specwise.store import dense as dense_copy, prepare
    from specwise.store.loading import load_model

    path = write_model_gguf(tmp_path / "model.gguf")
    dense = load_model(str(path), "float32")
    assert dense.format == "dense" and len(list(home.rglob("*.safetensors"))) == 1
    monkeypatch.setattr(dense_copy, "_convert_gguf", lambda *args, **kwargs: pytest.fail("converted again"))
    assert prepare.dense_model_dir(path, progress=False) == dense.path


def test_an_architecture_that_does_not_run_is_refused_by_name_before_anything_is_built(tmp_path, home):
    from specwise.store.loading import load_model

    path = write_model_gguf(tmp_path / "mamba.gguf", "mamba")
    with pytest.raises(GGUFFormatError, match="the mamba architecture does not run as stored"):
        load_model(str(path), format="gguf")
    assert not (home / "tokenizers").exists()
    done = subprocess.run([sys.executable, "-m", "specwise.cli", "generate", "hi", "--target", str(path),
                           "--max-new-tokens", "2"], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1], env=os.environ | {"SPECWISE_HOME": str(home)})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "mamba architecture does not run as stored" in done.stderr and "Traceback" not in done.stderr
    assert "specwise models inspect" in done.stderr
    assert not list(home.rglob("*.safetensors"))


def test_a_draft_model_from_a_gguf_file_runs_its_blocks_beside_a_gguf_target(tmp_path, home):
    from specwise import SamplingParams, SpecConfig, SpecDecoder
    from specwise.gguf.model import GGUFCausalLM

    target = write_model_gguf(tmp_path / "target.gguf", "qwen2", seed=0)
    drafter = write_model_gguf(tmp_path / "drafter.gguf", "qwen2", seed=1, layers=1)
    decoder = SpecDecoder(str(target), SpecConfig(drafter="none"), drafter_model=str(drafter))
    sampling = SamplingParams(max_new_tokens=12)
    plain = decoder.generate("the hat the", sampling, chat=False).token_ids
    fast = decoder.generate("the hat the", sampling, spec=SpecConfig(drafter="draft-model", k=3, adaptive=False), chat=False)
    assert fast.token_ids == plain and fast.stats.proposed > 0
    draft = next(d for d in decoder.drafters() if d.name == "draft-model")
    assert isinstance(draft.runner.model, GGUFCausalLM)  # its blocks, not a dense copy
    assert not list(home.rglob("*.safetensors"))


def test_a_gemma_files_attention_scale_is_its_head_size_but_hidden_over_heads_for_27b():
    """llama.cpp's rule (and the published configs): 1 / sqrt(head size), 1 / sqrt(hidden / heads) for 27B."""
    from specwise.gguf.config import _query_pre_attn_scalar

    gemma2_27b = {"hidden_size": 4608, "num_attention_heads": 32, "num_hidden_layers": 46, "head_dim": 128}
    gemma3_27b = {"hidden_size": 5376, "num_attention_heads": 32, "num_hidden_layers": 62, "head_dim": 128}
    gemma3_4b = {"hidden_size": 2560, "num_attention_heads": 8, "num_hidden_layers": 34, "head_dim": 256}
    assert _query_pre_attn_scalar("gemma2", gemma2_27b) == 144
    assert _query_pre_attn_scalar("gemma3", gemma3_27b) == 168
    assert _query_pre_attn_scalar("gemma3", gemma3_4b) == 256


def test_a_partial_rotary_embedding_is_refused_by_name(tmp_path):
    path = write_model_gguf(tmp_path / "partial.gguf", "phi3", metadata={"rope.dimension_count": 12})
    with pytest.raises(GGUFFormatError, match="turns 12 of each head's 16 dimensions .*use the dense format"):
        gguf_config(path)
    assert gguf_config(write_model_gguf(tmp_path / "whole.gguf", "phi3", metadata={"rope.dimension_count": 16}))
