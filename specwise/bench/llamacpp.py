"""`llamacpp-generate`: llama.cpp's plain decoding of the GGUF file the target came from.

A yardstick: llama.cpp runs the GGUF weights (Q4_K_M for the default target) with
its own kernels, which is the absolute speed a CPU user compares against. Its
arithmetic is not specwise's (other summation orders, its own attention), so the
harness does not hold its tokens to the target's; `scripts/lab/llamacpp_agreement.py`
reports where they part. Needs llama-cpp-python (`scripts/install.sh --llamacpp`).

llama.cpp runs at its best: the build of scripts/llamacpp_flags.sh (native; on CPUs with AMX,
without the AMX kernels, whose weight repacking crashes the pinned llama.cpp there) and its
default model parameters, so its CPU_REPACK buffer type (interleaved weight layouts) is on.
Every description names the package version, the build flags, the features llama.cpp reports
and the buffer types it allocated at load (`yardstick`), so a ratio can be checked against the
llama.cpp it was divided by.
"""

from __future__ import annotations

import ctypes
import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from specwise.bench.types import MethodOutput
from specwise.kernels.cpu import cpu_flags
from specwise.config import SamplingParams
from specwise.store.prepare import gguf_file

LLAMACPP_GENERATE = "llamacpp-generate"
FAMILY = "llamacpp"  # the harness does not compare its tokens with the target's
BUILD_RECORD = "llama-cpp-python.build"  # in the environment's prefix, written by scripts/install.sh --llamacpp


class LlamaCppMethod:
    """Plain decoding through llama-cpp-python over the target's GGUF file."""

    family = FAMILY
    weights = "gguf"

    def __init__(self, model: str, eos_token_ids: Sequence[int], threads: int, context: int = 4096) -> None:
        path = gguf_file(model)
        self.label = LLAMACPP_GENERATE
        self.eos_token_ids = set(eos_token_ids)
        self.llm, self.yardstick = open_llama(str(path), n_ctx=context, n_threads=threads, n_threads_batch=threads)
        self.description = (f"{describe(self.yardstick)}: plain decoding of {path.name} "
                            "(quantized weights: a speed yardstick, not the same model)")

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> MethodOutput:
        if sampling.greedy:
            options = dict(temp=0.0, top_k=1, top_p=1.0, min_p=0.0)
        else:
            options = dict(temp=sampling.temperature, top_k=sampling.top_k or 0,
                           top_p=sampling.top_p, min_p=0.0)
        stops = self.eos_token_ids | set(sampling.stop_token_ids)
        tokens: list[int] = []
        start = time.perf_counter()
        # generate() reuses the cache of a prompt prefix it has seen, even with reset=True: forget it,
        # so that every generation reads its whole prompt (as specwise's methods do).
        self.llm.reset()
        for token in self.llm.generate(list(prompt_ids), reset=True, repeat_penalty=sampling.repetition_penalty,
                                       **options):
            tokens.append(int(token))
            if token in stops and not sampling.ignore_eos or len(tokens) >= sampling.max_new_tokens:
                break
        seconds = time.perf_counter() - start
        return MethodOutput(tokens, seconds, len(tokens))


class LlamaCppPasses:
    """llama.cpp on the model's GGUF file as a pass timer for `specwise.bench.cost.measure_side_by_side`:
    n new tokens evaluated with logits for every row (what scoring a draft block needs), each time after
    llama.cpp's own eval drops the cache entries past the context."""

    def __init__(self, model: str, threads: int, max_context: int) -> None:
        self.model, self.threads, self.max_context = model, threads, max_context
        self.llm, self.yardstick = open_llama(str(gguf_file(model)), n_ctx=max_context + 8, n_batch=512,
                                              n_threads=threads, n_threads_batch=threads, logits_all=True)
        self.library = describe(self.yardstick)
        self.vocab = min(self.llm.n_vocab(), 150000)
        self.context = 0

    def start(self, context_ids: list[int]) -> None:
        self.llm.reset()
        self.llm.eval(context_ids)
        self.context = len(context_ids)

    def time(self, ids: list[int]) -> float:
        self.llm.n_tokens = self.context  # eval removes the cache entries past this point first
        start = time.perf_counter()
        self.llm.eval(ids)
        return time.perf_counter() - start

    def describe(self) -> dict:
        from specwise.bench.machine import machine_info

        return {"model": self.model, "runner": "llama.cpp", "dtype": "gguf", "threads": self.threads,
                "library": self.library, "yardstick": self.yardstick, "machine": machine_info("gguf")}


def build_record() -> dict | None:
    """How the installed llama-cpp-python was built (scripts/install.sh --llamacpp records it), or None."""
    path = Path(sys.prefix) / BUILD_RECORD
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def system_info() -> str:
    """The features llama.cpp reports for this build and CPU ("CPU : SSE3 = 1 | ... | REPACK = 1 | ...")."""
    return _import_llama_cpp().llama_print_system_info().decode("utf-8", "replace").strip()


def check_build(info: str) -> None:
    """Refuse a build that would crash here: the AMX kernels of the pinned llama.cpp, on a CPU with AMX."""
    if "amx_int8" in cpu_flags() and re.search(r"\bAMX_INT8 = 1\b", info):
        raise ValueError(
            "the installed llama-cpp-python was built with llama.cpp's AMX kernels, whose weight repacking "
            "crashes the pinned version on this CPU; build it without them: bash scripts/install.sh --llamacpp "
            "(scripts/llamacpp_flags.sh picks the flags)")


def buffer_sizes(log: str) -> dict[str, float]:
    """MiB of each buffer type llama.cpp allocated for the weights, from its load log
    ("load_tensors:   CPU_REPACK model buffer size =   596.00 MiB")."""
    sizes: dict[str, float] = {}
    for name, mib in re.findall(r"(\S+) model buffer size\s*=\s*([\d.]+) MiB", log):
        sizes[name] = sizes.get(name, 0.0) + float(mib)
    return sizes


def describe(yardstick: dict) -> str:
    """One line for a description: version, build flags, buffer types."""
    build = yardstick.get("build") or {}
    flags = build.get("cmake_args") or "build flags not recorded"
    buffers = ", ".join(f"{name} {mib:.0f} MiB" for name, mib in yardstick.get("buffers", {}).items())
    return f"llama.cpp (llama-cpp-python {yardstick.get('version', '?')}; {flags}; buffers: {buffers or '?'})"


def open_llama(path: str, **options) -> tuple:
    """llama_cpp.Llama over the file at `path` with its default model parameters (repacking on), quiet,
    and the yardstick's record: version, build, reported features and the buffer types it allocated."""
    llama_cpp = _import_llama_cpp()
    info = system_info()
    check_build(info)
    lines: list[str] = []

    @llama_cpp.llama_log_callback
    def capture(level: int, text: bytes, user_data) -> None:  # the load log, kept rather than printed
        lines.append(text.decode("utf-8", "replace"))

    llama_cpp.llama_log_set(capture, ctypes.c_void_p(0))
    try:
        llm = llama_cpp.Llama(model_path=path, verbose=False, **options)
    finally:
        from llama_cpp import _logger

        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
    yardstick = {"name": "llama.cpp", "package": "llama-cpp-python", "version": getattr(llama_cpp, "__version__", "?"),
                 "build": build_record(), "system_info": info, "buffers": buffer_sizes("".join(lines))}
    return llm, yardstick


def llamacpp_available() -> bool:
    try:
        _import_llama_cpp()
    except ValueError:
        return False
    return True


def _import_llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        raise ValueError(
            "llama.cpp is an optional yardstick and llama-cpp-python is not installed: "
            "`bash scripts/install.sh --llamacpp` builds it (compiles llama.cpp, 5-15 minutes on 2 cores)"
        ) from None
    return llama_cpp
