"""The served models described as Ollama's /api/tags and /api/show describe theirs.

A model read from a GGUF file is described from the file's header (specwise.gguf.file): its
architecture, parameter count, quantization (general.file_type, else the most common block type),
metadata, size and sha256 (hashed once per file content, remembered in the cache's index). Any other
model is described from its configuration and weights in memory; it has no digest.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specwise.gguf.file import read_header, type_name
from specwise.server.ollama_schemas import DEFAULT_OPTIONS

# general.file_type values (llama.cpp's LLAMA_FTYPE) by the names Ollama shows as quantization_level.
_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
               12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
               19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
               26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16"}
_TEMPLATE_KEY = "tokenizer.chat_template"  # shown as the template, not again among the metadata


def rfc3339(seconds: float) -> str:
    """A time as Ollama writes one (UTC, with a Z)."""
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def parameter_size(count: int) -> str:
    """A parameter count as Ollama shows it: 494.03M, 1.5B, 7B."""
    for unit, scale, decimals in (("B", 10**9, 1), ("M", 10**6, 2), ("K", 10**3, 0)):
        if count >= scale:
            number = count / scale
            return f"{number:.0f}{unit}" if number == math.floor(number) else f"{number:.{decimals}f}{unit}"
    return str(count)


@dataclass
class ModelFacts:
    """What Ollama's listing and show endpoints say of one served model."""

    family: str
    parameters: int
    quantization: str
    format: str
    size: int  # bytes: the file's, else the weights' in memory
    modified: float  # seconds since the epoch
    digest: str | None  # the file's sha256
    model_info: dict[str, Any]
    template: str  # the chat template (Jinja), "" without one
    context: int  # the context window, in tokens

    @classmethod
    def of(cls, decoder: Any, served_since: float) -> "ModelFacts":
        """The facts of a SpecDecoder's target: from its GGUF file when it runs one, else from memory."""
        loaded = decoder.target
        template = getattr(decoder.tokenizer, "chat_template", None) or ""
        path = Path(loaded.path) if loaded.path is not None else None
        if loaded.format == "gguf" and path is not None and path.is_file():
            return cls.from_gguf(path, template, decoder.runner.max_context)
        return cls.from_memory(loaded.model, path, template, decoder.runner.max_context, served_since)

    @classmethod
    def from_gguf(cls, path: Path, template: str, context: int) -> "ModelFacts":
        from specwise.store.packages import cached_sha256  # hashing a large file: only for a listing that asks

        header = read_header(path)
        stat = path.stat()
        parameters = sum(math.prod(entry.shape) for entry in header.tensors)
        file_type = header.metadata.get("general.file_type")
        common = Counter(entry.ggml_type for entry in header.tensors if len(entry.shape) > 1).most_common(1)
        quantization = (_FILE_TYPES.get(file_type) if isinstance(file_type, int) else None) or \
            (type_name(common[0][0]) if common else "unknown")
        info = {key: ([] if key in header.array_keys else value) for key, value in header.metadata.items()
                if key != _TEMPLATE_KEY}  # arrays (the vocabulary) as Ollama shows them unless verbose
        return cls(family=str(header.metadata.get("general.architecture", "unknown")), parameters=parameters,
                   quantization=quantization, format="gguf", size=stat.st_size, modified=stat.st_mtime,
                   digest=cached_sha256(path, progress=False),
                   model_info={**info, "general.parameter_count": parameters}, template=template, context=context)

    @classmethod
    def from_memory(cls, model: Any, path: Path | None, template: str, context: int,
                    served_since: float) -> "ModelFacts":
        config = model.config
        weights = list(model.parameters())
        family = str(getattr(config, "model_type", "unknown"))
        parameters = sum(weight.numel() for weight in weights)
        dtype = weights[0].dtype if weights else None
        keys = {"context_length": context, "embedding_length": getattr(config, "hidden_size", None),
                "block_count": getattr(config, "num_hidden_layers", None),
                "feed_forward_length": getattr(config, "intermediate_size", None),
                "attention.head_count": getattr(config, "num_attention_heads", None),
                "attention.head_count_kv": getattr(config, "num_key_value_heads", None),
                "vocab_size": getattr(config, "vocab_size", None)}
        return cls(family=family, parameters=parameters,
                   # torch.float32 is F32, torch.bfloat16 BF16, as GGUF names them
                   quantization=str(dtype).removeprefix("torch.").replace("float", "F").upper() if dtype else "unknown",
                   format="safetensors" if path is not None else "torch",
                   size=sum(weight.numel() * weight.element_size() for weight in weights),
                   modified=path.stat().st_mtime if path is not None and path.exists() else served_since,
                   digest=None,
                   model_info={"general.architecture": family, "general.parameter_count": parameters,
                               **{f"{family}.{key}": value for key, value in keys.items() if value is not None}},
                   template=template, context=context)

    def details(self) -> dict:
        return {"parent_model": "", "format": self.format, "family": self.family, "families": [self.family],
                "parameter_size": parameter_size(self.parameters), "quantization_level": self.quantization}

    def listing(self, name: str) -> dict:
        """One entry of /api/tags."""
        entry = {"name": name, "model": name, "modified_at": rfc3339(self.modified), "size": self.size}
        if self.digest is not None:
            entry["digest"] = self.digest
        return entry | {"details": self.details()}

    def parameters_text(self) -> str:
        """The sampling defaults an Ollama request gets, and the context window, as Modelfile parameters."""
        values = {"num_ctx": self.context, **DEFAULT_OPTIONS}
        return "\n".join(f"{name:<30} {value}" for name, value in values.items())

    def show(self, name: str) -> dict:
        """The body of /api/show."""
        modelfile = f"# served by specwise\nFROM {name}\n" + "".join(
            f"PARAMETER {line}\n" for line in self.parameters_text().splitlines())
        return {"modelfile": modelfile, "parameters": self.parameters_text(), "template": self.template,
                "details": self.details(), "model_info": self.model_info, "capabilities": ["completion"],
                "modified_at": rfc3339(self.modified)}


def now_rfc3339() -> str:
    return rfc3339(time.time())
