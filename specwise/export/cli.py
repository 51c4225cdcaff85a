"""`specwise export vllm|sglang|llama-server|all`: a speculation configuration as another engine's settings.

    specwise export vllm --method specwise:drafter=draft-model,k=5
    specwise export sglang --drafter suffix --k 16
    specwise export all --from-bench results/bench-qa results/bench-rag --format json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specwise.cli_options import add_model_options, spec_from_args

ALL = "all"


def add_export_parser(subparsers) -> argparse.ArgumentParser:
    from specwise.export.from_bench import RANKINGS
    from specwise.export.model import ENGINES

    parser = subparsers.add_parser(
        "export", help="hand a speculation configuration off to vLLM, SGLang or llama-server",
        description="Print a speculation configuration as a GPU engine's settings (vLLM's speculative_config, "
                    "SGLang's --speculative-* flags, llama-server's --spec-* flags), checked against each "
                    "engine's documented keys, with a note wherever the engine has no equivalent.")
    parser.add_argument("engine", choices=ENGINES + (ALL,), help="the engine to export to (all: every one)")
    source = parser.add_argument_group("what to export (default: the speculation flags below)")
    source.add_argument("--method", default=None, metavar="SPEC",
                        help="a bench method spec, e.g. specwise:drafter=ngram,k=4 (unset keys take the flags)")
    source.add_argument("--from-bench", nargs="+", default=None, metavar="DIR",
                        help="`specwise bench run` output folder(s), e.g. one per task: export the specwise "
                             "method with the best measured speedup")
    source.add_argument("--rank", choices=RANKINGS, default=None,
                        help="with --from-bench: rank by the pooled speedup or the task mean (default: the "
                             "task mean when the runs hold several tasks, else pooled)")
    output = parser.add_argument_group("output")
    output.add_argument("--format", choices=("text", "json"), default="text")
    output.add_argument("--out", default=None, metavar="FILE", help="write here instead of stdout")
    add_model_options(parser)
    parser.set_defaults(func=cmd_export)
    return parser


def cmd_export(args: argparse.Namespace) -> int:
    from specwise.export import ENGINES, Subject, best_from_bench, export_to, render_json, render_text

    if args.from_bench and args.method:
        raise ValueError("give --method or --from-bench, not both")
    if args.rank and not args.from_bench:
        raise ValueError("--rank goes with --from-bench")
    if args.from_bench:
        subject = best_from_bench([Path(d) for d in args.from_bench], args.rank)
    else:
        spec, model, label = spec_from_args(args), None, None
        origin = "the command line"
        if args.method:
            from specwise.bench.methods import parse_specwise_method, spec_label

            spec, model, label = parse_specwise_method(args.method, spec)
            origin = f"--method {args.method}"
            label = label or spec_label(spec, model)
        else:
            from specwise.bench.methods import spec_label

            label = spec_label(spec)
        from specwise.drafters.base import available_drafters

        if spec.drafter not in available_drafters():
            raise ValueError(f"unknown drafter {spec.drafter!r}; available: {', '.join(available_drafters())}")
        subject = Subject(spec=spec, target=args.target, origin=origin, label=label,
                          draft_model=(model or args.drafter_model) if spec.drafter == "draft-model" else None)
    engines = ENGINES if args.engine == ALL else (args.engine,)
    exports = [export_to(engine, subject) for engine in engines]
    text = render_json(subject, exports) if args.format == "json" else render_text(subject, exports)
    if args.out:
        try:
            Path(args.out).write_text(text + "\n", encoding="utf-8")
        except OSError as error:
            raise ValueError(f"cannot write --out {args.out}: {error.strerror or error}; name a file in a folder "
                             "that exists") from None
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text)
    return 0
