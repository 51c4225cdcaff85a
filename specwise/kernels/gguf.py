"""Linear layers over GGUF weights kept in their stored block formats.

The block types (`SUPPORTED_TYPES`): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL (32 values a block), Q2_K,
Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS (256 values a block): those of the common quantization mixes. Float
tensors (F32, F16, BF16) are not block types; gguf/model.py reads them as float32.

`GGUFWeight` holds a tensor's raw block bytes; `gguf_linear(x, weight, bias)` multiplies rows of
activations with it through the compiled kernel (gguf_linear.cpp and its files by job), and `dequantize_rows` reads
embedding rows. The kernel quantizes each activation row to int8 per block (as llama.cpp does), so
results match a float matmul with the dequantized weights to about 2^-8 relative, and a row's result
never depends on the other rows of the call.

The kernel has four paths, chosen by CPU features: "amx" (AVX-512 with Intel AMX-INT8 tiles for calls of
many rows of Q4_K, Q5_K and Q6_K: 16-20 and more, 10 of interleaved Q4_K), "avx512" (AVX-512 VNNI), "avx2",
"scalar". Only Q4_K, Q4_0, Q5_K, Q6_K, Q5_0, Q8_0 and IQ4_XS have AVX-512 tiles; on the avx512 path the other types run their AVX2 tiles.
`SPECWISE_GGUF_KERNEL=amx|avx512|avx2|scalar` forces one; forcing a path this CPU cannot run falls back
to the best one it can, with a warning. `kernel_path()` says which path is in use.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import shutil
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import torch

from specwise.kernels.build import build_kernel
from specwise.gguf.file import GGML_TYPES, type_name

if TYPE_CHECKING:
    from gguf import ReaderTensor

log = logging.getLogger("specwise")

_SOURCE = Path(__file__).with_name("gguf_linear.cpp")  # the module's entry points and the choice of path
# The module's other files, one job each (gguf_linear.cpp's opening comment lists them).
_EXTRA_SOURCES = tuple(_SOURCE.with_name(name) for name in (
    "gguf_quantize.cpp", "gguf_scalar.cpp", "gguf_avx2.cpp", "gguf_avx2_interleaved.cpp", "gguf_avx512.cpp", "gguf_avx512_interleaved.cpp", "gguf_amx.cpp", "gguf_amx_interleaved.cpp", "gguf_dequantize.cpp",
    "gguf_pass.cpp", "gguf_pass_layers.cpp", "gguf_pass_scalar.cpp", "gguf_pass_avx2.cpp", "gguf_pass_avx512.cpp"))
_LOCK = threading.Lock()
_STATE: dict[str, object] = {}

PATHS = ("amx", "avx512", "avx2", "scalar")
# The interleaved layout (gguf_interleaved.h): the types that have it, its group of rows, the flag on a type id.
INTERLEAVABLE = (2, 6, 8, 12, 13, 14, 23)  # Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS
GROUP_ROWS = 16
INTERLEAVED_FLAG = 256
# The block types the kernel runs, by ggml type id -> (name, values per block, bytes per block); the sizes
# are ggml's (specwise.gguf.file.GGML_TYPES).
SUPPORTED_TYPES: dict[int, tuple[str, int, int]] = {
    ggml_type: GGML_TYPES[ggml_type] for ggml_type in (
        2, 3, 6, 7, 8,  # Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
        10, 11, 12, 13, 14,  # Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
        20, 23,  # IQ4_NL, IQ4_XS
    )
}


def _check_type(ggml_type: int, where: str = "") -> None:
    if ggml_type not in SUPPORTED_TYPES:
        names = ", ".join(name for name, _, _ in SUPPORTED_TYPES.values())
        raise ValueError(f"{type_name(ggml_type)} weights{where} are not supported by the GGUF kernel "
                         f"(supported: {names})")


@dataclass(frozen=True)
class GGUFWeight:
    """A [out_features, in_features] GGUF tensor as its raw blocks: `data` is uint8 [out_features, row bytes]."""

    data: torch.Tensor
    ggml_type: int
    shape: tuple[int, int]
    # The blocks rearranged in 16-row groups (`interleave`; gguf_interleaved.h): same bytes, same shape.
    interleaved: bool = False

    def __post_init__(self) -> None:
        _check_type(self.ggml_type)
        if self.interleaved and (self.ggml_type not in INTERLEAVABLE or self.shape[0] % GROUP_ROWS):
            raise ValueError(f"{type_name(self.ggml_type)} [{self.shape[0]}, ...] has no interleaved layout "
                             f"(the types with AVX-512 tiles, in multiples of {GROUP_ROWS} rows, have)")
        out_features, in_features = self.shape
        name, block_values, block_bytes = SUPPORTED_TYPES[self.ggml_type]
        if in_features <= 0 or in_features % block_values:
            raise ValueError(f"{name}: in_features {in_features} is not a positive multiple of {block_values}")
        row_bytes = in_features // block_values * block_bytes
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != (out_features, row_bytes):
            raise ValueError(f"{name} [{out_features}, {in_features}] needs uint8 data of shape "
                             f"({out_features}, {row_bytes}), got {self.data.dtype} {tuple(self.data.shape)}")
        if not self.data.is_contiguous():
            raise ValueError("GGUF weight bytes must be contiguous")

    @classmethod
    def from_reader_tensor(cls, tensor: ReaderTensor, *, copy: bool = True) -> GGUFWeight:
        """From a `gguf.GGUFReader` tensor. `copy=False` keeps the bytes in the reader's read-only memory map."""
        ggml_type = int(tensor.tensor_type)
        _check_type(ggml_type, f" ({tensor.name})")
        in_features, out_features = (int(d) for d in tensor.shape)  # ggml lists the fastest dimension first
        data = np.ascontiguousarray(tensor.data).reshape(out_features, -1).view(np.uint8)
        if copy:
            return cls(torch.from_numpy(data.copy()), ggml_type, (out_features, in_features))
        with warnings.catch_warnings():  # the map is read-only; the kernel never writes to weights
            warnings.simplefilter("ignore", UserWarning)
            return cls(torch.from_numpy(data), ggml_type, (out_features, in_features))

    @property
    def type_name(self) -> str:
        return SUPPORTED_TYPES[self.ggml_type][0]

    @property
    def kernel_type(self) -> int:
        """The type id the compiled kernel reads: the ggml type, flagged when interleaved."""
        return self.ggml_type | INTERLEAVED_FLAG if self.interleaved else self.ggml_type

    def raw(self) -> GGUFWeight:
        """This weight with its blocks as stored in the file (itself when not interleaved; else a copy)."""
        if not self.interleaved:
            return self
        data = gguf_kernel_module().raw_blocks(self.data, self.kernel_type, self.out_features, self.in_features)
        return GGUFWeight(data, self.ggml_type, self.shape)

    @property
    def out_features(self) -> int:
        return self.shape[0]

    @property
    def in_features(self) -> int:
        return self.shape[1]

    @property
    def nbytes(self) -> int:
        return self.data.numel()


# Weights live in memory backed by 2 MiB pages where the system allows it (Linux transparent huge pages, "madvise"
# or "always"). A pass streams every weight byte once, and with 4 KiB pages each 4 KiB of it costs a TLB miss and a
# page walk, which the hardware prefetchers do not run ahead of. On 2 cores of an Intel Xeon (KVM, AVX-512, AMX)
# the target's linear layers for one row took 56 ms on 4 KiB pages against 38 ms on 2 MiB pages, side by side
# (a plain read of the same bytes: 44 against 35 ms).
_HUGE_PAGE = 2 << 20


def huge_page_buffer(nbytes: int) -> torch.Tensor:
    """A new uint8 tensor of `nbytes` (uninitialized; zeros in practice) in private anonymous memory whose 2 MiB
    aligned stretch the system is asked to back with huge pages (madvise MADV_HUGEPAGE; nothing is touched
    here, so pages come as the caller fills it). Where that cannot be asked (no MADV_HUGEPAGE, a small size),
    a plain torch.empty. The tensor keeps its mapping alive; the mapping goes with it."""
    if nbytes < _HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE") or not hasattr(mmap, "MAP_PRIVATE"):
        return torch.empty(nbytes, dtype=torch.uint8)
    region = mmap.mmap(-1, nbytes + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with warnings.catch_warnings():  # frombuffer warns that the buffer is not writable; an mmap's is
        warnings.simplefilter("ignore", UserWarning)
        whole = torch.frombuffer(region, dtype=torch.uint8)
    start = -whole.data_ptr() % _HUGE_PAGE  # the mapping is page aligned, so this offset is too
    try:
        region.madvise(mmap.MADV_HUGEPAGE, start, nbytes // mmap.PAGESIZE * mmap.PAGESIZE)
    except OSError:  # transparent huge pages compiled out or refused: 4 KiB pages, as torch.empty gives
        pass
    return whole[start:start + nbytes]


def _build() -> ModuleType:
    # No -march: the SIMD paths carry their own target pragmas, so the binary runs on any x86-64 CPU. On
    # Intel CPUs the tiles also prefetch far ahead into L2 (gguf_blocks.h says what it was measured against).
    from specwise.kernels.cpu import cpu_vendor

    flags = ["-O3", "-ffp-contract=off", "-fopenmp"]
    if cpu_vendor() == "GenuineIntel":
        flags.append("-DSPECWISE_FAR_PREFETCH")
    if os.environ.get("SPECWISE_STEP_TIMES") == "1":  # a lab build that times each step of a pass (scripts/lab/pass_steps.py)
        flags.append("-DSPECWISE_STEP_TIMES")
    return build_kernel(_SOURCE, "GGUF kernel", flags, extra_sources=_EXTRA_SOURCES)


def gguf_kernel_module() -> ModuleType:
    """The compiled kernel, building it on first call; RuntimeError saying why if it cannot be had."""
    with _LOCK:
        if "module" not in _STATE:
            try:
                if shutil.which(os.environ.get("CXX", "c++")) is None:
                    raise RuntimeError("no C++ compiler on PATH (install g++)")
                _STATE["module"] = _build()
            except Exception as exc:
                detail = str(exc).strip()
                _STATE["error"] = detail.splitlines()[-1] if detail else repr(exc)
                _STATE["module"] = None
        module = _STATE["module"]
        if module is None:
            raise RuntimeError(f"the GGUF linear kernel is unavailable: {_STATE['error']}")
        return module  # type: ignore[return-value]


def available_paths() -> list[str]:
    """The kernel paths this CPU can run, fastest first."""
    return list(gguf_kernel_module().supported_paths())


def _resolve(requested: str | None) -> str:
    supported = available_paths()
    if requested is None or requested == "":
        return supported[0]
    if requested not in PATHS:
        raise ValueError(f"unknown GGUF kernel path {requested!r} (choose from {', '.join(PATHS)})")
    if requested not in supported:
        log.warning("specwise: this CPU cannot run the %s GGUF kernel path; using %s", requested, supported[0])
        return supported[0]
    return requested


def kernel_path() -> str:
    """The path `gguf_linear` uses by default: SPECWISE_GGUF_KERNEL if this CPU can run it, else the fastest."""
    with _LOCK:
        env = os.environ.get("SPECWISE_GGUF_KERNEL", "")
        cached = _STATE.get("path")
        if cached is not None and _STATE.get("path_env") == env:
            return cached  # type: ignore[return-value]
    path = _resolve(env or None)
    with _LOCK:
        _STATE["path"], _STATE["path_env"] = path, env
    return path


def type_path(ggml_type: int, path: str | None = None) -> str:
    """Whose tiles run a block type's calls of few rows on `path` (default `kernel_path()`): the avx512 path
    runs the types without AVX-512 tiles through their AVX2 tiles, and the amx path is the avx512 path
    outside its AMX tiles (Q5_K and Q6_K in calls of 16 rows or more, Q4_K of 20; interleaved Q6_K of 7,
    Q8_0 of 8, Q4_K and IQ4_XS of 9: gguf_amx.cpp's amx::takes, gguf_amx_interleaved.cpp's
    amx::takes_interleaved). The
    compiled kernel answers, from its own dispatch (RuntimeError where it cannot be built)."""
    _check_type(ggml_type)
    chosen = kernel_path() if path is None else path
    if chosen not in PATHS:
        raise ValueError(f"unknown GGUF kernel path {chosen!r} (choose from {', '.join(PATHS)})")
    return str(gguf_kernel_module().type_path(ggml_type, chosen))  # the compiled kernel's own dispatch


# Rows from which a matmul goes to PyTorch's bfloat16 matmul over a temporary dequantized copy of the
# weight, on CPUs that multiply bfloat16 natively: there a long prompt reads faster that way (the int8
# kernel is built for the few rows of decoding). Only prefill passes have this many rows; they need be
# exact to tolerance only (docs/DESIGN.md, "Numerics"). None: never (AVX2-only CPUs, where the kernel wins).
PREFILL_ROWS = 64


_PREFILL = threading.local()


@contextlib.contextmanager
def prefill() -> Iterator[None]:
    """Within this block gguf_linear may take the bfloat16 route for many rows: only for passes whose
    rows need be exact to tolerance (a prompt read without logits), never for a scoring pass."""
    before = getattr(_PREFILL, "on", False)
    _PREFILL.on = True
    try:
        yield
    finally:
        _PREFILL.on = before


def many_rows_route() -> int | None:
    """From how many rows gguf_linear multiplies in bfloat16 by PyTorch on this CPU (None: never), inside
    `prefill()`. SPECWISE_GGUF_PREFILL=kernel keeps every row count on the kernel."""
    from specwise.kernels import native_bf16

    if os.environ.get("SPECWISE_GGUF_PREFILL", "") == "kernel" or not native_bf16():
        return None
    return PREFILL_ROWS


def gguf_linear(x: torch.Tensor, weight: GGUFWeight, bias: torch.Tensor | None = None, *,
                path: str | None = None) -> torch.Tensor:
    """x [..., in_features] (float32, bfloat16 or float16) @ weight.T (+ bias) -> [..., out_features] in x's dtype.

    `path` forces a kernel path for this call (falling back like SPECWISE_GGUF_KERNEL); default `kernel_path()`.
    Inside `prefill()`, with `many_rows_route()` rows or more (a long prompt on a native-bfloat16 CPU) and no
    path forced, the weight is dequantized to bfloat16 for this call and PyTorch multiplies; the result is then
    bfloat16 (converting it back would cost a fifth of the product).
    """
    if x.shape[-1] != weight.in_features:
        raise ValueError(f"x has {x.shape[-1]} features, the weight expects {weight.in_features}")
    if bias is not None and bias.numel() != weight.out_features:
        raise ValueError(f"bias has {bias.numel()} values, the weight has {weight.out_features} outputs")
    flat = x.reshape(-1, x.shape[-1])
    threshold = many_rows_route() if path is None and getattr(_PREFILL, "on", False) else None
    if threshold is not None and flat.shape[0] >= threshold:
        out = _bf16_product(flat, weight, bias)
        return out.view(*x.shape[:-1], weight.out_features)  # bfloat16: the caller's float32 ops promote it
    chosen = kernel_path() if path is None else _resolve(path)
    out = gguf_kernel_module().gguf_linear(flat, weight.data, weight.kernel_type, weight.out_features,
                                           weight.in_features, bias, chosen)
    return out.view(*x.shape[:-1], weight.out_features)


def dequantize_bf16(weight: GGUFWeight, rows: tuple[int, int] | None = None, *, out: torch.Tensor | None = None,
                    simd: bool = True) -> torch.Tensor:
    """Output rows [start, stop) (default all) of the weight as bfloat16 [stop - start, in_features], into `out`
    when given: each value dequantized in float32, then rounded to nearest even. simd=False forces the portable
    loop (the AVX-512 BF16 one gives the same bits)."""
    start, stop = rows if rows is not None else (0, weight.out_features)
    if out is None:
        out = torch.empty(stop - start, weight.in_features, dtype=torch.bfloat16)
    gguf_kernel_module().dequantize_bf16_rows(weight.data, weight.kernel_type, weight.out_features, weight.in_features,
                                              start, stop, out, simd)
    return out


# Bytes of bfloat16 weights dequantized at a time on the bfloat16 route: a slab stays in the caches while
# PyTorch multiplies it, and the buffer is reused, so no large temporary is ever touched for the first time.
_SLAB_BYTES = 4 << 20


def _bf16_product(flat: torch.Tensor, weight: GGUFWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """flat @ weight.T (+ bias) in bfloat16, slab by slab of the weight's rows."""
    x = flat.to(torch.bfloat16)
    out = torch.empty(flat.shape[0], weight.out_features, dtype=torch.bfloat16)
    step = max(16, _SLAB_BYTES // (2 * weight.in_features) // 16 * 16)
    slab = torch.empty(min(step, weight.out_features), weight.in_features, dtype=torch.bfloat16)
    for start in range(0, weight.out_features, step):
        stop = min(start + step, weight.out_features)
        w = dequantize_bf16(weight, (start, stop), out=slab[:stop - start])
        out[:, start:stop] = torch.nn.functional.linear(x, w, None if bias is None else bias[start:stop].to(torch.bfloat16))
    return out


def dequantize_rows(weight: GGUFWeight, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` (any shape of int64) of the weight as float32 [*ids.shape, in_features]: an embedding lookup.

    Bit-identical to `gguf.quants.dequantize` of those rows.
    """
    flat = ids.reshape(-1).to(torch.long)
    rows = gguf_kernel_module().dequantize_rows(weight.data, weight.kernel_type, weight.out_features,
                                                weight.in_features, flat)
    return rows.view(*ids.shape, weight.in_features)


# The types each path has tiles of the interleaved layout for (the amx path is the avx512 one below its AMX
# tiles, which read either layout; on AVX2, Q6_K's, Q5_K's and Q5_0's tiles lost to the stored ones:
# gguf_avx2_interleaved.cpp).
# avx2: Q4_0, Q8_0, Q4_K, IQ4_XS.
INTERLEAVED_TILES = {"amx": INTERLEAVABLE, "avx512": INTERLEAVABLE, "avx2": (2, 8, 12, 23)}
# The types interleaved at load unless SPECWISE_INTERLEAVE says otherwise: those whose interleaved tiles beat
# the stored ones at every row count measured, 1-16 (the default target and its re-quantized files, 2 Zen 4
# cores, the avx2 path forced there) (docs/DESIGN.md, "Interleaved weights").
INTERLEAVED_BY_DEFAULT = {
    # On an Intel Xeon: the default target's whole pass with Q4_K interleaved took 0.98 of T(1) with it
    # stored, 0.93 of T(2) and T(5), 0.84 of T(16) (builds alternated in one process); with Q6_K too (its
    # AMX tiles of the layout from 5 rows), 0.99-1.00 of T(1) to T(5), 0.95 of T(8), 0.82 of T(16); Q8_0
    # interleaved took 0.47-0.68 of the stored time, Q4_0 0.86-1.03, IQ4_XS 1.05 at one row and 0.51-0.86
    # from two (scripts/lab/interleave_ab.py).
    "amx": (2, 6, 8, 12, 14, 23),  # Q4_0, Q5_0, Q8_0, Q4_K, Q6_K, IQ4_XS
    "avx512": (2, 6, 8, 12, 23),  # Q4_0, Q5_0, Q8_0, Q4_K, IQ4_XS (not Q5_K, Q6_K: they lose at 1-2 rows)
    "avx2": (2, 8, 23),  # Q4_0, Q8_0, IQ4_XS (not Q4_K: it loses 7 % at one row)
}


def interleaved_types(path: str | None = None) -> frozenset[int]:
    """The block types interleaved at load on `path` (default `kernel_path()`), as SPECWISE_INTERLEAVE asks:
    unset or "auto", the path's INTERLEAVED_BY_DEFAULT; "0", none; "1" or "all", every type the path has
    interleaved tiles for; else a comma-separated list of type names (Q4_K,Q6_K), less those without tiles on
    the path. A name of a type without the layout is a ValueError."""
    chosen = path or kernel_path()
    tiles = frozenset(INTERLEAVED_TILES.get(chosen, ()))
    setting = os.environ.get("SPECWISE_INTERLEAVE", "auto").strip()
    if setting in ("", "auto"):
        return frozenset(INTERLEAVED_BY_DEFAULT.get(chosen, ()))
    if setting == "0":
        return frozenset()
    if setting in ("1", "all"):
        return tiles
    by_name = {SUPPORTED_TYPES[t][0].upper(): t for t in INTERLEAVABLE}
    names = [name.strip().upper() for name in setting.split(",") if name.strip()]
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise ValueError(f"SPECWISE_INTERLEAVE={setting!r}: {', '.join(unknown)} has no interleaved layout; use "
                         f"auto, 0, 1 or a comma-separated list of {', '.join(sorted(by_name))}")
    return frozenset(by_name[name] for name in names) & tiles


def interleaves(ggml_type: int, rows: int, path: str | None = None) -> bool:
    """Whether a weight of this type and rows is interleaved at load on `path` (default `kernel_path()`): a type
    of `interleaved_types(path)` in multiples of 16 rows. By default on avx512 Q4_0, Q5_0, Q8_0, Q4_K and
    IQ4_XS, on avx2 Q4_0, Q8_0 and IQ4_XS (docs/DESIGN.md, "Interleaved weights")."""
    return ggml_type in interleaved_types(path) and rows % GROUP_ROWS == 0


def interleaved_tiles(ggml_type: int, path: str | None = None) -> bool:
    """Whether a weight of this type in the interleaved layout runs tiles of that layout on `path` (default
    `kernel_path()`), as the compiled kernel's dispatch answers (INTERLEAVED_TILES states it); elsewhere its
    groups are read back into stored blocks for the stored tiles."""
    chosen = kernel_path() if path is None else path
    if chosen not in PATHS:
        raise ValueError(f"unknown GGUF kernel path {chosen!r} (choose from {', '.join(PATHS)})")
    return bool(gguf_kernel_module().interleaved_tiles(ggml_type, chosen))


def interleaved_type_names(path: str | None = None) -> list[str]:
    """The block types interleaved at load on `path` (default `kernel_path()`), by name: recorded beside every
    measured T(n), since a table measured under another layout is another kernel's (specwise.cost_model)."""
    return sorted(SUPPORTED_TYPES[t][0] for t in interleaved_types(path))


def interleave(weight: GGUFWeight) -> GGUFWeight:
    """The weight with its blocks rearranged in place into 16-row groups (the tensor is reused: `weight` must not
    be read as stored afterwards). Exact: the same bytes, moved (`GGUFWeight.raw` moves them back)."""
    if weight.interleaved:
        return weight
    result = GGUFWeight(weight.data, weight.ggml_type, weight.shape, interleaved=True)  # checks type and rows
    gguf_kernel_module().interleave_(weight.data, weight.ggml_type, weight.out_features, weight.in_features)
    return result
