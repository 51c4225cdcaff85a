"""`specwise generate | models | serve | bench | train-drafter`: the command line.

Errors a user can cause end with one line on stderr and exit status 2; the
subcommands' own modules hold their logic, this file only parses and dispatches.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

EXAMPLE_PROMPT = "Write a Python function that checks whether a string is a palindrome, with a docstring."


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


def add_model_options(parser: argparse.ArgumentParser) -> None:
    from specwise.config import RUNNERS, VERIFIERS
    from specwise.models.catalog import DEFAULT_DRAFTER, DEFAULT_TARGET

    group = parser.add_argument_group("models and speculation")
    group.add_argument("--target", default=DEFAULT_TARGET, help="registry name, HF model directory or .gguf file")
    group.add_argument("--drafter", default="draft-model", help="drafter: draft-model, ngram, none, ...")
    group.add_argument("--drafter-model", default=DEFAULT_DRAFTER, help="model for the draft-model drafter")
    group.add_argument("--drafter-option", action="append", default=[], metavar="KEY=VALUE",
                       help="an option for the drafter, e.g. head=DIR for eagle (repeatable)")
    group.add_argument("--drafter-quantize", default=None, choices=["int8", "none"],
                       help="int8 weight-only draft model (cheaper drafting; the target is never quantized)")
    group.add_argument("--drafter-vocab", type=int, default=0, metavar="N",
                       help="draft model proposes only the N most frequent tokens (plus special and prompt "
                            "tokens): a smaller output layer; 0 = all tokens (default)")
    group.add_argument("--verifier", default="auto", choices=VERIFIERS,
                       help="auto: greedy at temperature 0, block otherwise")
    group.add_argument("--k", type=int, default=None,
                       help="draft block size (default 5; `generate`'s n-gram default uses 4)")
    group.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=None,
                       help="choose k each step in [--k-min, --k-max] from measured acceptance and costs")
    group.add_argument("--k-min", type=int, default=1)
    group.add_argument("--k-max", type=int, default=12)
    group.add_argument("--ngram-min", type=int, default=1)
    group.add_argument("--ngram-max", type=int, default=4)
    group.add_argument("--tree-nodes", type=int, default=0,
                       help="draft a tree of at most this many nodes instead of a chain (0 = chain, default)")
    group.add_argument("--tree-depth", type=int, default=4, help="most levels of a draft tree")
    group.add_argument("--tree-branching", type=int, default=3, help="most children per draft tree node")
    group.add_argument("--tree-shape", default="", metavar="B1,B2,...",
                       help="a fixed draft tree instead of a dynamic one: children per node at each level, "
                            "e.g. 3,2,1 (3 + 6 + 6 = 15 nodes); sets the tree's nodes, depth and branching")
    group.add_argument("--runner", default="auto", choices=RUNNERS,
                       help="model runner: lean (static cache, fast bf16 kernel; Llama/Qwen2), hf, or auto")
    group.add_argument("--dtype", default="bfloat16", help="bfloat16 (default) or float32")
    group.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")


def sampling_from_args(args: argparse.Namespace):
    from specwise.config import SamplingParams

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


# `specwise generate` defaults to the fastest configuration measured over Spec-Bench's six tasks
# (docs/BENCHMARKS.md): n-gram drafting with k = 4; asked for the draft model, it takes that
# drafter's fastest configuration, int8 weights with adaptive k. Other commands keep SpecConfig's
# defaults, so that a benchmark's method spec means the same whatever the command line says.
GENERATE_DRAFTER = "ngram"
GENERATE_DEFAULTS = {"ngram": {"k": 4}, "draft-model": {"adaptive": True, "drafter_quantize": "int8"}}


def spec_from_args(args: argparse.Namespace):
    from specwise.config import SpecConfig, parse_tree_shape

    defaults = GENERATE_DEFAULTS.get(args.drafter, {}) if getattr(args, "generate_defaults", False) else {}
    adaptive = args.adaptive
    if adaptive is None:  # not given: trees are never adaptive, so a tree keeps a fixed budget
        adaptive = bool(defaults.get("adaptive")) and not (args.tree_nodes or args.tree_shape)
    quantize = args.drafter_quantize or defaults.get("drafter_quantize")
    k = args.k if args.k is not None else defaults.get("k", SpecConfig.k)
    return SpecConfig(drafter=args.drafter, verifier=args.verifier, k=k, adaptive=adaptive,
                      k_min=args.k_min, k_max=args.k_max, ngram_min=args.ngram_min, ngram_max=args.ngram_max,
                      draft_quantize=None if quantize == "none" else quantize,
                      draft_vocab=args.drafter_vocab, runner=args.runner, tree_nodes=args.tree_nodes,
                      tree_depth=args.tree_depth, tree_branching=args.tree_branching,
                      tree_shape=parse_tree_shape(args.tree_shape),
                      drafter_options=drafter_options_from_args(args))


def apply_threads(threads: int | None) -> None:
    import torch

    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be >= 1; got {threads}")
        torch.set_num_threads(threads)


def cmd_generate(args: argparse.Namespace) -> int:
    from specwise.api import SpecDecoder
    from specwise.report import print_summary, stream_to_console

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
                          "verifier": spec.resolve_verifier(sampling), "metrics": result.stats.to_dict()}))
        return 0
    result = stream_to_console(stream, color=not args.no_color)
    print_summary(result, spec, sampling, color=not args.no_color)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specwise", description="Lossless speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text with speculative decoding, streamed",
                         description="Generate with speculative decoding. Default: n-gram drafting from the "
                                     "prompt and the text so far, k = 4 (the fastest configuration over six tasks, "
                                     "docs/BENCHMARKS.md); --drafter draft-model uses the 0.5B draft model in "
                                     "int8 with adaptive k, its fastest configuration; add --no-adaptive "
                                     "--drafter-quantize none --k 5 for a fixed bfloat16 chain.")
    gen.add_argument("prompt", nargs="?", default=None, help="prompt text (default: a built-in example)")
    gen.add_argument("--raw", action="store_true", help="plain completion: no chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON result instead of streaming")
    gen.add_argument("--no-color", action="store_true")
    add_model_options(gen)
    add_sampling_options(gen)
    gen.set_defaults(func=cmd_generate, generate_defaults=True, drafter=GENERATE_DRAFTER)

    from specwise.eagle.commands import add_train_drafter_parser
    from specwise.models.commands import add_models_parser
    add_models_parser(sub)
    add_train_drafter_parser(sub)
    _add_optional(sub, "specwise.server.cli", "add_serve_parser")
    _add_optional(sub, "specwise.bench.cli", "add_bench_parser")
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
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
