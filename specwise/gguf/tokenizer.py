"""A GGUF file's tokenizer and chat template: built by transformers from the file's metadata once,
then kept in the cache.

transformers builds a tokenizer from the vocabulary, merges, special tokens and chat template a
GGUF file holds (`from_pretrained(..., gguf_file=...)`). Named by its model type, the tokenizer
class reads only those keys (seconds); left to guess the class, transformers first parses the
whole file's metadata for a config (tens of seconds). Either way it is seconds per start, so the
result is saved under `<home>/tokenizers/<key>/`, keyed by a hash of the file's header (every
metadata value and the tensor table, which is all a tokenizer can depend on) and of the
transformers and tokenizers versions that built it. A later start loads the saved files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from specwise.gguf.file import GGUFDamagedError, GGUFFormatError, GGUFHeader, read_header
from specwise.paths import tokenizers_dir

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MARKER = "specwise-tokenizer.json"
_CHUNK = 8 << 20


def _versions() -> dict[str, str]:
    import tokenizers
    import transformers

    return {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__}


def tokenizer_key(path: str | Path, header: GGUFHeader | None = None) -> str:
    """The cache key of a GGUF file's tokenizer: its header's bytes and the building libraries' versions."""
    path = Path(path)
    header = header or read_header(path)
    digest = hashlib.sha256(json.dumps(_versions(), sort_keys=True).encode())
    remaining = header.data_offset
    with open(path, "rb") as handle:
        while remaining > 0 and (chunk := handle.read(min(_CHUNK, remaining))):
            digest.update(chunk)
            remaining -= len(chunk)
    return digest.hexdigest()[:24]


def cached_tokenizer_dir(path: str | Path, header: GGUFHeader | None = None) -> Path:
    """Where the tokenizer of this GGUF file is (or would be) kept."""
    return tokenizers_dir() / tokenizer_key(path, header)


def _is_ready(directory: Path) -> bool:
    return (directory / MARKER).is_file()


def _build(path: Path, model_type: str | None) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    typed = {"tokenizer_type": model_type} if model_type in TOKENIZER_MAPPING_NAMES else {}
    try:
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, **typed)
    except (ValueError, KeyError, IndexError, OSError, TypeError) as error:
        lines = str(error).strip().splitlines()
        raise GGUFFormatError(f"{path.name}: transformers could not build a tokenizer from the file's metadata "
                              f"({type(error).__name__}: {lines[0] if lines else ''})") from error


def gguf_tokenizer(path: str | Path, *, header: GGUFHeader | None = None,
                   model_type: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer (with its chat template) of a GGUF file, from the cache or built and cached now.

    model_type: transformers' model type of the file (by default from its metadata,
    specwise.gguf.config), which picks the tokenizer class without a parse of the whole
    file. What is returned is always the saved copy read back, so a first start and a later one
    tokenize alike.
    """
    from transformers import AutoTokenizer

    from specwise.gguf.config import config_values

    path = Path(path)
    header = header or read_header(path)
    directory = cached_tokenizer_dir(path, header)
    if not _is_ready(directory):
        if model_type is None:
            try:
                model_type = config_values(header, path)[0]
            except GGUFDamagedError:  # a special token id outside the vocabulary, among others
                raise
            except GGUFFormatError:  # an architecture specwise does not read: transformers guesses the class
                pass
        tokenizer = _build(path, model_type)
        directory.parent.mkdir(parents=True, exist_ok=True)
        scratch = directory.with_name(f".{directory.name}.partial-{os.getpid()}")
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            tokenizer.save_pretrained(scratch)
            marker = {"source": str(path.resolve()), "size": path.stat().st_size,
                      "class": type(tokenizer).__name__, "tokens": len(tokenizer),
                      "has_chat_template": bool(getattr(tokenizer, "chat_template", None)), **_versions()}
            (scratch / MARKER).write_text(json.dumps(marker, indent=2) + "\n")  # last: it makes the copy count
            if directory.exists() and not _is_ready(directory):
                shutil.rmtree(directory, ignore_errors=True)  # not a copy this module finished
            try:
                os.replace(scratch, directory)
            except OSError:  # another process kept the same tokenizer first: its copy is as good
                if not _is_ready(directory):
                    raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return AutoTokenizer.from_pretrained(directory)
