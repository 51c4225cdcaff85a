"""Load a model by registry name, local directory or GGUF file, once per process."""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers.utils import logging as hf_logging
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from specwise.device import DeviceError, resolve_device
from specwise.runners.protocols import ModelRunner, RollbackError
from specwise.runners.hf import HFRunner

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from specwise.gguf.file import GGUFHeader

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32,
          "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
          "float64": torch.float64}


@dataclass
class LoadedModel:
    """A model, its tokenizer and where it came from."""

    name: str
    path: Path | None  # the model directory (dense) or the GGUF file (gguf); None for a model made in memory
    model: torch.nn.Module  # transformers' model; for the gguf format a GGUFCausalLM (see hf_model)
    tokenizer: PreTrainedTokenizerBase | None
    format: str = "dense"  # "dense": a model directory in its dtype; "gguf": the GGUF file's blocks as stored

    def runner(self, kind: str = "hf", *, compile_step: bool = False) -> ModelRunner:
        """A fresh runner (own KV cache) over the shared weights.

        kind: "hf" (Hugging Face forward, any causal LM), "lean" (specwise.runners.lean: the
        architectures of specwise.runners.architectures only, faster), or "auto" (lean where
        supported, else hf).
        compile_step: the lean runner's scoring step through torch.compile
        (specwise.runners.torch_step); refused where the runner would not be lean.
        """
        from specwise.runners.lean import LeanRunner, UnsupportedModelError

        if kind not in ("hf", "lean", "auto"):
            raise ValueError(f"runner must be 'auto', 'hf' or 'lean'; got {kind!r}")
        if compile_step and kind == "hf":
            raise ValueError("compile_step compiles the lean runner's step; use runner 'lean' or 'auto' with it")
        if kind == "hf":
            return HFRunner(self.hf_model)
        make = LeanRunner
        if compile_step:
            from specwise.runners.torch_step import CompiledLeanRunner as make
        if kind == "lean":
            return make(self.model)
        try:
            return make(self.model)
        except (UnsupportedModelError, RollbackError):
            if compile_step:
                raise
            return HFRunner(self.hf_model)

    @property
    def hf_model(self) -> PreTrainedModel:
        """The model as transformers' model: the gguf format's own module tree builds it on first use,
        over the same blocks (specwise.gguf.model.GGUFCausalLM)."""
        build = getattr(self.model, "hf_model", None)
        return build() if callable(build) else self.model

    def runs(self, module: torch.nn.Module) -> bool:
        """Whether a runner's model is this model (itself, or the transformers model built over it)."""
        return module is self.model or module is getattr(self.model, "built_hf_model", None)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def weights(self) -> str:
        """What the weights are, for cost tables and reports: "gguf", or the dense dtype ("bfloat16", ...)."""
        return "gguf" if self.format == "gguf" else str(self.dtype).removeprefix("torch.")


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """bfloat16 by default: on these CPUs it is much faster than float32 for LMs."""
    if dtype is None:
        return torch.bfloat16
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(sorted(DTYPES))}; got {dtype!r}")
    return DTYPES[dtype]


FORMATS = ("dense", "gguf")
_LOADED: dict[tuple[str, torch.dtype, str | None, str, str], LoadedModel] = {}
_LOCK = threading.Lock()


def load_model(name_or_path: str | os.PathLike, dtype: str | torch.dtype | None = None,
               quantize: str | None = None, format: str = "dense",
               device: str | torch.device | None = "cpu") -> LoadedModel:
    """Load (and cache for the process) a model: registry name, HF directory, .gguf file or a GGUF
    file another tool keeps (`ollama:NAME[:TAG]`, `lmstudio:NAME`, `hf:ORG/NAME[/FILE.gguf]`).

    device: where the weights go ("cpu", "cuda", "cuda:N" or "auto"; specwise.device). The
    gguf format and int8 quantization run on specwise's CPU kernels, so on the CPU only.

    format="gguf" runs the GGUF file's blocks as stored (specwise.gguf.model): config,
    tokenizer and chat template come from the file's metadata, nothing is converted, and
    activations are float32 (`dtype` does not apply). "dense" loads the model in `dtype` from a
    model directory, or, for a GGUF source, from its bfloat16 copy, written into the cache the
    first time it is asked for (specwise.store.prepare). quantize="int8" gives int8
    weight-only linear layers: for drafters only (specwise.runners.int8 explains why never
    for a target).
    """
    from specwise.runners.int8 import QUANTIZERS

    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}; got {format!r}")
    torch_dtype = torch.float32 if format == "gguf" else resolve_dtype(dtype)
    if quantize is not None and quantize not in QUANTIZERS:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZERS)} or None; got {quantize!r}")
    if quantize is not None and format == "gguf":
        raise ValueError("a model in the gguf format runs its stored blocks; it is not quantized again")
    place = resolve_device(device)
    if place.type != "cpu" and (format == "gguf" or quantize is not None):
        what = "the gguf format" if format == "gguf" else f"quantize={quantize!r}"
        raise DeviceError(f"{what} runs on specwise's CPU kernels, not on {place}; load the model dense "
                          "(format='dense', no quantize) there, or on device 'cpu'")
    key = (str(name_or_path), torch_dtype, quantize, format, str(place))
    with _LOCK:
        if key not in _LOADED:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            hf_logging.disable_progress_bar()  # per-tensor bars; loading a model takes seconds
            loaded = _load_gguf(name_or_path) if format == "gguf" else _load_dense(name_or_path, torch_dtype)
            if quantize is not None:
                loaded.model = QUANTIZERS[quantize](loaded.model)
            loaded.model = loaded.model.to(place).eval()
            _LOADED[key] = loaded
        return _LOADED[key]


def _load_gguf(name_or_path: str | os.PathLike) -> LoadedModel:
    """The GGUF file's blocks as stored, with the config and tokenizer its metadata holds."""
    from specwise.gguf.config import gguf_config
    from specwise.gguf.file import read_header
    from specwise.gguf.model import load_gguf_model
    from specwise.store.prepare import gguf_file  # the registry pulls in packaging code

    path = gguf_file(name_or_path)
    header = read_header(path)
    check_runs_as_stored(header, path)  # before a tokenizer is built for a file that cannot run
    config = gguf_config(path, header)
    tokenizer = _gguf_tokenizer(path, header, config.model_type)
    release_freed_memory()  # the tokenizer's parse garbage goes back before the weights are read
    return LoadedModel(name=str(name_or_path), path=path, model=load_gguf_model(path, config),
                       tokenizer=tokenizer, format="gguf")


def _load_dense(name_or_path: str | os.PathLike, dtype: torch.dtype) -> LoadedModel:
    from transformers import AutoModelForCausalLM  # its import alone is 120 MB: dense models only

    from specwise.store.prepare import dense_model_dir

    path = dense_model_dir(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(path)  # first: its parse's garbage goes back below
    release_freed_memory()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return LoadedModel(name=str(name_or_path), path=path, model=model, tokenizer=tokenizer)


def check_runs_as_stored(header: GGUFHeader, path: Path) -> None:
    """Refuse, naming it, a file whose architecture the gguf format does not run."""
    from specwise.gguf.config import ARCHITECTURE_KEYS
    from specwise.gguf.file import GGUFFormatError
    from specwise.gguf.model import ARCHITECTURES

    runs = [name for name, keys in ARCHITECTURE_KEYS.items() if keys.model_type in ARCHITECTURES]
    architecture = header.metadata.get("general.architecture")
    if isinstance(architecture, str) and architecture not in runs:  # none at all: gguf_config names that
        raise GGUFFormatError(
            f"{path.name}: the {architecture} architecture does not run as stored (the gguf format runs "
            f"{', '.join(runs)}); `--target-format dense` runs it through transformers from a bfloat16 "
            f"copy written into the cache, and `specwise models inspect {path}` shows what the file holds")


def release_freed_memory() -> None:
    """Give the C heap's free pages back to the system (glibc; elsewhere nothing happens).

    Reading a tokenizer frees some 50-100 MB of parse temporaries that glibc keeps for reuse, but
    weights are allocated in large blocks of their own that never reuse them, so without this the
    process keeps that memory resident for its whole life (docs/BENCHMARKS.md, "Memory").
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def load_tokenizer(name_or_path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """A model's tokenizer alone, without its weights: from the GGUF file's metadata for a known
    model, a found file or a .gguf file (specwise.gguf.tokenizer), else from the model directory."""
    from specwise.store.catalog import KNOWN_MODELS
    from specwise.errors import ModelError
    from specwise.store.prepare import gguf_file, resolve_model

    if has_gguf_source(name_or_path):
        try:
            return _gguf_tokenizer(gguf_file(name_or_path))
        except ModelError:
            if os.fspath(name_or_path) not in KNOWN_MODELS:
                raise  # a known model's dense copy holds the same tokenizer, when its packages are gone
    return AutoTokenizer.from_pretrained(resolve_model(name_or_path))


_TOKENIZERS: dict[str, PreTrainedTokenizerBase] = {}
_TOKENIZERS_LOCK = threading.Lock()


def _gguf_tokenizer(path: Path, header: GGUFHeader | None = None,
                    model_type: str | None = None) -> PreTrainedTokenizerBase:
    """A GGUF file's tokenizer, read once per process (a drafter's is read for the vocabulary check
    before the drafter itself is loaded)."""
    from specwise.gguf.tokenizer import gguf_tokenizer

    stat = path.stat()
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"  # a file written anew is read anew
    with _TOKENIZERS_LOCK:
        if key not in _TOKENIZERS:
            _TOKENIZERS[key] = gguf_tokenizer(path, header=header, model_type=model_type)
        return _TOKENIZERS[key]


def has_gguf_source(name_or_path: str | os.PathLike) -> bool:
    """Whether a model comes from a GGUF file (a known model, a file another tool keeps or a .gguf
    path), so it can run as stored."""
    from specwise.store.catalog import KNOWN_MODELS
    from specwise.store.found import is_found_name

    text = os.fspath(name_or_path)
    return text in KNOWN_MODELS or is_found_name(text) or Path(text).suffix.lower() == ".gguf"
