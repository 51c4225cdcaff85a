"""Tiny GGUF model files with full metadata (hyper-parameters, tokenizer, chat template), as
llama.cpp's converter writes them, for the tests that read a model from its file alone."""

from __future__ import annotations

from pathlib import Path

from helpers import _byte_alphabet

CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}" \
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
TOKENS = _byte_alphabet() + ["\u0120t", "he", "\u0120the", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["\u0120 t", "h e", "\u0120t he"]


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
