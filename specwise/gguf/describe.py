"""What a GGUF file holds and whether the gguf format runs it as stored, from the file's header alone.

For `specwise models inspect FILE.gguf`: the architecture and its hyper-parameters, the size and
parameter count, the block types of each group of tensors (embeddings, attention, feed-forward,
output, norms) with the path each takes (specwise's GGUF kernel, read as float32, or not run),
the tokenizer's size and whether the file carries a chat template. Nothing is built or loaded:
it works on any GGUF file, including those whose architecture or block types do not run yet.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specwise.gguf.file import GGUFDamagedError, GGUFFormatError, GGUFHeader, TensorEntry, read_header, tensor_bytes, type_name

RUNS = "runs as stored"
AS_FLOAT = "read as float32"
DENSE_FIX = "use --target-format dense"

# Tensor groups by the GGUF tensor names llama.cpp writes; the first group that matches takes a tensor.
_GROUPS: tuple[tuple[str, re.Pattern], ...] = (
    ("norms", re.compile(r".*_norm(\.\w+)?$")),
    ("embeddings", re.compile(r"^(token_embd|token_types|pos_embd)\.")),
    ("output", re.compile(r"^output\.")),
    ("attention", re.compile(r"^blk\.\d+\.attn_")),
    ("ffn", re.compile(r"^blk\.\d+\.ffn_")),
)
GROUP_ORDER = ("embeddings", "attention", "ffn", "output", "norms", "other")


@dataclass(frozen=True)
class BlockTypeUse:
    """One block type within a tensor group, and how the gguf format runs it."""

    type: str  # ggml's name: Q4_K, F32, IQ2_XS...
    tensors: int
    parameters: int
    bytes: int
    path: str  # RUNS, AS_FLOAT, or "not supported: ..." with the fix
    runs: bool


@dataclass(frozen=True)
class TensorGroup:
    name: str  # one of GROUP_ORDER
    types: tuple[BlockTypeUse, ...]
    note: str = ""  # e.g. the output layer tied to the embedding


@dataclass(frozen=True)
class GGUFInspection:
    """`specwise models inspect`'s report; `to_dict()` is its --json form."""

    path: str
    file_size: int
    architecture: str
    name: str | None  # general.name
    parameters: int
    bits_per_weight: float
    hyperparameters: dict[str, object]  # the config fields the metadata gives (specwise.gguf.config)
    context_length: int | None
    vocab_size: int  # rows of the token embedding
    tokenizer: str | None  # tokenizer.ggml.model: gpt2 (byte-level BPE), llama (sentencepiece)...
    tokenizer_tokens: int | None
    chat_template: bool
    tied_embeddings: bool
    groups: tuple[TensorGroup, ...]
    runs_as_stored: bool
    problems: tuple[str, ...] = field(default_factory=tuple)  # why not, each with its fix

    def to_dict(self) -> dict:
        return asdict(self)


def kernel_path(ggml_type: int) -> tuple[str, bool]:
    """(what the gguf format does with tensors of this type, whether it runs them), from the GGUF
    kernel's type table (specwise.kernels.gguf) and the float types the loader reads."""
    from specwise.kernels.gguf import SUPPORTED_TYPES
    from specwise.gguf.model import FLOAT_TYPES

    if ggml_type in SUPPORTED_TYPES:
        return RUNS, True
    if ggml_type in FLOAT_TYPES:
        return AS_FLOAT, True
    return f"not supported: {DENSE_FIX}", False


def _group_of(name: str) -> str:
    return next((group for group, pattern in _GROUPS if pattern.match(name)), "other")


def _groups(header: GGUFHeader, tied: bool) -> tuple[TensorGroup, ...]:
    by_group: dict[str, dict[int, list[TensorEntry]]] = {}
    for entry in header.tensors:
        by_group.setdefault(_group_of(entry.name), {}).setdefault(entry.ggml_type, []).append(entry)
    if tied:
        by_group.setdefault("output", {})
    groups = []
    for name in GROUP_ORDER:
        if name not in by_group:
            continue
        uses = []
        for ggml_type, entries in sorted(by_group[name].items(), key=lambda item: -len(item[1])):
            path, runs = kernel_path(ggml_type)
            uses.append(BlockTypeUse(type_name(ggml_type), len(entries), sum(math.prod(e.shape) for e in entries),
                                     sum(tensor_bytes(e.ggml_type, e.shape) or 0 for e in entries), path, runs))
        note = "reads the token embedding's blocks" if name == "output" and tied else ""
        groups.append(TensorGroup(name, tuple(uses), note))
    return tuple(groups)


def inspect_gguf(path: str | Path) -> GGUFInspection:
    """What the GGUF file at `path` holds and whether the gguf format runs it (header only)."""
    from specwise.gguf.config import ARCHITECTURE_KEYS, config_values
    from specwise.gguf.model import ARCHITECTURES, LONGROPE_TENSORS

    path = Path(path)
    header = read_header(path)
    metadata = header.metadata
    architecture = str(metadata.get("general.architecture", "?"))
    tensors = {entry.name: entry for entry in header.tensors}
    tied = "output.weight" not in tensors
    embedding = tensors.get("token_embd.weight")
    parameters = sum(math.prod(entry.shape) for entry in header.tensors)
    problems: list[str] = []
    hyperparameters: dict[str, object] = {}
    try:
        model_type, hyperparameters = config_values(header, path)
    except GGUFDamagedError as error:  # the same checks generate makes before it reads a tensor
        model_type = None
        problems.append(str(error))
    except GGUFFormatError as error:
        model_type = None
        problems.append(f"{error}; --target-format dense runs it where transformers reads the architecture")
    if model_type is not None and model_type not in ARCHITECTURES:
        known = ", ".join(a for a, keys in ARCHITECTURE_KEYS.items() if keys.model_type in ARCHITECTURES)
        problems.append(f"the {architecture} architecture does not run as stored yet (the gguf format runs {known})")
    longrope = [name for name in LONGROPE_TENSORS if name in tensors]
    if longrope:
        problems.append(f"{longrope[0]}: long-context rotary factors chosen by the sequence's length, which the "
                        f"gguf format does not run; {DENSE_FIX}")
    groups = _groups(header, tied)
    for group in groups:
        for use in group.types:
            if not use.runs:
                problems.append(f"{use.tensors} {group.name} tensor(s) stored as {use.type}, which the GGUF kernel "
                                f"does not run; {DENSE_FIX}")
    size = path.stat().st_size
    tokens = metadata.get("tokenizer.ggml.tokens")
    return GGUFInspection(
        path=str(path),
        file_size=size,
        architecture=architecture,
        name=metadata.get("general.name") if isinstance(metadata.get("general.name"), str) else None,
        parameters=parameters,
        bits_per_weight=round(8 * (size - header.data_offset) / parameters, 2) if parameters else 0.0,
        hyperparameters=hyperparameters,
        context_length=metadata.get(f"{architecture}.context_length"),
        vocab_size=embedding.shape[-1] if embedding is not None else 0,
        tokenizer=metadata.get("tokenizer.ggml.model") if isinstance(metadata.get("tokenizer.ggml.model"), str)
        else None,
        tokenizer_tokens=tokens if isinstance(tokens, int) else None,
        chat_template=isinstance(metadata.get("tokenizer.chat_template"), str),
        tied_embeddings=tied,
        groups=groups,
        runs_as_stored=not problems,
        problems=tuple(problems),
    )
