"""Every speculation setting is declared once; the CLI, the bench keys and the server schema agree on it.

The walk is over `spec_settings()`, so a setting added to SpecConfig is covered
here without editing this file (unless no out-of-range value can be derived for
it, which fails the test and asks for one).
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from specwise.bench.methods import parse_specwise_method, spec_label
from specwise.cli_options import add_model_options, add_sampling_options, spec_from_args
from specwise.config import SpecConfig, spec_settings
from specwise.server.errors import APIError
from specwise.server.schemas import CompletionRequest, SpeculativeOptions, parse_request
from specwise.settings import ConfigError, SettingInfo

SETTINGS = spec_settings()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_model_options(parser)
    add_sampling_options(parser)
    return parser


def _text(value) -> str:
    """A value as the CLI and the bench keys write it."""
    if isinstance(value, tuple):
        return "x".join(map(str, value))
    return "none" if value is None else str(value)


def _out_of_range(info: SettingInfo):
    """(extra valid settings, a value the declaration forbids), or None for booleans (no range)."""
    s = info.spec
    if s.auto:  # a switch that may also be "auto": any other word is refused
        return {}, "bogus"
    if info.type is bool:
        return None
    if info.type is int:
        if isinstance(s.low, str):  # bounded below by another field: raise that one
            return {s.low: 5}, 4
        if s.low is not None:
            return {}, s.low - 1
        raise AssertionError(f"{info.name}: declare a range (low/high) so an out-of-range value exists")
    if info.type == tuple[int, ...]:
        return {}, (0,)
    if s.choices is not None:
        return {}, "bogus"
    if info.type is str:
        return {}, ""
    raise AssertionError(f"{info.name}: add an out-of-range value for type {info.type} to this test")


def test_every_specconfig_field_is_a_declared_setting():
    declared = {info.name for info in SETTINGS}
    fields = {f.name for f in dataclasses.fields(SpecConfig)}
    assert fields - declared == {"drafter_options"}  # free-form drafter options, not one setting


@pytest.mark.parametrize("info", SETTINGS, ids=lambda info: info.name)
def test_front_ends_share_the_default(info: SettingInfo):
    library = getattr(SpecConfig(), info.name)
    assert library == info.default
    assert getattr(spec_from_args(_parser().parse_args([])), info.name) == info.default
    bench, _, _ = parse_specwise_method("specwise", SpecConfig())
    assert getattr(bench, info.name) == info.default
    assert info.spec.help and info.flag in _parser().format_help()
    if not info.spec.server:  # the operator's to set (e.g. memory bounds): no request may change it
        assert info.name not in SpeculativeOptions.model_fields
        with pytest.raises(APIError, match=f"unrecognized request argument supplied: speculative.{info.name}"):
            parse_request(CompletionRequest, {"model": "m", "prompt": "hi", "speculative": {info.name: info.default}})
        return
    server_field = SpeculativeOptions.model_fields[info.name]
    default = list(info.default) if isinstance(info.default, tuple) else info.default
    assert server_field.default == default
    assert getattr(SpeculativeOptions().apply(SpecConfig()), info.name) == info.default


def _other_valid(info: SettingInfo):
    """(extra settings it needs, a valid value other than the default)."""
    if info.type is bool:
        return {}, not info.default
    if info.spec.auto:
        return {}, False
    if info.type is int:
        if info.name == "k_min":
            return {"k_max": 64}, 64
        if info.name == "ngram_min":
            return {"ngram_max": info.spec.high}, info.spec.high
        return {}, info.spec.high or info.default + 3
    if info.type == tuple[int, ...]:
        return {}, (3, 2, 1)
    if info.spec.choices is not None:
        return {}, next(c for c in info.spec.choices if c != info.default)
    if info.name == "device":
        return {}, "cpu"
    return {}, "draft-model" if info.default != "draft-model" else "ngram"


@pytest.mark.parametrize("info", SETTINGS, ids=lambda info: info.name)
def test_front_ends_accept_a_valid_value(info: SettingInfo):
    """A value other than the default, set through each front end, arrives in SpecConfig."""
    extra, value = _other_valid(info)
    args = [a for k, v in extra.items() for a in (f"--{k.replace('_', '-')}", _text(v))]
    switch = info.type is bool or info.spec.auto  # --name / --no-name
    flag = [info.flag if value else "--no-" + info.flag[2:]] if switch else [info.flag, _text(value)]
    cli = spec_from_args(_parser().parse_args(args + flag))
    keys = [f"{k}={_text(v)}" for k, v in extra.items()] + [f"{info.name}={_text(value)}"]
    bench, _, _ = parse_specwise_method("specwise:" + ",".join(keys), SpecConfig())
    assert getattr(cli, info.name) == value
    assert cli == bench == SpecConfig(**extra, **{info.name: value})
    request = {"model": "m", "prompt": "hi", "speculative": {
        **extra, info.name: list(value) if isinstance(value, tuple) else value}}
    if not info.spec.server:
        with pytest.raises(APIError) as error:  # named as an unknown key, not silently ignored
            parse_request(CompletionRequest, request)
        assert error.value.param == f"speculative.{info.name}"
        return
    if info.spec.resource:  # only the operator's value: no request makes the server load weights
        with pytest.raises(APIError) as error:
            parse_request(CompletionRequest, request).speculative.apply(SpecConfig())
        assert error.value.status == 400 and error.value.param == f"speculative.{info.name}"
        assert "operator's choice" in error.value.message
        assert parse_request(CompletionRequest, request).speculative.apply(SpecConfig(**extra, **{info.name: value})) \
            == cli
        return
    served = parse_request(CompletionRequest, request).speculative.apply(SpecConfig())
    assert served == cli


@pytest.mark.parametrize("info", [i for i in SETTINGS if _out_of_range(i) is not None], ids=lambda info: info.name)
def test_front_ends_refuse_out_of_range_values_with_the_same_message(info: SettingInfo):
    extra, bad = _out_of_range(info)
    with pytest.raises(ConfigError) as library:
        SpecConfig(**extra, **{info.name: bad})
    message = str(library.value)
    assert message.startswith(f"{info.name} must be ")

    args = [a for k, v in extra.items() for a in (f"--{k.replace('_', '-')}", _text(v))]
    keys = [f"{k}={_text(v)}" for k, v in extra.items()] + [f"{info.name}={_text(bad)}"]
    with pytest.raises(ConfigError) as bench:
        parse_specwise_method("specwise:" + ",".join(keys), SpecConfig())
    if info.spec.auto:  # the CLI's --name / --no-name take no value; leaving both out is auto
        with pytest.raises(argparse.ArgumentError, match="ignored explicit argument 'bogus'"):
            _parser().parse_args(args + [f"{info.flag}={bad}"])
        assert message == f"{info.name} must be true, false or 'auto'; got {bad!r}"
        assert str(bench.value) == f"{info.name} must be true, false or auto (1/0/auto); got {bad!r}"
    else:
        with pytest.raises(ConfigError) as cli:
            spec_from_args(_parser().parse_args(args + [info.flag, _text(bad)]))
        assert str(cli.value) == str(bench.value) == message
    if not info.spec.server:
        return
    request = parse_request(CompletionRequest, {"model": "m", "prompt": "hi", "speculative": {
        **extra, info.name: list(bad) if isinstance(bad, tuple) else bad}})
    with pytest.raises(APIError) as server:
        request.speculative.apply(SpecConfig())
    assert server.value.status == 400
    assert server.value.message == message and server.value.param == f"speculative.{info.name}"


def test_short_bench_keys_name_the_same_setting():
    for info in SETTINGS:
        for key in info.keys[1:]:
            choices = [c for c in info.spec.choices or ("int8",) if c is not None]
            example = str(info.spec.high or 32768) if info.type == int else str(choices[0])
            via_short, _, _ = parse_specwise_method(f"specwise:drafter=draft-model,{key}={example}", SpecConfig())
            via_name, _, _ = parse_specwise_method(f"specwise:drafter=draft-model,{info.name}={example}",
                                                   SpecConfig())
            assert via_short == via_name and str(getattr(via_short, info.name)) == example


def test_labels_come_from_the_declarations():
    base = SpecConfig()
    assert spec_label(base) == "specwise-ngram-k4-auto1-12"  # k 4 or adaptive 1-12, as the request samples
    assert spec_label(SpecConfig(adaptive=False)) == "specwise-ngram-k4"
    assert spec_label(SpecConfig(adaptive=True)) == "specwise-ngram-adaptive1-12"
    assert spec_label(SpecConfig(drafter="none")) == "specwise-ar"
    assert spec_label(SpecConfig(drafter="none", runner="hf")) == "specwise-ar-hf"
    spec = SpecConfig(drafter="draft-model", adaptive=True, draft_quantize="int8", verifier="token", runner="lean")
    assert spec_label(spec) == "specwise-draft-model-adaptive1-12-int8-token-lean"
    # Settings that do not matter for a configuration stay out of its label.
    assert spec_label(SpecConfig(draft_quantize="int8", draft_vocab=100, adaptive=False)) == "specwise-ngram-k4"


def test_unknown_speculative_key_is_named():
    with pytest.raises(APIError) as error:
        parse_request(CompletionRequest, {"model": "m", "prompt": "hi", "speculative": {"colour": "red"}})
    assert error.value.param == "speculative.colour" and "speculative.colour" in error.value.message


def test_the_settings_a_drafter_reads_are_declared_as_the_drafters():
    """Every SpecConfig field a built-in drafter factory reads is marked drafter=True, so that the decoder
    keys its drafters on it (a setting it did not know of would hand one configuration's drafter to another)."""
    import re
    from pathlib import Path

    import specwise

    package = Path(specwise.__file__).parent
    sources = list((package / "drafters").glob("*.py")) + [package / "eagle" / "drafter.py"]
    read = {name for path in sources for name in re.findall(r"\bspec\.(\w+)", path.read_text())}
    declared = {info.name for info in spec_settings() if info.spec.drafter}
    assert read and read <= declared, read - declared
    assert {"drafter", "runner", "ngram_min", "suffix_depth", "draft_vocab"} <= declared
    assert not {"k", "adaptive", "verifier", "tree_nodes", "device", "target_format"} & declared


def test_a_decoder_keeps_one_drafter_per_drafter_settings():
    from specwise import SpecDecoder
    from specwise.testing import tiny_loaded

    decoder = SpecDecoder(tiny_loaded(0), SpecConfig(drafter="ngram"))
    ngram = decoder.drafter_for(SpecConfig(drafter="ngram"))
    assert decoder.drafter_for(SpecConfig(drafter="ngram", k=7, adaptive=True, verifier="token")) is ngram
    other = decoder.drafter_for(SpecConfig(drafter="ngram", ngram_max=6))
    assert other is not ngram and other.ngram_max == 6
    suffix = decoder.drafter_for(SpecConfig(drafter="suffix"))
    # A setting of another drafter's leaves the suffix drafter (and its store of earlier requests) shared.
    assert decoder.drafter_for(SpecConfig(drafter="suffix", ngram_min=3)) is suffix
    assert decoder.drafter_for(SpecConfig(drafter="suffix", suffix_depth=12)).depth == 12
    assert len(decoder.drafters()) == 4
