"""A decoder layer's projections (specwise.runners.architectures) fused into as few matrix products as
their weights allow.

The lean runner multiplies q/k/v as one matmul and gate/up as one (`fused_layers`). Dense
layers' weights are concatenated once per model and the Hugging Face layers' weights are
re-pointed at slices of the result, so fusing costs no memory and both runners keep serving
one loaded model; GGUF layers of one block type concatenate whole rows of blocks (exact);
anything else (int8 weights, mixed block types) runs as it is; a stored matrix that holds
several projections already (Phi-3's qkv_proj and gate_up_proj) is one matmul as it is.
`apply_linear` multiplies through specwise's CPU kernel where a layer is a plain nn.Linear.
Norm weights are what the layer pass multiplies by: transformers' Gemma modules hold w for a
norm computing x * (1 + w), so a dense Gemma model's come as 1 + w, as a GGUF file stores them.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from specwise.kernels import linear
from specwise.runners.architectures import ArchitectureSpec, architecture

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class FusedLayer:
    """One decoder layer's weights as the lean runner multiplies them."""

    input_norm: torch.Tensor  # [hidden]
    qkv: tuple[torch.nn.Module, ...]  # their outputs side by side are [q | k | v]: one matmul where possible
    o_proj: torch.nn.Module
    post_norm: torch.Tensor  # [hidden]: the norm before the MLP
    gate_up: tuple[torch.nn.Module, ...] | None  # outputs side by side: [gate | up]; None: run `mlp` as it is
    down_proj: torch.nn.Module
    mlp: torch.nn.Module
    q_norm: torch.Tensor | None = None  # [head_dim]: each head of q, before the rotary embedding
    k_norm: torch.Tensor | None = None  # [head_dim]: likewise for k
    attn_out_norm: torch.Tensor | None = None  # [hidden]: attention's output, before the residual
    mlp_out_norm: torch.Tensor | None = None  # [hidden]: the MLP's output, before the residual


class FusedLinear(torch.nn.Module):
    """Several dense nn.Linear layers as one matmul over their concatenated weights."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _linear(x, self.weight, self.bias)


# Fused weights per model, shared by all its runners. The Hugging Face layers' weights are
# re-pointed at slices of the fused tensors, so fusing costs no extra memory.
_FUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _fuse_rows(modules: Sequence[torch.nn.Module]) -> torch.Tensor | None:
    """Concatenate the weights of plain nn.Linear layers and make each layer a view into the result."""
    weights = [plain_weight(m) for m in modules]
    if any(w is None for w in weights):
        return None
    fused = torch.cat(weights).contiguous()
    offset = 0
    for module, weight in zip(modules, weights):
        module.weight.data = fused[offset:offset + weight.shape[0]]
        offset += weight.shape[0]
    return fused


def _fused(modules: Sequence[torch.nn.Module]) -> tuple[torch.nn.Module, ...]:
    """Modules whose outputs, side by side, equal the given modules' outputs side by side, in as
    few matmuls as the weights allow: dense layers become one; GGUF layers of one block type
    become one (whole rows of blocks concatenated: exact, and one activation rounding instead
    of several); anything else runs as it is."""
    from specwise.runners.gguf_layers import GGUFLinear

    biases = [getattr(m, "bias", None) for m in modules]
    if all(b is None for b in biases) or all(b is not None for b in biases):
        weight = _fuse_rows(modules)
        if weight is not None:
            return (FusedLinear(weight, None if biases[0] is None else torch.cat(biases)),)
    if all(isinstance(m, GGUFLinear) for m in modules):
        runs: list[list[GGUFLinear]] = []
        for module in modules:
            if runs and runs[-1][0].gguf_weight.kernel_type == module.gguf_weight.kernel_type:
                runs[-1].append(module)
            else:
                runs.append([module])
        return tuple(GGUFLinear.concatenate(run) if len(run) > 1 else run[0] for run in runs)
    return tuple(modules)


def fused_layers(model: PreTrainedModel) -> list[FusedLayer]:
    """The model's decoder layers fused (once per model: its runners share them)."""
    if model not in _FUSED:
        spec = architecture(model.config)
        offset = norm_offset(model)
        _FUSED[model] = [_fuse(layer, spec, offset) for layer in model.model.layers]
    return _FUSED[model]


def norm_offset(model: PreTrainedModel) -> float:
    """What to add to the model's norm weights to get the factor the layer pass multiplies by: Gemma's
    offset for transformers' modules, nothing for a GGUF model's (the file stores it added)."""
    spec = architecture(model.config)
    return 0.0 if spec is None or getattr(model, "norm_offset_stored", False) else spec.norm_offset


def norm_weight(module: torch.nn.Module, offset: float) -> torch.Tensor:
    """A norm's factor [size]: its weight, plus `offset` (a copy) where that is not 0."""
    return module.weight if not offset else (module.weight.float() + offset).to(module.weight.dtype)


def _fuse(layer: torch.nn.Module, spec: ArchitectureSpec | None, offset: float) -> FusedLayer:
    attn, mlp = layer.self_attn, layer.mlp
    gate_up: tuple[torch.nn.Module, ...] | None
    if hasattr(mlp, "gate_up_proj"):  # one stored matrix holds [gate | up] already
        gate_up = (mlp.gate_up_proj,)
    else:
        pair = (mlp.gate_proj, mlp.up_proj)
        gate_up = _fused(pair)
        gate_up = None if gate_up == pair else gate_up  # unfused (e.g. int8): the MLP runs itself
    qkv = (attn.qkv_proj,) if hasattr(attn, "qkv_proj") else _fused((attn.q_proj, attn.k_proj, attn.v_proj))
    sandwich = spec is not None and spec.sandwich_norms
    qk_norm = spec is not None and spec.qk_norm
    return FusedLayer(
        input_norm=norm_weight(layer.input_layernorm, offset),
        qkv=qkv,
        o_proj=attn.o_proj,
        post_norm=norm_weight(layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm,
                              offset),
        gate_up=gate_up,
        down_proj=mlp.down_proj,
        mlp=mlp,
        q_norm=norm_weight(attn.q_norm, offset) if qk_norm else None,
        k_norm=norm_weight(attn.k_norm, offset) if qk_norm else None,
        attn_out_norm=norm_weight(layer.post_attention_layernorm, offset) if sandwich else None,
        mlp_out_norm=norm_weight(layer.post_feedforward_layernorm, offset) if sandwich else None,
    )


def side_by_side(modules: tuple[torch.nn.Module, ...], x: torch.Tensor) -> torch.Tensor:
    """The modules' outputs for x, concatenated along the last dimension."""
    if len(modules) == 1:
        return apply_linear(modules[0], x)
    return torch.cat([apply_linear(m, x) for m in modules], dim=-1)


def plain_weight(module: torch.nn.Module) -> torch.Tensor | None:
    """The plain weight of an nn.Linear, or None for anything else (e.g. a quantized layer)."""
    return module.weight if type(module) is torch.nn.Linear else None


def apply_linear(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """module(x), through specwise's CPU kernel where the module is a plain nn.Linear."""
    weight = plain_weight(module)
    if weight is None:
        return module(x)
    return _linear(x, weight, module.bias)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """specwise's CPU kernel on the CPU; PyTorch's own matmul (cuBLAS) on any other device."""
    if x.device.type == "cpu":
        return linear(x, weight, bias)
    return F.linear(x, weight, bias)
