"""Shared pieces for the engine tests: reference decoding and drafters that misbehave on purpose."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specwise.config import SamplingParams
from specwise.drafters.base import DraftProposal
from specwise.verify.result import VerifyResult


def hf_greedy(model, prompt_ids: Sequence[int], max_new_tokens: int, repetition_penalty: float = 1.0,
              eos: bool = True) -> list[int]:
    """The target's own greedy decoding, through Hugging Face generate()."""
    out = model.generate(torch.tensor([list(prompt_ids)]), max_new_tokens=max_new_tokens, do_sample=False,
                         repetition_penalty=repetition_penalty, eos_token_id=0 if eos else None,
                         pad_token_id=0, attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long))
    return out[0, len(prompt_ids):].tolist()


class CorruptingDrafter:
    """Wraps a drafter and replaces the token at block position j, so acceptance stops there."""

    name = "corrupt"

    def __init__(self, inner, position: int, vocab_size: int) -> None:
        self.inner, self.position, self.vocab_size = inner, position, vocab_size

    def start(self, prompt_ids, sampling: SamplingParams, generator) -> None:
        self.inner.start(prompt_ids, sampling, generator)

    def propose(self, context, k: int) -> DraftProposal:
        proposal = self.inner.propose(context, k)
        tokens = proposal.tokens.clone()
        if len(tokens) > self.position:
            tokens[self.position] = (tokens[self.position] + 1) % self.vocab_size
        return DraftProposal(tokens, None)

    def observe(self, result: VerifyResult) -> None:
        self.inner.observe(result)


class RandomDrafter:
    """Proposes uniformly random tokens (point masses): almost never accepted."""

    name = "random"

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)

    def start(self, prompt_ids, sampling, generator) -> None:
        pass

    def propose(self, context, k: int) -> DraftProposal:
        return DraftProposal(torch.randint(0, self.vocab_size, (k,), generator=self.generator), None)

    def observe(self, result) -> None:
        pass
