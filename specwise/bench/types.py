"""What every benchmark method is and returns: the interface the harness runs and the record it keeps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from specwise.api import SpecDecoder
from specwise.config import SamplingParams
from specwise.stats import SpecStats
from specwise.store.loading import LoadedModel


@dataclass
class MethodOutput:
    token_ids: list[int]  # new tokens, a final EOS included
    seconds: float  # wall time of the generate call
    steps: int | None  # target forward passes (specwise: decoding steps, prefill not counted)
    stats: SpecStats | None = None  # specwise methods only


class Method(Protocol):
    label: str
    family: str  # "hf", "specwise" or "llamacpp"
    weights: str  # the model it runs: "dense" or "gguf"; greedy outputs are checked within one model
    description: str

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> MethodOutput: ...


@dataclass
class BenchModels:
    """What the methods run on: one decoder (target + its drafters) and the drafter model."""

    decoder: SpecDecoder
    drafter: LoadedModel | None  # the draft model, for hf-assisted and specwise's draft-model drafter
