"""Hand a specwise speculation configuration off to a GPU engine: vLLM, SGLang or llama-server.

`export_to(engine, subject)` turns a `Subject` (a SpecConfig, the models it names, and
what a benchmark measured) into that engine's settings, checked against the engine's
documented key list kept in `keys/<engine>.json` (source and version recorded there),
with a note for everything the engine has no equivalent for. Each engine's exporter is a
table (vllm.py, sglang.py, llama_server.py) applied by table.py, which writes what all
engines share. `best_from_bench` picks
the configuration from `specwise bench run` output.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from specwise.export.from_bench import best_from_bench
from specwise.export.model import (ENGINES, EngineExport, ExportError, KeyList, Subject, UnknownKeyError,
                                   key_list)
from specwise.export.table import EngineTable, export_with

__all__ = ["ENGINES", "EngineExport", "EngineTable", "ExportError", "KeyList", "Subject", "UnknownKeyError",
           "best_from_bench", "engine_table", "export_to", "key_list", "render_json", "render_text"]


def export_to(engine: str, subject: Subject) -> EngineExport:
    """One engine's settings for `subject`; ExportError for an unknown engine or plain decoding."""
    if engine not in ENGINES:
        raise ExportError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    if subject.spec.drafter == "none":
        raise ExportError("drafter 'none' is plain decoding: there is no speculation to export")
    return export_with(engine_table(engine), subject)


def engine_table(engine: str) -> EngineTable:
    """The declared exporter of an engine (vllm, sglang, llama-server)."""
    if engine == "vllm":
        from specwise.export.vllm import TABLE
    elif engine == "sglang":
        from specwise.export.sglang import TABLE
    elif engine == "llama-server":
        from specwise.export.llama_server import TABLE
    else:
        raise ExportError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    return TABLE


def render_json(subject: Subject, exports: Sequence[EngineExport]) -> str:
    return json.dumps({"source": subject.to_dict(), "exports": [e.to_dict() for e in exports]}, indent=2)


def render_text(subject: Subject, exports: Sequence[EngineExport]) -> str:
    from specwise.settings import describe

    lines = [f"# specwise export of {subject.label or 'a configuration'} from {subject.origin}",
             f"# settings: {describe(subject.spec)}", ""]
    for export in exports:
        lines += [f"## {export.name}: {export.method}", f"# key list: {export.key_source}", ""]
        if export.engine == "vllm":
            lines += ["speculative_config:", json.dumps(export.settings, indent=2), ""]
        lines += [export.command_line, ""]
        if export.notes:
            lines += ["notes:"] + [f"- {note}" for note in export.notes] + [""]
    return "\n".join(lines)
