"""`ikllamacpp-generate`: ik_llama.cpp's plain decoding of the target's GGUF file, a second yardstick.

ik_llama.cpp is the CPU-focused fork of llama.cpp; at load it can repack the weights into its
row-interleaved `_R4`/`_R8` layouts (run-time repacking), which lead mainline on prompt reading.
The registries carry it as `ik-llama-cpp-python` (`scripts/install.sh --ikllamacpp`), a prebuilt
AVX2 build: on an AVX2-only CPU it is the fork at its best; on an AVX-512 CPU it leaves that
instruction set unused, which every description says. Greedy decoding only (the benchmark's
yardsticks are greedy): the argmax of its logits, ties to the lowest id as in llama.cpp.
"""

from __future__ import annotations

import ctypes
import re
import time
from collections.abc import Sequence

from specwise.bench.llamacpp import buffer_sizes
from specwise.bench.types import MethodOutput
from specwise.config import SamplingParams
from specwise.kernels.cpu import cpu_flags, cpuinfo_field
from specwise.store.prepare import gguf_file

IKLLAMACPP_GENERATE = "ikllamacpp-generate"
FAMILY = "llamacpp"  # a yardstick: the harness does not hold its tokens to the target's


def _import():
    try:
        import ik_llama_cpp
        from ik_llama_cpp import _ctypes_api
    except ImportError:
        raise ValueError("ikllamacpp-generate needs ik-llama-cpp-python: bash scripts/install.sh --ikllamacpp "
                         "(a prebuilt AVX2 build, no compiler needed)") from None
    return ik_llama_cpp, _ctypes_api


def build_note() -> str:
    """What the prebuilt wheel leaves unused on this CPU ("" where nothing)."""
    return "an AVX2 build: AVX-512 unused on this CPU" if "avx512f" in cpu_flags() else "an AVX2 build"


class IkLlamaCppMethod:
    """Plain greedy decoding through ik_llama.cpp, weights repacked at load (its best CPU setting)."""

    family = FAMILY
    weights = "gguf"

    def __init__(self, model: str, eos_token_ids: Sequence[int], threads: int, context: int = 4096) -> None:
        import numpy as np

        package, api = _import()
        self._np, self._api = np, api
        path = gguf_file(model)
        api.llama_backend_init()
        params = api.llama_model_default_params()
        params.use_mmap = False  # run-time repacking rewrites the weights in memory
        params.repack_tensors = True
        lines: list[str] = []
        # Its load log, kept for the record rather than printed (the bindings leave llama_log_set unbound).
        log_callback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(
            lambda level, text, user_data: lines.append(text.decode("utf-8", "replace")))
        set_log = api._lib.llama_log_set
        set_log.argtypes, set_log.restype = [ctypes.c_void_p, ctypes.c_void_p], None
        set_log(ctypes.cast(log_callback, ctypes.c_void_p), None)
        self._log_callback = log_callback  # alive as long as the library may call it
        self._model = api.llama_model_load_from_file(str(path).encode(), params)
        log = "".join(lines)
        repacked = re.search(r"Repacked (\d+) tensors", log)
        if not self._model:
            raise ValueError(f"ik_llama.cpp could not load {path}")
        context_params = api.llama_context_default_params()
        context_params.n_ctx = context
        context_params.n_batch = context
        context_params.n_threads = context_params.n_threads_batch = threads
        # Its flash attention asserts on long prompts without AVX-VNNI (ik-llama-cpp-python's own note).
        context_params.flash_attn = "avx_vnni" in (cpuinfo_field("flags") or "").split()
        self._context = api.llama_init_from_model(self._model, context_params)
        if not self._context:
            raise ValueError(f"ik_llama.cpp could not make a context of {context} tokens for {path}")
        self._ubatch = api.llama_n_ubatch(self._context)
        self._vocab = api.llama_vocab_n_tokens(api.llama_model_get_vocab(self._model))
        self.eos_token_ids = set(eos_token_ids)
        version = getattr(package, "__version__", "?")
        self.label = IKLLAMACPP_GENERATE
        self.yardstick = {"name": "ik_llama.cpp", "package": "ik-llama-cpp-python", "version": version,
                          "build": {"prebuilt": True, "note": build_note()}, "repack_tensors": True,
                          "repacked_tensors": int(repacked.group(1)) if repacked else 0,
                          "buffers": buffer_sizes(log.replace("buffer size", "model buffer size"))}
        self.description = (f"ik_llama.cpp (ik-llama-cpp-python {version}, {build_note()}; weights repacked at "
                            f"load) plain decoding of {path.name} (quantized weights: a speed yardstick, not "
                            "the same model)")

    def _decode(self, tokens: Sequence[int], start: int) -> None:
        from ik_llama_cpp._internals import make_batch_range

        for offset in range(0, len(tokens), self._ubatch):
            chunk = list(tokens[offset:offset + self._ubatch])
            batch = make_batch_range(chunk, pos_start=start + offset,
                                     logits_last=offset + len(chunk) == len(tokens))
            try:
                code = self._api.llama_decode(self._context, batch)
            finally:
                self._api.llama_batch_free(batch)
            if code != 0:
                raise RuntimeError(f"ik_llama.cpp's llama_decode failed ({code}) at position {start + offset}")

    def _argmax(self) -> int:
        logits = self._api.llama_get_logits_ith(self._context, -1)
        return int(self._np.ctypeslib.as_array(logits, shape=(self._vocab,)).argmax())

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> MethodOutput:
        if not sampling.greedy:
            raise ValueError("ikllamacpp-generate decodes greedily only (temperature 0)")
        stops = self.eos_token_ids | set(sampling.stop_token_ids)
        tokens: list[int] = []
        start = time.perf_counter()
        self._api.llama_kv_cache_clear(self._context)  # every generation reads its whole prompt
        self._decode(prompt_ids, 0)
        position = len(prompt_ids)
        while True:
            token = self._argmax()
            tokens.append(token)
            if token in stops and not sampling.ignore_eos or len(tokens) >= sampling.max_new_tokens:
                break
            self._decode([token], position)
            position += 1
        return MethodOutput(tokens, time.perf_counter() - start, len(tokens))

    def __del__(self) -> None:
        api = getattr(self, "_api", None)
        if api is not None:
            if getattr(self, "_context", None):
                api.llama_free(self._context)
            if getattr(self, "_model", None):
                api.llama_free_model(self._model)


def ikllamacpp_available() -> bool:
    try:
        _import()
    except ValueError:
        return False
    return True
