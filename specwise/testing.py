"""Tiny random models and a character tokenizer, built from a config with no download.

Used by specwise's tests and useful for testing code built on specwise: the
models are real Hugging Face Qwen2 models, only small and untrained.
"""

from __future__ import annotations

import string

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from specwise.models.loading import LoadedModel

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
