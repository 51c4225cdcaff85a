"""Compiled CPU kernels, built once per machine on first use (or by `specwise models prepare`).

Two kernels: `linear_bf16`, a small-batch bfloat16 matmul for AVX2 CPUs (see
bf16_linear.cpp for why), and `linear_int8`, its int8-weight twin for drafters. It is optional: without a C++ compiler, on other
CPUs, or with SPECWISE_KERNELS=0, `linear` falls back to PyTorch and
`kernel_status()` says why.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F

from specwise.kernels.build import build_kernel

log = logging.getLogger("specwise")

_SOURCE = Path(__file__).with_name("bf16_linear.cpp")
_LOCK = threading.Lock()
_STATE: dict[str, object] = {}


def _unavailable_reason() -> str | None:
    if os.environ.get("SPECWISE_KERNELS", "1") == "0":
        return "disabled by SPECWISE_KERNELS=0"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return f"needs an AVX2 CPU (PyTorch reports {capability})"
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "no C++ compiler on PATH (install g++)"
    try:
        import ninja  # noqa: F401  (torch builds extensions with it)
    except ImportError:
        return "the ninja package is missing (pip install ninja)"
    return None


def _build() -> ModuleType:
    return build_kernel(_SOURCE, "bfloat16 linear kernel", ["-O3", "-mavx2", "-mfma", "-fopenmp"])


def bf16_linear_module() -> ModuleType | None:
    """The compiled kernel module, building it on first call; None if it cannot be had here."""
    with _LOCK:
        if "module" not in _STATE:
            reason = _unavailable_reason()
            module = None
            if reason is None:
                try:
                    module = _build()
                except Exception as exc:  # a failed build must not stop decoding: PyTorch still works
                    detail = str(exc).strip()
                    reason = f"build failed: {detail.splitlines()[-1] if detail else repr(exc)}"
            if reason is not None:
                log.warning("specwise: bfloat16 linear kernel unavailable (%s); using PyTorch's matmul", reason)
            _STATE["module"], _STATE["reason"] = module, reason
        return _STATE["module"]  # type: ignore[return-value]


# On CPUs with native bfloat16 instructions PyTorch's matmul costs about the same for 1 to 8 rows
# (AVX-512 BF16, 2 cores, the 1.5B target: 207 / 201 / 222 ms for 1 / 5 / 8 rows) while this kernel
# widens to float32 and pays per row (143 / 209 / 309 ms), and on a long prompt PyTorch is about 5x
# faster. There the kernel takes only the few rows it wins; elsewhere (AVX2) every row count.
NATIVE_BF16_KERNEL_ROWS = 4


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX)."""
    from specwise.kernels.cpu import cpu_flags

    return any(flag in cpu_flags() for flag in ("avx512_bf16", "amx_bf16"))


def bf16_kernel_rows() -> int | None:
    """The most rows the bfloat16 kernel takes on this CPU (None: any number)."""
    if "rows" not in _STATE:
        _STATE["rows"] = NATIVE_BF16_KERNEL_ROWS if native_bf16() else None
    return _STATE["rows"]  # type: ignore[return-value]


def kernel_status() -> str:
    """'ready' (and for which row counts), or why the kernel is not used."""
    if bf16_linear_module() is None:
        return f"unavailable: {_STATE['reason']}"
    rows = bf16_kernel_rows()
    return "ready" if rows is None else (f"ready for up to {rows} rows (native bfloat16 CPU: PyTorch's matmul "
                                         "takes more rows)")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear over the last dimension, through the kernel when x and weight are bfloat16 and the
    kernel is the faster choice for this many rows on this CPU."""
    rows = bf16_kernel_rows()
    if (weight.dtype == torch.bfloat16 and x.dtype == torch.bfloat16 and weight.shape[1] % 8 == 0
            and (rows is None or x.numel() // x.shape[-1] <= rows)
            and weight.is_contiguous()):  # the kernel reads w row-major; a transposed view goes to PyTorch
        module = bf16_linear_module()
        if module is not None:
            flat = x.reshape(-1, x.shape[-1])
            return module.linear_bf16(flat, weight, bias).view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)


def linear_int8(x: torch.Tensor, weight_int8: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """(x @ weight_int8.T) * scale (+ bias) in x's dtype: the kernel when available, else PyTorch's int8 mm."""
    flat = x.reshape(-1, x.shape[-1])
    module = bf16_linear_module() if weight_int8.shape[1] % 8 == 0 else None
    if module is not None:
        out = module.linear_int8(flat, weight_int8, scale, bias)
    else:
        out = torch.ops.aten._weight_int8pack_mm(flat, weight_int8, scale.to(x.dtype))
        if bias is not None:
            out = out + bias
    return out.view(*x.shape[:-1], weight_int8.shape[0])
