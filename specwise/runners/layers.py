"""The pieces of a decoder layer that the lean runner, the GGUF model and the EAGLE head share."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm with the same steps and roundings as Qwen2RMSNorm / LlamaRMSNorm."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class RMSNorm(nn.Module):
    """`rms_norm` with a learned weight."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of x [..., head_dim] with cos and sin broadcast to it."""
    return x * cos + rotate_half(x) * sin


def activate(x: torch.Tensor, activation: str) -> torch.Tensor:
    """A gated MLP's activation by its ArchitectureSpec name: "silu", or "gelu_tanh" (Gemma's GeGLU)."""
    return F.silu(x) if activation == "silu" else F.gelu(x, approximate="tanh")
