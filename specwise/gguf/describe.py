"""What a GGUF file holds and whether the gguf format runs it as stored, from the file's header alone.

For `specwise models inspect FILE.gguf`: the architecture and its hyper-parameters, the size and
parameter count, the block types of each group of tensors (embeddings, attention, feed-forward,
output, norms) with the path each takes (the GGUF kernel's tiles, read as float32, or not run),
the tokenizer's size and whether the file carries a chat template. Which tiles run a block type
is the compiled kernel's own answer for this CPU's path (`specwise.kernels.gguf.kernel_path` and
`type_path`), never a copy of its dispatch. Every tensor's full shape is checked against the
place the file's config gives it in the model the loader builds (that model's skeleton, which
holds no weights): a tensor that does not fit its role is named as the reason the file does not
run. No weight is read: it works on any GGUF file, including those whose architecture or block
types do not run yet.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specwise.gguf.file import (DAMAGED, GGUFDamagedError, GGUFFormatError, GGUFHeader, TensorEntry, read_header,
                                shown, tensor_bytes, type_name)

RUNS = "runs as stored"
ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1+ files: per-dimension divisors of the rotary frequencies
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
    path: str  # "runs as stored: avx2 tiles on the avx512 path", AS_FLOAT, or "not supported: ..." with the fix
    runs: bool
    tiles: str | None = None  # whose tiles run the type's calls of few rows (the kernel's type_path); None: none


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
    kernel_path: str | None = None  # the GGUF kernel's path on this CPU (None: the kernel is unavailable here)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class KernelAnswer:
    """The compiled kernel's path on this CPU, or why it cannot answer (it cannot be built here)."""

    path: str | None
    error: str | None = None

    @classmethod
    def ask(cls) -> KernelAnswer:
        from specwise.kernels.gguf import kernel_path

        try:
            return cls(kernel_path())
        except RuntimeError as error:  # no compiler, or a build that failed: said, not fatal to a description
            return cls(None, str(error))

    @classmethod
    def unasked(cls) -> KernelAnswer:
        """For a listing of many files: whether each runs needs the block types only, not the kernel's
        path, and asking would compile the kernel (a minute) first."""
        return cls(None, "not asked (a listing)")


def block_type_path(ggml_type: int, kernel: KernelAnswer) -> tuple[str, bool, str | None]:
    """(what the gguf format does with tensors of this type, whether it runs them, whose tiles run them):
    a block type the kernel runs takes the tiles the compiled kernel's dispatch names for `kernel`'s path
    (`type_path`), a float type is read as float32 (gguf/model.py), anything else does not run."""
    from specwise.gguf.model import FLOAT_TYPES
    from specwise.kernels.gguf import SUPPORTED_TYPES, type_path

    if ggml_type in SUPPORTED_TYPES:
        if kernel.path is None:
            return f"{RUNS}; its kernel path is unknown: {kernel.error}", True, None
        tiles = type_path(ggml_type, kernel.path)
        return f"{RUNS}: {tiles} tiles on the {kernel.path} path", True, tiles
    if ggml_type in FLOAT_TYPES:
        return AS_FLOAT, True, None
    return f"not supported: {DENSE_FIX}", False, None


def _group_of(name: str) -> str:
    return next((group for group, pattern in _GROUPS if pattern.match(name)), "other")


def _groups(header: GGUFHeader, tied: bool, kernel: KernelAnswer) -> tuple[TensorGroup, ...]:
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
            path, runs, tiles = block_type_path(ggml_type, kernel)
            uses.append(BlockTypeUse(type_name(ggml_type), len(entries), sum(math.prod(e.shape) for e in entries),
                                     sum(tensor_bytes(e.ggml_type, e.shape) or 0 for e in entries), path, runs,
                                     tiles))
        note = "reads the token embedding's blocks" if name == "output" and tied else ""
        groups.append(TensorGroup(name, tuple(uses), note))
    return tuple(groups)


_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")  # llama.cpp's names of a layer's tensors
_SHOWN_SHAPES = 3  # shape problems named one by one; the rest are counted


def _shape_problems(header: GGUFHeader, path: Path) -> list[str]:
    """Every tensor against the place the file's config gives it in the model the loader builds (its skeleton:
    no weights), worded as the loader refuses it: one problem per tensor that has no place there or another
    shape than its place takes, the first few named and the rest counted."""
    from specwise.gguf.config import gguf_config
    from specwise.gguf.model import FLOAT_TYPES, LONGROPE_TENSORS, GGUFCausalLM
    from specwise.runners.architectures import ARCHITECTURES as SPECS

    try:
        config = gguf_config(path, header)
    except GGUFFormatError as error:  # transformers refuses the hyper-parameters
        return [str(error)]
    model = GGUFCausalLM(config)
    spec = SPECS[config.model_type]
    names = {id(module): name for name, module in model.named_modules()}
    # llama.cpp's names of the tensors outside the layers, each to its place
    outside = {"token_embd": model.get_input_embeddings(), "output": model.get_output_embeddings(),
               "output_norm": model.model.norm}
    problems: list[str] = []
    for entry in header.tensors:
        if entry.name in LONGROPE_TENSORS:  # named on their own
            continue
        stem, _, kind = entry.name.rpartition(".")
        if entry.name == ROPE_FREQS:
            frequencies = getattr(model.model.rotary_emb, "inv_freq", None)  # None: a table per layer type
            target, expected = "model.rotary_emb", None if frequencies is None else tuple(frequencies.shape)
        else:
            place = outside.get(stem)
            layer = _LAYER_TENSOR.match(entry.name)
            if layer is not None and layer.group(2) in spec.tensors and int(layer.group(1)) < len(model.model.layers):
                place = model.model.layers[int(layer.group(1))].get_submodule(spec.tensors[layer.group(2)])
            if place is None:
                problems.append(f"{path.name}: tensor {shown(entry.name)} has no place in this {spec.model_type} "
                                f"model; {DAMAGED}")
                continue
            target, expected = names[id(place)], _expected_shape(place, kind)
        stored = tuple(entry.shape)
        if expected is None:
            problems.append(f"{path.name}: tensor {shown(entry.name)} ({target}.{kind}) is not one the "
                            f"{spec.model_type} model of this config holds; {DENSE_FIX}")
        elif stored != expected and not (len(expected) == 1 and math.prod(stored) == expected[0]
                                         and entry.ggml_type in FLOAT_TYPES):
            problems.append(f"{path.name}: tensor {shown(entry.name)} is {list(stored)}, the config gives "
                            f"{target}.{kind} {list(expected)}; {DAMAGED}")
    if len(problems) > _SHOWN_SHAPES:
        problems[_SHOWN_SHAPES:] = [f"and {len(problems) - _SHOWN_SHAPES} more tensor(s) that do not fit the "
                                    "config"]
    return problems


def _expected_shape(place, kind: str) -> tuple[int, ...] | None:
    """The shape, in ggml's order (the fastest dimension first), that a place of the loader's model takes for
    its `kind` ("weight" or "bias"); None where it takes none."""
    if kind == "bias":
        return (place.out_features,) if getattr(place, "expects_bias", False) else None
    if kind != "weight":
        return None
    if hasattr(place, "size") and not callable(place.size):  # a norm over `size` values
        return (place.size,)
    if hasattr(place, "in_features"):  # a matrix, or the token embedding
        return (place.in_features, place.out_features)
    return None


def inspect_gguf(path: str | Path, kernel: KernelAnswer | None = None) -> GGUFInspection:
    """What the GGUF file at `path` holds and whether the gguf format runs it (header only); the tiles
    named per block type are those of `kernel`'s path (default: ask the compiled kernel)."""
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
    if model_type in ARCHITECTURES:
        problems += _shape_problems(header, path)
    kernel = KernelAnswer.ask() if kernel is None else kernel
    groups = _groups(header, tied, kernel)
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
        kernel_path=kernel.path,
    )
