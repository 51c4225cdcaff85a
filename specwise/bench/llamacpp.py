"""`llamacpp-generate`: llama.cpp's plain decoding of the GGUF file the target came from.

A yardstick: llama.cpp runs the GGUF weights (Q4_K_M for the default target) with
its own kernels, which is the absolute speed a CPU user compares against. Its
arithmetic is not specwise's (other summation orders, its own attention), so the
harness does not hold its tokens to the target's; `scripts/lab/llamacpp_agreement.py`
reports where they part. Needs llama-cpp-python (`scripts/install.sh --llamacpp`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from specwise.bench.types import MethodOutput
from specwise.config import SamplingParams
from specwise.models.prepare import gguf_file

LLAMACPP_GENERATE = "llamacpp-generate"
FAMILY = "llamacpp"  # the harness does not compare its tokens with the target's


class LlamaCppMethod:
    """Plain decoding through llama-cpp-python over the target's GGUF file."""

    family = FAMILY
    weights = "gguf"

    def __init__(self, model: str, eos_token_ids: Sequence[int], threads: int, context: int = 4096) -> None:
        llama_cpp = _import_llama_cpp()
        path = gguf_file(model)
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
        llama_cpp = _import_llama_cpp()
        self.model, self.threads, self.max_context = model, threads, max_context
        self.library = f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')}"
        self.llm = llama_cpp.Llama(model_path=str(gguf_file(model)), n_ctx=max_context + 8,
                                   n_batch=512, n_threads=threads, n_threads_batch=threads, logits_all=True,
                                   verbose=False)
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
                "library": self.library, "machine": machine_info("gguf")}


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
