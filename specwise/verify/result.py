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


@dataclass(frozen=True)
class TreeVerifyResult(VerifyResult):
    """What one tree verification step commits; a VerifyResult, so metrics and drafters'
    observe() take it unchanged.

    tokens: the tokens of the accepted path, root to end, then the recovered token (all
        children of the path's last node rejected) or the bonus token (it ended at a leaf).
    num_accepted: the accepted path's length (its depth in the tree).
    num_proposed: n, the number of tree nodes offered.
    accepted_nodes: the node indices of the accepted path, root to end:
        tokens[:num_accepted] == [tree_tokens[i] for i in accepted_nodes].
    all_accepted (inherited) holds only when every node was accepted, which only a chain allows.
    """

    accepted_nodes: list[int]
