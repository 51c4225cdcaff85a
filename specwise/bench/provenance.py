"""Where a published number came from: the code, the yardstick, the machine, the date and the command.

Every result file (`bench run`'s run.json, `bench cost`'s and `bench project`'s JSON, the server
comparison's results.json, the lab scripts' outputs) carries `provenance()`, so a ratio can be traced
to the commit that produced it and to the build of the llama.cpp it was divided by. Paths in a record
are written relative to the repository or to `$SPECWISE_HOME` (`portable`): a record says what ran,
not where one machine keeps its files.
"""

from __future__ import annotations

import datetime
import os
import subprocess
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[2]  # the checkout specwise runs from (editable install)


def code_version() -> dict:
    """specwise's version, and where it runs from a git checkout, its commit and whether the tracked
    files differ from it (`dirty`: the numbers then come from code no commit holds)."""
    from specwise import __version__

    described: dict = {"version": __version__, "commit": None, "dirty": None}
    if not (REPOSITORY / ".git").exists():
        return described
    try:
        commit = _git("rev-parse", "HEAD")
        status = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return described
    described.update(commit=commit, dirty=bool(status))
    return described


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPOSITORY), *args], check=True, capture_output=True, text=True,
                          timeout=30).stdout.strip()


def machine_summary(bandwidth: bool = True) -> dict:
    """The CPU (model, vendor, the flags the kernels choose by), usable cores and, where asked, the read
    bandwidth measured now (GB/s; it moves within an hour on a shared machine, so a record keeps its own)."""
    from specwise.kernels.cpu import cpu_flags, cpu_vendor, usable_cores
    from specwise.bench.machine import cpu_model

    family, model = cpu_family_model()
    described = {"cpu": cpu_model(), "vendor": cpu_vendor(), "family": family, "model": model,
                 "class": machine_class(), "flags": list(cpu_flags()), "cores": usable_cores()}
    if bandwidth:
        from specwise.bench.machine import memory_bandwidth

        described["read_bandwidth_gbs"] = round(memory_bandwidth(), 1)
    return described


def cpu_family_model() -> tuple[int | None, int | None]:
    from specwise.kernels.cpu import cpuinfo_field

    def number(name: str) -> int | None:
        value = cpuinfo_field(name)
        return int(value) if value is not None and value.isdigit() else None

    return number("cpu family"), number("model")


# AMD's family and model ranges of each Zen generation (a KVM guest often names its CPU just "AMD EPYC").
_ZEN = ((23, range(0x00, 0x30), "Zen"), (23, range(0x30, 0x100), "Zen 2"), (25, range(0x00, 0x10), "Zen 3"),
        (25, range(0x10, 0x20), "Zen 4"), (25, range(0x20, 0x60), "Zen 3"), (25, range(0x60, 0x100), "Zen 4"),
        (26, range(0x00, 0x100), "Zen 5"))


def machine_class() -> str:
    """The CPU as the docs name a machine class: "AMD EPYC Zen 4, AVX-512", "Intel Xeon, AMX", "..., AVX2 only"."""
    from specwise.kernels.cpu import cpu_flags, cpu_vendor
    from specwise.bench.machine import cpu_model

    flags = set(cpu_flags())
    isa = "AMX" if "amx_int8" in flags else "AVX-512" if "avx512f" in flags else \
        "AVX2 only" if "avx2" in flags else "no AVX2"
    family, model = cpu_family_model()
    name = cpu_model()
    if cpu_vendor() == "AuthenticAMD" and family is not None and model is not None:
        generation = next((g for f, models, g in _ZEN if f == family and model in models), None)
        if generation:
            name = ("AMD EPYC " if "EPYC" in name else "AMD ") + generation
    elif cpu_vendor() == "GenuineIntel" and "Xeon" in name:
        name = "Intel Xeon"
    return f"{name}, {isa}"


def provenance(command: str | None = None, yardsticks: list[dict] | None = None,
               bandwidth: bool = True) -> dict:
    """The record every result carries: code, machine, date, command and the yardsticks beside it."""
    return {
        "specwise": code_version(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": portable(command) if command is not None else None,
        "machine": machine_summary(bandwidth),
        "environment": environment(),
        "yardsticks": yardsticks or [],
    }


def _prefixes() -> tuple[tuple[str, str], ...]:
    from specwise.paths import specwise_home

    pairs = [(str(specwise_home().resolve()), "$SPECWISE_HOME"), (str(specwise_home()), "$SPECWISE_HOME"),
             (str(REPOSITORY), "."), (str(Path.cwd()), "."), (str(Path.home()), "~")]
    # Longest first, so a cache inside the home directory is named by the cache's variable.
    seen: dict[str, str] = {}
    for prefix, name in sorted(pairs, key=lambda pair: -len(pair[0])):
        if prefix not in ("", "/") and prefix not in seen:
            seen[prefix] = name
    return tuple(seen.items())


def portable(value: Any, prefixes: tuple[tuple[str, str], ...] | None = None) -> Any:
    """`value` (a string, or lists and dicts of them) with every absolute path under the repository,
    `$SPECWISE_HOME`, the working folder or the home folder written relative to it: `./results/x` for
    `/work/repo/results/x` becomes `results/x`, and a cached GGUF file `$SPECWISE_HOME/gguf/...`."""
    prefixes = _prefixes() if prefixes is None else prefixes
    if isinstance(value, str):
        for prefix, name in prefixes:
            if prefix in value:
                value = value.replace(prefix + "/", "" if name == "." else name + "/")
                value = value.replace(prefix, name)
        return value
    if isinstance(value, dict):
        return {key: portable(item, prefixes) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(item, prefixes) for item in value]
    return value


def environment() -> dict[str, str]:
    """The SPECWISE_* variables set for the run (kernel and thread switches change the numbers), less
    the cache's location, which changes none."""
    return {name: value for name, value in sorted(os.environ.items())
            if name.startswith("SPECWISE_") and name != "SPECWISE_HOME"}
