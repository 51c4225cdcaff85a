"""Layers whose weights stay in a GGUF file's stored blocks: the linear layer and the embedding.

The GGUF model (specwise.gguf.model) is built from them, and the runners recognise them to take the
native pass (specwise.runners.native_pass) or to fuse projections (specwise.runners.fusion).
"""

from __future__ import annotations

import torch
from torch import nn

from specwise.kernels.gguf import GGUFWeight, dequantize_rows, gguf_linear, huge_page_buffer


class GGUFLinear(nn.Module):
    """y = x @ W.T (+ bias) with W in its stored GGUF blocks (float32 activations in and out)."""

    def __init__(self, weight: GGUFWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.gguf_weight = weight
        self.in_features, self.out_features = weight.in_features, weight.out_features
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.expects_bias = bias is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gguf_linear(x, self.gguf_weight, self.bias)

    @classmethod
    def concatenate(cls, layers: list[GGUFLinear]) -> GGUFLinear:
        """One layer whose outputs are the given layers' side by side (same block type and input;
        whole rows of blocks are copied, so the result is exact)."""
        first = layers[0].gguf_weight
        if any(m.gguf_weight.kernel_type != first.kernel_type or m.in_features != first.in_features for m in layers):
            raise ValueError("only GGUF layers of one block type, layout and input size can be concatenated")
        parts = [m.gguf_weight.data for m in layers]
        if _adjacent(parts):  # read side by side already (load_gguf_model): a view, no copy
            base = parts[0]
            data = torch.empty(0, dtype=torch.uint8).set_(base.untyped_storage(), base.storage_offset(),
                                                            (sum(p.shape[0] for p in parts), base.shape[1]))
        else:  # into huge pages where the system allows, as the loader reads weights (kernels/gguf.py)
            data = huge_page_buffer(sum(p.numel() for p in parts)).view(-1, first.data.shape[1])
            torch.cat(parts, out=data)
        # Whole rows of blocks, or whole 16-row groups when interleaved: the result keeps the layout.
        weight = GGUFWeight(data, first.ggml_type, (data.shape[0], first.in_features), first.interleaved)
        offset = 0
        for m in layers:  # each layer becomes a view of its rows: the blocks are held once
            rows = m.out_features
            m.gguf_weight = GGUFWeight(data[offset:offset + rows], first.ggml_type, (rows, first.in_features),
                                       first.interleaved)
            offset += rows
        biases = [m.bias for m in layers]
        if all(b is None for b in biases):
            return cls(weight)
        return cls(weight, torch.cat([b.data if b is not None else torch.zeros(m.out_features)
                                      for b, m in zip(biases, layers)]))

    def select_rows(self, ids: torch.Tensor) -> GGUFLinear:
        """A copy holding only output rows `ids` (whole rows of blocks: exact)."""
        w = self.gguf_weight.raw()  # rows as stored: a selection breaks the 16-row groups
        data = huge_page_buffer(len(ids) * w.data.shape[1]).view(len(ids), -1)  # as the loader reads weights
        torch.index_select(w.data, 0, ids.to(device=w.data.device, dtype=torch.long), out=data)
        rows = GGUFWeight(data, w.ggml_type, (len(ids), w.in_features))
        return GGUFLinear(rows, None if self.bias is None else self.bias.data[ids].clone())

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.gguf_weight.type_name}"


def _adjacent(parts: list[torch.Tensor]) -> bool:
    """Whether these contiguous uint8 matrices follow one another in one storage."""
    storage = parts[0].untyped_storage().data_ptr()
    end = parts[0].data_ptr()
    for part in parts:
        if part.untyped_storage().data_ptr() != storage or part.data_ptr() != end or not part.is_contiguous():
            return False
        end += part.numel()
    return all(p.shape[1] == parts[0].shape[1] for p in parts)


class GGUFEmbedding(nn.Module):
    """Token embedding rows dequantized from GGUF blocks on lookup."""

    def __init__(self, weight: GGUFWeight) -> None:
        super().__init__()
        self.gguf_weight = weight
        self.num_embeddings, self.embedding_dim = weight.out_features, weight.in_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return dequantize_rows(self.gguf_weight, ids)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings} x {self.embedding_dim}, {self.gguf_weight.type_name}"
