"""A causal LM with a KV cache that can grow by a block and shrink back.

`HFRunner` is the `ModelRunner` (specwise.runners.protocols) over any Hugging Face
`AutoModelForCausalLM` whose cache can be cropped, and also a `TreeRunner` and a
`FeatureRunner`. Rollback is checked when the runner is made, so an unsuitable
cache fails before decoding starts, with an error that names the cache type.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from specwise.runners.checks import check_hidden_layers, check_tree, check_window
from specwise.runners.protocols import RollbackError
from specwise.runners.tree_layout import tree_layout

if TYPE_CHECKING:
    from transformers import PreTrainedModel


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
        self.last_hidden: torch.Tensor | None = None  # [n, len(hidden_layers), hidden] of the last pass asking for it
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

    @contextmanager
    def _capture(self, layers: Sequence[int] | None, n: int) -> Iterator[None]:
        """Record the outputs of decoder `layers` (0-based, before any final norm) into last_hidden.

        Forward hooks rather than output_hidden_states: those give the last layer's output
        after the final norm, and the lean runner's features must mean the same thing.
        """
        if layers is None:
            yield
            return
        decoder = getattr(getattr(self.model, "model", None), "layers", None)
        if decoder is None:
            raise ValueError(f"{type(self.model).__name__} has no model.layers to take hidden states from")
        check_hidden_layers(layers, len(decoder))
        captured: dict[int, torch.Tensor] = {}

        def hook(index: int):
            def record(module, inputs, output) -> None:
                captured[index] = (output[0] if isinstance(output, tuple) else output)[0]
            return record

        handles = [decoder[i].register_forward_hook(hook(i)) for i in sorted(set(layers))]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
        hidden = self.model.config.hidden_size
        self.last_hidden = (torch.stack([captured[i] for i in layers], dim=1) if n else  # [n, layers, hidden]
                            torch.empty(0, len(layers), hidden, dtype=self.model.get_input_embeddings().weight.dtype,
                                        device=self.device))

    @torch.inference_mode()
    def forward(self, ids: Sequence[int], *, logits: bool = True,
                hidden_layers: Sequence[int] | None = None) -> torch.Tensor | None:
        """Append `ids` to the cache in one pass; return their logits [len(ids), vocab] (float32).

        With logits=False (prefill of a prompt whose last token is fed later) the
        output layer runs on one position only, which on a 150k vocabulary is most
        of a long prompt's reading cost, and None is returned. hidden_layers: also set
        `last_hidden` to those decoder layers' outputs, [len(ids), len(hidden_layers), hidden].
        """
        if self._cache is None:
            self.reset()
        if not ids:
            with self._capture(hidden_layers, 0):
                pass
            return torch.empty(0, self.vocab_size, device=self.device) if logits else None
        check_window(self._length, len(ids), self.max_context)
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        positions = torch.arange(self._length, self._length + len(ids), device=self.device)
        with self._capture(hidden_layers, len(ids)):
            out = self.model(input_ids=input_ids, cache=self._cache, use_cache=True,
                             position_ids=positions.unsqueeze(0), logits_to_keep=0 if logits else 1)
        self._length += len(ids)
        if not logits:
            return None
        return out.logits[0].float()  # [len(ids), vocab]

    @torch.inference_mode()
    def forward_tree(self, ids: Sequence[int], parents: Sequence[int], *,
                     hidden_layers: Sequence[int] | None = None) -> torch.Tensor:
        """Score tree nodes in one pass: node i sees the cache, its ancestors and itself, at
        position length + its depth. parents[i] < i, -1 for a child of the last cached token.

        Returns logits [len(ids), vocab] (float32); the nodes stay cached until `keep` or `rollback`.
        hidden_layers: as in `forward`, one row per node.
        """
        if self._cache is None:
            self.reset()
        check_tree(ids, parents, self._length, self.max_context)
        n = len(ids)
        if n == 0:
            return torch.empty(0, self.vocab_size, device=self.device)
        self._refuse_sliding()  # one custom mask would also override their windows
        visible, depth = tree_layout(parents)
        dtype = self.model.get_input_embeddings().weight.dtype
        # An additive 4D mask is passed through to attention as is; the cached context is visible to all.
        mask = torch.zeros(1, 1, n, self._length + n, dtype=dtype, device=self.device)
        mask[0, 0, :, self._length:].masked_fill_(~visible.to(self.device), torch.finfo(dtype).min)
        positions = self._length + torch.tensor(depth, dtype=torch.long, device=self.device)
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        with self._capture(hidden_layers, n):
            out = self.model(input_ids=input_ids, attention_mask=mask, cache=self._cache, use_cache=True,
                             position_ids=positions.unsqueeze(0), logits_to_keep=0)
        self._length += n
        return out.logits[0].float()  # [n, vocab]

    def _refuse_sliding(self) -> None:
        if any(getattr(layer, "is_sliding", False) for layer in self._cache.layers):
            raise RollbackError(
                f"the KV cache of {type(self.model).__name__} has sliding-window layers, which cannot keep "
                "an arbitrary subset of entries; tree drafting needs full-attention layers (use tree_nodes=0)")

    def keep(self, start: int, indices: Sequence[int]) -> None:
        """Keep, of the entries from `start` on, only those at start + indices, packed contiguously.

        After tree verification: the accepted path's nodes move right after the committed
        context and every other node is dropped. Sliding-window layers cannot be compacted
        this way (their window may already have evicted entries), so they are refused.
        """
        if self._cache is None or start < 0 or start > self._length:
            raise ValueError(f"cannot compact from {start} in a cache of {self._length}")
        self._refuse_sliding()
        offsets = list(indices)
        if any(not 0 <= i < self._length - start for i in offsets):
            raise ValueError(f"indices {offsets} fall outside the {self._length - start} entries after {start}")
        index = torch.tensor([start + i for i in offsets], dtype=torch.long, device=self.device)
        for layer in self._cache.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys.index_select(-2, index)], dim=-2)
            layer.values = torch.cat([layer.values[..., :start, :], layer.values.index_select(-2, index)], dim=-2)
        self._length = start + len(offsets)

    def rollback(self, n: int) -> None:
        """Forget the last n cached tokens."""
        if n < 0 or n > self._length:
            raise ValueError(f"cannot roll back {n} tokens from a cache of {self._length}")
        if self._cache is not None:
            self._cache.crop(-n)  # also trims sliding-window layers back to their window when n == 0
            self._length -= n
