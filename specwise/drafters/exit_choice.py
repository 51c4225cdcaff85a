"""Choosing the exit layer E of layerskip drafting by measurement, on the request's own prompt.

The rule (SWIFT-style, Xia et al. 2024, kept short): for the candidates E = L/4, L/2 and 3L/4
(rounded, within [1, L - 1]), re-score the last `EXIT_WINDOW` prompt tokens the target's cache holds
in one pass that also records the states after layers E - 1; the agreement α_E is the share of those
rows whose exit-E argmax (final norm and output layer of that state) equals the full model's. Then
pick the E with the highest expected speedup by the cost model (docs/DESIGN.md, "Cost model"), in
units of a one-token pass T(1) = L + h (h: the output layer's weight bytes in layers' bytes):

    speedup(E) = E[τ](α_E, k) · T(1) / (T(1) · (1 + ROW_COST · k) + k · D_E),  D_E = E + h,

with E[τ](α, k) = (1 − α^(k+1)) / (1 − α) and T(k + 1) ≈ T(1) · (1 + ROW_COST · k) (the compiled
pass: T(5) / T(1) ≈ 1.8). Drafting reads E layers and the output layer per token; the scoring pass
reuses those layers for all but the last row, so it costs about what a pass of k + 1 rows costs
anyway. The pass re-writes the window's cache entries (bitwise the same on the compiled GGUF pass);
its time is the prompt's (the drafter's `start` runs in the engine's prefill phase). Where no E pays,
the best is still taken: adaptive k (SpecConfig.adaptive) then drafts 0 tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specwise.estimators import expected_acceptance_length

EXIT_WINDOW = 12  # prompt rows re-scored to measure agreement: enough to rank 3 candidates, cheap in one pass
EXIT_SHARES = (0.25, 0.5, 0.75)  # candidate exits as shares of the target's layers
ROW_COST = 0.2  # an extra row of a scoring pass, in one-token passes


@dataclass(frozen=True)
class ExitChoice:
    """The exit layer chosen and what it was chosen from (empty where nothing was measured)."""

    exit_layer: int
    agreement: dict[int, float]  # E -> share of window rows whose exit-E argmax was the model's
    speedup: dict[int, float]  # E -> the cost model's expected speedup


def candidate_exits(layers: int) -> list[int]:
    """E = L/4, L/2, 3L/4, rounded into [1, L - 1], without repeats."""
    return sorted({min(max(round(share * layers), 1), layers - 1) for share in EXIT_SHARES})


def expected_speedup(alpha: float, k: int, exit_layer: int, layers: int, head: float) -> float:
    """The module docstring's speedup of drafting k tokens at exit E (head: h, in layers)."""
    plain = layers + head
    step = plain * (1 + ROW_COST * k) + k * (exit_layer + head)
    return expected_acceptance_length(alpha, k) * plain / step


def output_layer_share(runner) -> float:
    """h: the output layer's weight bytes over a decoder layer's (their mean)."""
    layers = [_layer_bytes(layer) for layer in runner.layers]
    return _bytes(runner.lm_head) / max(sum(layers) / len(layers), 1)


@torch.inference_mode()
def exit_agreement(runner, prompt: Sequence[int], exits: Sequence[int], window: int = EXIT_WINDOW) -> dict[int, float]:
    """α_E for each exit, over the last `window` prompt tokens in the runner's cache (which must hold
    prompt[:-1]); {} when it holds none."""
    cached = runner.length
    if cached != len(prompt) - 1:
        raise ValueError(f"the target's cache holds {cached} tokens; measuring exits needs the prompt's "
                         f"{len(prompt) - 1} (all but the last)")
    rows = min(window, cached)
    if rows == 0:
        return {}
    runner.rollback(rows)
    full = runner.forward(list(prompt[cached - rows:cached]), hidden_layers=[e - 1 for e in exits])  # [rows, V]
    states = runner.last_hidden  # [rows, len(exits), H]
    best = full.argmax(-1)
    return {e: float((runner.logits(states[:, i]).argmax(-1) == best).float().mean()) for i, e in enumerate(exits)}


def choose_exit(runner, prompt: Sequence[int], k: int, window: int = EXIT_WINDOW) -> ExitChoice:
    """The exit with the highest expected speedup at draft length k (module docstring); L/2 where the
    prompt leaves nothing to measure."""
    layers = runner.num_layers
    exits = candidate_exits(layers)
    agreement = exit_agreement(runner, prompt, exits, window)
    if not agreement:
        return ExitChoice(max(layers // 2, 1), {}, {})
    head = output_layer_share(runner)
    speedup = {e: expected_speedup(a, k, e, layers, head) for e, a in agreement.items()}
    return ExitChoice(max(speedup, key=speedup.get), agreement, speedup)


def _bytes(module: torch.nn.Module) -> int:
    """Weight bytes a pass reads of a module: its GGUF blocks as stored, else its tensors."""
    stored = getattr(module, "gguf_weight", None)
    own = sum(t.nbytes for t in (*module.parameters(), *module.buffers()))
    return own + (stored.data.nbytes if stored is not None else 0)


def _layer_bytes(layer) -> int:
    """A fused decoder layer's projection bytes (norms are negligible)."""
    mlp = (*layer.gate_up, layer.down_proj) if layer.gate_up is not None else (layer.mlp,)
    return sum(_bytes(m) for m in (*layer.qkv, layer.o_proj, *mlp))
