"""`specwise generate | models | serve | bench | export | train-drafter`: the command line.

Errors a user can cause end with one line on stderr and exit status 2; any other exception
is a bug, reported in one line (exit 1) with the traceback only under --debug or
SPECWISE_DEBUG=1. The subcommands' own modules hold their logic, this file only parses and
dispatches.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from specwise.cli_options import (add_model_options, add_sampling_options, apply_threads, sampling_from_args,
                                  spec_from_args)

EXAMPLE_PROMPT = "Write a Python function that checks whether a string is a palindrome, with a docstring."


def cmd_generate(args: argparse.Namespace) -> int:
    from specwise.api import SpecDecoder
    from specwise.console import print_summary, stream_to_console

    sampling, spec = sampling_from_args(args), spec_from_args(args)
    apply_threads(args.threads)
    decoder = SpecDecoder(args.target, spec, drafter_model=args.drafter_model, dtype=args.dtype)
    prompt = args.prompt if args.prompt is not None else EXAMPLE_PROMPT
    stream = decoder.stream(prompt, sampling, chat=not args.raw)
    if args.json:
        result = stream.result
        print(json.dumps({"text": result.text, "token_ids": result.token_ids,
                          "prompt_tokens": len(result.prompt_ids), "finish_reason": result.finish_reason,
                          "from_draft": result.from_draft, "target": args.target, "drafter": spec.drafter,
                          "verifier": spec.resolve_verifier(sampling), "seed": result.seed,
                          "metrics": result.stats.to_dict()}))
        return 0
    result = stream_to_console(stream, color=not args.no_color)
    print_summary(result, spec, sampling, color=not args.no_color)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specwise", description="Lossless speculative decoding.")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an unexpected error (as SPECWISE_DEBUG=1 does)")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text with speculative decoding, streamed",
                         description="Generate with speculative decoding. Default: n-gram drafting from the "
                                     "prompt and the text so far with adaptive k (1 to 12, from 4), the configuration "
                                     "measured best on the GGUF target (docs/BENCHMARKS.md); its drafts are "
                                     "verified coupled, so a sampled request with --seed gets plain decoding's "
                                     "tokens whatever k is (--json reports the seed an unseeded run drew); "
                                     "--no-adaptive drafts k tokens every step. --drafter draft-model "
                                     "--draft-quantize int8 --adaptive drafts with the 0.5B draft model in int8 "
                                     "with adaptive k.")
    gen.add_argument("prompt", nargs="?", default=None, help="prompt text (default: a built-in example)")
    gen.add_argument("--raw", action="store_true", help="plain completion: no chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON result instead of streaming")
    gen.add_argument("--no-color", action="store_true")
    add_model_options(gen)
    add_sampling_options(gen)
    gen.set_defaults(func=cmd_generate)

    from specwise.eagle.commands import add_train_drafter_parser
    from specwise.store.commands import add_models_parser
    add_models_parser(sub)
    add_train_drafter_parser(sub)
    _add_optional(sub, "specwise.server.cli", "add_serve_parser")
    _add_optional(sub, "specwise.bench.cli", "add_bench_parser")
    from specwise.export.cli import add_export_parser
    add_export_parser(sub)
    return parser


def _add_optional(sub, module: str, function: str) -> None:
    """Subcommands whose extras may not be installed still parse when they are."""
    import importlib

    try:
        getattr(importlib.import_module(module), function)(sub)
    except ImportError as error:
        name = module.split(".")[1]
        missing = sub.add_parser(name, help=f"(unavailable: {error.name} is not installed)")
        missing.set_defaults(func=lambda args, e=error: _missing_extra(name, e))


def _missing_extra(name: str, error: ImportError) -> int:
    print(f"error: `specwise {name}` needs {error.name}; install it with "
          f"pip install 'specwise[{ 'server' if name == 'serve' else 'bench'}]'", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    from specwise.errors import USER_ERRORS

    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as error:
        print(f"error: {one_line(str(error))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001: the boundary; anything else is a bug to report, in one line
        if args.debug or os.environ.get("SPECWISE_DEBUG") == "1":
            raise
        print(f"error: unexpected {type(error).__name__}: {one_line(str(error))}. This is a bug in specwise; "
              "run the command again with --debug (or SPECWISE_DEBUG=1) for the traceback and report it",
              file=sys.stderr)
        return 1


MAX_ERROR_CHARS = 600  # a message built from a damaged file's bytes could run to megabytes


def one_line(message: str) -> str:
    """`message` on one line, at most MAX_ERROR_CHARS long."""
    text = " ".join(message.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + f"... ({len(text)} characters)"


if __name__ == "__main__":
    sys.exit(main())
