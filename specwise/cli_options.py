"""Command-line options shared by `generate`, `serve`, `bench` and `train-drafter`.

The speculation flags are generated from SpecConfig's declarations
(specwise.settings): one flag per setting, named after the field, with its
declared default and help. Values are only parsed here; SpecConfig checks the
ranges, so a bad value gets the same message on every front end.
"""

from __future__ import annotations

import argparse

from specwise.config import SamplingParams, SpecConfig, spec_settings
from specwise.settings import ConfigError, SettingInfo


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling (as plain decoding from the target would use)")
    group.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    group.add_argument("--top-k", type=int, default=0, help="0 = off")
    group.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    group.add_argument("--repetition-penalty", type=float, default=1.0, help="1 = off")
    group.add_argument("--seed", type=int, default=None)
    group.add_argument("--max-new-tokens", type=int, default=128)
    group.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    group.add_argument("--stop-id", action="append", type=int, default=[], metavar="ID", help="stop token id")


def _add_setting(group: argparse._ArgumentGroup, info: SettingInfo) -> None:
    default = info.default
    shown = "x".join(map(str, default)) if isinstance(default, tuple) else default
    help_text = f"{info.spec.help} (default: {'none' if shown in (None, '') else shown})"
    if info.type is bool or info.spec.auto:  # --name / --no-name; a switch with auto keeps auto when unset
        group.add_argument(info.flag, dest=info.name, action=argparse.BooleanOptionalAction, default=default,
                           help=help_text)
        return

    def parse(text: str, info: SettingInfo = info):
        try:
            return info.parse(text)
        except ConfigError as error:  # argparse reports it as "argument --flag: <message>"
            raise argparse.ArgumentTypeError(str(error)) from None

    parse.__name__ = info.name  # argparse names the type in its own messages
    metavar = "B1,B2,..." if info.type == tuple[int, ...] else None
    group.add_argument(info.flag, dest=info.name, type=parse, default=default, metavar=metavar, help=help_text)


def add_setting_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, name: str) -> None:
    """One declared setting's flag alone, for commands that take only it (e.g. --device)."""
    _add_setting(parser, next(info for info in spec_settings() if info.name == name))


def add_model_options(parser: argparse.ArgumentParser) -> None:
    from specwise.store.catalog import DEFAULT_DRAFTER, DEFAULT_TARGET

    group = parser.add_argument_group("models")
    group.add_argument("-m", "--target", default=DEFAULT_TARGET,
                       help="the model: registry name, HF model directory, .gguf file, or a GGUF file another "
                            "tool keeps: ollama:NAME[:TAG], lmstudio:NAME, hf:ORG/NAME[/FILE.gguf] "
                            "(specwise models list --found)")
    group.add_argument("--drafter-model", default=DEFAULT_DRAFTER,
                       help="model for the draft-model drafter (any form --target takes)")
    group.add_argument("--drafter-option", action="append", default=[], metavar="KEY=VALUE",
                       help="an option for the drafter, e.g. head=DIR for eagle (repeatable)")
    group.add_argument("--dtype", default="bfloat16", help="bfloat16 (default) or float32")
    group.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    spec_group = parser.add_argument_group("speculation (defaults: the configuration measured best, n-gram "
                                           "drafting with adaptive k, docs/BENCHMARKS.md)")
    for info in spec_settings():
        _add_setting(spec_group, info)


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          repetition_penalty=args.repetition_penalty, seed=args.seed,
                          max_new_tokens=args.max_new_tokens, stop_strings=tuple(args.stop),
                          stop_token_ids=tuple(args.stop_id))


def drafter_options_from_args(args: argparse.Namespace) -> dict:
    """--drafter-option KEY=VALUE pairs as SpecConfig.drafter_options (values stay strings)."""
    options = {}
    for item in getattr(args, "drafter_option", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--drafter-option takes KEY=VALUE; got {item!r}")
        options[key] = value
    return options


def spec_from_args(args: argparse.Namespace) -> SpecConfig:
    """The SpecConfig the command line describes (every declared setting has a flag)."""
    values = {info.name: getattr(args, info.name) for info in spec_settings()}
    return SpecConfig(**values, drafter_options=drafter_options_from_args(args))


def apply_threads(threads: int | None) -> None:
    import torch

    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be >= 1; got {threads}")
        torch.set_num_threads(threads)
