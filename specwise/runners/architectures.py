"""How each decoder architecture's GGUF tensors map onto the one layer pass: one declared entry each.

Every architecture the gguf format runs is the same decoder layer (norm, q/k/v, rotary,
attention, output projection, residual, norm, gated MLP, residual) with a few declared
differences: extra norms (q/k norms per head; Gemma's norms after attention and after the
MLP), one tensor holding several projections side by side (Phi-3's q/k/v and gate/up), the
MLP's activation, an embedding scale, soft-capped attention and output logits, and a
sliding window or a rotary base of its own on some layers. `ARCHITECTURES` holds the
static part (`ArchitectureSpec`), keyed by transformers' model_type; `decoder_plan` reads
the per-model part (`DecoderPlan`: scales, caps, each layer's window and rotary table) from
the model's transformers config, so a dense model of the same architecture runs by the
same description.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

# GGUF per-layer tensor stems shared by every architecture -> the module under the layer.
_ATTENTION = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj"}
_MLP = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_PRE_NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
# Gemma 2/3: the norm before the MLP is "pre_feedforward"; "post_attention" normalizes attention's output.
_GEMMA_NORMS = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
                "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}


@dataclass(frozen=True)
class ArchitectureSpec:
    """What one architecture changes in the shared decoder layer, and how its GGUF tensors fill it."""

    model_type: str  # transformers' model_type (the config's)
    tensors: Mapping[str, str]  # GGUF tensor stem in blk.N -> module under model.layers[N] (transformers' names)
    fused_qkv: bool = False  # one projection holds [q | k | v] rows (self_attn.qkv_proj)
    fused_gate_up: bool = False  # one projection holds [gate | up] rows (mlp.gate_up_proj)
    permute_qk: bool = False  # llama.cpp's converter interleaved q/k rows per head: undone on load
    qkv_bias: bool = False  # q/k/v projections carry a bias
    qk_norm: bool = False  # RMSNorm over each head of q and k, before the rotary embedding
    sandwich_norms: bool = False  # RMSNorm of attention's output and of the MLP's output before each residual
    activation: Literal["silu", "gelu_tanh"] = "silu"  # the gated MLP's activation (gelu_tanh: Gemma's GeGLU)
    embedding_scale: bool = False  # embeddings times sqrt(hidden), rounded to the model's dtype
    # What llama.cpp's converter added to every norm weight (Gemma's norms compute x * (1 + w): the file
    # holds 1 + w, which the layer pass multiplies by as stored; transformers' modules hold w).
    norm_offset: float = 0.0
    query_pre_attn_scalar: bool = False  # attention scale 1 / sqrt(config.query_pre_attn_scalar), not head_dim
    sliding_everywhere: bool = False  # config.sliding_window, where set, narrows every layer's attention


_LLAMA_TENSORS = {**_PRE_NORMS, **_ATTENTION, **_MLP}
ARCHITECTURES: dict[str, ArchitectureSpec] = {
    spec.model_type: spec for spec in (
        ArchitectureSpec("llama", _LLAMA_TENSORS, permute_qk=True),
        ArchitectureSpec("qwen2", _LLAMA_TENSORS, qkv_bias=True),
        ArchitectureSpec("qwen3", tensors={**_PRE_NORMS, **_ATTENTION, **_QK_NORMS, **_MLP}, qk_norm=True),
        ArchitectureSpec("gemma2", tensors={**_GEMMA_NORMS, **_ATTENTION, **_MLP}, sandwich_norms=True,
                         activation="gelu_tanh", embedding_scale=True, norm_offset=1.0,
                         query_pre_attn_scalar=True),
        ArchitectureSpec("gemma3_text", tensors={**_GEMMA_NORMS, **_ATTENTION, **_QK_NORMS, **_MLP}, qk_norm=True,
                         sandwich_norms=True, activation="gelu_tanh", embedding_scale=True, norm_offset=1.0,
                         query_pre_attn_scalar=True),
        ArchitectureSpec("phi3", tensors={**_PRE_NORMS, "attn_qkv": "self_attn.qkv_proj",
                                          "attn_output": "self_attn.o_proj", "ffn_up": "mlp.gate_up_proj",
                                          "ffn_down": "mlp.down_proj"},
                         fused_qkv=True, fused_gate_up=True, sliding_everywhere=True),
    )
}


def architecture(config) -> ArchitectureSpec | None:
    """The spec of a transformers config's architecture, or None where the layer pass does not run it."""
    return ARCHITECTURES.get(getattr(config, "model_type", None))


@dataclass(frozen=True)
class DecoderPlan:
    """The per-model settings of the layer pass, read from a transformers config."""

    spec: ArchitectureSpec
    head_dim: int
    attention_scale: float  # multiplies q . k
    attention_softcap: float | None  # scores become cap * tanh(score / cap)
    final_softcap: float | None  # likewise for the output logits
    embedding_scale: float | None  # sqrt(hidden) where the architecture scales its embeddings
    windows: tuple[int | None, ...]  # per layer: the entries a row attends to at most (its own included)
    rope_types: tuple[str | None, ...]  # the rotary tables: None for a model with one, else layer types
    rope_table: tuple[int, ...]  # per layer: its index into rope_types

    @property
    def plain(self) -> bool:
        """Whether every layer is the Llama layer (no extra norms, caps, windows or second rotary table)."""
        spec = self.spec
        return not (spec.qk_norm or spec.sandwich_norms or spec.embedding_scale or self.attention_softcap
                    or self.final_softcap or any(self.windows) or len(self.rope_types) > 1
                    or spec.activation != "silu" or self.attention_scale != self.head_dim ** -0.5)


def decoder_plan(config) -> DecoderPlan:
    """The layer pass's settings for a model of a supported architecture (ValueError otherwise)."""
    spec = architecture(config)
    if spec is None:
        raise ValueError(f"no layer pass for {getattr(config, 'model_type', None)!r} models "
                         f"(known: {', '.join(ARCHITECTURES)})")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    layers = config.num_hidden_layers
    scalar = config.query_pre_attn_scalar if spec.query_pre_attn_scalar else head_dim
    layer_types = list(getattr(config, "layer_types", None) or ["full_attention"] * layers)
    window = getattr(config, "sliding_window", None)
    if spec.sliding_everywhere and window:
        layer_types = ["sliding_attention"] * layers
    windows = tuple(int(window) if kind == "sliding_attention" and window else None for kind in layer_types)
    unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
    if unknown:
        raise ValueError(f"layer types {unknown} have no layer pass (full and sliding attention only)")
    # One rotary table per layer type where the config gives each type its own (Gemma 3's local base).
    rope = getattr(config, "rope_parameters", None)
    per_type = isinstance(rope, Mapping) and all(kind in rope for kind in set(layer_types))
    rope_types: tuple[str | None, ...] = tuple(sorted(set(layer_types))) if per_type else (None,)
    rope_table = tuple(rope_types.index(kind) for kind in layer_types) if per_type else (0,) * layers
    return DecoderPlan(
        spec=spec, head_dim=head_dim, attention_scale=float(scalar) ** -0.5,
        attention_softcap=getattr(config, "attn_logit_softcapping", None) or None,
        final_softcap=getattr(config, "final_logit_softcapping", None) or None,
        embedding_scale=math.sqrt(config.hidden_size) if spec.embedding_scale else None,
        windows=windows, rope_types=rope_types, rope_table=rope_table)
