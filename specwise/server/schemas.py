"""Request bodies of the OpenAI-compatible API, checked with pydantic.

Fields follow OpenAI's completions and chat completions APIs; `top_k`,
`repetition_penalty` and the `speculative` object are specwise extensions.
Types are checked strictly (the string "5" is not an integer, 5.0 is not one
either). Ranges are left to SamplingParams and SpecConfig, whose ValueError
messages name the field; `sampling_params` and `SpeculativeOptions.apply` turn
those into 400 errors that name the request's own field.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, create_model

from specwise.config import SamplingParams, SpecConfig, spec_settings
from specwise.settings import SettingInfo
from specwise.server.errors import APIError, bad_request, plain_name, quoted, shown


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


def _json_field(info: SettingInfo) -> tuple[Any, Any]:
    """The JSON type and default a request uses for a setting (a tree shape is a list of integers)."""
    if info.type == tuple[int, ...]:
        return list[int], Field(default=list(info.default), description=info.spec.help)
    if info.spec.auto:  # true, false or "auto": any other string is SpecConfig's to refuse, by name
        return bool | str, Field(default=info.default, description=info.spec.help)
    return info.type, Field(default=info.default, description=info.spec.help)


class _SpeculativeBase(_Strict):
    def apply(self, base: SpecConfig) -> SpecConfig:
        changes = self.model_dump(exclude_unset=True)
        if "tree_shape" in changes:  # the shape sets the tree's size: drop the base's derived budget
            changes.setdefault("tree_nodes", 0)
        try:
            spec = dataclasses.replace(base, **changes)
        except ValueError as exc:
            raise _from_value_error(exc, prefix="speculative.") from None
        for info in spec_settings():  # in range, but perhaps not the server's to change
            ours = getattr(base, info.name)
            if info.spec.resource and info.name in changes and changes[info.name] != ours:
                raise bad_request(f"{info.name} is the server operator's choice (it decides which weights are "
                                  f"loaded): this server runs {info.name} {_value_words(ours)}; leave it out",
                                  f"speculative.{info.name}", "operator_setting")
        return spec


def _value_words(value: Any) -> str:
    return "null" if value is None else repr(value)


# The `speculative` extension: how to speculate for this one request. Generated from SpecConfig's
# declarations (specwise.settings); unset fields keep the server's default SpecConfig.
SpeculativeOptions = create_model(
    "SpeculativeOptions", __base__=_SpeculativeBase,
    **{info.name: _json_field(info) for info in spec_settings() if info.spec.server})


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")  # OpenAI adds options here over time

    include_usage: bool = False


# OpenAI fields that specwise does not implement, with the values that mean "off".
# A request may send them (clients often fill in defaults) but only at these values.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
}

DEFAULT_MAX_TOKENS = 256  # when a request gives none (capped by what fits in the context window)
# Stop strings as OpenAI bounds them (at most 4), each short: every one is searched for in the text
# after every step, so that their count and length are what a step's stop check costs.
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 256
MAX_USER_CHARS = 256  # an identifier for the client's own logs (and its share of the server)
_StopString = Annotated[str, StringConstraints(max_length=MAX_STOP_CHARS)]


class _GenerationRequest(_Strict):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: _StopString | Annotated[list[_StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    speculative: SpeculativeOptions | None = None
    user: Annotated[str, StringConstraints(max_length=MAX_USER_CHARS)] | None = None  # the client's own name
    timings: bool = False  # add llama.cpp-style `timings` (prompt_n, cache_n, predicted_n, draft_n, ...)
    frequency_penalty: Any = None
    presence_penalty: Any = None
    logit_bias: Any = None
    logprobs: Any = None

    def check_supported(self) -> None:
        """Refuse what specwise cannot honour instead of silently ignoring it."""
        if self.n not in (None, 1):
            raise bad_request(f"n must be 1: specwise returns one completion per request; got {self.n!r}", "n")
        for name, neutral in _NEUTRAL.items():
            value = getattr(self, name, None)
            if not any(value == v and type(value) is type(v) for v in neutral):
                raise bad_request(f"{name} is not supported by specwise; leave it out (got {shown(value)})", name)
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed when stream is true", "stream_options")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """SamplingParams for this request; OpenAI's defaults (temperature 1, top_p 1) when unset."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        try:
            return SamplingParams(
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p,
                top_k=0 if self.top_k is None else self.top_k,
                repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
                seed=self.seed,
                max_new_tokens=max_tokens,
                stop_strings=tuple(stop),
            )
        except ValueError as exc:
            raise _from_value_error(exc) from None


class CompletionRequest(_GenerationRequest):
    """POST /v1/completions: one prompt, as text or token ids."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: Any = None
    suffix: Any = None
    best_of: Any = None

    def single_prompt(self) -> str | list[int]:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise bad_request(f"specwise takes one prompt per request; got a batch of {len(prompt)}", "prompt")
            prompt = prompt[0]
        if len(prompt) == 0:
            raise bad_request("prompt is empty; give at least one character or token id", "prompt")
        return prompt


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")  # e.g. "name": harmless to drop

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart]
    tool_calls: Any = None  # refused (ChatCompletionRequest.check_supported), never silently dropped
    tool_call_id: Any = None

    def as_template_message(self) -> dict:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": self.role, "content": content}


class ChatCompletionRequest(_GenerationRequest):
    """POST /v1/chat/completions: messages, rendered with the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    top_logprobs: Any = None

    def check_supported(self) -> None:
        super().check_supported()
        for i, message in enumerate(self.messages):
            for name in ("tool_calls", "tool_call_id"):
                if getattr(message, name) not in (None, []):
                    raise bad_request(f"messages[{i}].{name}: tool calls are not supported by specwise, and a "
                                      "history with them would lose them; send their results as plain text "
                                      "messages", "messages")

    @property
    def requested_max_tokens(self) -> int | None:
        if (self.max_tokens is not None and self.max_completion_tokens is not None
                and self.max_tokens != self.max_completion_tokens):
            raise bad_request("max_tokens and max_completion_tokens disagree; give one of them",
                              "max_completion_tokens")
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# Request field names for SamplingParams fields whose names differ.
_REQUEST_NAMES = {"max_new_tokens": "max_tokens", "stop_strings": "stop"}

# What union-typed fields accept, for a readable message instead of one line per union member.
_EXPECTED = {
    "adaptive": 'true, false or "auto"',
    "prompt": "a string, a list of token ids, or a list holding one of those",
    "stop": "a string or a list of strings",
    "content": "a string or a list of {\"type\": \"text\", \"text\": ...} parts",
}

_BOUNDS = {"too_long", "too_short", "string_too_long", "string_too_short"}
_NESTED_FIELDS = {"role", "content", "type", "text", "include_usage"}
_TYPE_TAG = re.compile(r"^[a-z_-]+(\[.*\])?$")


def _from_value_error(exc: ValueError, prefix: str = "") -> APIError:
    """A 400 from a config ValueError ("NAME must be ...; got ..."), naming the request field."""
    message = str(exc)
    if hasattr(exc, "value") and "; got " in message:  # the value refused, only as far as it is safe to show
        message = message[:message.rindex("; got ")] + "; got " + _safe_value(exc.value)
    name = getattr(exc, "field", None) or message.split(" ", 1)[0]
    field = _REQUEST_NAMES.get(name, name)
    if field != name:
        message = field + message[len(name):]
    return bad_request(message, prefix + field)


def _safe_value(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, list) and len(value) <= 64 and all(isinstance(v, int) for v in value):
        return repr(value)
    return quoted(value)


def _json_type(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _param(loc: tuple, fields: set[str]) -> tuple[str, str, bool]:
    """(dotted parameter name, its last field name, whether a union was involved).

    pydantic puts a tag naming the union member it tried ("str", "list[int]")
    into the location; the parameter is what comes before the first tag.
    """
    parts: list[str] = []
    last = ""
    for i, item in enumerate(loc):
        if isinstance(item, int):
            parts.append(str(item))
        elif i == 0 or item in fields or not _TYPE_TAG.match(item):
            parts.append(item)
            last = item
        else:
            return ".".join(parts), last, True
    return ".".join(parts), last, False


def parse_request(model: type[_GenerationRequest], body: Any) -> _GenerationRequest:
    """Validate a decoded JSON body; the first problem becomes a 400 that names the field."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object; got {_json_type(body)}")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors()
        fields = set(model.model_fields) | set(SpeculativeOptions.model_fields) | _NESTED_FIELDS
        param, last, union = _param(tuple(errors[0]["loc"]), fields)
        # Of a union's members, the one whose type matched says what is wrong (a list too long).
        error = next((e for e in errors if e["type"] in _BOUNDS and _param(tuple(e["loc"]), fields)[0] == param),
                     errors[0])
        kind = error["type"]
        if kind == "extra_forbidden":  # the unknown key itself, not a union tag: name it in full
            where, key = error["loc"][:-1], error["loc"][-1]
            if plain_name(key):
                param = ".".join(str(part) for part in error["loc"])
                message = f"unrecognized request argument supplied: {param}"
            else:  # named by where it is, not by itself
                param = ".".join(str(part) for part in where) or None
                message = f"unrecognized request argument supplied in {param or 'the request body'}: " \
                          f"a key that is {shown(key)}"
        elif kind in _BOUNDS:
            message = f"invalid {param}: {error['msg']}"
        elif kind == "missing":
            message = f"missing required parameter: {param}"
        elif union and last in _EXPECTED:
            message = f"{param} must be {_EXPECTED[last]}"
        else:
            message = f"invalid {param}: {error['msg']}"
            if "input" in error and kind.endswith("_type"):
                message += f" (got {_json_type(error['input'])})"
        raise bad_request(message, param) from None
