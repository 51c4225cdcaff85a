"""The result every verification rule returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VerifyResult:
    """What one verification step commits.

    tokens: the accepted draft prefix followed by exactly one token chosen by the
        verifier: the recovered token (sampled after the first rejection) or the
        bonus token (sampled from the target after the last draft token when all
        were accepted). len(tokens) == num_accepted + 1 == the step's acceptance length τ.
    num_accepted: how many draft tokens were kept.
    num_proposed: k, the number of draft tokens offered.
    """

    tokens: list[int]
    num_accepted: int
    num_proposed: int

    @property
    def all_accepted(self) -> bool:
        return self.num_accepted == self.num_proposed

    @property
    def acceptance_length(self) -> int:
        return self.num_accepted + 1
