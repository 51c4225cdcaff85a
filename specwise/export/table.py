"""An engine's exporter as a table, and the one function that applies a table to a Subject.

Each engine module (vllm.py, sglang.py, llama_server.py) declares an `EngineTable`: how it is
started, which of its keys each specwise setting fills for each drafter it has an equivalent
of (`Method`), its stand-in for a drafter it lacks, and its own notes. `export_with` does the
rest, the same for every engine: the fixed k an engine drafts (with the note on adaptive k),
the stand-in drafter, the notes every engine shares (`common_notes`), the settings in the
table's order, every emitted key checked against the engine's key list (keys/<engine>.json),
and the command line that applies them.

A table's values are constants or functions of the `Context` (the configuration as the engine
sees it); a value function that returns OMIT leaves its key out, and a flag whose value is None
is a switch (`flag_argv`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from specwise.config import SpecConfig
from specwise.export.model import EngineExport, ExportError, KeyList, Subject, flag_argv, key_list, other_tokenizer


class _Omit:
    def __repr__(self) -> str:
        return "OMIT"


OMIT: Any = _Omit()  # a value function's answer for "leave this key out"


@dataclass(frozen=True)
class Context:
    """The configuration as one engine sees it, what a table's values and notes are computed from."""

    subject: Subject
    drafter: str  # the engine-side drafter: specwise's own, or the engine's stand-in for it
    k: int  # the fixed number of draft tokens the engine gets (Subject.fixed_k)
    draft_model: str  # the draft model as the engine names it (a placeholder when none is known)

    @property
    def spec(self) -> SpecConfig:
        return self.subject.spec

    @property
    def other_tokenizer(self) -> bool | None:
        """Whether the draft model has another tokenizer than the target (None: cannot tell)."""
        return other_tokenizer(self.subject.target, self.subject.draft_model)


Value = Union[Any, Callable[[Context], Any]]  # a constant, or computed from the Context (OMIT: no key)
Text = Union[str, Callable[[Context], str]]


@dataclass(frozen=True)
class Note:
    """A note the export carries when `when` holds (always, when it is None)."""

    text: Text
    when: Callable[[Context], bool] | None = None


@dataclass(frozen=True)
class Method:
    """How one drafter maps onto the engine: its keys in emitting order, and the notes it brings."""

    settings: Mapping[str, Value]
    notes: tuple[Note, ...] = ()


@dataclass(frozen=True)
class StandIn:
    """The engine's nearest to a specwise drafter it has no equivalent of: the drafter whose Method is
    exported instead (or a function of the configuration choosing it), and that Method in words for the
    note saying so ("{drafter}" there is the drafter chosen)."""

    drafter: str | Callable[[SpecConfig], str]
    words: str


@dataclass(frozen=True)
class EngineTable:
    """One engine's exporter, declared."""

    keys: str  # the key list's engine name: keys/<keys>.json
    label: str  # the engine as the notes name it
    program: tuple[str, ...]  # the serve command before its arguments
    target_flag: str | None  # the flag naming the target model (None: the program's first argument)
    name_model: Callable[[str | None, str], str]  # a specwise model name -> the engine's, or the placeholder
    target_placeholder: str
    draft_placeholder: str
    method_key: str  # the setting that names the engine's method
    methods: Mapping[str, Method]  # engine-side drafter -> its mapping
    stand_ins: Mapping[str, StandIn] = field(default_factory=dict)  # specwise drafter -> the engine's nearest
    after: Mapping[str, Value] = field(default_factory=dict)  # keys every method emits after its own
    notes: tuple[Note, ...] = ()  # the engine's notes after the method's
    config_flag: str | None = None  # settings go in one JSON object under this flag (vLLM); None: flags
    block_key: str | None = None  # the key whose documented choices include "block" when it verifies by blocks
    reads_gguf: bool = False  # the engine loads GGUF files (a draft model's GGUF blocks then need no note)

    def declared_keys(self) -> set[str]:
        """Every key or flag this table can emit: for the static check against the key list."""
        keys = {key for method in self.methods.values() for key in method.settings} | set(self.after)
        return keys | {flag for flag in (self.target_flag, self.config_flag) if flag}


def _value(value: Value, context: Context) -> Any:
    return value(context) if callable(value) else value


def _text(note: Note, context: Context) -> str | None:
    if note.when is not None and not note.when(context):
        return None
    return _value(note.text, context)


def _settings(values: Mapping[str, Value], context: Context) -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        resolved = _value(value, context)
        if resolved is not OMIT:
            out[key] = resolved
    return out


def export_with(table: EngineTable, subject: Subject) -> EngineExport:
    """`subject` as the engine of `table` takes it (ExportError where it has no equivalent)."""
    keys = key_list(table.keys)
    spec = subject.spec
    k, k_note = subject.fixed_k()
    stand_in = table.stand_ins.get(spec.drafter)
    drafter, stand_in_words = spec.drafter, ""
    if stand_in is not None:
        drafter = stand_in.drafter(spec) if callable(stand_in.drafter) else stand_in.drafter
        stand_in_words = stand_in.words.format(drafter=drafter)
    method = table.methods.get(drafter)
    if method is None:
        raise ExportError(f"{table.label} has no equivalent of specwise's drafter {drafter!r}")
    context = Context(subject, drafter, k, table.name_model(subject.draft_model, table.draft_placeholder))
    notes = [k_note] if k_note else []
    notes += common_notes(subject, table.label, block=_verifies_blocks(table, keys),
                          stand_in=stand_in_words, reads_gguf=table.reads_gguf)
    notes += [text for note in (*method.notes, *table.notes) if (text := _text(note, context)) is not None]
    settings = _settings({**method.settings, **table.after}, context)

    config, flags = ({}, settings) if table.config_flag is None else \
        (settings, {table.config_flag: json.dumps(settings, separators=(",", ":"))})
    target = table.name_model(subject.target, table.target_placeholder)
    serve = flags if table.target_flag is None else {table.target_flag: target, **flags}
    keys.check(config, serve)
    command = [*table.program, *([target] if table.target_flag is None else []), *flag_argv(serve)]
    return EngineExport(engine=table.keys, name=keys.name, version=keys.version, key_source=keys.source_line(),
                        settings=settings, command=command, notes=notes, method=settings[table.method_key])


def _verifies_blocks(table: EngineTable, keys: KeyList) -> bool:
    return table.block_key is not None and "block" in keys.choices.get(table.block_key, ())


# --------------------------------------------------------------------------- notes every engine shares


def common_notes(subject: Subject, engine: str, *, block: bool, stand_in: str, reads_gguf: bool) -> list[str]:
    """What specwise does that the engine does not, and what it does instead. block: the engine verifies
    by blocks; stand_in: the engine's nearest to a recycle or layerskip drafter, in words."""
    spec = subject.spec
    notes: list[str] = []
    if spec.drafter == "recycle":
        notes.append(f"recycle (Token Recycling: the target's own top candidates per token) has no equivalent in "
                     f"{engine}; exported its nearest, {stand_in}, which drafts only from matches in the "
                     "text and loses the drafts the candidate table gives where nothing matches")
    if spec.drafter == "layerskip":
        notes.append(f"layerskip (early-exit self-speculation through the target's first layers) has no "
                     f"equivalent in {engine}; exported {stand_in} instead, which needs no extra "
                     "weights either (a LayerSkip-trained model's exit would need engine support)")
    if spec.drafter != "none" and not spec.tree and spec.verifier in ("auto", "block") and not block:
        notes.append(f"block verification (Sun et al., specwise's verifier under sampling) has no equivalent in "
                     f"{engine}: it verifies token by token (rejection sampling), still lossless but with fewer "
                     "tokens per step on average; greedy requests are verified greedily by both")
    if spec.drafter == "draft-model":
        if spec.draft_vocab:
            notes.append(f"the restricted draft vocabulary (draft_vocab={spec.draft_vocab}) has no equivalent for "
                         f"a draft model in {engine}: the draft model proposes over its whole vocabulary "
                         "(lossless either way; a larger output layer per draft token)")
        if spec.draft_quantize == "int8":
            notes.append(f"int8 drafter quantization is specwise's CPU kernel; {engine} runs the draft model as "
                         "its checkpoint is stored: give it a quantized checkpoint of the draft model "
                         "(its own formats) to get a cheaper drafter")
        if spec.draft_quantize == "gguf" and not reads_gguf:
            notes.append(f"draft_quantize=gguf runs the draft model's GGUF blocks on specwise's CPU kernels; "
                         f"{engine} loads the Hugging Face checkpoint named instead")
    return notes


# Notes that several engines word alike, each with the engine's own ending.

def eagle_note(not_a: str, fix: str) -> Note:
    """specwise's EAGLE head is not the engine's kind of head: `not_a` names what it is not, `fix` the way out."""
    return Note(f"eagle: specwise's head (three target layers, one decoder layer, a reduced draft vocabulary) is "
                f"not {not_a}; {fix}")


def vocabulary_note(engine_rule: str) -> Note:
    """A draft model whose tokenizer differs from the target's, or may: `engine_rule` says what the engine does."""
    return Note(lambda c: ("the draft model has another tokenizer" if c.other_tokenizer else
                           "if the draft model's tokenizer differs from the target's") + ": " + engine_rule,
                when=lambda c: c.other_tokenizer is not False)
