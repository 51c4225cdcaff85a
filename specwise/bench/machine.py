"""What a measurement ran on: CPU, cores, threads, library versions, the command line."""

from __future__ import annotations

import os
import platform
import shlex
import sys


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_info(dtype: str | None = None) -> dict:
    import torch
    import transformers

    return {
        "cpu": cpu_model(),
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
