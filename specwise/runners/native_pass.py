"""Every decoder layer of a GGUF model in one compiled call (specwise/kernels/gguf_pass.cpp).

The lean runner hands a pass to it when every projection of every layer is a
`GGUFLinear`: the call does the norms, rotary embedding, cache writes, attention and
all projections with the threads of one parallel region, instead of some twenty
PyTorch operations and four kernel calls per layer. The architecture's differences
(specwise.runners.architectures: q/k norms, post-attention and post-MLP norms, GeGLU,
attention scale and soft-capping, each layer's sliding window and rotary table) are
parameters of the one pass. Each row attends alone (only the
cache entries it may see, in cache order), so a row's result never depends on the
other rows of the pass (docs/DESIGN.md, "Numerics"); a long pass runs as several calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specwise.kernels.gguf import gguf_kernel_module, kernel_path
from specwise.runners.architectures import DecoderPlan, decoder_plan
from specwise.runners.passes import DECODER_PASS_ROWS

_ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}  # the native pass's codes for ArchitectureSpec.activation


def _parts(modules: Sequence[torch.nn.Module]) -> list[tuple] | None:
    from specwise.runners.gguf_layers import GGUFLinear

    if not all(isinstance(m, GGUFLinear) for m in modules):
        return None
    return [(m.gguf_weight.data, m.gguf_weight.kernel_type, m.out_features, m.in_features,
             None if m.bias is None else m.bias.data) for m in modules]


class GGUFDecoderPass:
    """The decoder layers of one model, registered once with the native pass."""

    def __init__(self, module: Any, layers: int) -> None:
        self._pass = module
        self.layers = layers

    @classmethod
    def build(cls, layers: Sequence[Any], config: Any, plan: DecoderPlan | None = None) -> GGUFDecoderPass | None:
        """The pass over the lean runner's fused layers with the settings of `plan` (by default the
        config's, specwise.runners.architectures.decoder_plan), or None when some projection is not
        GGUF blocks (a dense or int8 model) or the kernel cannot be built."""
        specs = []
        for layer in layers:
            # gate/up of two block types stay two modules (the runner then calls the MLP as it is).
            gate_up = layer.gate_up or (getattr(layer.mlp, "gate_proj", None), getattr(layer.mlp, "up_proj", None))
            parts = [_parts(layer.qkv), _parts((layer.o_proj,)), _parts(gate_up), _parts((layer.down_proj,))]
            if any(p is None for p in parts) or layer.input_norm.dtype != torch.float32:
                return None
            specs.append((layer.input_norm, parts))
        if not specs:
            return None
        try:
            kernel = gguf_kernel_module()
        except RuntimeError:
            return None
        plan = plan or decoder_plan(config)
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        # A Llama-style model keeps the pass's own 1 / sqrt(head_dim) (0: that default), bit for bit as before.
        scale = 0.0 if plan.attention_scale == plan.head_dim ** -0.5 else plan.attention_scale
        compiled = kernel.DecoderPass(config.hidden_size, heads, kv_heads, plan.head_dim, config.intermediate_size,
                                      float(config.rms_norm_eps), _ACTIVATIONS[plan.spec.activation], scale,
                                      plan.attention_softcap or 0.0)
        for index, (layer, (norm, (qkv, o, gate_up, down))) in enumerate(zip(layers, specs)):
            compiled.add_layer(norm, qkv, o, layer.post_norm, gate_up, down, layer.q_norm, layer.k_norm,
                               layer.attn_out_norm, layer.mlp_out_norm, plan.windows[index] or 0,
                               plan.rope_table[index])
        return cls(compiled, len(specs))

    def run(self, hidden: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, cos: torch.Tensor,
            sin: torch.Tensor, visible: torch.Tensor | None, capture: Sequence[int] = (),
            layers: range | None = None) -> torch.Tensor | None:
        """Run the decoder layers over hidden [n, hidden] (float32, updated in place), writing the rows' keys
        and values at cache slots start..start + n - 1. visible [n, start + n] (True: may attend) or None for
        a chain (row i sees slots 0..start + i). layers: a range [first, last) of them (None: all); hidden
        is then the output of layer first - 1 (the embeddings for 0) and becomes that of layer last - 1,
        and only those layers' entries are written; a range and the rest give bitwise what all give.
        Returns the outputs of the `capture` layers (within the range), [n, len(capture), hidden], or None
        when none are asked for."""
        captured = _captured(hidden, capture)
        path, wanted = kernel_path(), list(capture)
        first, last = (0, self.layers) if layers is None else (layers.start, layers.stop)
        # In calls of at most DECODER_PASS_ROWS rows, in order (a row's entries are written before a later
        # call reads them): rows are independent, so this bounds the scratch and changes no bit.
        for top in range(0, hidden.shape[0], DECODER_PASS_ROWS):
            rows = slice(top, min(top + DECODER_PASS_ROWS, hidden.shape[0]))  # cos/sin: [n, d] or [tables, n, d]
            self._pass.run(hidden[rows], keys, values, start + top, cos[..., rows, :], sin[..., rows, :],
                           None if visible is None else visible[rows], wanted,
                           None if captured is None else captured[rows], path, first, last)
        return captured

    def run_ragged(self, hidden: torch.Tensor, caches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                   owners: torch.Tensor, slots: torch.Tensor, offsets: torch.Tensor, seen: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor, capture: Sequence[int] = ()) -> torch.Tensor | None:
        """`run` over the rows of several sequences: row i belongs to caches[owners[i]] (keys, values),
        writes its entries at slot slots[i] of it and attends to its slots seen[offsets[i]:offsets[i + 1]]
        (ascending). owners, slots, offsets [n], [n], [n + 1] int64; seen int32. Each row computes exactly
        what `run` computes for it in a pass of its own sequence alone."""
        captured = _captured(hidden, capture)
        self._pass.run_ragged(hidden, list(caches), owners, slots, offsets, seen, cos, sin, list(capture), captured,
                              kernel_path())
        return captured


def _captured(hidden: torch.Tensor, capture: Sequence[int]) -> torch.Tensor | None:
    """Room for the outputs of the `capture` layers: [n, len(capture), hidden]."""
    return torch.empty(hidden.shape[0], len(capture), hidden.shape[1]) if capture else None
