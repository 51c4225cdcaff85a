"""Tiny GGUF model files with full metadata (hyper-parameters, tokenizer, chat template), as
llama.cpp's converter writes them, for the tests that read a model from its file alone."""

from __future__ import annotations

from pathlib import Path

from helpers import _byte_alphabet

CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}" \
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
TOKENS = _byte_alphabet() + ["\u0120t", "he", "\u0120the", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["\u0120 t", "h e", "\u0120t he"]


def _add_tokenizer(writer, tokens: list[str], token_types: list[int], chat_template: bool) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(TOKENS.index("<|endoftext|>"))
    writer.add_eos_token_id(TOKENS.index("<|im_end|>"))
    writer.add_pad_token_id(TOKENS.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    if chat_template:
        writer.add_chat_template(CHAT_TEMPLATE)


def write_model_gguf(path: Path, architecture: str = "llama", *, layers: int = 2, hidden: int = 64,
                     heads: int = 4, kv_heads: int = 2, ffn: int = 128, seed: int = 0, tied: bool = True,
                     chat_template: bool = True, types: dict[str, str] | None = None,
                     metadata: dict[str, object] | None = None, padding: int = 0) -> Path:
    """A small random model of `architecture` ("llama", "qwen2" or "gemma3") as a GGUF file.

    Matrices are Q8_0 unless `types` names another ggml type for a tensor kind ("ffn_down": "Q8_1":
    random blocks of that type); `metadata` adds or replaces "<architecture>.<key>" values (a list
    value is written as an array); `padding` appends that many "[PAD<id>]" placeholder tokens to the
    vocabulary, as llama.cpp does for an embedding wider than the tokenizer.
    """
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens = TOKENS + [f"[PAD{len(TOKENS) + i}]" for i in range(padding)]
    token_types = [1] * (len(TOKENS) - 3) + [3, 3, 3] + [5] * padding  # 3: control, 5: unused
    head_dim = hidden // heads
    kv = kv_heads * head_dim
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(f"tiny test {architecture}")
    keys = {"context_length": 128, "embedding_length": hidden, "block_count": layers,
            "feed_forward_length": ffn, "attention.head_count": heads, "attention.head_count_kv": kv_heads,
            "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 10000.0}
    if architecture == "llama":
        keys["rope.dimension_count"] = head_dim
    if architecture == "gemma3":
        keys.update({"attention.key_length": head_dim, "attention.value_length": head_dim,
                     "attention.sliding_window": 16})
    keys.update(metadata or {})
    for key, value in keys.items():
        name = f"{architecture}.{key}"
        if isinstance(value, list):
            writer.add_array(name, value)
        elif isinstance(value, str):
            writer.add_string(name, value)
        elif isinstance(value, float):
            writer.add_float32(name, value)
        else:
            writer.add_uint32(name, value)
    _add_tokenizer(writer, tokens, token_types, chat_template)
    kinds = {"token_embd": "Q8_0", "output": "Q8_0", "attn_q": "Q8_0", "attn_k": "Q8_0", "attn_v": "Q8_0",
             "attn_output": "Q8_0", "ffn_gate": "Q8_0", "ffn_up": "Q8_0", "ffn_down": "Q8_0", **(types or {})}

    def matrix(name: str, rows: int, columns: int) -> None:
        kind = name.split(".")[-2]
        qtype = gguf.GGMLQuantizationType[kinds[kind]]
        data = (rng.standard_normal((rows, columns)) * 0.1).astype(np.float32)
        try:
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        except NotImplementedError:  # a type the gguf package cannot quantize: random blocks of it
            block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
            raw = rng.integers(0, 256, (rows, columns // block_values * block_bytes), dtype=np.uint8)
            writer.add_tensor(name, raw, raw_dtype=qtype)

    def vector(name: str, size: int, offset: float = 1.0) -> None:
        writer.add_tensor(name, (offset + 0.1 * rng.standard_normal(size)).astype(np.float32))

    matrix("token_embd.weight", len(tokens), hidden)
    vector("output_norm.weight", hidden)
    if not tied:
        matrix("output.weight", len(tokens), hidden)
    for i in range(layers):
        vector(f"blk.{i}.attn_norm.weight", hidden)
        matrix(f"blk.{i}.attn_q.weight", heads * head_dim, hidden)
        matrix(f"blk.{i}.attn_k.weight", kv, hidden)
        matrix(f"blk.{i}.attn_v.weight", kv, hidden)
        if architecture == "qwen2":
            for name, size in (("attn_q", heads * head_dim), ("attn_k", kv), ("attn_v", kv)):
                vector(f"blk.{i}.{name}.bias", size, 0.0)
        if architecture == "gemma3":
            vector(f"blk.{i}.attn_q_norm.weight", head_dim)
            vector(f"blk.{i}.attn_k_norm.weight", head_dim)
            vector(f"blk.{i}.post_attention_norm.weight", hidden)
            vector(f"blk.{i}.post_ffw_norm.weight", hidden)
        matrix(f"blk.{i}.attn_output.weight", hidden, heads * head_dim)
        vector(f"blk.{i}.ffn_norm.weight", hidden)
        matrix(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_up.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_down.weight", hidden, ffn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# What llama.cpp's converter writes for each transformers architecture: the GGUF architecture name, and
# each transformers parameter's GGUF name (the tests' own table, not the runner's).
_GGUF_ARCHITECTURE = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
                      "gemma3_text": "gemma3", "phi3": "phi3"}
_GLOBAL_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.qkv_proj": "attn_qkv",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate_up_proj": "ffn_up",
    "input_layernorm": "attn_norm",
}
_PRE_MLP_NORMS = {"post_attention_layernorm": "ffn_norm"}
_GEMMA_NORMS = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                "post_feedforward_layernorm": "post_ffw_norm"}


def gguf_name(model_type: str, name: str) -> str:
    """The GGUF tensor name llama.cpp's converter gives a transformers parameter ('model.layers.0.mlp.up_proj.weight'
    -> 'blk.0.ffn_up.weight')."""
    stem, _, kind = name.rpartition(".")
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{kind}"
    _, _, layer, rest = stem.split(".", 3)
    names = {**_LAYER_NAMES, **(_GEMMA_NORMS if model_type.startswith("gemma") else _PRE_MLP_NORMS)}
    return f"blk.{layer}.{names[rest]}.{kind}"


def llama_permute(weight, heads: int):
    """llama.cpp's converter's interleaving of a Llama q/k weight's rows within each head."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def write_architecture_gguf(path: Path, model, block_type: str = "F32",
                            extra: dict[str, object] | None = None) -> dict[str, object]:
    """A transformers model as llama.cpp's converter would write it, every matrix in `block_type` (F32, Q8_0
    by the gguf package's quantizer, any other block type by llama.cpp's: `llama_cpp_quantize`), norms and
    biases in F32.

    Returns, per transformers parameter, the float32 values the file holds for it, back in transformers'
    form (dequantized, Llama rows un-permuted, Gemma's norm offset taken off): load them into the model
    to get the float reference of exactly the file. `extra`: more F32 tensors by GGUF name.
    """
    import gguf
    import numpy as np
    import torch

    config = model.config
    model_type = config.model_type
    architecture = _GGUF_ARCHITECTURE[model_type]
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(f"tiny test {model_type}")
    keys: dict[str, object] = {
        "context_length": config.max_position_embeddings, "embedding_length": config.hidden_size,
        "block_count": config.num_hidden_layers, "feed_forward_length": config.intermediate_size,
        "attention.head_count": heads, "attention.head_count_kv": kv_heads,
        "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        "attention.key_length": head_dim, "attention.value_length": head_dim,
    }
    rope = config.rope_parameters
    keys["rope.freq_base"] = float((rope.get("full_attention") or rope)["rope_theta"])
    if model_type == "llama":
        keys["rope.dimension_count"] = head_dim
    if getattr(config, "sliding_window", None):
        keys["attention.sliding_window"] = int(config.sliding_window)
    for field in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, field, None):
            keys[field] = float(getattr(config, field))
    for key, value in keys.items():
        (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(f"{architecture}.{key}", value)
    _add_tokenizer(writer, TOKENS, [1] * (len(TOKENS) - 3) + [3, 3, 3], True)
    if rope.get("rope_type") == "llama3":  # as llama.cpp writes Llama 3.1+: the divisors of each frequency
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        default = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config)
        writer.add_tensor("rope_freqs.weight", (default / scaled).numpy().astype(np.float32))
    stored: dict[str, object] = {}
    offset = 1.0 if model_type.startswith("gemma") else 0.0
    state = model.state_dict()
    for name, value in state.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        data = value.detach().float().numpy()
        permute = None
        if model_type == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            permute = heads if "q_proj" in name else kv_heads
            data = llama_permute(data, permute)
        if data.ndim == 1:  # a norm or a bias
            if name.endswith("norm.weight"):
                data = data + offset
            writer.add_tensor(gguf_name(model_type, name), data.astype(np.float32))
            back = data - offset if name.endswith("norm.weight") else data
        else:
            if block_type == "F32":
                blocks, qtype = data.astype(np.float32), None
            elif block_type == "Q8_0":
                qtype = gguf.GGMLQuantizationType.Q8_0
                blocks = gguf.quants.quantize(data.astype(np.float32), qtype)
            else:
                qtype = gguf.GGMLQuantizationType[block_type]
                blocks = llama_cpp_quantize(data.astype(np.float32), block_type)
            writer.add_tensor(gguf_name(model_type, name), blocks, raw_dtype=qtype)
            back = data if qtype is None else gguf.quants.dequantize(blocks, qtype).reshape(data.shape)
            if permute is not None:  # the inverse interleaving
                back = back[np.argsort(llama_permute(np.arange(back.shape[0]), permute))]
        stored[name] = torch.from_numpy(np.array(back, dtype=np.float32))
    for name, data in (extra or {}).items():
        writer.add_tensor(name, np.asarray(data, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


def llama_cpp_quantize(data, block_type: str):
    """float32 [rows, columns] quantized by llama.cpp's own quantizer (ggml_quantize_chunk, from the library
    llama-cpp-python ships): uint8 [rows, row bytes]. For the block types the gguf package cannot quantize."""
    import ctypes

    import gguf
    import llama_cpp
    import numpy as np

    library = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    quantize = library.ggml_quantize_chunk
    quantize.restype = ctypes.c_size_t
    quantize.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                         ctypes.c_int64, ctypes.c_void_p]
    qtype = gguf.GGMLQuantizationType[block_type]
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rows, columns = data.shape
    data = np.ascontiguousarray(data, dtype=np.float32)
    out = np.zeros((rows, columns // block_values * block_bytes), dtype=np.uint8)
    library.ggml_quantize_init(ctypes.c_int(int(qtype)))
    written = quantize(int(qtype), data.ctypes.data, out.ctypes.data, 0, rows, columns, None)
    assert written == out.nbytes, (written, out.nbytes)
    return out
