"""Where each tensor of a GGUF file lies, read from the file's header without building its metadata.

Why not `gguf.GGUFReader`: it makes a NumPy view of every metadata value, and a chat model's
tokenizer holds some 300,000 of them (tokens and merges), which takes 15-30 s and a transient
few hundred MB before any weight is read. Loading needs only the tensor table and the
alignment, so this reader walks past the metadata values (reading a length field per string)
and keeps the scalar ones. The layout follows the GGUF specification (ggml's docs/gguf.md):
a header, key/value metadata, tensor infos, then the tensor data from an aligned offset.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from specwise.errors import ModelError

GGUF_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32

# Metadata value types (gguf.md): the fixed-size ones by struct format.
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


# The tensor types specwise reads, by ggml type id: (name, values per block, bytes per block), as ggml
# defines them (gguf.GGML_QUANT_SIZES, checked equal in the tests). Float types are blocks of one value.
# The GGUF kernel runs the block types among them (specwise.kernels.gguf.SUPPORTED_TYPES), the loader
# reads the float ones as float32 (specwise.gguf.model.FLOAT_TYPES).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    30: ("BF16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    20: ("IQ4_NL", 32, 18),
    23: ("IQ4_XS", 256, 136),
}


def type_name(ggml_type: int) -> str:
    """ggml's name of a tensor type (Q4_K, IQ2_XS...), or "ggml type N" for an id it does not know."""
    if ggml_type in GGML_TYPES:
        return GGML_TYPES[ggml_type][0]
    try:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(ggml_type).name
    except (ImportError, ValueError):
        return f"ggml type {ggml_type}"


def tensor_bytes(ggml_type: int, shape: tuple[int, ...]) -> int | None:
    """Bytes of a tensor of this type and shape as stored (whole blocks), or None for a type whose block
    size is unknown. Types specwise does not read are sized by gguf's table (for `models inspect`)."""
    if ggml_type in GGML_TYPES:
        _, block_values, block_bytes = GGML_TYPES[ggml_type]
    else:
        try:
            from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

            block_values, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        except (ImportError, ValueError, KeyError):
            return None
    return -(-math.prod(shape) // block_values) * block_bytes


class GGUFFormatError(ValueError, ModelError):
    """The GGUF file cannot be run as stored: not a readable GGUF file, cut short, or holding
    something the gguf format does not run (a block type, an architecture)."""


class GGUFDamagedError(GGUFFormatError):
    """The GGUF file is not a well-formed, complete GGUF (a field out of range, a tensor outside the
    file): no format runs it; it must be downloaded again."""


DAMAGED = "the file is damaged or not a complete GGUF; download it again (or prepare it again)"
MAX_NAME = 64 << 10  # bytes of a metadata key or a tensor name
MAX_DEPTH = 8  # arrays within arrays in the metadata
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_DIM = 1 << 40  # values along one dimension
_SHOWN = 80  # characters of a name read from the file that a message shows


def shown(text: str) -> str:
    """A name read from the file, quoted and cut short for a message: one line, bounded in length."""
    text = text.replace("\n", " ").replace("\r", " ")
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


def _damaged(path: Path, what: str) -> GGUFDamagedError:
    return GGUFDamagedError(f"{path.name}: {what}; {DAMAGED}")


@dataclass(frozen=True)
class TensorEntry:
    """One row of the tensor table."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]  # ggml's order: the fastest dimension first
    data_offset: int  # from the start of the file


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, object]  # scalar and string values; arrays as their length
    tensors: list[TensorEntry]
    data_offset: int  # where the tensor data begins: everything before it is the header
    array_keys: frozenset[str] = frozenset()  # the keys whose metadata value is an array's length


class _Cursor:
    def __init__(self, buffer: memoryview | mmap.mmap, path: Path) -> None:
        self.buffer, self.path, self.at = buffer, path, 0

    def left(self) -> int:
        return len(self.buffer) - self.at

    def unpack(self, fmt: str) -> tuple:
        size = struct.calcsize("<" + fmt)
        if self.at + size > len(self.buffer):
            raise _damaged(self.path, f"the GGUF header is cut short at byte {self.at}")
        values = struct.unpack_from("<" + fmt, self.buffer, self.at)
        self.at += size
        return values

    def string(self, what: str = "a metadata string", limit: int | None = None) -> str:
        start = self.at
        (length,) = self.unpack("Q")
        if limit is not None and length > limit:
            raise _damaged(self.path, f"{what} at byte {start} claims {length:,} bytes (at most {limit:,})")
        if length > self.left():
            raise _damaged(self.path, f"{what} at byte {start} claims {length:,} bytes, more than the "
                                      f"{self.left():,} left in the file")
        raw = bytes(self.buffer[self.at:self.at + length])
        self.at += length
        return raw.decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        if count > self.left() // 8:
            raise _damaged(self.path, f"a string array at byte {self.at} claims {count:,} strings, more than "
                                      "the file holds")
        try:
            for _ in range(count):
                (length,) = struct.unpack_from("<Q", self.buffer, self.at)
                self.at += 8 + length
                if self.at > len(self.buffer):
                    break
        except struct.error:
            self.at = len(self.buffer) + 1
        if self.at > len(self.buffer):
            raise _damaged(self.path, "the GGUF metadata runs past the end of the file")

    def value(self, kind: int, key: str, depth: int = 0) -> object:
        if kind in _FIXED:
            return self.unpack(_FIXED[kind])[0]
        if kind == _STRING:
            return self.string(f"the value of {shown(key)}")
        if kind == _ARRAY:
            if depth >= MAX_DEPTH:
                raise _damaged(self.path, f"metadata {shown(key)} nests arrays more than {MAX_DEPTH} deep")
            element, count = self.unpack("IQ")
            if element in _FIXED:
                size = struct.calcsize("<" + _FIXED[element]) * count
                if size > self.left():
                    raise _damaged(self.path, f"metadata {shown(key)} claims {count:,} values, more than the "
                                              "file holds")
                self.at += size
            elif element == _STRING:
                self.skip_strings(count)
            elif element == _ARRAY:
                if count > self.left() // 12:
                    raise _damaged(self.path, f"metadata {shown(key)} claims {count:,} arrays, more than the "
                                              "file holds")
                for _ in range(count):
                    self.value(_ARRAY, key, depth + 1)
            else:
                raise _damaged(self.path, f"metadata {shown(key)}: unknown GGUF array element type {element}")
            return count
        raise _damaged(self.path, f"metadata {shown(key)}: unknown GGUF metadata value type {kind}")


def read_header(path: str | Path) -> GGUFHeader:
    """The tensor table of a GGUF file, its scalar metadata and where its data begins, checked
    (`check_tensors`) before any tensor's data is read: a damaged file is one GGUFFormatError."""
    path = Path(path)
    if path.is_dir():
        raise GGUFFormatError(f"{path} is a directory, not a GGUF file (give the .gguf file itself)")
    try:
        handle = open(path, "rb")
    except OSError as error:
        raise GGUFFormatError(f"cannot open the GGUF file {path}: {error.strerror}") from None
    with handle:
        size = path.stat().st_size
        if size < 24:
            raise GGUFFormatError(f"{path.name} is too short to be a GGUF file ({size} bytes); {DAMAGED}")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:  # pages dropped on close
            cursor = _Cursor(view, path)
            magic = bytes(view[:4])
            if magic != GGUF_MAGIC:
                raise GGUFFormatError(f"{path.name} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
            cursor.at = 4
            (version,) = cursor.unpack("I")
            if version not in _VERSIONS:
                raise GGUFFormatError(f"{path.name}: GGUF version {version} is not supported (versions "
                                      f"{', '.join(map(str, _VERSIONS))}; a big-endian file reads as a huge version)")
            tensor_count, kv_count = cursor.unpack("QQ")
            if kv_count > size // 12 or tensor_count > size // 24:  # the smallest entry of each
                raise _damaged(path, f"the header is cut short: it claims {tensor_count:,} tensors and {kv_count:,} metadata "
                                     f"keys, more than a file of {size:,} bytes holds")
            metadata: dict[str, object] = {}
            arrays: set[str] = set()
            for _ in range(kv_count):
                key = cursor.string("a metadata key", MAX_NAME)
                (kind,) = cursor.unpack("I")
                metadata[key] = cursor.value(kind, key)
                if kind == _ARRAY:
                    arrays.add(key)
            entries = []
            for _ in range(tensor_count):
                name = cursor.string("a tensor name", MAX_NAME)
                (dims,) = cursor.unpack("I")
                if not 1 <= dims <= MAX_DIMS:
                    raise _damaged(path, f"tensor {shown(name)} claims {dims} dimensions (1 to {MAX_DIMS})")
                shape = cursor.unpack("Q" * dims)
                ggml_type, offset = cursor.unpack("IQ")
                entries.append((name, ggml_type, tuple(int(d) for d in shape), offset))
            alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
            if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
                raise _damaged(path, f"general.alignment {shown(str(alignment))} is not a power of two")
            data_offset = -(-cursor.at // alignment) * alignment
    tensors = [TensorEntry(name, ggml_type, shape, data_offset + offset) for name, ggml_type, shape, offset in entries]
    header = GGUFHeader(int(version), metadata, tensors, data_offset, frozenset(arrays))
    check_tensors(header, path, size)
    return header


def check_tensors(header: GGUFHeader, path: Path, size: int) -> None:
    """The tensor table's own consistency, from the header alone: names unique, every dimension
    positive and bounded, whole blocks per row, and every tensor's bytes (sized from its type's
    block size) inside the data section and overlapping no other tensor's. A type whose block size
    is not known (one no reader here runs) is not placed; `models inspect` still names it."""
    seen: set[str] = set()
    extents: list[tuple[int, int, str]] = []
    for entry in header.tensors:
        name = shown(entry.name)
        if entry.name in seen:
            raise _damaged(path, f"tensor {name} is listed twice")
        seen.add(entry.name)
        if any(not 1 <= d <= MAX_DIM for d in entry.shape):
            raise _damaged(path, f"tensor {name} has the dimensions {list(entry.shape)} (each from 1 to {MAX_DIM:,})")
        n_bytes = tensor_bytes(entry.ggml_type, entry.shape)
        if n_bytes is None:
            continue
        block_values = _block_values(entry.ggml_type)
        if entry.shape[0] % block_values:
            raise _damaged(path, f"tensor {name} is stored as {type_name(entry.ggml_type)}, whose blocks hold "
                                 f"{block_values} values, but its rows hold {entry.shape[0]}")
        if entry.data_offset + n_bytes > size:
            raise _damaged(path, f"tensor {name} is cut short ({n_bytes:,} bytes at byte {entry.data_offset:,}; "
                                 f"the file ends at byte {size:,})")
        extents.append((entry.data_offset, entry.data_offset + n_bytes, entry.name))
    extents.sort()
    for (_, end, first), (start, _, second) in zip(extents, extents[1:]):
        if start < end:
            raise _damaged(path, f"tensors {shown(first)} and {shown(second)} overlap in the file")


def _block_values(ggml_type: int) -> int:
    if ggml_type in GGML_TYPES:
        return GGML_TYPES[ggml_type][1]
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)][0]


def pass_bytes(path: str | Path) -> int:
    """Bytes of weights one decoding pass reads from a GGUF file: every tensor's data (each runs
    from its offset to the next tensor's, the padding counted), less the input embedding table
    where the file holds a separate output matrix (a pass looks up only its tokens' rows there)."""
    path = Path(path)
    header = read_header(path)
    names = {tensor.name for tensor in header.tensors}
    ordered = sorted(header.tensors, key=lambda tensor: tensor.data_offset)
    ends = [tensor.data_offset for tensor in ordered[1:]] + [path.stat().st_size]
    looked_up = {"token_embd.weight"} if "output.weight" in names else set()
    return sum(end - tensor.data_offset for tensor, end in zip(ordered, ends) if tensor.name not in looked_up)
