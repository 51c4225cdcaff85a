"""`llamacpp-generate`: llama.cpp's plain decoding of the GGUF file the target came from.

A yardstick, not a lossless method: llama.cpp runs the quantized GGUF weights
(Q4_K_M for the default target) with its own kernels, which is the absolute
speed a CPU user compares against. specwise's target is the bfloat16 model
prepared from the same file, so token identity is not expected and not checked.
Needs llama-cpp-python (optional: it compiles llama.cpp when installed).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from specwise.bench.types import MethodOutput
from specwise.config import SamplingParams

LLAMACPP_GENERATE = "llamacpp-generate"
FAMILY = "llamacpp"  # the harness does not compare its tokens with the target's


def gguf_path(model: str) -> Path:
    """The GGUF file of a registry model (assembled from its pinned packages if needed) or a .gguf path."""
    from specwise.models.catalog import KNOWN_MODELS
    from specwise.models.prepare import assemble_gguf
    from specwise.paths import gguf_dir

    if model in KNOWN_MODELS:
        path = gguf_dir() / KNOWN_MODELS[model].gguf_name
        return path if path.is_file() else assemble_gguf(model)
    path = Path(model)
    if path.suffix == ".gguf" and path.is_file():
        return path
    raise ValueError(f"llamacpp-generate needs a registry model or a .gguf file; {model!r} is neither")


class LlamaCppMethod:
    """Plain decoding through llama-cpp-python over the target's GGUF file."""

    family = FAMILY

    def __init__(self, model: str, eos_token_ids: Sequence[int], threads: int, context: int = 4096) -> None:
        try:
            import llama_cpp
        except ImportError:
            raise ValueError(
                "llamacpp-generate needs llama-cpp-python, which is not installed; it is an optional "
                "yardstick: `.venv/bin/pip install llama-cpp-python` (compiles llama.cpp, about 10-20 "
                "minutes on 2 cores), or leave llamacpp-generate out of --methods") from None
        path = gguf_path(model)
        self.label = LLAMACPP_GENERATE
        self.description = (f"llama.cpp {getattr(llama_cpp, '__version__', '?')} plain decoding of {path.name} "
                            f"(quantized weights: a speed yardstick, not the same model)")
        self.eos_token_ids = set(eos_token_ids)
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=context, n_threads=threads,
                                   n_threads_batch=threads, verbose=False)

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> MethodOutput:
        if sampling.greedy:
            options = dict(temp=0.0, top_k=1, top_p=1.0, min_p=0.0)
        else:
            options = dict(temp=sampling.temperature, top_k=sampling.top_k or 0,
                           top_p=sampling.top_p, min_p=0.0)
        stops = self.eos_token_ids | set(sampling.stop_token_ids)
        tokens: list[int] = []
        start = time.perf_counter()
        for token in self.llm.generate(list(prompt_ids), reset=True, repeat_penalty=sampling.repetition_penalty,
                                       **options):
            tokens.append(int(token))
            if token in stops and not sampling.ignore_eos or len(tokens) >= sampling.max_new_tokens:
                break
        seconds = time.perf_counter() - start
        return MethodOutput(tokens, seconds, len(tokens))
