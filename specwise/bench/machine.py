"""What a measurement ran on: CPU, cores, threads, library versions, the command line."""

from __future__ import annotations

import os
import platform
import shlex
import sys
import time

from specwise.kernels.cpu import KERNEL_FLAGS, cpu_flags, cpu_ticks, cpuinfo_field, usable_cores  # noqa: F401 (the machine record's)


def cpu_model() -> str:
    return cpuinfo_field("model name") or platform.processor() or platform.machine() or "unknown"


def kernel_choices() -> dict[str, str | list[str]]:
    """Which kernel path this machine uses and the block types it interleaves at load, as recorded beside
    every measurement."""
    from specwise.kernels import kernel_status
    from specwise.kernels.gguf import interleaved_type_names, kernel_path

    try:
        gguf = kernel_path()
        layout = interleaved_type_names(gguf)
    except (RuntimeError, ValueError) as error:
        return {"bfloat16": kernel_status(), "gguf": str(error)}
    return {"bfloat16": kernel_status(), "gguf": gguf, "gguf_interleaved": layout}


def memory_bandwidth(gib: float = 1.0, repeats: int = 3) -> float:
    """Read bandwidth in GB/s: the best of a few sums over a buffer far larger than the caches, in memory
    backed by huge pages where the system allows, as the gguf format's weights are (kernels/gguf.py,
    huge_page_buffer): over 4 KiB pages the same sums read about a fifth slower (2 cores of an Intel Xeon,
    KVM: 24 against 30 GB/s), which would understate what a pass can read."""
    import torch

    from specwise.kernels.gguf import huge_page_buffer

    buffer = huge_page_buffer(int(gib * 2**30) // 4 * 4).view(torch.float32).fill_(1.0)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * 4 / best / 1e9


def machine_info(dtype: str | None = None) -> dict:
    import torch
    import transformers

    return {
        "cpu": cpu_model(),
        "cpu_flags": list(cpu_flags()),
        "kernels": kernel_choices(),
        "cores": usable_cores(),
        "torch_threads": torch.get_num_threads(),
        "dtype": dtype,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed: `specwise ...` when run through specwise's entry point or cli module.

    Read from sys.argv: the CLI's parsed options do not keep the words they came from.
    """
    args = sys.argv if argv is None else argv
    program = os.path.basename(args[0]) if args else ""
    if "bench" not in args[1:]:
        return "(not from the command line: " + shlex.join(args) + ")"
    if program in ("specwise", "cli.py", "__main__.py"):
        return "specwise " + shlex.join(args[1:])
    return shlex.join(args)


MIN_PROBE_SECONDS = 0.5  # shorter timings get no share (None)
CONTENDED = 0.05  # share of the machine's CPU time used by other processes above which a timing is flagged


def contended(record: dict) -> bool:
    """Whether a bench record was timed while other processes used more than CONTENDED of the CPU."""
    return (record.get("other_cpu") or 0.0) > CONTENDED


def _busy_jiffies() -> int | None:
    """Busy CPU time of the whole machine (all processes), in clock ticks, from /proc/stat."""
    ticks = cpu_ticks()
    return None if ticks is None else ticks[1] - ticks[0]


class CpuProbe:
    """How much CPU other processes used while we timed something.

    A timing on a 2-core machine is ruined by any other busy process (a thread of a
    parallel region gets descheduled and the others wait for it), so every benchmark
    record carries this share and the report flags contended ones.
    """

    def __init__(self) -> None:
        self._busy = _busy_jiffies()
        self._own = time.process_time()
        self._wall = time.perf_counter()

    def other_share(self) -> float | None:
        """Other processes' CPU time / (wall time x usable cores) since the probe started;
        None when that cannot be told (no /proc/stat, or under MIN_PROBE_SECONDS)."""
        busy = _busy_jiffies()
        if busy is None or self._busy is None:
            return None
        wall = time.perf_counter() - self._wall
        if wall < MIN_PROBE_SECONDS:  # /proc/stat counts in 10 ms ticks: too coarse to judge
            return None
        other = (busy - self._busy) / os.sysconf("SC_CLK_TCK") - (time.process_time() - self._own)
        return max(0.0, other) / (wall * (os.cpu_count() or 1))
