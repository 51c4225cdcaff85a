"""One declaration per speculation setting, and everything generated from it.

Each field of `SpecConfig` is declared once with `setting(...)`: its default, help
text, allowed range and, where the benchmark uses a shorter name, its short key.
From that one declaration come the range check (`check_settings`, run by
SpecConfig itself, so every front end gets the same error text), the CLI flags
(`specwise.cli_options`), the benchmark's `specwise:key=value` keys
(`specwise.bench.methods`), the server's `speculative` request object
(`specwise.server.schemas`) and the method labels (`method_label`).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Label = Callable[[Any, Any], "str | None"]  # (spec, base spec) -> a label part or None
AUTO = "auto"  # the third value of a switch declared with auto=True
_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class ConfigError(ValueError):
    """A setting out of its allowed range; `field` names it (the message starts with it) and `value`,
    where given, is the value refused (a server shows it only when it is safe to echo)."""

    def __init__(self, field: str, message: str, value: Any = None) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


@dataclass(frozen=True)
class Setting:
    """What a front end needs to know about one SpecConfig field besides its name and type."""

    help: str
    low: int | str | None = None  # an int, or the name of the field that bounds it
    high: int | None = None
    choices: tuple[Any, ...] | None = None  # for strings (None among them: unset is allowed)
    words: str | None = None  # the allowed values in words, where the type and range do not say it
    short_key: str | None = None  # a second, shorter key in the benchmark's method specs
    relevant: Callable[[Any], bool] | None = None  # whether the value matters for this spec
    label: Label | None = None  # this setting's part of a method label, when relevant
    server: bool = True  # settable per request through the server's `speculative` object
    valid: Callable[[Any], bool] | None = None  # for strings without fixed choices: which values are allowed
    drafter: bool = False  # the drafter is built from it: another value (where relevant) is another drafter
    # It chooses weights the server loads (a copy of the target, a runner, a draft model's copy): a
    # request may send it only with the value the server runs, so that no request loads anything.
    resource: bool = False
    # A switch (type bool | str) that may also be AUTO: on or off decided per generation from its
    # sampling settings (SpecConfig.resolve_adaptive).
    auto: bool = False


@dataclass(frozen=True)
class SettingInfo:
    """A declared setting with its field name, Python type and default."""

    name: str
    type: Any  # int, bool, str, str | None, tuple[int, ...]
    default: Any
    spec: Setting

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def keys(self) -> tuple[str, ...]:
        """The benchmark keys that name it: the field name and the short key, if any."""
        return (self.name,) + ((self.spec.short_key,) if self.spec.short_key else ())

    def allowed(self, values: Any = None) -> str:
        """The allowed values in words, as error messages state them."""
        s = self.spec
        if s.words is not None:
            return s.words
        if s.auto:
            return f"true, false or {AUTO!r}"
        if self.type is bool:
            return "true or false"
        if s.choices is not None:
            shown = [repr(c) if c is not None else "None" for c in s.choices]
            return " or ".join(shown) if len(shown) == 2 else "one of " + ", ".join(
                str(c) for c in s.choices)
        if self.type is int:
            low = s.low
            if isinstance(low, str):  # bounded by another field: name it with its value
                low = f"{low}={getattr(values, low, '?')}"
            if s.high is not None:
                return f"an integer in [{low}, {s.high}]"
            return f"an integer >= {low}"
        if self.type is str:
            return "a non-empty string"
        return str(self.type)

    def parse(self, text: str) -> Any:
        """A value from command-line or benchmark text; ranges are SpecConfig's to check."""
        text = text.strip()
        if self.type is bool or self.spec.auto:
            lowered = text.lower()
            if lowered in _ON:
                return True
            if lowered in _OFF:
                return False
            if self.spec.auto and lowered == AUTO:
                return AUTO
            words = f"true, false or {AUTO} (1/0/{AUTO})" if self.spec.auto else "true or false (1/0)"
            raise ConfigError(self.name, f"{self.name} must be {words}; got {text!r}")
        if self.type is int:
            try:
                return int(text)
            except ValueError:
                raise ConfigError(self.name, f"{self.name} must be an integer; got {text!r}") from None
        if self.type == tuple[int, ...]:
            return parse_tree_shape(text)
        if self.spec.choices is not None and None in self.spec.choices and text.lower() in ("", "none", "0", "off"):
            return None
        return text


def setting(default: Any, help: str, **options: Any) -> Any:
    """A SpecConfig field declared with what every front end needs (see Setting)."""
    return dataclasses.field(default=default, metadata={"setting": Setting(help=help, **options)})


_CACHE: dict[type, tuple[SettingInfo, ...]] = {}


def settings_of(cls: type) -> tuple[SettingInfo, ...]:
    """Every field of a dataclass declared with `setting(...)`, in declaration order."""
    if cls not in _CACHE:
        hints = typing.get_type_hints(cls)
        _CACHE[cls] = tuple(SettingInfo(f.name, hints[f.name], f.default, f.metadata["setting"])
                            for f in dataclasses.fields(cls) if "setting" in f.metadata)
    return _CACHE[cls]


def is_int(value: object) -> bool:
    """An int and not a bool (True is an int to Python, not a count or an id to a setting)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_settings(values: Any) -> None:
    """Raise ConfigError naming the first declared setting whose value is out of range."""
    for info in settings_of(type(values)):
        value = getattr(values, info.name)
        s = info.spec
        if s.auto:
            ok = isinstance(value, bool) or (isinstance(value, str) and value == AUTO)
        elif info.type is bool:
            ok = isinstance(value, bool)
        elif s.choices is not None:
            ok = value in s.choices and (value is None or isinstance(value, str))
        elif info.type is int:
            low = getattr(values, s.low) if isinstance(s.low, str) else s.low
            ok = (is_int(value) and (low is None or value >= low)
                  and (s.high is None or value <= s.high))
        elif info.type is str:
            ok = isinstance(value, str) and value != "" and (s.valid is None or s.valid(value))
        else:
            continue  # structured values (tree_shape) are checked by their owner
        if not ok:
            shown = list(value) if isinstance(value, tuple) else value
            raise ConfigError(info.name, f"{info.name} must be {info.allowed(values)}; got {shown!r}", value)


def parse_tree_shape(text: str) -> tuple[int, ...]:
    """'3,2,1' or '3x2x1' -> (3, 2, 1); '' -> () (a dynamic tree). Ranges are SpecConfig's to check."""
    parts = [p.strip() for p in text.replace("x", ",").split(",")] if text.strip() else []
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError("tree_shape", f"tree_shape must be children per level such as 3,2,1 (or 3x2x1); "
                                        f"got {text!r}") from None


def tree_shape_nodes(shape: Sequence[int]) -> int:
    """Nodes of a fixed tree with shape[i] children per node at level i: (3, 2, 1) -> 3 + 6 + 6."""
    total, width = 0, 1
    for branching in shape:
        width *= branching
        total += width
    return total


def method_label(spec: Any, base: Any, model: str | None = None) -> str:
    """A short readable method name built from the settings' own label parts, e.g.
    specwise-ngram-k4, specwise-draft-model-adaptive1-12-int8, specwise-draft-model-tree16d4b3-hf."""
    parts = ["specwise", spec.drafter]
    if model:
        parts.append(model.rstrip("/").split("/")[-1])
    for info in settings_of(type(spec)):
        s = info.spec
        if s.label is not None and (s.relevant is None or s.relevant(spec)):
            part = s.label(spec, base)
            if part:
                parts.append(part)
    return "-".join(parts)


def describe(spec: Any) -> str:
    """Every setting that matters for this configuration, as name=value, for reports."""
    shown = []
    for info in settings_of(type(spec)):
        if info.spec.relevant is None or info.spec.relevant(spec):
            value = getattr(spec, info.name)
            if info.type == tuple[int, ...]:
                value = "x".join(map(str, value)) if value else "dynamic"
            shown.append(f"{info.name}={value}")
    return ", ".join(shown)


def drafter_settings(spec: Any) -> tuple[tuple[str, Any], ...]:
    """(name, value) of every setting the drafter is built from that matters for this configuration:
    two configurations with the same ones can share a drafter."""
    return tuple((info.name, getattr(spec, info.name)) for info in settings_of(type(spec))
                 if info.spec.drafter and (info.spec.relevant is None or info.spec.relevant(spec)))


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
