"""A model's transformers config and generation config, read from its GGUF file's metadata alone.

llama.cpp's converter writes a model's hyper-parameters as `<architecture>.<key>` metadata
(ggml's docs/gguf.md, "Standardized key-value pairs"). `ARCHITECTURE_KEYS` declares, per GGUF
architecture, which key fills which field of the transformers config of that architecture;
the rest is derived from the tensor table (tied embeddings: no `output.weight`; the vocabulary:
the embedding's rows) and the tokenizer keys (special token ids). The config class fills in what
the file leaves out with its own defaults, as transformers does when it reads a GGUF file, so
the result equals the config transformers derives, without its full parse of the file (which
builds every metadata value, the whole vocabulary among them: tens of seconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specwise.models.gguf_file import GGUFFormatError, GGUFHeader, read_header

if TYPE_CHECKING:
    from transformers import GenerationConfig, PretrainedConfig

# Keys every decoder architecture llama.cpp writes, after "<architecture>.".
_SHARED = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.key_length": "head_dim",  # written where a head is not hidden / heads wide
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
}
_SLIDING = {"attention.sliding_window": "sliding_window"}
_SOFTCAP = {"attn_logit_softcapping": "attn_logit_softcapping",
            "final_logit_softcapping": "final_logit_softcapping"}
# tokenizer.ggml.<key> -> the config's special token ids
_TOKEN_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
              "padding_token_id": "pad_token_id", "unknown_token_id": "unk_token_id"}


@dataclass(frozen=True)
class ArchitectureKeys:
    """How one GGUF architecture's metadata becomes a transformers config."""

    model_type: str  # transformers' model_type for it
    keys: Mapping[str, str]  # metadata key after "<architecture>." -> config field


ARCHITECTURE_KEYS: dict[str, ArchitectureKeys] = {
    # Llama files give the rotary width; a Llama head is fully rotary, so it is the head size.
    "llama": ArchitectureKeys("llama", {**_SHARED, "rope.dimension_count": "head_dim"}),
    "qwen2": ArchitectureKeys("qwen2", _SHARED),
    "qwen3": ArchitectureKeys("qwen3", _SHARED),
    "gemma2": ArchitectureKeys("gemma2", {**_SHARED, **_SLIDING, **_SOFTCAP}),
    # A Gemma 3 file holds the text model only: transformers' text config.
    "gemma3": ArchitectureKeys("gemma3_text", {**_SHARED, **_SLIDING, **_SOFTCAP}),
    "phi3": ArchitectureKeys("phi3", {**_SHARED, **_SLIDING}),
}
_ROPE_SCALING_TYPES = ("none", "linear", "yarn")


def _architecture(header: GGUFHeader, path: Path) -> str:
    architecture = header.metadata.get("general.architecture")
    if not isinstance(architecture, str):
        raise GGUFFormatError(f"{path.name} names no architecture (general.architecture); it is not a model file")
    return architecture


def _scalar(header: GGUFHeader, key: str, path: Path) -> object:
    if key in header.array_keys:
        raise GGUFFormatError(f"{path.name}: {key} holds one value per layer; specwise reads models whose layers "
                              "share it (use the dense format for this file)")
    return header.metadata[key]


def _rope_scaling(header: GGUFHeader, prefix: str, path: Path) -> dict | None:
    kind = header.metadata.get(f"{prefix}rope.scaling.type", "none")
    if kind not in _ROPE_SCALING_TYPES:
        raise GGUFFormatError(f"{path.name}: rope scaling {kind!r} is not one specwise reads "
                              f"({', '.join(_ROPE_SCALING_TYPES)}); use the dense format for this file")
    factor = header.metadata.get(f"{prefix}rope.scaling.factor")
    if kind == "none" or factor in (None, 1.0):
        return None
    scaling = {"rope_type": kind, "factor": float(factor)}
    if kind == "yarn":
        original = header.metadata.get(f"{prefix}rope.scaling.original_context_length")
        if original is None:
            raise GGUFFormatError(f"{path.name}: yarn rope scaling without {prefix}rope.scaling."
                                  "original_context_length; the file is incomplete")
        scaling["original_max_position_embeddings"] = int(original)
    return scaling


def config_values(header: GGUFHeader, path: str | Path) -> tuple[str, dict[str, object]]:
    """(transformers model_type, config fields) from a GGUF header; GGUFFormatError for an
    architecture with no entry in ARCHITECTURE_KEYS."""
    path = Path(path)
    architecture = _architecture(header, path)
    if architecture not in ARCHITECTURE_KEYS:
        raise GGUFFormatError(f"{path.name}: GGUF architecture {architecture!r} is not one specwise reads "
                              f"(known: {', '.join(ARCHITECTURE_KEYS)})")
    entry = ARCHITECTURE_KEYS[architecture]
    prefix = f"{architecture}."
    values: dict[str, object] = {}
    for key, field in entry.keys.items():
        if prefix + key in header.metadata:
            values.setdefault(field, _scalar(header, prefix + key, path))  # key_length before rope dims
    for key, field in _TOKEN_IDS.items():
        if f"tokenizer.ggml.{key}" in header.metadata:
            values[field] = header.metadata[f"tokenizer.ggml.{key}"]
    tensors = {entry.name: entry for entry in header.tensors}
    embedding = tensors.get("token_embd.weight")
    if embedding is None:
        raise GGUFFormatError(f"{path.name} holds no token embedding (token_embd.weight)")
    values.setdefault("vocab_size", embedding.shape[-1])  # ggml's order: [hidden, vocab]
    values["tie_word_embeddings"] = "output.weight" not in tensors
    scaling = _rope_scaling(header, prefix, path)
    if scaling is not None:
        values["rope_scaling"] = scaling
    if architecture in _GEMMA_27B_LAYERS:
        values["query_pre_attn_scalar"] = _query_pre_attn_scalar(architecture, values)
    _check_full_rotary(header, prefix, values, path)
    return entry.model_type, values


def _check_full_rotary(header: GGUFHeader, prefix: str, values: dict[str, object], path: Path) -> None:
    """Refuse a rotary embedding over part of each head (Phi-4-mini's, stored as a phi3 file): the layer
    pass rotates whole heads, and the config would not say otherwise."""
    rotary = header.metadata.get(f"{prefix}rope.dimension_count")
    if rotary is None or "hidden_size" not in values or "num_attention_heads" not in values:
        return
    head = int(values.get("head_dim") or int(values["hidden_size"]) // int(values["num_attention_heads"]))
    if int(rotary) != head:
        raise GGUFFormatError(f"{path.name}: the rotary embedding turns {rotary} of each head's {head} dimensions "
                              "(a partial rotary embedding), which specwise does not read; use the dense format")


# A Gemma file holds no attention scale: llama.cpp takes 1 / sqrt(head size), except for the 27B models
# (known by their layer count), whose scale is 1 / sqrt(hidden / heads), as their transformers configs say.
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def _query_pre_attn_scalar(architecture: str, values: dict[str, object]) -> int:
    hidden, heads = int(values["hidden_size"]), int(values["num_attention_heads"])
    if values.get("num_hidden_layers") == _GEMMA_27B_LAYERS[architecture]:
        return hidden // heads
    return int(values.get("head_dim") or hidden // heads)


def gguf_config(path: str | Path, header: GGUFHeader | None = None) -> PretrainedConfig:
    """The transformers config of the model in a GGUF file, from its metadata (header only)."""
    from transformers import AutoConfig

    path = Path(path)
    header = header or read_header(path)
    model_type, values = config_values(header, path)
    return AutoConfig.for_model(model_type, **values)


def gguf_generation_config(config: PretrainedConfig) -> GenerationConfig:
    """What a GGUF file says about generation: its special token ids (a GGUF holds no sampling defaults)."""
    from transformers import GenerationConfig

    return GenerationConfig.from_model_config(config)
