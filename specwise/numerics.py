"""Greedy identity on real models: where two outputs diverge, and whether that can be rounding.

A forward pass over a block does not give bit-identical logits to one-token
passes; in bfloat16 that can flip an argmax where the top two logits nearly tie.

Rule (docs/DESIGN.md, "Numerics"). At the
first position j where a method's tokens differ from the reference's, run the
target once over the common prefix (prompt + the j tokens both produced), in
the run's dtype, and read its logits l at that position. With top = max(l) and
eps = the dtype's machine epsilon (2^-7 for bfloat16, 2^-10 for float16, 2^-23
for float32), the tolerance is

    tol = ulps · eps · max(|top|, 1)        (ulps = DEFAULT_TIE_ULPS = 2)

eps · |top| is at least the spacing of representable numbers around the top
logit, so tol is two steps of the dtype's grid (bfloat16, logit 20: about 0.31).
The divergence is "numerical" only when both diverging tokens have logits within
tol of the top one (the target itself finds them tied to within its
resolution). Anything else is a "FAILURE": a token the target ranks clearly
lower, or a length difference with no diverging token (one method stopped where
the other did not). The margin is recorded in units of
eps · max(|top|, 1) too, so a reader can apply another rule.

Two *implementations* of one model (specwise's native pass and transformers' model over
the same modules) add in other orders, so their logits differ by rounding everywhere, not
only at ties. Through int8 activations that difference can grow far past the dtype's grid:
one input rounding flips an activation code, and the change travels through every layer.
`rounding_sensitivity` measures how far the model's own logits move when its input
embeddings move by one unit in the last place; two implementations whose logits are no
further apart than that are the same model up to rounding, and a divergence between them
is numerical when both diverging tokens lie within their difference at that position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

NUMERICAL = "numerical"
FAILURE = "FAILURE"
DEFAULT_TIE_ULPS = 2.0


@dataclass(frozen=True)
class Mismatch:
    position: int  # first diverging new-token index (0-based)
    reference_token: int | None  # None: the reference stopped here
    method_token: int | None  # None: the method stopped here
    top_token: int | None  # the target's argmax on the common prefix
    top2_margin: float | None  # its top logit minus its second
    reference_gap: float | None  # top logit minus the reference token's logit
    method_gap: float | None
    tolerance: float | None
    margin_ulps: float | None  # max of the two gaps in units of eps · max(|top|, 1)
    classification: str  # NUMERICAL or FAILURE

    @property
    def numerical(self) -> bool:
        return self.classification == NUMERICAL

    def describe(self) -> str:
        return (f"first divergence at new token {self.position}: {self.method_token} vs reference "
                f"{self.reference_token}, gaps to the top logit {self.method_gap} / {self.reference_gap} "
                f"(tolerance {self.tolerance}): {self.classification}")

    def to_dict(self) -> dict:
        return {key: (round(value, 6) if isinstance(value, float) else value)
                for key, value in asdict(self).items()}


def first_divergence(reference: Sequence[int], tokens: Sequence[int]) -> int | None:
    """Index of the first differing token (or the shorter length); None when identical."""
    for i, (a, b) in enumerate(zip(reference, tokens)):
        if a != b:
            return i
    return None if len(reference) == len(tokens) else min(len(reference), len(tokens))


@torch.inference_mode()
def target_logits(model, ids: Sequence[int]) -> torch.Tensor:
    """The target's logits for the token after `ids`, in the model's own dtype, as float32 [V]."""
    device = next(model.parameters()).device
    out = model(input_ids=torch.tensor([list(ids)], dtype=torch.long, device=device), logits_to_keep=1)
    return out.logits[0, -1].float()


def classify(logits: torch.Tensor, reference_token: int | None, method_token: int | None,
             dtype: torch.dtype, ulps: float = DEFAULT_TIE_ULPS) -> dict:
    """Gaps, tolerance and verdict for a divergence at a position with these target logits ([V])."""
    top2 = torch.topk(logits, 2)
    top = float(top2.values[0])
    unit = torch.finfo(dtype).eps * max(abs(top), 1.0)
    gaps = [None if t is None else top - float(logits[t]) for t in (reference_token, method_token)]
    numerical = all(g is not None and g <= ulps * unit for g in gaps)
    known = [g for g in gaps if g is not None]
    return dict(top_token=int(top2.indices[0]), top2_margin=top - float(top2.values[1]),
                reference_gap=gaps[0], method_gap=gaps[1], tolerance=ulps * unit,
                margin_ulps=max(known) / unit if known else None,
                classification=NUMERICAL if numerical else FAILURE)


@torch.inference_mode()
def sequence_logits(model, ids: Sequence[int]) -> torch.Tensor:
    """The model's logits at every position of `ids`, as float32 [len(ids), V]."""
    device = next(model.parameters()).device
    return model(input_ids=torch.tensor([list(ids)], dtype=torch.long, device=device)).logits[0].float()


def rms_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """Root mean square of a - b over every element."""
    return float((a.float() - b.float()).pow(2).mean().sqrt())


@torch.inference_mode()
def rounding_sensitivity(model, ids: Sequence[int], draws: int = 3, seed: int = 0) -> float:
    """How far one rounding at the input moves `model`'s logits over `ids`: the largest (over `draws`
    draws) root-mean-square change of `sequence_logits` when every input embedding value is multiplied
    by 1 ± eps (random signs). Two implementations of the same model whose logits differ by about this
    much differ by rounding only."""
    reference = sequence_logits(model, ids)
    generator = torch.Generator().manual_seed(seed)

    def nudge(module, args, output):
        signs = torch.randint(0, 2, output.shape, generator=generator).to(output) * 2 - 1
        return output * (1 + signs * torch.finfo(output.dtype).eps)

    hook = model.get_input_embeddings().register_forward_hook(nudge)
    try:
        return max(rms_difference(sequence_logits(model, ids), reference) for _ in range(draws))
    finally:
        hook.remove()


def check_identity(model, prompt_ids: Sequence[int], reference: Sequence[int], tokens: Sequence[int],
                   ulps: float = DEFAULT_TIE_ULPS,
                   logits_cache: dict[int, torch.Tensor] | None = None) -> Mismatch | None:
    """None when the tokens equal the reference's; else the classified first divergence.

    logits_cache: the target's logits by divergence position, for one prompt and reference:
    methods that leave the reference at the same place share one plain pass (on a long
    prompt that pass costs minutes on a small CPU)."""
    position = first_divergence(reference, tokens)
    if position is None:
        return None
    ref_token = reference[position] if position < len(reference) else None
    method_token = tokens[position] if position < len(tokens) else None
    dtype = next(model.parameters()).dtype
    logits = logits_cache.get(position) if logits_cache is not None else None
    if logits is None:
        logits = target_logits(model, list(prompt_ids) + list(reference[:position]))
        if logits_cache is not None:
            logits_cache[position] = logits
    verdict = classify(logits, ref_token, method_token, dtype, ulps)
    return Mismatch(position=position, reference_token=ref_token, method_token=method_token, **verdict)
