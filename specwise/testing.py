"""Tiny random models and a character tokenizer, built from a config with no download.

Used by specwise's tests and useful for testing code built on specwise: the
models are real Hugging Face Qwen2 models, only small and untrained.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from specwise.store.loading import LoadedModel

CHARACTERS = string.ascii_lowercase + string.ascii_uppercase + string.digits + " .,:;!?'\"-()\n"
SPECIAL = ["<eos>", "<unk>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer (one token per character) with an EOS and a chat template."""
    vocab = {token: i for i, token in enumerate(SPECIAL + list(CHARACTERS))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.add_special_tokens(SPECIAL)
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", unk_token="<unk>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_other_tokenizer(merges: Sequence[str] = ("ab", "bf", "kb", "th", "he", "the", " t", "in"),
                         missing: str = "QZ") -> PreTrainedTokenizerFast:
    """A second tokenizer over tiny_tokenizer's characters, for drafters with another vocabulary: other
    ids (its tokens in reverse order), the `merges` as tokens of their own (BPE merges, in that order of
    priority, each of two tokens before it), and the `missing` characters left out (read as <unk>)."""
    pieces = [c for c in CHARACTERS if c not in missing][::-1] + list(merges)
    vocab = {token: i for i, token in enumerate(SPECIAL[::-1] + pieces)}
    pairs = []
    for merged in merges:
        split = next(i for i in range(len(merged) - 1, 0, -1) if merged[:i] in vocab and merged[i:] in vocab)
        pairs.append((merged[:split], merged[split:]))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=pairs, unk_token="<unk>"))
    backend.add_special_tokens(SPECIAL)
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", unk_token="<unk>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def reordered_copy(model: Qwen2ForCausalLM, tokenizer, other) -> Qwen2ForCausalLM:
    """A copy of `model` for the ids of tokenizer `other`: each token of `other` that `tokenizer` holds
    too gets that token's embedding and output rows, so on text both tokenize alike the copy computes
    the same logits, by other ids (a drafter with another vocabulary that agrees with its target)."""
    import copy

    theirs = tokenizer.get_vocab()
    twin = Qwen2ForCausalLM(tiny_config(vocab_size=len(other), layers=model.config.num_hidden_layers,
                                        hidden=model.config.hidden_size,
                                        max_positions=model.config.max_position_embeddings)).to(model.dtype).eval()
    twin.model.layers = copy.deepcopy(model.model.layers)
    twin.model.norm = copy.deepcopy(model.model.norm)
    with torch.no_grad():
        for token, index in other.get_vocab().items():
            if token in theirs:
                twin.model.embed_tokens.weight[index] = model.model.embed_tokens.weight[theirs[token]]
                twin.lm_head.weight[index] = model.lm_head.weight[theirs[token]]
    twin.generation_config.eos_token_id = other.eos_token_id
    twin.generation_config.pad_token_id = other.eos_token_id
    return twin


def tiny_config(vocab_size: int = len(SPECIAL) + len(CHARACTERS), layers: int = 2,
                hidden: int = 32, max_positions: int = 512) -> Qwen2Config:
    return Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=max_positions, tie_word_embeddings=False,
                       initializer_range=0.3, eos_token_id=0, bos_token_id=None, pad_token_id=None)


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32, **config) -> Qwen2ForCausalLM:
    """A random Qwen2 model; the same seed gives the same weights.

    A large init range makes its next-token distributions peaked rather than
    uniform, so that drafts are sometimes accepted and sometimes not.
    """
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(tiny_config(**config)).to(dtype).eval()
    model.generation_config.eos_token_id = 0
    model.generation_config.pad_token_id = 0
    return model


def tiny_loaded(seed: int = 0, dtype: torch.dtype = torch.float32, name: str | None = None,
                tokenizer: bool = True, **config) -> LoadedModel:
    """A tiny model with the character tokenizer, as the API and server take it."""
    return LoadedModel(name=name or f"tiny-{seed}", path=None, model=tiny_model(seed, dtype, **config),
                       tokenizer=tiny_tokenizer() if tokenizer else None)


# GGUF block types a tiny GGUF model mixes, one per kind of layer, so that every supported type runs.
TINY_GGUF_TYPES = {"token_embd": "Q4_K", "attn_q": "Q4_K", "attn_k": "Q5_0", "attn_v": "Q6_K",
                   "attn_output": "Q8_0", "ffn_gate": "Q4_K", "ffn_up": "Q5_0", "ffn_down": "Q6_K",
                   "output": "Q6_K"}


# For the block types gguf cannot quantize: where each fp16 scale lies in a block and its range, so that
# random blocks make weights of a few tenths.
_RANDOM_BLOCK_SCALES = {
    "Q4_K": ((0, 2e-4, 1e-3), (2, 2e-4, 1e-3)),  # d, dmin
    "Q5_K": ((0, 1e-4, 5e-4), (2, 1e-4, 5e-4)),
    "Q6_K": ((208, -3e-4, 3e-4),),
    "Q3_K": ((108, -5e-3, 5e-3),),
    "Q2_K": ((80, 5e-3, 2e-2), (82, 5e-3, 2e-2)),
    "IQ4_NL": ((0, -5e-3, 5e-3),),
    "IQ4_XS": ((0, -3e-4, 3e-4),),
}


def random_gguf_blocks(type_name: str, out_features: int, in_features: int, rng):
    """Valid GGUF blocks of a [out_features, in_features] matrix: uint8 [out_features, row bytes].

    Q4_0, Q5_0, Q8_0 and other simple types quantize random normal weights with the `gguf` package;
    for the types it cannot quantize (the K-quants, IQ4_NL, IQ4_XS) every field is random with small
    fp16 scales (weights of a few tenths), which is all a random test model needs.
    """
    import gguf
    import numpy as np

    qtype = gguf.GGMLQuantizationType[type_name]
    if type_name not in _RANDOM_BLOCK_SCALES:
        dense = (rng.standard_normal((out_features, in_features)) * 0.3).astype(np.float32)
        return gguf.quants.quantize(dense, qtype)
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n = out_features * in_features // block_values
    raw = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
    for offset, low, high in _RANDOM_BLOCK_SCALES[type_name]:
        raw[:, offset:offset + 2] = rng.uniform(low, high, n).astype(np.float16).view(np.uint8).reshape(n, 2)
    return raw.reshape(out_features, -1)


def write_tiny_gguf_model(directory, seed: int = 0, layers: int = 2, hidden: int = 256,
                          types: dict[str, str] | None = None, max_positions: int = 512):
    """A tiny random Qwen2 model as a GGUF file of mixed block types plus its config and tokenizer.

    Returns (gguf file, model directory): `specwise.gguf.model.load_gguf_model(file,
    directory)` runs it as stored. hidden must be a multiple of 256 for the K-quants.
    """
    from pathlib import Path

    import gguf
    import numpy as np

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    types = {**TINY_GGUF_TYPES, **(types or {})}
    config = tiny_config(layers=layers, hidden=hidden, max_positions=max_positions)
    config.save_pretrained(directory)
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(directory)
    rng = np.random.default_rng(seed)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    kv = kv_heads * hidden // heads
    path = directory / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")

    tensors: list[tuple[str, np.ndarray, object]] = []

    def matrix(name: str, kind: str, out_features: int, in_features: int) -> None:
        qtype = gguf.GGMLQuantizationType[types[kind]]
        tensors.append((name, random_gguf_blocks(types[kind], out_features, in_features, rng), qtype))

    def vector(name: str, size: int, scale: float, offset: float = 0.0) -> None:
        tensors.append((name, (offset + scale * rng.standard_normal(size)).astype(np.float32), None))

    matrix("token_embd.weight", "token_embd", config.vocab_size, hidden)
    vector("output_norm.weight", hidden, 0.1, 1.0)
    matrix("output.weight", "output", config.vocab_size, hidden)
    for i in range(layers):
        vector(f"blk.{i}.attn_norm.weight", hidden, 0.1, 1.0)
        vector(f"blk.{i}.ffn_norm.weight", hidden, 0.1, 1.0)
        matrix(f"blk.{i}.attn_q.weight", "attn_q", hidden, hidden)
        matrix(f"blk.{i}.attn_k.weight", "attn_k", kv, hidden)
        matrix(f"blk.{i}.attn_v.weight", "attn_v", kv, hidden)
        for name, size in (("attn_q", hidden), ("attn_k", kv), ("attn_v", kv)):
            vector(f"blk.{i}.{name}.bias", size, 0.1)
        matrix(f"blk.{i}.attn_output.weight", "attn_output", hidden, hidden)
        matrix(f"blk.{i}.ffn_gate.weight", "ffn_gate", config.intermediate_size, hidden)
        matrix(f"blk.{i}.ffn_up.weight", "ffn_up", config.intermediate_size, hidden)
        matrix(f"blk.{i}.ffn_down.weight", "ffn_down", hidden, config.intermediate_size)
    # Files list a layer's bias before or after its weight (llama.cpp's converter: before); odd layers here
    # put them first, so loading must not depend on the order.
    late = [t for t in tensors if re.match(r"blk\.\d*[13579]\.attn_[qkv]\.bias$", t[0])]
    for entry in late:
        tensors.remove(entry)
        tensors.insert(next(i for i, t in enumerate(tensors) if t[0] == entry[0].replace(".bias", ".weight")), entry)
    for name, data, qtype in tensors:
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, directory


def tiny_gguf_loaded(directory, seed: int = 0, name: str | None = None, **options) -> LoadedModel:
    """A tiny random Qwen2 model in the gguf format (written to `directory`), as the API takes it."""
    from specwise.gguf.model import load_gguf_model

    path, model_dir = write_tiny_gguf_model(directory, seed, **options)
    model = load_gguf_model(path, model_dir)
    model.generation_config.eos_token_id = 0
    model.generation_config.pad_token_id = 0
    return LoadedModel(name=name or f"tiny-gguf-{seed}", path=model_dir, model=model,
                       tokenizer=tiny_tokenizer(), format="gguf")
