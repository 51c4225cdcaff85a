"""`llamacpp-generate`: llama.cpp's plain decoding of the GGUF file the target came from.

A yardstick: llama.cpp runs the GGUF weights (Q4_K_M for the default target) with
its own kernels, which is the absolute speed a CPU user compares against. Its
arithmetic is not specwise's (other summation orders, its own attention), so the
harness does not hold its tokens to the target's; `scripts/lab/llamacpp_agreement.py`
reports where they part. Needs llama-cpp-python (`scripts/install.sh --llamacpp`).

On a CPU with AMX, llama.cpp repacks the weights for its AMX matrix kernels, and the pinned build
crashes (a segmentation fault) on the first pass of more than one row there (llama.cpp issue
#20824, reported for Q4_K_M files). `open_llama` then loads the file without its repacked buffer
types, as `llama-server --no-repack` does: the llama.cpp a user of that CPU can run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from specwise.bench.types import MethodOutput
from specwise.kernels.cpu import cpu_flags
from specwise.config import SamplingParams
from specwise.models.prepare import gguf_file

LLAMACPP_GENERATE = "llamacpp-generate"
# What open_llama's models lack on this CPU, for the descriptions beside their numbers ("" where nothing).
NO_REPACK_NOTE = "weight repacking off (its AMX kernels crash on this CPU)"
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
                            f"(quantized weights: a speed yardstick, not the same model"
                            f"{'; ' + NO_REPACK_NOTE if repacking_crashes() else ''})")
        self.eos_token_ids = set(eos_token_ids)
        self.llm = open_llama(str(path), n_ctx=context, n_threads=threads, n_threads_batch=threads)

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
        self.library = (f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')}"
                        f"{', ' + NO_REPACK_NOTE if repacking_crashes() else ''}")
        self.llm = open_llama(str(gguf_file(model)), n_ctx=max_context + 8, n_batch=512, n_threads=threads,
                              n_threads_batch=threads, logits_all=True)
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


def repacking_crashes() -> bool:
    """Whether llama.cpp would repack the weights for its AMX kernels here (see the module's note)."""
    return "amx_int8" in cpu_flags()


def open_llama(path: str, **options):
    """llama_cpp.Llama over the file at `path` (quiet), without weight repacking where that crashes."""
    llama_cpp = _import_llama_cpp()
    if not repacking_crashes():
        return llama_cpp.Llama(model_path=path, verbose=False, **options)
    # llama-cpp-python has no argument for it: Llama() takes its model parameters from this function.
    api = llama_cpp.llama_cpp
    defaults = api.llama_model_default_params

    def without_repacking():
        params = defaults()
        params.use_extra_bufts = False
        return params

    api.llama_model_default_params = without_repacking
    try:
        return llama_cpp.Llama(model_path=path, verbose=False, **options)
    finally:
        api.llama_model_default_params = defaults


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
