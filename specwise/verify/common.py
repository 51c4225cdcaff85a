"""What every verification rule shares: input checks and error messages, float64 copies of
the probabilities, the clipped likelihood ratio, the step's uniforms and the sampling of the
committed token.

Every helper runs on the probabilities' own device and reads nothing back to the host, so a
step keeps its one host synchronisation (see `read_back`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class InputNames:
    """How error messages name a verifier's inputs: a chain's or a tree's."""

    tokens: str  # the argument holding the draft tokens
    size: str  # its length's letter
    tokens_note: str  # said after the expected token shape
    rows_note: str  # what target_probs' rows are for
    draft_note: str  # what draft_probs' rows are


CHAIN = InputNames("draft_tokens", "k", "", "draft tokens (the last row is for the bonus token)",
                   "same V as target_probs")
TREE = InputNames("tokens", "n", " (one token per tree node)",
                  "tree nodes (row 0 after the context, row i + 1 after node i)",
                  "row i: the drafter's distribution at node i's parent, same V as target_probs")


def is_integer_tensor(x: object) -> bool:
    return (
        isinstance(x, torch.Tensor)
        and not x.is_floating_point()
        and not x.is_complex()
        and x.dtype != torch.bool
    )


def describe(x: object) -> str:
    """A value as an error message shows what it got."""
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__


def check_tokens(tokens: torch.Tensor, names: InputNames = CHAIN) -> None:
    """Refuse anything but a 1-D integer tensor of draft tokens."""
    if not is_integer_tensor(tokens) or tokens.dim() != 1:
        raise ValueError(f"{names.tokens} must be a 1-D integer tensor [{names.size}]{names.tokens_note}; "
                         f"got {describe(tokens)}")


def check_probs(tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                names: InputNames = CHAIN) -> list[int]:
    """Validate the shapes of target_probs [m + 1, V] and draft_probs [m, V] (or None) for m
    checked draft tokens, and that the tokens lie in the vocabulary; return them as a list."""
    m = tokens.numel()
    size = names.size
    if not isinstance(target_probs, torch.Tensor) or target_probs.dim() != 2:
        raise ValueError(f"target_probs must be a 2-D tensor [{size} + 1, V]; got {describe(target_probs)}")
    if target_probs.shape[0] != m + 1:
        raise ValueError(
            f"target_probs must have {size} + 1 = {m + 1} rows for {size} = {m} {names.rows_note}; "
            f"got shape {tuple(target_probs.shape)}"
        )
    vocab = target_probs.shape[1]
    if vocab == 0:
        raise ValueError("target_probs has an empty vocabulary dimension (V = 0)")
    if draft_probs is not None and (
        not isinstance(draft_probs, torch.Tensor) or tuple(draft_probs.shape) != (m, vocab)
    ):
        got = tuple(draft_probs.shape) if isinstance(draft_probs, torch.Tensor) else type(draft_probs).__name__
        raise ValueError(
            f"draft_probs must have shape [{size}, V] = [{m}, {vocab}] ({names.draft_note}), "
            f"or be None for point masses; got {got}"
        )
    token_list = tokens.tolist()
    if not all(0 <= x < vocab for x in token_list):
        raise ValueError(f"{names.tokens} must lie in [0, V) = [0, {vocab}); got {token_list}")
    return token_list


def check_inputs(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
) -> list[int]:
    """Validate a chain step's shapes (cheaply) and return the draft tokens as a list."""
    check_tokens(draft_tokens)
    return check_probs(draft_tokens, draft_probs, target_probs)


@dataclass(frozen=True)
class Float64Rows:
    """A float64 copy of [m, V] probabilities, left unnormalized (normalizing would cost a pass over
    [m, V]: callers fold 1 / sums into the scalars and scales they use), with whether they were
    probabilities at all: a device flag, read back with the step's result."""

    rows: torch.Tensor  # [m, V]
    sums: torch.Tensor  # [m]
    valid: torch.Tensor  # [] bool: finite, non-negative, every row with positive mass


class NextTokenRows:
    """What chain and tree plans share: per outcome of the step (the number accepted, or the
    accepted path's last node), a row proportional to the committed token's distribution."""

    next_token_weights: torch.Tensor  # [outcomes, V] unnormalized, every row with positive mass

    @property
    def next_token_dists(self) -> torch.Tensor:  # [outcomes, V]
        return self.next_token_weights / self.next_token_weights.sum(dim=1, keepdim=True)


def float64_rows(probs: torch.Tensor, device: torch.device) -> Float64Rows:
    """probs copied to float64 on `device` (no host synchronisation)."""
    rows = probs.detach().to(device=device, dtype=torch.float64, non_blocking=True, copy=True)  # [m, V]
    sums = rows.sum(dim=1)  # [m]
    if not rows.numel():
        return Float64Rows(rows, sums, torch.ones((), dtype=torch.bool, device=device))
    return Float64Rows(rows, sums, (torch.isfinite(sums) & (sums > 0)).all() & (rows.amin() >= 0))


def clipped_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """min(1, num / den) elementwise, with den == 0 read as an infinite ratio unless num <= 0.

    A token drafted from d has d(x) > 0 with probability 1, so den == 0 only arises when a
    caller breaks the contract; this never divides 0 by 0 and never accepts a token to which
    the target gives probability zero.
    """
    return torch.where(num <= 0, torch.zeros_like(num), (num / den).clamp_max(1.0))


def send(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`, copied without the host waiting for the device's queued work."""
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def send_indices(device: torch.device, *lists: list[int]) -> list[torch.Tensor]:
    """Host integer lists as long tensors on `device`, in one transfer."""
    flat = torch.tensor([x for values in lists for x in values], dtype=torch.long)
    return list(torch.split(send(flat, device), [len(values) for values in lists]))


def step_uniforms(count: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """One uniform per draft position or node, then one for the committed token: [count + 1] float64.

    Drawn from the (CPU) generator in that order whatever the device, so a seed gives the same
    decisions anywhere, and sent with the work.
    """
    uniforms = torch.rand(count, generator=generator, dtype=torch.float64)
    last = torch.rand((), generator=generator, dtype=torch.float64)
    return send(torch.cat([uniforms, last.reshape(1)]), device)


def sample_row(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token whose CDF interval holds u: a sample from a [V] row of non-negative weights
    (maybe unnormalized) for u ~ U[0, 1), as a [] long device tensor. A token of zero weight is
    never returned (u * total rounding up to total falls to the last positive one)."""
    cdf = torch.cumsum(weights, dim=0)  # [V]
    index = torch.searchsorted(cdf, (u * cdf[-1]).reshape(1), right=True)[0]
    last_positive = weights.numel() - 1 - (weights > 0).flip(0).long().argmax()
    return torch.where(index >= weights.numel(), last_positive, index)


def read_back(*values: torch.Tensor) -> list[int]:
    """The step's one host synchronisation: [] integer or bool device tensors as ints."""
    return torch.stack([v.long() for v in values]).tolist()


NOT_PROBABILITIES = "must hold probabilities: finite, non-negative, every row with positive mass"


def check_probabilities(target_valid: int | bool, draft_valid: int | bool) -> None:
    """Raise for the first input that did not hold probabilities (flags read back from the device)."""
    if not target_valid:
        raise ValueError(f"target_probs {NOT_PROBABILITIES}")
    if not draft_valid:
        raise ValueError(f"draft_probs {NOT_PROBABILITIES}")
