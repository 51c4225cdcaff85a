"""What an export is made of: the configuration handed off, one engine's settings, and the key lists.

An engine exporter reads a `Subject` (a SpecConfig with the models it names and, when it
comes from a benchmark, what was measured) and returns an `EngineExport`: the settings
in the engine's own names, the command line that applies them, and a note for every
part of the configuration the engine does not have. Every emitted key goes through
`KeyList.check` first, so a name the engine's documented list lacks is refused, never
printed.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from specwise.config import AUTO, SpecConfig

ENGINES = ("vllm", "sglang", "llama-server")

# Hugging Face repositories and GGUF files of the models specwise knows by name: GPU engines
# load checkpoints by repository id, llama-server a GGUF file.
HF_REPOS = {
    "qwen2.5-coder-1.5b": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    "qwen2.5-coder-0.5b": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "gemma3-270m": "google/gemma-3-270m",
}


class ExportError(ValueError):
    """Something that cannot be exported as asked (the CLI prints it as one line)."""


class UnknownKeyError(ExportError):
    """An exporter tried to emit a key or value the engine's documented list does not have."""


@dataclass(frozen=True)
class Subject:
    """The configuration to hand off, and where it came from."""

    spec: SpecConfig
    target: str | None = None  # a specwise model name, a checkpoint directory or a .gguf file
    draft_model: str | None = None  # the draft-model drafter's model (None: not that drafter)
    origin: str = "the command line"  # in words, for the output's header
    label: str | None = None  # the method label (bench) the configuration had
    mean_k: float | None = None  # measured draft tokens per drafting step (adaptive k), from bench records
    speedup: float | None = None  # the measured speedup it was picked for
    ranked_by: str | None = None  # "pooled" or "task mean (geometric)" when picked from a bench

    def fixed_k(self) -> tuple[int, str | None]:
        """The one k an engine gets (engines draft a fixed number of tokens), with a note when it
        stands for adaptive k: the measured mean where a benchmark recorded it, else the first k."""
        spec = self.spec
        if spec.tree:
            return spec.tree_depth, None
        if spec.adaptive is False:
            return spec.k, None
        # "auto" keeps k fixed only for seeded sampled requests: adaptive k for the rest
        which = "" if spec.adaptive is True else f", with adaptive {AUTO!r} for all but seeded sampled requests"
        if self.mean_k is not None:
            k = max(1, round(self.mean_k))
            return k, (f"adaptive k (k in [{spec.k_min}, {spec.k_max}] chosen each step from measured acceptance "
                       f"and costs{which}) has no equivalent: the engine drafts a fixed k; exported k = {k}, the "
                       f"mean draft length the benchmark measured ({self.mean_k:.2f} tokens per drafting step)")
        return spec.k, (f"adaptive k (k in [{spec.k_min}, {spec.k_max}] chosen each step{which}) has no "
                        f"equivalent: the engine drafts a fixed k; exported k = {spec.k}, the first step's (export "
                        "from a benchmark run, --from-bench, to get the mean k measured)")

    def to_dict(self) -> dict[str, Any]:
        from specwise.settings import describe

        return {"origin": self.origin, "label": self.label, "settings": describe(self.spec),
                "target": self.target, "draft_model": self.draft_model, "mean_k": self.mean_k,
                "speedup": self.speedup, "ranked_by": self.ranked_by}


@dataclass(frozen=True)
class KeyList:
    """An engine's documented speculation keys, as kept in specwise/export/keys/<engine>.json."""

    engine: str
    name: str
    version: str
    sources: tuple[dict, ...]
    keys: frozenset[str]  # keys of a configuration object (vLLM's speculative_config)
    flags: frozenset[str]  # command-line flags
    choices: Mapping[str, tuple[str, ...]]  # key or flag -> its documented values

    def check(self, config: Mapping[str, Any], flags: Mapping[str, Any]) -> None:
        """Raise UnknownKeyError naming every key of a configuration object (vLLM's speculative_config),
        command-line flag or enumerated value outside the documented list."""
        bad = [f"key {k!r}" for k in config if k not in self.keys]
        bad += [f"flag {f!r}" for f in flags if f not in self.flags]
        for key, value in [*config.items(), *flags.items()]:
            allowed = self.choices.get(key)
            if allowed is not None and value is not None and str(value) not in allowed:
                bad.append(f"{key}={value!r} (documented: {', '.join(allowed)})")
        if bad:
            raise UnknownKeyError(f"refusing to emit for {self.name}: {'; '.join(bad)} not in the key list of "
                                  f"{self.version} ({self.sources[0]['url']})")

    def source_line(self) -> str:
        return f"{self.version}; {self.sources[0]['url']}"


@cache
def key_list(engine: str) -> KeyList:
    """The key list kept for an engine (vllm, sglang, llama-server)."""
    if engine not in ENGINES:
        raise ExportError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    text = resources.files("specwise.export").joinpath("keys", engine.replace("-", "_") + ".json").read_text(
        encoding="utf-8")
    data = json.loads(text)
    return KeyList(engine=data["engine"], name=data["name"], version=data["version"],
                   sources=tuple(data["sources"]), keys=frozenset(data["keys"]), flags=frozenset(data["flags"]),
                   choices={k: tuple(v) for k, v in data.get("choices", {}).items()})


@dataclass
class EngineExport:
    """One engine's settings for a Subject."""

    engine: str
    name: str
    version: str
    key_source: str
    settings: dict[str, Any]  # vLLM: the speculative_config object; others: flag -> value (None: a switch)
    command: list[str]  # the serve command line, as argv
    notes: list[str] = field(default_factory=list)
    method: str = ""  # the engine's method in words, e.g. "draft_model", "NGRAM", "draft-simple"

    @property
    def command_line(self) -> str:
        return shlex.join(self.command)

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "name": self.name, "version": self.version, "key_source": self.key_source,
                "method": self.method, "settings": self.settings, "command": self.command,
                "command_line": self.command_line, "notes": self.notes}


def flag_argv(flags: Mapping[str, Any]) -> list[str]:
    """{'--a': 1, '--switch': None} -> ['--a', '1', '--switch']."""
    argv: list[str] = []
    for flag, value in flags.items():
        argv.append(flag)
        if value is not None:
            argv.append(str(value))
    return argv


def model_for_gpu_engine(name: str | None, placeholder: str) -> str:
    """A Hugging Face repository id for a specwise model name; other names (paths, repos) as given."""
    if not name:
        return placeholder
    return HF_REPOS.get(name, name)


def gguf_for_llama(name: str | None, placeholder: str) -> str:
    """A GGUF file name for a specwise model name (the file `specwise models prepare` assembles)."""
    if not name:
        return placeholder
    from specwise.store.catalog import KNOWN_MODELS

    known = KNOWN_MODELS.get(name)
    return known.gguf_name if known else name


def other_tokenizer(target: str | None, draft: str | None) -> bool | None:
    """Whether the draft model has another tokenizer than the target: True/False for models specwise
    knows (one architecture family shares one vocabulary here), None when it cannot tell."""
    from specwise.store.catalog import KNOWN_MODELS

    a, b = KNOWN_MODELS.get(target or ""), KNOWN_MODELS.get(draft or "")
    if a is None or b is None:
        return None
    return a.architecture != b.architecture

