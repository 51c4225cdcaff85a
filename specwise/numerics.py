"""Telling a numerical near-tie from a real bug when two greedy outputs differ.

A forward pass over a block does not give bit-identical logits to one-token
passes (kernels block and accumulate differently); in bfloat16 that can flip an
argmax where the top two logits nearly tie (DESIGN.md, "Numerics"). At the first
position where two token sequences differ, we recompute the target's logits on
the common prefix in one plain pass and look at the gap between the two tokens
chosen there. The divergence is "numerical" only when that gap is within
`TIE_ULPS` units of the dtype's relative precision at the logits' magnitude
(bfloat16: 2 × 2^-7 × |logit|, about 0.3 for a logit of 20); otherwise it is a
failure to investigate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

TIE_ULPS = 2.0


@dataclass(frozen=True)
class Divergence:
    position: int  # index into the new tokens
    ours: int
    reference: int
    gap: float  # |logit[ours] - logit[reference]| in a plain pass on the common prefix
    tolerance: float
    numerical: bool

    def describe(self) -> str:
        verdict = "numerical near-tie" if self.numerical else "FAILURE"
        return (f"first divergence at new token {self.position}: {self.ours} vs reference {self.reference}, "
                f"logit gap {self.gap:.4g} (tolerance {self.tolerance:.4g}): {verdict}")


def first_divergence(ours: Sequence[int], reference: Sequence[int]) -> int | None:
    """Index of the first differing token, or None if one sequence is a prefix of the other."""
    for i, (a, b) in enumerate(zip(ours, reference)):
        if a != b:
            return i
    return None


@torch.inference_mode()
def classify_divergence(model, prompt_ids: Sequence[int], ours: Sequence[int],
                        reference: Sequence[int]) -> Divergence | None:
    """None when the sequences agree (up to the shorter length), else the first divergence, classified."""
    position = first_divergence(ours, reference)
    if position is None:
        return None
    prefix = list(prompt_ids) + list(reference[:position])
    logits = model(input_ids=torch.tensor([prefix]), logits_to_keep=1).logits[0, -1].float()
    a, b = int(ours[position]), int(reference[position])
    gap = abs(float(logits[a] - logits[b]))
    eps = torch.finfo(next(model.parameters()).dtype).eps
    tolerance = TIE_ULPS * eps * max(abs(float(logits.max())), 1.0)
    return Divergence(position, a, b, gap, tolerance, gap <= tolerance)
