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

from specwise.gguf.file import GGUFDamagedError, GGUFFormatError, GGUFHeader, read_header, shown, type_name

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
    check_hyperparameters(header, path, architecture, values)
    _check_full_rotary(header, prefix, values, path)
    return entry.model_type, values


MAX_LAYERS = 512
_FLOAT_TYPE_IDS = (0, 1, 30)  # F32, F16, BF16: what a norm or a bias is read as


def _damaged(path: Path, what: str) -> GGUFDamagedError:
    from specwise.gguf.file import DAMAGED

    return GGUFDamagedError(f"{path.name}: {what}; {DAMAGED}")


def check_hyperparameters(header: GGUFHeader, path: Path, architecture: str, values: dict[str, object]) -> None:
    """The hyper-parameters a model is built from, sane and agreeing with the tensor table (header only):
    heads and kv heads positive, kv heads dividing heads, an even head size, 1 to 512 layers with every
    layer's tensors present, the vocabulary positive and the special token ids inside it, the embedding
    as wide as the hidden size, and 1-D tensors (norms, biases) stored as floats."""
    prefix = f"{architecture}."

    def number(field: str, key: str) -> int | None:
        value = values.get(field)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise _damaged(path, f"{prefix}{key} is {shown(str(value))}, not a whole number")
        return int(value)

    heads = number("num_attention_heads", "attention.head_count")
    kv_heads = number("num_key_value_heads", "attention.head_count_kv")
    hidden = number("hidden_size", "embedding_length")
    layers = number("num_hidden_layers", "block_count")
    for value, key in ((heads, "attention.head_count"), (kv_heads, "attention.head_count_kv"),
                       (hidden, "embedding_length"), (number("intermediate_size", "feed_forward_length"),
                                                      "feed_forward_length"),
                       (number("head_dim", "attention.key_length"), "attention.key_length")):
        if value is not None and value <= 0:
            raise _damaged(path, f"{prefix}{key} is {value}; it must be positive")
    if heads is not None and hidden is not None and heads > hidden:
        raise _damaged(path, f"{prefix}attention.head_count {heads} exceeds {prefix}embedding_length {hidden}")
    if heads is not None and kv_heads is not None and heads % kv_heads:
        raise _damaged(path, f"{prefix}attention.head_count_kv {kv_heads} does not divide "
                             f"{prefix}attention.head_count {heads}")
    head_dim = number("head_dim", "attention.key_length")
    if head_dim is None and heads is not None and hidden is not None:
        if hidden % heads:
            raise _damaged(path, f"{prefix}embedding_length {hidden} is not a multiple of "
                                 f"{prefix}attention.head_count {heads}")
        head_dim = hidden // heads
    if head_dim is not None and head_dim % 2:
        raise _damaged(path, f"a head is {head_dim} wide; the rotary embedding needs an even width")
    indices = set()
    for entry in header.tensors:
        if entry.name.startswith("blk."):
            index = entry.name.split(".")[1]
            if not index.isdigit():
                raise _damaged(path, f"tensor {shown(entry.name)} names no layer number")
            indices.add(int(index))
        if len(entry.shape) == 1 and entry.ggml_type not in _FLOAT_TYPE_IDS:
            raise GGUFFormatError(f"{path.name}: tensor {shown(entry.name)} is 1-D (a norm or a bias) but stored as "
                                  f"{type_name(entry.ggml_type)}; the gguf format reads 1-D tensors as F32, F16 "
                                  "or BF16 only (use the dense format)")
        if len(entry.shape) > 2:
            raise GGUFFormatError(f"{path.name}: tensor {shown(entry.name)} has {len(entry.shape)} dimensions; the "
                                  "gguf format reads matrices and vectors only (use the dense format)")
    if layers is None:
        raise _damaged(path, f"{prefix}block_count is missing")
    if not 1 <= layers <= MAX_LAYERS:
        raise _damaged(path, f"{prefix}block_count is {layers} (1 to {MAX_LAYERS})")
    if indices != set(range(layers)):
        extra = sorted(indices - set(range(layers)))
        what = (f"tensors of layer {extra[0]}" if extra
                else f"no tensors of layer {min(set(range(layers)) - indices)}")
        raise _damaged(path, f"{prefix}block_count is {layers}, but the file holds {what}")
    embedding = next(entry for entry in header.tensors if entry.name == "token_embd.weight")
    if len(embedding.shape) != 2 or (hidden is not None and embedding.shape[0] != hidden):
        raise _damaged(path, f"token_embd.weight is {list(embedding.shape)}, not [{hidden}, vocabulary]")
    vocab = number("vocab_size", "vocab_size")
    if vocab is None or vocab <= 0:
        raise _damaged(path, f"the vocabulary holds {vocab} tokens")
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    limit = min(vocab, tokens) if isinstance(tokens, int) and "tokenizer.ggml.tokens" in header.array_keys else vocab
    for key, field in _TOKEN_IDS.items():
        token = values.get(field)
        if token is not None and (isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < limit):
            raise _damaged(path, f"tokenizer.ggml.{key} is {shown(str(token))}, outside the vocabulary "
                                 f"of {limit} tokens")


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
    try:
        return AutoConfig.for_model(model_type, **values)
    except Exception as error:  # noqa: BLE001 - transformers' validators raise their own types
        lines = str(error).strip().splitlines()
        raise _damaged(path, f"transformers refuses its hyper-parameters ({type(error).__name__}: "
                             f"{lines[-1][:200] if lines else ''})") from None


def gguf_generation_config(config: PretrainedConfig) -> GenerationConfig:
    """What a GGUF file says about generation: its special token ids (a GGUF holds no sampling defaults)."""
    from transformers import GenerationConfig

    return GenerationConfig.from_model_config(config)
