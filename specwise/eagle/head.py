"""The draft head: one decoder layer over the target's fused features (EAGLE-3, arXiv 2503.01840).

At head position i the input is the target's hidden states after token c_i from a
low, a middle and a high layer, concatenated and projected to the hidden size
(`fuse`), together with the embedding of token c_{i+1}; the output predicts
c_{i+2}. Further draft tokens feed the head's own output state (before its final
norm) in place of the fused target features. Logits cover a draft vocabulary,
`draft_to_target[j]` being the target id of draft id j.

Two ways to run it: `forward_cached` (drafting, over a `HeadCache`, any mask, so
chains and trees) and `forward_unrolled` (training: every position of a sequence
and `steps` draft steps at once, each step attending exactly where drafting would).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specwise.runners.layers import RMSNorm, apply_rope


@dataclass(frozen=True)
class HeadConfig:
    """The head's sizes; `for_target` sizes it for one target."""

    hidden_size: int
    num_heads: int
    head_dim: int
    intermediate_size: int
    draft_vocab_size: int
    target_vocab_size: int
    feature_layers: tuple[int, ...]  # the target's decoder layers whose outputs are fused
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
        if not 0 < self.draft_vocab_size <= self.target_vocab_size:
            raise ValueError(f"draft_vocab_size must be in [1, {self.target_vocab_size}]; got {self.draft_vocab_size}")

    def to_dict(self) -> dict:
        return {**asdict(self), "feature_layers": list(self.feature_layers)}


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """A low, a middle and a high decoder layer (never the last, whose output the final norm rescales)."""
    top = max(num_layers - 2, 0)
    return tuple(sorted((min(1, top), min(num_layers // 2, top), max(num_layers - 3, 0))))


def config_for_target(model: nn.Module, *, draft_vocab_size: int | None = None,
                      intermediate_size: int | None = None,
                      feature_layers: tuple[int, ...] | None = None) -> HeadConfig:
    """A head for a Hugging Face Qwen2/Llama-style model; the MLP defaults to the target's width."""
    config = model.config
    vocab = model.get_output_embeddings().out_features
    heads = config.num_attention_heads
    return HeadConfig(
        hidden_size=config.hidden_size, num_heads=heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        intermediate_size=intermediate_size or config.intermediate_size,
        draft_vocab_size=min(draft_vocab_size or vocab, vocab), target_vocab_size=vocab,
        feature_layers=feature_layers or default_feature_layers(config.num_hidden_layers),
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=float(getattr(config, "rope_theta", None)
                         or (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)))


class HeadCache:
    """The head's own KV cache: [heads, capacity, head_dim] keys and values, rollback by pointer."""

    def __init__(self, config: HeadConfig, dtype: torch.dtype, device: torch.device | str = "cpu",
                 capacity: int = 256) -> None:
        self.shape = (config.num_heads, capacity, config.head_dim)
        self.keys = torch.empty(self.shape, dtype=dtype, device=device)
        self.values = torch.empty(self.shape, dtype=dtype, device=device)
        self.length = 0

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """keys, values: [heads, n, head_dim]."""
        end = self.length + keys.shape[1]
        if end > self.keys.shape[1]:  # doubling keeps regrowth rare
            grown = (self.shape[0], max(end, 2 * self.keys.shape[1]), self.shape[2])
            for name in ("keys", "values"):
                old = getattr(self, name)
                new = old.new_empty(grown)
                new[:, :self.length] = old[:, :self.length]
                setattr(self, name, new)
        self.keys[:, self.length:end] = keys
        self.values[:, self.length:end] = values
        self.length = end

    def rollback_to(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll the head cache back to {length} from {self.length}")
        self.length = length


class EagleHead(nn.Module):
    """Feature fusion, input projection, one decoder layer, final norm, draft-vocabulary output."""

    def __init__(self, config: HeadConfig, draft_to_target: torch.Tensor | None = None) -> None:
        super().__init__()
        self.config = config
        hidden, inner = config.hidden_size, config.num_heads * config.head_dim
        eps = config.rms_norm_eps
        self.fc = nn.Linear(len(config.feature_layers) * hidden, hidden, bias=False)  # [3H -> H]
        self.embed_norm = RMSNorm(hidden, eps)
        self.feature_norm = RMSNorm(hidden, eps)
        self.in_proj = nn.Linear(2 * hidden, hidden, bias=False)  # concat(embedding, feature) -> H
        self.attn_norm = RMSNorm(hidden, eps)
        self.qkv = nn.Linear(hidden, 3 * inner, bias=False)
        self.o_proj = nn.Linear(inner, hidden, bias=False)
        self.mlp_norm = RMSNorm(hidden, eps)
        self.gate_up = nn.Linear(hidden, 2 * config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, hidden, bias=False)
        self.norm = RMSNorm(hidden, eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        if draft_to_target is None:
            draft_to_target = torch.arange(config.draft_vocab_size)
        ids = draft_to_target.tolist()
        if len(ids) != config.draft_vocab_size or len(set(ids)) != len(ids):
            raise ValueError(f"draft_to_target must be {config.draft_vocab_size} distinct ids; got {len(ids)}")
        if not 0 <= min(ids) <= max(ids) < config.target_vocab_size:
            raise ValueError(f"draft_to_target ids must be in [0, {config.target_vocab_size})")
        self.register_buffer("draft_to_target", draft_to_target.long().clone())

    def init_from_target(self, target_lm_head: torch.Tensor) -> None:
        """Start the output layer at the target's rows for the draft vocabulary ([V, H] weight)."""
        with torch.no_grad():
            self.lm_head.weight.copy_(target_lm_head[self.draft_to_target].to(self.lm_head.weight.dtype))

    def target_to_draft(self) -> torch.Tensor:
        """[target vocab] long: the draft id of each target id, -1 outside the draft vocabulary."""
        index = torch.full((self.config.target_vocab_size,), -1, dtype=torch.long, device=self.draft_to_target.device)
        index[self.draft_to_target] = torch.arange(self.config.draft_vocab_size, device=index.device)
        return index

    # -- pieces ---------------------------------------------------------------------------------

    def fuse(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[..., layers, H] target hidden states -> [..., H] fused feature."""
        return self.fc(target_hidden.flatten(-2).to(self.fc.weight.dtype))

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # Computed in float32 every time: a float buffer would be cast along with the weights.
        c = self.config
        inv_freq = 1.0 / c.rope_theta ** (torch.arange(0, c.head_dim, 2, device=positions.device).float() / c.head_dim)
        freqs = positions[..., None].float() * inv_freq  # [..., T, head_dim / 2]
        angles = torch.cat([freqs, freqs], dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def _qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [B, T, H] -> q, k, v [B, heads, T, head_dim], rotated at `positions` [B, T] or [T]."""
        c = self.config
        batch, length = x.shape[:2]
        q, k, v = self.qkv(self.attn_norm(x)).view(batch, length, 3, c.num_heads, c.head_dim).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        cos, sin = self._rope(positions, q.dtype)
        if cos.dim() == 3:
            cos, sin = cos[:, None], sin[:, None]
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residuals and MLP around the attention output attn [B, heads, T, head_dim]; returns [B, T, H]."""
        batch, _, length, _ = attn.shape
        h = x + self.o_proj(attn.transpose(1, 2).reshape(batch, length, -1))
        gate, up = self.gate_up(self.mlp_norm(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)

    def _input(self, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        dtype = self.in_proj.weight.dtype
        return self.in_proj(torch.cat([self.embed_norm(embeds.to(dtype)), self.feature_norm(features.to(dtype))], -1))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Output states [..., H] -> draft-vocabulary logits [..., draft_vocab]."""
        return self.lm_head(self.norm(hidden))

    # -- drafting -------------------------------------------------------------------------------

    def forward_cached(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                       cache: HeadCache, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Append n positions to `cache`; returns (logits [n, draft_vocab], output states [n, H]).

        embeds, features: [n, H]; positions: [n] long; mask: [n, cache.length + n] bool (True:
        may attend), None for the cached context then causal within the block.
        """
        n = embeds.shape[0]
        x = self._input(embeds, features)[None]  # [1, n, H]
        q, k, v = self._qkv(x, positions)
        start = cache.length
        cache.append(k[0], v[0])
        if mask is None and n > 1:
            mask = torch.ones(n, start + n, dtype=torch.bool, device=x.device).tril(start)
        keys, values = cache.keys[None, :, :cache.length], cache.values[None, :, :cache.length]
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.config.head_dim ** -0.5)
        hidden = self._finish(x, attn)[0]
        return self.logits(hidden), hidden

    # -- training -------------------------------------------------------------------------------

    def forward_unrolled(self, embeds: torch.Tensor, target_hidden: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test: `steps` draft steps over whole sequences at once.

        embeds: [B, T, H], row p the embedding of c_{p+1}; target_hidden: [B, T, layers, H], row p the
        target's states after c_p. Returns per step j the logits [B, T, draft_vocab]; row p of step j
        is the head's (j + 1)-th draft token after the context c_0..c_{p-j+1} (valid for p >= j),
        computed from its own states of steps 0..j-1 exactly as drafting computes it: it attends to
        step-0 positions <= p - j and to step s's position p - j + s for s = 1..j.
        """
        batch, length, _ = embeds.shape
        positions = torch.arange(length, device=embeds.device)
        features = self.fuse(target_hidden)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        out: list[torch.Tensor] = []
        scale = self.config.head_dim ** -0.5
        for step in range(steps):
            x = self._input(embeds, features)
            q, k, v = self._qkv(x, positions)  # [B, heads, T, d]
            keys.append(k)
            values.append(v)
            scores = [(q @ keys[0].transpose(-1, -2)) * scale]  # [B, heads, T, T]
            visible = torch.ones(length, length, dtype=torch.bool, device=x.device).tril(-step)
            scores[0] = scores[0].masked_fill(~visible, float("-inf"))
            shifted_values = []
            for s in range(1, step + 1):
                # Step s's key at position p - (step - s): shift it down by step - s rows.
                ks, vs = _shift(keys[s], step - s), _shift(values[s], step - s)
                diagonal = (q * ks).sum(-1, keepdim=True) * scale  # [B, heads, T, 1]
                if step - s:
                    diagonal[:, :, :step - s] = float("-inf")
                scores.append(diagonal)
                shifted_values.append(vs)
            weights = torch.cat(scores, dim=-1).float().softmax(dim=-1).to(q.dtype)
            attn = weights[..., :length] @ values[0]
            for s, vs in enumerate(shifted_values):
                attn = attn + weights[..., length + s, None] * vs
            hidden = self._finish(x, attn)
            out.append(self.logits(hidden))
            features = _shift(hidden, 1, dim=1)  # step j + 1 at p reads step j's state at p - 1
        return out


def _shift(x: torch.Tensor, n: int, dim: int = 2) -> torch.Tensor:
    """Move rows n places later along dim (zeros first): row p of the result is row p - n."""
    if n == 0:
        return x
    if n >= x.shape[dim]:
        return torch.zeros_like(x)
    pad = torch.zeros_like(x.narrow(dim, 0, n))
    return torch.cat([pad, x.narrow(dim, 0, x.shape[dim] - n)], dim=dim)
