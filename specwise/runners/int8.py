"""Int8 weight-only linear layers, for drafters only.

A drafter decodes one token at a time, which is bound by reading weights: int8
weights halve the bytes read compared with bfloat16 (docs/DESIGN.md, "Cost model";
the 0.5B drafter went from 90 to 49 ms a token). Quantizing a drafter cannot change the
output, because the target verifies every token; the drafter then reports the
quantized model's own processed probabilities. Never quantize the target: its
distribution is what specwise preserves.
"""

from __future__ import annotations

import torch
from torch import nn

from specwise.kernels import linear_int8


class Int8WeightOnlyLinear(nn.Module):
    """y = x @ (scale * W_int8)^T + b, with one symmetric scale per output channel."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()  # [out, in]
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [out]
        self.register_buffer("weight_int8", torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.compute_dtype = linear.weight.dtype
        self.register_buffer("scale", scale.to(self.compute_dtype))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def select_rows(self, ids: torch.Tensor) -> "Int8WeightOnlyLinear":
        """A copy with only output rows `ids` (a drafter's restricted output layer)."""
        rows = Int8WeightOnlyLinear.__new__(Int8WeightOnlyLinear)
        nn.Module.__init__(rows)
        rows.register_buffer("weight_int8", self.weight_int8[ids].contiguous())
        rows.register_buffer("scale", self.scale[ids].contiguous())
        rows.compute_dtype = self.compute_dtype
        rows.bias = None if self.bias is None else nn.Parameter(self.bias[ids].clone(), requires_grad=False)
        rows.in_features, rows.out_features = self.in_features, len(ids)
        return rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_int8(x.to(self.compute_dtype), self.weight_int8, self.scale, self.bias)


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear (the output layer included) by its int8 weight-only version, in place.

    Tied input/output embeddings are untied first: the embedding lookup keeps its
    floating-point matrix, the output layer gets the int8 copy.
    """
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, Int8WeightOnlyLinear(child))
    if hasattr(model, "config"):
        model.config.tie_word_embeddings = False
    return model


QUANTIZERS = {"int8": quantize_int8}
