"""What this CPU is: the instruction sets that decide the kernel path, its vendor, the cores this process
may use and their clock ticks."""

from __future__ import annotations

import functools
import os

# The instruction sets that decide which kernels run (docs/BENCHMARKS.md names them beside every number).
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def cpuinfo_field(name: str) -> str | None:
    """The value of the first `name` line of /proc/cpuinfo ("flags", "vendor_id", "model name"), or None."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith(name):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


@functools.cache  # read once: the route choices ask on every call
def cpu_flags() -> tuple[str, ...]:
    """The KERNEL_FLAGS this CPU reports in /proc/cpuinfo."""
    present = set((cpuinfo_field("flags") or "").split())
    return tuple(flag for flag in KERNEL_FLAGS if flag in present)


@functools.cache
def cpu_vendor() -> str:
    """The vendor_id /proc/cpuinfo reports ("GenuineIntel", "AuthenticAMD"), or "" where it is not known."""
    return cpuinfo_field("vendor_id") or ""


def usable_cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_ticks(cpus: set[int] | None = None) -> tuple[int, int] | None:
    """(idle, total) clock ticks so far from /proc/stat: of the whole machine, or summed over `cpus`;
    idle counts iowait, total user to steal (guest time is inside user). None where it cannot be read."""
    names = {"cpu"} if cpus is None else {f"cpu{c}" for c in cpus}
    idle = total = 0
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            for line in stat:
                name, *fields = line.split()
                if name in names:
                    ticks = [int(f) for f in fields[:8]]
                    idle += ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
                    total += sum(ticks)
    except (OSError, ValueError, IndexError):
        return None
    return (idle, total) if total > 0 else None
