"""What this CPU can run: the instruction sets that decide which kernel path is used."""

from __future__ import annotations

import functools

# The instruction sets that decide which kernels run (docs/BENCHMARKS.md names them beside every number).
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


@functools.cache  # read once: the route choices ask on every call
def cpu_flags() -> tuple[str, ...]:
    """The KERNEL_FLAGS this CPU reports in /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith("flags"):
                    present = set(line.split(":", 1)[1].split())
                    return tuple(flag for flag in KERNEL_FLAGS if flag in present)
    except OSError:
        pass
    return ()


@functools.cache
def cpu_vendor() -> str:
    """The vendor_id /proc/cpuinfo reports ("GenuineIntel", "AuthenticAMD"), or "" where it is not known."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
