"""A causal LM with a KV cache that can grow by a block and shrink back.

The engine needs three things from a model: append tokens and get their logits
in one forward pass, drop the last n cache entries (rollback after a rejected
draft), and know how long the cache is. `HFRunner` provides them over any
Hugging Face `AutoModelForCausalLM` whose cache can be cropped; the check runs
when the runner is made, so an unsuitable cache fails before decoding starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch
from transformers import DynamicCache, PreTrainedModel


class RollbackError(RuntimeError):
    """The model's KV cache cannot drop its last entries, so drafts cannot be undone."""


@runtime_checkable
class ModelRunner(Protocol):
    """What the engine and the draft-model drafter use of a model."""

    vocab_size: int  # width of the logits (the embedding matrix, >= the tokenizer's vocabulary)
    max_context: int

    @property
    def length(self) -> int: ...

    def reset(self) -> None: ...

    def forward(self, ids: Sequence[int], *, logits: bool = True) -> torch.Tensor | None: ...

    def rollback(self, n: int) -> None: ...


class HFRunner:
    """Runs a Hugging Face causal LM one block at a time over a croppable DynamicCache."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model.eval()
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.vocab_size: int = model.get_output_embeddings().out_features
        self.max_context: int = int(getattr(config, "max_position_embeddings", 1 << 30))
        self.device = next(model.parameters()).device
        self._cache: DynamicCache | None = None
        self._length = 0
        self._check_rollback()

    def _check_rollback(self) -> None:
        probe = self._new_cache()
        if not hasattr(probe, "crop"):
            raise RollbackError(
                f"{type(probe).__name__} of {type(self.model).__name__} has no crop(); "
                "speculative decoding needs a KV cache that can roll back rejected draft tokens"
            )
        with torch.inference_mode():
            self.model(input_ids=torch.zeros(1, 2, dtype=torch.long, device=self.device),
                       cache=probe, use_cache=True, logits_to_keep=1)
        if not probe.is_croppable:
            kinds = sorted({type(layer).__name__ for layer in probe.layers})
            raise RollbackError(
                f"the KV cache of {type(self.model).__name__} ({type(probe).__name__} with "
                f"{', '.join(kinds)} layers) cannot be cropped exactly (sliding-window or "
                "recurrent layers), so rejected draft tokens cannot be rolled back"
            )

    @property
    def length(self) -> int:
        """Number of tokens whose keys and values are in the cache."""
        return self._length

    def _new_cache(self) -> DynamicCache:
        cache = DynamicCache(config=self.model.config)
        for layer in cache.layers:
            if getattr(layer, "is_sliding", False):
                layer.activate_past_recording()  # keep evicted states until rollback has decided
        return cache

    def reset(self) -> None:
        self._cache = self._new_cache()
        self._length = 0

    @torch.inference_mode()
    def forward(self, ids: Sequence[int], *, logits: bool = True) -> torch.Tensor | None:
        """Append `ids` to the cache in one pass; return their logits [len(ids), vocab] (float32).

        With logits=False (prefill of a prompt whose last token is fed later) the
        output layer runs on one position only, which on a 150k vocabulary is most
        of a long prefill's cost, and None is returned.
        """
        if self._cache is None:
            self.reset()
        if not ids:
            return torch.empty(0, self.vocab_size) if logits else None
        if self._length + len(ids) > self.max_context:
            raise ValueError(
                f"context of {self._length + len(ids)} tokens exceeds the model's window of "
                f"{self.max_context}; shorten the prompt or lower max_new_tokens"
            )
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        positions = torch.arange(self._length, self._length + len(ids), device=self.device)
        out = self.model(input_ids=input_ids, cache=self._cache, use_cache=True,
                         position_ids=positions.unsqueeze(0), logits_to_keep=0 if logits else 1)
        self._length += len(ids)
        if not logits:
            return None
        return out.logits[0].float()  # [len(ids), vocab]

    def rollback(self, n: int) -> None:
        """Forget the last n cached tokens."""
        if n < 0 or n > self._length:
            raise ValueError(f"cannot roll back {n} tokens from a cache of {self._length}")
        if self._cache is not None:
            self._cache.crop(-n)  # also trims sliding-window layers back to their window when n == 0
            self._length -= n
