"""The dense format's copy of a GGUF file: a bfloat16 safetensors model directory in the cache.

Only the dense format needs it (the gguf format runs the file as stored).

1. convert (once): load the GGUF through transformers (which dequantizes it), rebuild a
   plain model from the same config without the GGUF quantization config (transformers
   refuses `save_pretrained` on a GGUF-loaded model), cast to bfloat16, and save it with its
   tokenizer and chat template as safetensors.
2. mark: write `specwise-prepared.json` last, then move the directory into place, so a
   half-prepared directory is never taken as ready.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from specwise.errors import ModelError
from specwise.store.progress import stage

MARKER = "specwise-prepared.json"
MARKER_FORMAT = 1


def read_marker(directory: Path) -> dict[str, Any] | None:
    """The preparation marker of a directory, or None if it is not (fully) prepared."""
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or not (directory / "config.json").is_file():
        return None
    return marker


def is_ready(directory: Path, sha256: str) -> bool:
    """Whether `directory` holds a finished dense copy of the file whose sha256 is given."""
    marker = read_marker(directory)
    return marker is not None and marker.get("source", {}).get("sha256") == sha256


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def _convert_gguf(gguf_path: Path, out_dir: Path, *, progress: bool) -> dict[str, Any]:
    """Load `gguf_path` through transformers and save it as a bfloat16 safetensors model directory."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GgufConfig
    from transformers.utils import logging as hf_logging

    from specwise.gguf.tokenizer import gguf_tokenizer

    dtype = torch.bfloat16
    bars_were_on = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        stage(f"loading the tokenizer from {gguf_path.name}", progress)
        tokenizer = gguf_tokenizer(gguf_path)  # the gguf format's own: built once, kept in the cache
        stage(f"loading and dequantizing {gguf_path.name}", progress)
        # dequantize=True says what we want (dense weights) whichever GGUF path transformers takes.
        loaded = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=dtype, quantization_config=GgufConfig(dequantize=True)
        )
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()

    # The loaded model's weights are already dense, but it still carries the GGUF
    # quantizer, and transformers refuses to save such a model: rebuild a plain one.
    stage("rebuilding a plain model from the config", progress)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # only skips a random init that load_state_dict overwrites anyway
        from contextlib import nullcontext as no_init_weights
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # no_init_weights also skips the tying that config.tie_word_embeddings asks for
    state = loaded.state_dict()
    model.load_state_dict(state, strict=True)
    for key, tensor in model.state_dict().items():
        if not torch.equal(tensor, state[key]):
            raise ModelError(f"{gguf_path.name}: weight {key} changed while rebuilding the model")
    model.generation_config = copy.deepcopy(loaded.generation_config)
    tied = model.get_output_embeddings() is not None and (
        model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    )
    del loaded, state

    stage(f"saving safetensors and tokenizer to {out_dir}", progress)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "architecture": config.model_type,
        "config_vocab_size": config.vocab_size,
        "tokenizer_len": len(tokenizer),
        "tied_embeddings": tied,
        "has_chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }


def build_dense_copy(gguf_path: Path, target: Path, source: dict[str, Any], *, progress: bool) -> Path:
    """Convert into a scratch directory beside `target`, mark it last, then move it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        started = time.perf_counter()
        try:
            details = _convert_gguf(gguf_path, scratch, progress=progress)
        except ModelError:
            raise
        except (ValueError, KeyError, OSError, RuntimeError, NotImplementedError) as error:
            raise ModelError(f"could not convert {gguf_path.name} with transformers ({_one_line(error)})") from error
        marker = {
            "format": MARKER_FORMAT,
            "name": target.name,
            "source": source,
            **details,
            "convert_seconds": round(time.perf_counter() - started, 1),
            "prepared_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        # Written last: its presence is what makes the directory count as prepared.
        (scratch / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    stage(f"prepared {target}", progress)
    return target
