"""Request bodies of Ollama's API (/api/chat, /api/generate, /api/show), read into the shared path's requests.

Ollama's bodies are checked here (field types, what specwise cannot honour) and then become the
OpenAI routes' request objects (specwise/server/schemas.py), so that every range, limit and
setting is checked once, by the same code, whichever API a request came through. As Ollama does,
fields and options it does not know are ignored, while a known one of the wrong type is a 400.

Options map to the sampling settings of the OpenAI routes: temperature, top_p, top_k, seed,
num_predict (max_tokens), stop and repeat_penalty (repetition_penalty); unset ones take Ollama's
defaults (temperature 0.8, top_k 40, top_p 0.9, no repeat penalty, a random seed). num_predict
unset or negative (Ollama's "no limit") takes the server's default limit. The `speculative`
option is the OpenAI routes' `speculative` object. Ollama's options for loading a model (num_ctx,
num_gpu, num_thread, ...) are the server operator's choice: checked, then ignored. Sampling options
specwise does not have (min_p, typical_p, presence_penalty, frequency_penalty) are refused unless
neutral, as the OpenAI routes refuse theirs. specwise's repeat_penalty weighs every token of the
context, as Ollama's repeat_last_n -1 does.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from specwise.server.errors import APIError, bad_request, shown
from specwise.server.schemas import ChatCompletionRequest, CompletionRequest, parse_request
from specwise.settings import is_int

# Ollama's defaults for what a request leaves unset (its DefaultOptions).
DEFAULT_OPTIONS: dict[str, Any] = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}

INTEGER, NUMBER, BOOLEAN, STRINGS = "an integer", "a number", "true or false", "a list of strings"
# The options Ollama knows, by the type it requires.
OPTION_TYPES: dict[str, str] = {
    "num_keep": INTEGER, "seed": INTEGER, "num_predict": INTEGER, "top_k": INTEGER, "top_p": NUMBER,
    "min_p": NUMBER, "typical_p": NUMBER, "repeat_last_n": INTEGER, "temperature": NUMBER,
    "repeat_penalty": NUMBER, "presence_penalty": NUMBER, "frequency_penalty": NUMBER, "stop": STRINGS,
    "num_ctx": INTEGER, "num_batch": INTEGER, "num_gpu": INTEGER, "main_gpu": INTEGER, "use_mmap": BOOLEAN,
    "num_thread": INTEGER, "draft_num_predict": INTEGER,
}
# Ollama's options that become the OpenAI routes' fields of another name (the rest keep theirs).
_OPENAI_NAMES = {"num_predict": "max_tokens", "repeat_penalty": "repetition_penalty"}
_SAMPLING = ("temperature", "top_p", "top_k", "seed", "num_predict", "stop", "repeat_penalty")
# Sampling options specwise does not have, with the value that leaves sampling as it is.
_NEUTRAL = {"min_p": 0.0, "typical_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


class _Lenient(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")  # as Ollama: unknown fields are ignored


class OllamaMessage(_Lenient):
    role: str
    content: str = ""
    images: list[Any] | None = None
    tool_calls: list[Any] | None = None
    tool_name: str | None = None
    thinking: str | None = None  # an earlier answer's reasoning: not sent back to the model, as Ollama does


class _OllamaRequest(_Lenient):
    model: str
    stream: bool | None = None  # Ollama streams unless told not to
    options: dict[str, Any] | None = None
    format: str | dict[str, Any] | None = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    keep_alive: str | int | float | None = None  # the model stays loaded: nothing to keep alive

    def check_supported(self) -> None:
        """Refuse what specwise cannot honour rather than answer as if it had."""
        if self.format not in (None, ""):
            raise bad_request("format (JSON mode, structured outputs) is not supported by specwise; leave it out",
                              "format")
        if self.think not in (None, False):
            raise bad_request("think: the models specwise serves do not think aloud; leave it out", "think")
        if self.logprobs or self.top_logprobs:
            raise bad_request("logprobs are not supported by specwise; leave them out", "logprobs")

    @property
    def streams(self) -> bool:
        return self.stream is not False


class OllamaChatRequest(_OllamaRequest):
    """POST /api/chat."""

    messages: list[OllamaMessage] | None = None
    tools: list[Any] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.tools:
            raise bad_request("tools are not supported by specwise; leave them out", "tools")
        for i, message in enumerate(self.messages or []):
            if message.images:
                raise bad_request(f"messages[{i}].images: specwise serves text-only models; send text",
                                  f"messages.{i}.images")
            if message.tool_calls:
                raise bad_request(f"messages[{i}].tool_calls: tool calls are not supported by specwise; send their "
                                  "results as plain text messages", f"messages.{i}.tool_calls")

    @property
    def loads_only(self) -> bool:
        """No messages: Ollama's way of asking for the model to be loaded, answered at once."""
        return not self.messages

    def to_openai(self, served: str) -> ChatCompletionRequest:
        messages = [{"role": m.role, "content": m.content} for m in self.messages or []]
        return _openai(ChatCompletionRequest, {"model": served, "messages": messages}, self)


class OllamaGenerateRequest(_OllamaRequest):
    """POST /api/generate: a prompt, in the model's chat template unless raw."""

    prompt: str = ""
    system: str | None = None
    raw: bool | None = None
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None
    images: list[Any] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.suffix:
            raise bad_request("suffix (fill in the middle) is not supported by specwise; leave it out", "suffix")
        if self.template:
            raise bad_request("template: specwise applies the model's own chat template; leave it out, or send the "
                              "prompt formatted with raw: true", "template")
        if self.context:
            raise bad_request("context is not supported by specwise; send the conversation to /api/chat as "
                              "messages", "context")
        if self.images:
            raise bad_request("images: specwise serves text-only models; send text", "images")
        if self.raw and self.system:
            raise bad_request("system has no place in a raw prompt; write it into the prompt, or leave raw out",
                              "system")

    @property
    def loads_only(self) -> bool:
        return not self.prompt

    def to_openai(self, served: str, chat_template: bool) -> ChatCompletionRequest | CompletionRequest:
        """A chat request of the system and prompt (the model's chat template applies), or the prompt as
        it is when raw or when the model has no chat template."""
        if self.raw or not chat_template:
            if self.system:
                raise bad_request("system: this model has no chat template to place a system message in; write it "
                                  "into the prompt", "system")
            return _openai(CompletionRequest, {"model": served, "prompt": self.prompt}, self)
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + \
            [{"role": "user", "content": self.prompt}]
        return _openai(ChatCompletionRequest, {"model": served, "messages": messages}, self)


class OllamaShowRequest(_Lenient):
    """POST /api/show: `model`, or `name` as older clients send it."""

    model: str | None = None
    name: str | None = None
    verbose: bool | None = None

    @property
    def asked(self) -> str:
        if not (self.model or self.name):
            raise bad_request("missing required parameter: model", "model")
        return self.model or self.name or ""


def checked_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """The options Ollama knows, each of its type (whole numbers may come as 5.0, as JSON allows); null ones
    left out, unknown ones ignored (as Ollama does), `speculative` kept for the shared path to check."""
    checked: dict[str, Any] = {}
    for name, value in (options or {}).items():
        if value is None or (name not in OPTION_TYPES and name != "speculative"):
            continue
        kind = OPTION_TYPES.get(name)
        if kind == INTEGER and isinstance(value, float) and value.is_integer():
            value = int(value)
        ok = {INTEGER: is_int(value), NUMBER: isinstance(value, (int, float)) and not isinstance(value, bool),
              BOOLEAN: isinstance(value, bool), None: True,
              STRINGS: isinstance(value, list) and all(isinstance(v, str) for v in value)}[kind]
        if not ok:
            raise bad_request(f"options.{name} must be {kind}; got {shown(value)}", f"options.{name}")
        checked[name] = value
    return checked


def sampling_fields(options: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI routes' request fields for checked Ollama options (Ollama's defaults for those unset)."""
    for name, neutral in _NEUTRAL.items():
        if name in options and options[name] != neutral:
            raise bad_request(f"options.{name} is not supported by specwise; leave it out or set it to {neutral:g}",
                              f"options.{name}")
    penalty = options.get("repeat_penalty", 1.0)
    if penalty != 1 and options.get("repeat_last_n", -1) != -1:
        raise bad_request("options.repeat_last_n: specwise's repeat_penalty weighs every token of the context; "
                          "leave repeat_last_n out or set it to -1", "options.repeat_last_n")
    fields = dict(DEFAULT_OPTIONS)
    fields.update({_OPENAI_NAMES.get(name, name): options[name] for name in _SAMPLING if name in options})
    if fields.get("seed") is not None and fields["seed"] < 0:  # Ollama's -1: a random seed
        fields["seed"] = None
    if fields.get("max_tokens") is not None and fields["max_tokens"] < 0:  # -1, -2: as long as allowed
        fields["max_tokens"] = None
    if "speculative" in options:
        fields["speculative"] = options["speculative"]
    return fields


def _openai(kind: type[ChatCompletionRequest | CompletionRequest], fields: dict[str, Any],
            request: _OllamaRequest):
    request.check_supported()
    body = fields | sampling_fields(checked_options(request.options)) | {"stream": request.streams}
    return parse_request(kind, body)


# The OpenAI routes' names of a refusal's field, as an Ollama client knows them.
_OLLAMA_NAMES = {"max_tokens": "num_predict", "repetition_penalty": "repeat_penalty", "temperature": "temperature",
                 "top_p": "top_p", "top_k": "top_k", "seed": "seed", "stop": "stop", "speculative": "speculative"}
_OPENAI_NAME = re.compile(r"(?<![\w.-])(" + "|".join(_OLLAMA_NAMES) + r")\b")
_NAMING_FIELDS = {*_OLLAMA_NAMES, "messages", "prompt"}  # the refusals whose messages may name such a field


def in_ollama_terms(err: APIError) -> str:
    """A refusal's message with the OpenAI routes' field names as Ollama's options name them
    (max_tokens is options.num_predict, speculative.k is options.speculative.k)."""
    param = err.param or ""
    first, _, rest = param.partition(".")
    if first not in _NAMING_FIELDS:
        return err.message
    message = err.message
    if first == "speculative" and rest and message.startswith(rest + " "):  # named by its own field alone
        message = "speculative." + message
    return _OPENAI_NAME.sub(lambda match: "options." + _OLLAMA_NAMES[match.group(1)], message)
