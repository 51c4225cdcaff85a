"""The lean runner with its scoring step compiled by torch.compile, one graph per block size.

On a GPU a decoding step of a small model is bound by launching kernels (hundreds per
pass) rather than by reading the weights; compiling the step fuses them, and on CUDA
replays it as a CUDA graph (mode "reduce-overhead", as gpt-fast does). Shapes must not
change between calls for that, so the torch.compile step attends over the cache's whole
capacity with a mask instead of over its filled part, and writes the block's keys and
values at their positions inside the graph. The cache and the weights are marked as
static addresses, so a graph replays on them without copies. Growing the cache (doubling
its capacity) or a new block size compiles again; the first pass of each size pays that.

Only chain scoring passes (logits wanted, no hidden states, the whole output layer) of up
to MAX_COMPILED_BLOCK rows take the torch.compile step (`choose_pass`, specwise.runners.passes);
prefill, trees and feature passes run the lean runner's eager code. The torch.compile step
computes the same function as the eager one with batched attention, so on the CPU a row's
result may differ from a one-token pass in the last bits (docs/DESIGN.md, "Numerics"); greedy identity is checked in float32.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from specwise.runners.layers import apply_rope, rms_norm
from specwise.runners.fusion import FusedLinear, plain_weight
from specwise.runners.lean import BlockLayout, LeanRunner, UnsupportedModelError
from specwise.runners.passes import Implementation, Pass, PassMeans

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger("specwise")


def _dense(module: object) -> torch.Tensor | None:
    if isinstance(module, FusedLinear):
        return module.weight
    return plain_weight(module) if isinstance(module, torch.nn.Module) else None


class CompiledLeanRunner(LeanRunner):
    """LeanRunner whose chain scoring passes run one compiled graph per block size."""

    def __init__(self, model: PreTrainedModel, **options) -> None:
        super().__init__(model, **options)
        if not self.plan.plain:
            raise UnsupportedModelError(f"compile_step runs Llama-style layers only, not {model.config.model_type}'s; "
                                        "run this model without compile_step")
        for layer in self.layers:
            if len(layer.qkv) != 1 or layer.gate_up is None or len(layer.gate_up) != 1 or any(
                    _dense(m) is None for m in (layer.qkv[0], layer.o_proj, layer.gate_up[0], layer.down_proj)):
                raise UnsupportedModelError("compile_step needs dense linear layers (not the gguf format or "
                                            "int8 weights); run this model without compile_step")
        if _dense(self.lm_head) is None:
            raise UnsupportedModelError("compile_step needs a dense output layer; run without compile_step")
        for layer in self.layers:
            for module in (layer.qkv[0], layer.o_proj, layer.gate_up[0], layer.down_proj):
                _mark_static(_dense(module))
        # CUDA graphs replay the whole step with one launch; on the CPU there is nothing to replay.
        mode = "reduce-overhead" if self.device.type == "cuda" else None
        self._compiled = torch.compile(self._step, mode=mode, dynamic=False, fullgraph=True)

    def _allocate(self, capacity: int) -> None:
        super()._allocate(capacity)
        # The step attends over the whole capacity with a mask: a masked value slot still enters the
        # product with weight 0, and 0 * NaN (garbage in fresh memory) would poison the row.
        self._keys[:, :, self._length:].zero_()
        self._values[:, :, self._length:].zero_()
        _mark_static(self._keys)
        _mark_static(self._values)

    @property
    def means(self) -> PassMeans:
        return replace(super().means, compiled_step=True)

    def _execute(self, plan: Pass, ids: Sequence[int], layout: BlockLayout, logits: bool,
                 hidden_layers: Sequence[int] | None) -> torch.Tensor | None:
        if plan.implementation is not Implementation.COMPILED_STEP:
            return super()._execute(plan, ids, layout, logits, hidden_layers)
        input_ids = self._checked_ids(ids)
        self.reserve(layout.start + layout.rows)
        keys, values = self.cache
        positions = layout.positions
        # Row i sees the cache up to its own position: the whole capacity, masked, keeps shapes fixed.
        mask = torch.arange(keys.shape[2], device=self.device)[None] <= positions[:, None]  # [n, capacity]
        out = self._compiled(input_ids, positions, mask, keys, values)
        self.append(layout)
        return out.clone()  # a CUDA graph's output is overwritten by its next replay

    def _step(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
              keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """One chain pass: write the block's keys and values at `positions`, return its logits [n, V]."""
        n = input_ids.shape[0]
        hidden = self.embed_tokens(input_ids)[None]  # [1, n, hidden]
        cos, sin = self.rotary(hidden, positions[None])
        cos, sin = cos[:, None], sin[:, None]
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn_mask = mask[None, None]  # [1, 1, n, capacity]
        for index, layer in enumerate(self.layers):
            residual = hidden
            x = rms_norm(hidden, layer.input_norm, self.eps)
            qkv = layer.qkv[0]
            q, k, v = F.linear(x, _dense(qkv), qkv.bias).split([q_size, kv_size, kv_size], dim=-1)
            q = q.view(1, n, self.num_heads, self.head_dim).transpose(1, 2)
            k = k.view(1, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(1, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            keys[index].index_copy_(1, positions, k[0])
            values[index].index_copy_(1, positions, v[0])
            attn = F.scaled_dot_product_attention(q, keys[index, None], values[index, None], attn_mask=attn_mask,
                                                  scale=self.head_dim ** -0.5, enable_gqa=True)
            attn = attn.transpose(1, 2).reshape(1, n, q_size)
            hidden = residual + F.linear(attn, _dense(layer.o_proj), layer.o_proj.bias)
            residual = hidden
            x = rms_norm(hidden, layer.post_norm, self.eps)
            gate_up = layer.gate_up[0]
            gate, up = F.linear(x, _dense(gate_up), gate_up.bias).chunk(2, dim=-1)
            hidden = residual + F.linear(F.silu(gate) * up, _dense(layer.down_proj), layer.down_proj.bias)
        hidden = rms_norm(hidden, self.final_norm, self.eps)
        return F.linear(hidden, _dense(self.lm_head), self.lm_head.bias)[0].float()  # [n, V]


def _mark_static(tensor: torch.Tensor) -> None:
    """Tell torch.compile this tensor keeps its address, so CUDA graphs read it in place."""
    if tensor.device.type == "cuda":
        torch._dynamo.mark_static_address(tensor)
