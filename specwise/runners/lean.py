"""A lean runner for decoder models (specwise.runners.architectures): static KV cache, one fused path, fast
bf16 matmuls.

It computes the same function as the Hugging Face model (tests compare logits in
float32) with less around it: the KV cache is preallocated and rolling back is
moving a pointer; q/k/v and gate/up projections are fused into one matmul each
(specwise.runners.fusion); in bfloat16 every linear layer goes through
specwise.kernels.linear, which on AVX2 CPUs scores 8 tokens for about 3x the
price of one instead of PyTorch's ~6x.
The weights are the Hugging Face model's own tensors (fused copies of q/k/v and
gate/up excepted), so both runners can serve one loaded model.

Tree scoring (`forward_tree`) lets every node attend to the context and its own
ancestors only, at its depth as position; `keep` then compacts the accepted
path's entries into contiguous cache slots.

`hidden_layers=` on forward / forward_tree also records the fed tokens' hidden
states after the named decoder layers in `last_hidden` (a feature drafter such as
EAGLE reads them); without it the pass does no extra work.

Which code runs a pass, the compiled GGUF pass or the PyTorch layers, is chosen by
its kind in specwise.runners.passes, which states each kind's numerics. What every
pass does before and after its layers is the runner's public pass interface
(`layout`, `embed`, `reserve`, `cache`, `append`, `logits`), which the ragged pass
over several sequences' caches (specwise.runners.ragged) uses too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from specwise.kernels.gguf import prefill as gguf_prefill
from specwise.runners.architectures import ARCHITECTURES, DecoderPlan, decoder_plan
from specwise.runners.block_layout import BlockLayout, layers_of, visible_keys, windowed  # noqa: F401 (their home before)
from specwise.runners.checks import check_hidden_layers, check_tree, check_window
from specwise.runners.fusion import FusedLayer, apply_linear, fused_layers, norm_offset, norm_weight, plain_weight
from specwise.runners.fusion import side_by_side
from specwise.runners.layers import activate, apply_rope, rms_norm
from specwise.runners.passes import Attention, Implementation, Pass, PassMeans, choose_pass
from specwise.runners.stash import LayerStash
from specwise.runners.tree_layout import tree_layout
from specwise.threads import pass_threads

if TYPE_CHECKING:
    from transformers import PreTrainedModel

SUPPORTED_TYPES = tuple(ARCHITECTURES)
# The config fields that name a model's MLP activation, and the names each ArchitectureSpec activation has there.
_ACTIVATION_FIELDS = ("hidden_activation", "hidden_act")
_ACTIVATION_NAMES = {"silu": ("silu", "swish"), "gelu_tanh": ("gelu_pytorch_tanh", "gelu_tanh")}
_ACTIVATION_TITLES = {"silu": "SiLU", "gelu_tanh": "GELU (tanh)"}
_INITIAL_CAPACITY = 1024


class UnsupportedModelError(ValueError):
    """The lean runner does not implement this architecture; use the Hugging Face runner."""


class LeanRunner:
    """The ModelRunner protocol over a decoder model, with a static cache and fused layers."""

    can_extend_trees = True  # forward_tree(..., extend=True): drafters grow trees level by level

    def __init__(self, model: PreTrainedModel, *, capacity: int = _INITIAL_CAPACITY) -> None:
        config = model.config
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_TYPES:
            raise UnsupportedModelError(
                f"the lean runner supports {', '.join(SUPPORTED_TYPES)} models, not {model_type!r}; "
                "use runner='hf'")
        try:
            self.plan: DecoderPlan = decoder_plan(config)
        except ValueError as error:
            raise UnsupportedModelError(f"{error}; use runner='hf'") from None
        activation = next((getattr(config, f) for f in _ACTIVATION_FIELDS if getattr(config, f, None)), None)
        if activation is not None and activation not in _ACTIVATION_NAMES[self.plan.spec.activation]:
            raise UnsupportedModelError(f"the lean runner runs {model_type} MLPs with "
                                        f"{_ACTIVATION_TITLES[self.plan.spec.activation]}, not {activation!r}; "
                                        "use runner='hf'")
        self.model = model.eval()
        inner = model.model
        self.dtype = inner.norm.weight.dtype  # activations and KV cache (float32 for GGUF blocks)
        self.device = inner.norm.weight.device
        self.vocab_size: int = model.get_output_embeddings().out_features
        self.max_context: int = int(getattr(config, "max_position_embeddings", 1 << 30))
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = self.plan.head_dim
        self.eps = config.rms_norm_eps
        self.embed_tokens = inner.embed_tokens  # nn.Embedding, or GGUFEmbedding (rows dequantized on lookup)
        self.embed_rows, self.hidden_size = inner.embed_tokens.num_embeddings, inner.embed_tokens.embedding_dim
        self.final_norm = norm_weight(inner.norm, norm_offset(model))
        # Gemma's embedding scale, rounded to the model's dtype as transformers computes it; transformers' own
        # Gemma embedding modules scale their rows themselves.
        scales_itself = getattr(inner.embed_tokens, "embed_scale", None) is not None
        self.embedding_scale = None if self.plan.embedding_scale is None or scales_itself else torch.tensor(
            self.plan.embedding_scale, dtype=self.dtype, device=self.device)
        self.lm_head = model.get_output_embeddings()
        self.rotary = inner.rotary_emb  # reuse HF's: it knows every rope scaling type and its cos/sin rounding
        self.layers = fused_layers(model)
        # GGUF blocks: every layer in one compiled call (specwise/runners/native_pass.py), else PyTorch ops.
        self.decoder_pass = _decoder_pass(model, self.layers, self.plan)
        self._capacity = 0
        self._keys: torch.Tensor | None = None  # [layers, kv_heads, capacity, head_dim]
        self._values: torch.Tensor | None = None
        self._length = 0
        self._tree: tuple[int, torch.Tensor, list[int]] | None = None  # (start, visible, depths) of the last tree
        self._initial_capacity = max(16, min(capacity, self.max_context))
        self.last_hidden: torch.Tensor | None = None  # [n, len(hidden_layers), hidden] of the last pass asking for it
        self._output: tuple[torch.Tensor, torch.nn.Module] | None = None  # (kept ids, their rows): restrict_output
        # Rows a self-drafter ran through the first layers past the cached ones (specwise.runners.early_exit):
        # the next pass reuses those it is fed again; anything else that changes the cache voids them.
        self.stash: LayerStash | None = None

    # -- cache ---------------------------------------------------------------------------------

    @property
    def length(self) -> int:
        return self._length

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def reset(self) -> None:
        self._length = 0
        self._tree = None
        self.stash = None
        if self._keys is None:
            self._allocate(self._initial_capacity)

    def free_cache(self) -> None:
        """Let go of the KV cache's memory; the next pass (or reset) allocates a small one again."""
        self._keys = self._values = None
        self._capacity = self._length = 0
        self._tree = None
        self.stash = None

    def _allocate(self, capacity: int) -> None:
        shape = (len(self.layers), self.num_kv_heads, capacity, self.head_dim)
        keys = torch.empty(shape, dtype=self.dtype, device=self.device)
        values = torch.empty(shape, dtype=self.dtype, device=self.device)
        if self._keys is not None:  # every slot: a stash's entries lie past the cached ones
            keys[:, :, :self._capacity] = self._keys
            values[:, :, :self._capacity] = self._values
        self._keys, self._values, self._capacity = keys, values, capacity

    def rollback(self, n: int) -> None:
        """Forget the last n cached tokens (moves the pointer; nothing is copied)."""
        if n < 0 or n > self._length:
            raise ValueError(f"cannot roll back {n} tokens from a cache of {self._length}")
        self._length -= n
        self._tree = None
        self.stash = None

    @torch.inference_mode()  # the cache may have been (re)allocated inside forward's inference mode
    def keep(self, start: int, indices: Sequence[int]) -> None:
        """Keep, of the entries from `start` on, only those at start + indices, packed contiguously.

        After tree verification: the accepted path's nodes move to the slots right
        after the committed context; every other node is dropped.
        """
        if self._keys is None or start < 0 or start > self._length:
            raise ValueError(f"cannot compact from {start} in a cache of {self._length}")
        positions = [start + int(i) for i in indices]  # checked on the host: no device round trip
        if positions and (max(positions) >= self._length or min(positions) < start):
            raise ValueError(f"indices {list(indices)} fall outside the {self._length - start} entries after {start}")
        index = torch.tensor(positions, dtype=torch.long, device=self.device)
        end = start + len(index)
        self._keys[:, :, start:end] = self._keys.index_select(2, index)
        self._values[:, :, start:end] = self._values.index_select(2, index)
        self._length = end
        self._tree = None
        self.stash = None

    # -- output layer ----------------------------------------------------------------------------

    def restrict_output(self, token_ids: Sequence[int] | None) -> None:
        """Compute logits for these tokens only; every other token gets -inf (None: all again).

        For drafters (specwise.drafters.vocab): their rows of the output layer are copied
        once here, so each pass reads only them. Never for a target, whose distribution
        must stay whole.
        """
        if token_ids is None:
            self._output = None
            return
        ids = torch.tensor(sorted(set(int(t) for t in token_ids)), dtype=torch.long)
        if len(ids) == 0 or int(ids[0]) < 0 or int(ids[-1]) >= self.vocab_size:
            raise ValueError(f"restrict_output needs token ids in [0, {self.vocab_size}); got "
                             f"{len(ids)} ids" + (f" from {int(ids[0])} to {int(ids[-1])}" if len(ids) else ""))
        self._output = (ids.to(self.device), _output_rows(self.lm_head, ids))

    @property
    def output_ids(self) -> torch.Tensor | None:
        """The ids restrict_output kept (sorted), or None when logits cover every token."""
        return None if self._output is None else self._output[0]

    # -- forward -------------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, ids: Sequence[int], *, logits: bool = True,
                hidden_layers: Sequence[int] | None = None) -> torch.Tensor | None:
        """Append `ids` to the cache in one pass; return their logits [len(ids), vocab] (float32).

        hidden_layers: also set `last_hidden` to the outputs of these decoder layers (0-based,
        before any final norm) for the fed tokens: [len(ids), len(hidden_layers), hidden].
        """
        if not ids:
            if hidden_layers is not None:
                self.last_hidden = torch.empty(0, len(hidden_layers), self.hidden_size, dtype=self.dtype,
                                               device=self.device)
            return torch.empty(0, self.vocab_size, device=self.device) if logits else None
        return self._run(ids, self.layout(ids), logits, hidden_layers)

    @torch.inference_mode()
    def forward_tree(self, ids: Sequence[int], parents: Sequence[int], *, extend: bool = False,
                     hidden_layers: Sequence[int] | None = None) -> torch.Tensor:
        """Score tree nodes in one pass: node i sees the context and its ancestors, at its depth.

        parents[i] is the index of node i's parent (-1: a child of the last cached token),
        always smaller than i. Returns logits [n, vocab]; the nodes stay in the cache
        until `keep` (or `rollback`). hidden_layers: as in `forward`, one row per node.

        extend=True grows the tree of the previous forward_tree call instead of starting
        one: indices count that tree's nodes first, so parents may name them (a drafter
        growing a tree level by level feeds each level once).
        """
        layout = self.layout(ids, parents, extend=extend)
        if not ids:
            return torch.empty(0, self.vocab_size, device=self.device)
        return self._run(ids, layout, True, hidden_layers)

    @property
    def means(self) -> PassMeans:
        """What this runner runs its passes with (specwise.runners.passes chooses among them)."""
        return PassMeans(decoder_pass=self.decoder_pass is not None, compiled_step=False, device=self.device.type)

    def _run(self, ids: Sequence[int], layout: BlockLayout, logits: bool,
             hidden_layers: Sequence[int] | None) -> torch.Tensor | None:
        """One pass over a block laid out by `layout`, by the code `choose_pass` names for it."""
        plan = choose_pass(len(ids), logits, self.means, chain=layout.tree is None,
                           features=hidden_layers is not None, restricted=self._output is not None)
        if plan.implementation is not Implementation.DECODER_PASS:
            return self._execute(plan, ids, layout, logits, hidden_layers)
        with pass_threads():  # its thread count, fewer while other programs hold cores (specwise/threads.py)
            return self._execute(plan, ids, layout, logits, hidden_layers)

    def _execute(self, plan: Pass, ids: Sequence[int], layout: BlockLayout, logits: bool,
                 hidden_layers: Sequence[int] | None) -> torch.Tensor | None:
        order = sorted(check_hidden_layers(hidden_layers, len(self.layers)))
        hidden, cos, sin = self.embed(ids, layout.positions)  # [n, hidden], [n, head_dim] each
        self.reserve(layout.start + layout.rows)
        stash, self.stash = self.stash, None  # this pass scores the stashed rows or voids them
        reused = stash.covered(layout, ids) if stash is not None and not order else 0
        first = 0
        if reused:  # the stashed rows skip the first layers; the others run them, after the stashed ones
            first = stash.exit_layer
            if reused < layout.rows:
                hidden[reused:] = self.run_layers(plan, hidden[reused:], cos[..., reused:, :], sin[..., reused:, :],
                                                  layout.after(reused), range(first))[0]
            hidden[:reused] = stash.states(reused)
        hidden, captured = self.run_layers(plan, hidden, cos, sin, layout, range(first, len(self.layers)), order)
        self.append(layout, None if hidden_layers is None else layers_of(captured, order, hidden_layers))
        return self.logits(hidden) if logits else None

    def run_layers(self, plan: Pass, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: BlockLayout,
                   layers: range, order: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The decoder layers `layers` (a range [first, last)) over hidden [n, hidden], the outputs of layer
        first - 1 (the embeddings for 0), by the code `plan` names, writing those layers' entries of the rows
        laid out by `layout` (reserve room first; the cache's length does not change). Returns the outputs
        of layer last - 1 [n, hidden] and of the `order` layers (within the range) [n, len(order), hidden]."""
        if plan.implementation is Implementation.DECODER_PASS:
            hidden = hidden.contiguous()
            captured = self.decoder_pass.run(hidden, self._keys, self._values, layout.start, cos, sin,
                                             layout.visible, order, layers)
            return hidden, captured
        if plan.implementation is Implementation.LAYERS:
            with gguf_prefill() if plan.bf16_prefill else contextlib.nullcontext():
                return self._layers(hidden, cos, sin, layout, plan.attention, order, layers)
        raise ValueError(f"the lean runner cannot run a {plan.implementation.value} pass")

    # -- the pass interface: what a pass over this cache does before and after its layers ---------
    # (forward, forward_tree and the ragged pass of several sequences, specwise.runners.ragged)

    def layout(self, ids: Sequence[int], parents: Sequence[int] | None = None, *,
               extend: bool = False) -> BlockLayout:
        """Check a block to append (a chain, or a tree as in forward_tree) against this cache and lay
        out its rows: their positions and the entries each attends to. Changes nothing."""
        n, start = len(ids), self._length
        if parents is None:
            check_window(start, n, self.max_context)
            return BlockLayout.chain(start, n, self.device)
        check_tree(ids, parents, start, self.max_context)
        tree = self._tree
        if extend and (tree is None or tree[0] + len(tree[2]) != start):
            raise ValueError("extend=True needs the tree of the previous forward_tree call still in the cache")
        base, grown = (tree[0], tree[1:]) if extend else (start, None)
        visible, depth = tree_layout(parents, grown)
        visible = visible.to(self.device)
        old = len(depth) - n
        positions = base + torch.tensor(depth[old:], dtype=torch.long, device=self.device)
        mask = torch.ones(n, start + n, dtype=torch.bool, device=self.device)  # the cached context: seen by all
        mask[:, base:] = visible[old:]
        return BlockLayout(start, positions, mask, (base, visible, depth))

    def embed(self, ids: Sequence[int], positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The embeddings of token ids (checked), [n, hidden], and the rotary cos and sin of their
        positions [n], [n, head_dim] each (the model's dtype); a model with a rotary table per layer
        type (plan.rope_types) gets them per table, [tables, n, head_dim] each."""
        hidden = self.embed_tokens(self._checked_ids(ids))[None]  # [1, n, hidden]
        if self.embedding_scale is not None:
            hidden = hidden * self.embedding_scale
        kinds = self.plan.rope_types
        if kinds == (None,):
            cos, sin = self.rotary(hidden, positions[None])  # [1, n, head_dim]
            return hidden[0].contiguous(), cos[0], sin[0]
        tables = [self.rotary(hidden, positions[None], kind) for kind in kinds]
        return (hidden[0].contiguous(), torch.cat([cos for cos, _ in tables]),  # [tables, n, head_dim]
                torch.cat([sin for _, sin in tables]))

    def _checked_ids(self, ids: Sequence[int]) -> torch.Tensor:
        ids = [int(i) for i in ids]  # checked on the host: no device round trip
        if min(ids) < 0 or max(ids) >= self.embed_rows:
            raise ValueError(f"token ids must be in [0, {self.embed_rows}); got {ids}")
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    def reserve(self, length: int) -> None:
        """Make room in the cache for `length` entries (allocating it if it was freed)."""
        if self._keys is None:
            self._allocate(self._initial_capacity)
        if length > self._capacity:  # rare: doubling keeps regrowth to O(log length) copies
            self._allocate(min(max(length, 2 * self._capacity), max(length, self.max_context)))

    @property
    def cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The cache's (keys, values), [layers, kv_heads, capacity, head_dim] each: the first `length`
        slots hold the cached entries; a pass writes a block's rows after them (`reserve` first)."""
        if self._keys is None:
            raise ValueError("the cache is not allocated: reserve room first")
        return self._keys, self._values

    def append(self, layout: BlockLayout, last_hidden: torch.Tensor | None = None) -> None:
        """Count a block as cached once a pass has written its rows' entries at slots layout.start
        on: the length grows by its rows; a tree stays open to extend or keep (any other pass ends
        it); last_hidden, where given, becomes the rows' recorded hidden states [n, layers, hidden]."""
        if layout.start != self._length or layout.start + layout.rows > self._capacity:
            raise ValueError(f"a block laid out at {layout.start} does not fit a cache of {self._length} "
                             f"entries and room for {self._capacity}")
        self._length = layout.start + layout.rows
        self._tree = layout.tree
        self.stash = None
        if last_hidden is not None:
            self.last_hidden = last_hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits [n, vocab] (float32) of the last decoder layer's outputs hidden [n, hidden]: the
        final norm, then the output layer (restrict_output's tokens only, -inf for the others)."""
        hidden = rms_norm(hidden[None], self.final_norm, self.eps)  # [1, n, hidden]
        if self._output is None:
            return self._capped(apply_linear(self.lm_head, hidden)[0]).float()  # [n, vocab]
        ids, rows = self._output
        out = torch.full((hidden.shape[1], self.vocab_size), float("-inf"), device=self.device)
        out[:, ids] = self._capped(apply_linear(rows, hidden)[0]).float()
        return out

    def _capped(self, logits: torch.Tensor) -> torch.Tensor:
        """Gemma 2's final soft-capping, cap * tanh(logits / cap), in transformers' steps."""
        cap = self.plan.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    # -- the PyTorch layers ------------------------------------------------------------------------

    def _attend_alone(self, layer: int, q: torch.Tensor, seen: int | torch.Tensor) -> torch.Tensor:
        """Attention of one query row [1, heads, 1, head_dim] over the entries it sees, as a one-token
        pass computes it (no mask; the keys in cache order)."""
        if isinstance(seen, int):
            keys, values = self._keys[layer, None, :, :seen], self._values[layer, None, :, :seen]
        else:
            keys = self._keys[layer, None].index_select(2, seen)
            values = self._values[layer, None].index_select(2, seen)
        return self._attention(q, keys, values, None)

    def _attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   mask: torch.Tensor | None) -> torch.Tensor:
        """Attention of q [1, heads, n, head_dim] over keys and values [1, kv_heads, entries, head_dim]
        (mask [n, entries], True: may attend), with the plan's scale; soft-capped scores (Gemma 2) in
        transformers' eager steps, since the fused kernel caps nothing."""
        cap, scale = self.plan.attention_softcap, self.plan.attention_scale
        if cap is None:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)
        group = self.num_heads // self.num_kv_heads
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        scores = torch.matmul(q, keys.transpose(2, 3)) * scale  # [1, heads, n, entries]
        scores = torch.tanh(scores / cap) * cap
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(weights, values)

    def _layers(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: BlockLayout,
                attention: Attention, order: Sequence[int], layers: range) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The decoder layers `layers` as PyTorch operations over hidden [n, hidden_size]: the last one's
        output [n, hidden_size] and the outputs of the `order` layers, [n, len(order), hidden_size]."""
        n, start = hidden.shape[0], layout.start
        end = start + n
        plan = self.plan
        hidden = hidden[None]  # [1, n, hidden]
        tables = (cos[None], sin[None]) if cos.dim() == 2 else (cos, sin)  # [tables, n, head_dim] each
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        full = layout.visible  # [n, end]; a chain's: the cached context, then causal within the block
        if full is None and n > 1:
            full = torch.ones(n, end, dtype=torch.bool, device=self.device).tril(start)
        masks: dict[int | None, tuple[torch.Tensor | None, list | None]] = {}

        def visibility(window: int | None) -> tuple[torch.Tensor | None, list | None]:
            """The mask of a layer with this window and, row by row, each row's entries."""
            if window not in masks:
                mask = full if window is None else windowed(
                    full if full is not None else torch.ones(n, end, dtype=torch.bool, device=self.device), window)
                # Row by row, each row attends over exactly the keys a one-token pass gives it (batched attention
                # sums in another order); a single chain row (mask None) sees every entry, and the one call is
                # its own.
                rows = visible_keys(mask, end) if attention is Attention.ROW_BY_ROW and mask is not None else None
                masks[window] = (mask, rows)
            return masks[window]

        captured: dict[int, torch.Tensor] = {}
        for index in layers:
            layer = self.layers[index]
            table = plan.rope_table[index]
            cos, sin = tables[0][table][None, None], tables[1][table][None, None]  # [1, 1, n, head_dim]
            mask, rows = visibility(plan.windows[index])
            residual = hidden
            x = rms_norm(hidden, layer.input_norm, self.eps)
            q, k, v = side_by_side(layer.qkv, x).split([q_size, kv_size, kv_size], dim=-1)
            q = q.view(1, n, self.num_heads, self.head_dim)
            k = k.view(1, n, self.num_kv_heads, self.head_dim)
            if layer.q_norm is not None:  # per head, before the rotary embedding
                q, k = rms_norm(q, layer.q_norm, self.eps), rms_norm(k, layer.k_norm, self.eps)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = v.view(1, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            self._keys[index, :, start:end] = k[0]
            self._values[index, :, start:end] = v[0]
            if rows is None:
                attn = self._attention(q, self._keys[index, None, :, :end], self._values[index, None, :, :end], mask)
            else:
                attn = torch.cat([self._attend_alone(index, q[:, :, i:i + 1], seen) for i, seen in enumerate(rows)],
                                 dim=2)
            attn = attn.transpose(1, 2).reshape(1, n, q_size)
            out = apply_linear(layer.o_proj, attn)
            if layer.attn_out_norm is not None:
                out = rms_norm(out, layer.attn_out_norm, self.eps)
            hidden = residual + out
            residual = hidden
            x = rms_norm(hidden, layer.post_norm, self.eps)
            if layer.gate_up is not None:
                gate, up = side_by_side(layer.gate_up, x).chunk(2, dim=-1)
                out = apply_linear(layer.down_proj, activate(gate, plan.spec.activation) * up)
            else:
                out = layer.mlp(x)
            if layer.mlp_out_norm is not None:
                out = rms_norm(out, layer.mlp_out_norm, self.eps)
            hidden = residual + out
            if index in order:
                captured[index] = hidden[0]
        return hidden[0], torch.stack([captured[i] for i in order], dim=1) if order else None


def _decoder_pass(model: PreTrainedModel, layers: list[FusedLayer], plan: DecoderPlan):
    """The native pass over every layer when all of them hold GGUF blocks, else None."""
    from specwise.runners.gguf_layers import GGUFLinear
    from specwise.runners.native_pass import GGUFDecoderPass

    if not layers or not isinstance(layers[0].o_proj, GGUFLinear):
        return None
    return GGUFDecoderPass.build(layers, model.config, plan)


def _output_rows(head: torch.nn.Module, ids: torch.Tensor) -> torch.nn.Module:
    """A copy of the output layer holding only rows `ids` (plain, int8 weight-only or GGUF blocks)."""
    from specwise.runners.gguf_layers import GGUFLinear
    from specwise.runners.int8 import Int8WeightOnlyLinear

    if isinstance(head, Int8WeightOnlyLinear):
        return head.select_rows(ids)
    if isinstance(head, GGUFLinear):
        return head.select_rows(ids)
    weight = plain_weight(head)
    if weight is None:
        raise UnsupportedModelError(f"cannot restrict an output layer of type {type(head).__name__}")
    rows = torch.nn.Linear(weight.shape[1], len(ids), bias=head.bias is not None, device="meta")
    rows.weight = torch.nn.Parameter(weight[ids].contiguous(), requires_grad=False)
    if head.bias is not None:
        rows.bias = torch.nn.Parameter(head.bias[ids].contiguous(), requires_grad=False)
    return rows


