"""The kinds of pass a lean runner makes over its model, and which code runs each: chosen here only.

A pass appends rows to KV caches and, for a scoring pass, returns their logits. What a pass is
for names its kind; the kind and the runner's means (`PassMeans`) choose the code that runs it
(`choose_pass`, `choose_ragged`), and with that code comes the pass's numerics contract: whether
a row's result is bitwise independent of the other rows of the pass (docs/DESIGN.md, "Numerics").

The rule of the gguf format: every row of every pass, scoring or prefill, is computed exactly as a
one-token pass computes it (the native pass attends row by row and its products are
row-independent bitwise). So a prompt's cache entries are bitwise the same whatever the chunks it
is read in, the batch it is read beside, or the cached prefix it continues, and so are the entries
written while generating: a prefix cache (specwise.prefix_cache) may hand any of them to a later
request without changing a token (`exact_prefill`).

- SCORE: a block whose logits are wanted (the last committed token and a draft chain, or a tree):
  the rows the verifier reads. On the compiled GGUF pass: row-independent, bitwise, so each row
  gets exactly what a one-token pass gives and speculation equals plain decoding token for token.
- PREFILL: rows read without logits (a prompt, a chunk of one, a drafter catching up). On the
  compiled GGUF pass, whatever its rows: row-independent, bitwise. A long prompt is read in calls
  of at most DECODER_PASS_ROWS rows (specwise.runners.native_pass), which bounds the pass's scratch
  memory and, the rows being independent, changes no bit.
- RAGGED: the SCORE blocks of several sequences in one pass (continuous batching), each row over
  its own sequence's cache. On the compiled GGUF pass (`run_ragged`, the same per-row arithmetic
  as `run`): each sequence gets bitwise what its own SCORE pass gives alone. Where that pass is not
  available, there is no ragged pass: each block runs its own runner's pass.

Dense and int8 models (no native pass) run every kind through the PyTorch layers: a scoring
pass on the CPU attends row by row (batched attention would add its own dependence), a prefill
attends batched and, for GGUF products of many rows on native-bfloat16 CPUs (a GGUF model whose
native pass could not be built), multiplies in bfloat16 (`specwise.kernels.gguf.prefill`);
PyTorch's matrix products choose their blocking by shape, so rows are not claimed independent
there, a prompt's entries depend on its chunking, and no prefix is reused. On a GPU attention is
batched too. The torch.compile step (`specwise.runners.torch_step`) takes the chain SCORE passes it can
compile; its masked attention is batched. The Hugging Face runner runs every kind through
transformers' forward and claims no row independence either.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# Rows of one call of the compiled GGUF pass: a longer pass is split into calls of this many rows, so
# that its scratch (~35 KB of activations a row for a 1.5B model, and each row's list of cache slots)
# stays small. Rows being independent, the split changes no bit.
DECODER_PASS_ROWS = 256
# Rows up to which a chain SCORE pass takes the torch.compile step: a graph per block size beyond that
# (a prompt read with logits) would not pay for its compilation.
MAX_COMPILED_BLOCK = 64


class PassKind(Enum):
    """What a pass is for (module docstring: each kind's numerics contract)."""

    SCORE = "score"
    PREFILL = "prefill"
    RAGGED = "ragged"


class Implementation(Enum):
    """The code that runs a pass."""

    DECODER_PASS = "decoder pass"  # gguf_pass.cpp run(): every layer in one compiled call
    RAGGED_DECODER_PASS = "ragged decoder pass"  # gguf_pass.cpp run_ragged(): rows of several caches
    LAYERS = "layers"  # the lean runner's PyTorch operations, one kernel call per matmul
    COMPILED_STEP = "torch.compile step"  # torch.compile's graph of the chain scoring step


class Attention(Enum):
    """How a pass's rows attend to the cache."""

    ROW_BY_ROW = "row by row"  # each row alone over exactly its entries, in cache order, as a one-token pass
    BATCHED = "batched"  # one masked attention call over all rows: sums in an order that depends on the block


@dataclass(frozen=True)
class PassMeans:
    """What a runner can run a pass with."""

    decoder_pass: bool  # every layer's projections are GGUF blocks and the native pass was built
    compiled_step: bool  # a torch.compile'd chain scoring step (CompiledLeanRunner)
    device: str  # "cpu", "cuda", ...


@dataclass(frozen=True)
class Pass:
    """One pass's kind, the code that runs it and how, and so its numerics contract."""

    kind: PassKind
    implementation: Implementation
    attention: Attention
    bf16_prefill: bool  # GGUF products of many rows may run in bfloat16 (specwise.kernels.gguf.prefill)

    @property
    def row_independent(self) -> bool:
        """Whether a row's result is bitwise independent of the other rows of the pass: only the
        compiled GGUF pass keeps both attention and every product per row (docs/DESIGN.md, "Numerics")."""
        return self.implementation in (Implementation.DECODER_PASS, Implementation.RAGGED_DECODER_PASS)


def pass_kind(rows: int, logits: bool) -> PassKind:
    """The kind of a single sequence's pass over `rows` new rows (at least one)."""
    if rows < 1:
        raise ValueError(f"a pass appends at least one row, not {rows}")
    return PassKind.SCORE if logits else PassKind.PREFILL


def choose_pass(rows: int, logits: bool, means: PassMeans, *, chain: bool = True, features: bool = False,
                restricted: bool = False) -> Pass:
    """How one sequence's pass over `rows` new rows runs on a runner with these means.

    chain: the rows are a chain (False: a tree); features: hidden states are recorded;
    restricted: the output layer is restricted to some tokens (a drafter's vocabulary).
    """
    kind = pass_kind(rows, logits)
    if means.decoder_pass:
        return Pass(kind, Implementation.DECODER_PASS, Attention.ROW_BY_ROW, bf16_prefill=False)
    if (means.compiled_step and kind is PassKind.SCORE and chain and not features and not restricted
            and rows <= MAX_COMPILED_BLOCK):
        return Pass(kind, Implementation.COMPILED_STEP, Attention.BATCHED, bf16_prefill=False)
    # On a GPU the matrix products choose their kernels by the number of rows anyway, so one batched
    # attention call costs nothing in row independence there.
    row_by_row = kind is PassKind.SCORE and means.device == "cpu"
    return Pass(kind, Implementation.LAYERS, Attention.ROW_BY_ROW if row_by_row else Attention.BATCHED,
                bf16_prefill=kind is not PassKind.SCORE)


def exact_prefill(means: PassMeans) -> bool:
    """Whether a runner with these means writes a prompt's cache entries bitwise the same whatever
    its chunking, its batch or a cached prefix (the compiled GGUF pass): the condition for reusing
    cached entries in a later request (specwise.prefix_cache)."""
    return means.decoder_pass


def choose_ragged(means: PassMeans, *, one_model: bool, restricted: bool) -> Pass | None:
    """The one pass over several sequences' SCORE blocks, or None where each block must run its own
    runner's pass: the ragged pass needs one model (one_model: every runner holds the same one) in
    the compiled GGUF pass on the CPU, with the whole output layer (restricted: some runner's is not)."""
    if means.decoder_pass and means.device == "cpu" and one_model and not restricted:
        return Pass(PassKind.RAGGED, Implementation.RAGGED_DECODER_PASS, Attention.ROW_BY_ROW, bf16_prefill=False)
    return None
