"""`specwise bench [run] | cost | report`: parse options, wire the pieces, write the files.

    specwise bench run --tasks qa,translation --questions-per-task 5 --max-new-tokens 128 \\
        --methods hf-generate,specwise:drafter=draft-model,k=5 --methods specwise:drafter=ngram,k=8
    specwise bench cost --n 1,2,4,8,16 --contexts 128,512
    specwise bench report results/bench-20250101-120000/
    specwise bench project results/cost-20250101-120000/ --cores 4,8,16

`specwise bench` with no subcommand is `specwise bench run` (options go after
the subcommand when one is named). Exit status 1 when a greedy run found a
mismatch classified FAILURE.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from specwise.bench import methods as bench_methods
from specwise.bench.prompts import DEFAULT_QUESTIONS, TASKS
from specwise.cli_options import (add_model_options, add_setting_option, add_sampling_options, apply_threads, sampling_from_args,
                                  spec_from_args)


def _number_list(convert: type, plural: str, one: str):
    """An argparse type for comma-separated numbers (int or float), at least one."""
    def parse(text: str) -> list:
        try:
            values = [convert(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {plural}; got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected at least one {one}")
        return values
    return parse


_int_list = _number_list(int, "integers", "integer")
_float_list = _number_list(float, "numbers", "number")


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def method_names(text: str) -> list[str]:
    """'hf-generate,specwise:drafter=ngram,k=4,specwise-ar' -> ['hf-generate', 'specwise:drafter=ngram,k=4',
    'specwise-ar']: commas separate the methods and a specwise method's options alike, so a key=value
    item belongs to the specwise method before it (method names hold no '=')."""
    names: list[str] = []
    for part in _names(text):
        if "=" in part and not part.startswith("specwise:"):
            if not names or not names[-1].startswith("specwise:"):
                after = f"after {names[-1]!r}" if names else "first"
                raise argparse.ArgumentTypeError(
                    f"{part!r} comes {after}, not after a specwise:key=value,... method it could belong to; "
                    f"write it inside one, e.g. specwise:{part}")
            names[-1] += "," + part
        else:
            names.append(part)
    if not names:
        raise argparse.ArgumentTypeError("expected at least one method")
    return names


def _timestamp() -> str:
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S")


def add_run_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("prompts")
    group.add_argument("--questions", default=str(DEFAULT_QUESTIONS), metavar="FILE",
                       help="Spec-Bench-format JSON lines (default: %(default)s)")
    group.add_argument("--tasks", type=_names, default=None,
                       help=f"comma-separated tasks to run (default: all): {', '.join(TASKS)} "
                            "(mt-bench = multi-turn conversation)")
    group.add_argument("--categories", type=_names, default=None, help="comma-separated categories to keep")
    group.add_argument("--questions-per-task", type=int, default=5, metavar="N",
                       help="first N questions of each task; MT-bench's spread over its categories (default 5)")
    group.add_argument("--no-chat", action="store_true", help="plain text prompts, no chat template")
    group = parser.add_argument_group("methods")
    group.add_argument("--methods", type=method_names, action="extend", default=None, metavar="METHOD,...",
                       help="the methods to run, comma-separated (repeatable; default: "
                            f"{','.join(bench_methods.BUILTIN_METHODS)}): built-in names, llamacpp-generate, "
                            "ikllamacpp-generate, or specwise:drafter=NAME,k=N,verifier=block,adaptive=1|0|auto,"
                            "k_min=..,k_max=..,ngram_min=..,ngram_max=..,quantize=int8,vocab=N,model=..,label=.., "
                            "whose key=value items follow it; unset keys take --drafter, --k, ... (adaptive auto "
                            "is settled for the run's sampling: fixed k where it samples with a seed)")
    # The one-method flag of earlier versions, which added to the built-ins: refused with its equivalent.
    group.add_argument("--method", dest="retired_method", action="append", default=None, help=argparse.SUPPRESS)
    group.add_argument("--sweep-k", type=_int_list, default=None, metavar="K,K,...",
                       help="run each specwise configuration at these k (and plot speedup and τ against k)")
    group.add_argument("--prompt-lookup-tokens", type=int, default=bench_methods.DEFAULT_PROMPT_LOOKUP_TOKENS,
                       help="hf-prompt-lookup's prompt_lookup_num_tokens (default %(default)s)")
    group = parser.add_argument_group("run")
    group.add_argument("--out", default=None, help="output directory (default: results/bench-<timestamp>/)")
    group.add_argument("--resume", action="store_true",
                       help="continue the interrupted run in --out: keep its finished questions, run the rest "
                            "(the options must be the earlier run's)")
    group.add_argument("--redo-contended", action="store_true",
                       help="with --resume: also run again every question with a timing taken while other "
                            "processes used the CPU (all its methods, side by side)")
    group.add_argument("--warmup-tokens", type=int, default=16,
                       help="tokens of the one warm-up generation per method (0: none)")
    group.add_argument("--retakes", type=int, default=1,
                       help="time a generation again when other processes took over 5%% of the CPU during it, "
                            "up to this many times (default %(default)s; 0: only flag it)")
    group.add_argument("--tie-ulps", type=float, default=None,
                       help="a greedy mismatch is 'numerical' when both tokens' logits are within this many "
                            "eps(dtype)·|top logit| of the top one (default: specwise.numerics.TIE_ULPS)")
    group.add_argument("--no-progress", action="store_true")
    add_model_options(parser)
    add_sampling_options(parser)
    parser.set_defaults(max_new_tokens=128, func=cmd_run)


def add_cost_options(parser: argparse.ArgumentParser) -> None:
    from specwise.bench.cost import DEFAULT_CONTEXTS, DEFAULT_NS, DEFAULT_REPEATS
    from specwise.store.catalog import DEFAULT_DRAFTER, DEFAULT_TARGET

    parser.add_argument("-m", "--target", default=DEFAULT_TARGET,
                        help="the model: registry name, HF model directory or .gguf file")
    parser.add_argument("--drafter-model", default=DEFAULT_DRAFTER, help="second model to measure ('none': skip)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=_int_list, default=None, metavar="T,T,...",
                        help="threads of every pass, one or several counts measured in turn, e.g. 1,2 "
                             "(default: all cores)")
    add_setting_option(parser, "device")
    parser.add_argument("--n", type=_int_list, default=list(DEFAULT_NS), metavar="N,N,...",
                        help=f"new tokens per pass (default {','.join(map(str, DEFAULT_NS))}; 1 always added)")
    parser.add_argument("--contexts", type=_int_list, default=list(DEFAULT_CONTEXTS), metavar="L,L,...",
                        help=f"context lengths (default {','.join(map(str, DEFAULT_CONTEXTS))})")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="timings per point; median kept")
    parser.add_argument("--runners", default="hf,lean", metavar="R,R",
                        help="model runners to measure, side by side (default hf,lean)")
    parser.add_argument("--formats", default="dense,gguf", metavar="F,F",
                        help="weight formats to measure: dense (--dtype) and gguf (the stored blocks; lean "
                             "runner only; models from a GGUF file) (default dense,gguf)")
    parser.add_argument("--no-llamacpp", action="store_true",
                        help="skip llama.cpp's T(n) on the same GGUF files (measured when llama-cpp-python "
                             "is installed)")
    parser.add_argument("--out", default=None, help="output directory (default: results/cost-<timestamp>/)")
    parser.add_argument("--no-save-home", action="store_true",
                        help="do not write the tables under $SPECWISE_HOME/cost/ for the adaptive tuner")
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(func=cmd_cost)


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    bench = subparsers.add_parser("bench", help="benchmark methods on Spec-Bench prompts; measure T(n)",
                                  description="Benchmark specwise against Hugging Face baselines.",
                                  allow_abbrev=False)  # else run's --no-* options swallow cost's --n
    add_run_options(bench)
    actions = bench.add_subparsers(dest="bench_command", metavar="{run,cost,report,project,table}")
    add_run_options(actions.add_parser("run", help="run the methods on the prompts (default)"))
    add_cost_options(actions.add_parser("cost", help="measure forward time T(n) of target and drafter"))
    report = actions.add_parser("report", help="rewrite summary.md and plots from a run's directory, "
                                                "or merge several runs (e.g. one per task) into one report")
    report.add_argument("directory", nargs="+", help="run directories (written by `specwise bench run`)")
    report.add_argument("--out", default=None, help="where a merged report goes (needed with several runs)")
    report.add_argument("--methods", type=_names, default=None, metavar="LABEL,LABEL",
                        help="report only these methods (the baseline included), e.g. those every merged run has")
    report.set_defaults(func=cmd_report)
    add_project_options(actions.add_parser(
        "project", help="project T(n) and a free drafter's speedup to more cores from `bench cost --threads 1,2` "
                        "(a projection, not a measurement)"))
    table = actions.add_parser("table", help="the published results tables, generated from their result files "
                                             "(docs/results/headline.json)")
    table.add_argument("rows", help="the JSON list of rows and their result files (docs/results/headline.json)")
    table.add_argument("--format", choices=("readme", "benchmarks"), default="readme",
                       help="which table to print (default %(default)s)")
    table.add_argument("--write", nargs="+", default=[], metavar="DOC",
                       help="replace the tables between each document's markers (README.md docs/BENCHMARKS.md)")
    table.add_argument("--check", nargs="+", default=[], metavar="DOC",
                       help="exit 1 if a document's tables differ from what the files give")
    table.set_defaults(func=cmd_table)
    return bench


def add_project_options(parser: argparse.ArgumentParser) -> None:
    from specwise.bench.projection import DEFAULT_ALPHAS, DEFAULT_CORES, DEFAULT_MAX_ROWS

    parser.add_argument("table", nargs="+", help="the --out directory (or cost.json) of `specwise bench cost "
                                                 "--threads 1,2`")
    parser.add_argument("--cores", type=_int_list, default=list(DEFAULT_CORES), metavar="C,C,...",
                        help=f"core counts to project (default {','.join(map(str, DEFAULT_CORES))})")
    parser.add_argument("--bandwidth", type=float, default=None, metavar="GB/S",
                        help="read bandwidth at which more cores stop adding any (default: the highest measured)")
    parser.add_argument("--alphas", type=_float_list, default=list(DEFAULT_ALPHAS), metavar="A,A",
                        help=f"acceptance rates of the free drafter (default {','.join(map(str, DEFAULT_ALPHAS))})")
    parser.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS,
                        help="the largest n the model is fitted to (default %(default)s; past it the kernel may "
                             "change route)")
    parser.add_argument("--k-max", type=int, default=None, help="largest k considered (default: --max-rows - 1)")
    parser.add_argument("--model", default=None, help="the model whose tables to fit (default: the first measured)")
    parser.add_argument("--runner", default="lean", help="the runner whose tables to fit (default %(default)s)")
    parser.add_argument("--context", type=int, default=None, help="context length (default: the smallest measured)")
    parser.add_argument("--out", default=None, help="also write projection.md and projection.json in this directory")
    parser.set_defaults(func=cmd_project)


# --------------------------------------------------------------------------- run


def _uses_drafter_model(names: list[str], base_spec) -> bool:
    """Whether some method drafts with --drafter-model (Hugging Face's assisted generation, or a
    specwise draft-model method that names no model of its own)."""
    for name in names:
        if name == bench_methods.HF_ASSISTED:
            return True
        if name == "specwise" or name.startswith("specwise:"):
            spec, model, _ = bench_methods.parse_specwise_method(name, base_spec)
            if spec.drafter == "draft-model" and model is None:
                return True
    return False


def _refuse_retired_method(args: argparse.Namespace) -> None:
    """--method is gone: every method goes in --methods. The error names the --methods that runs what the
    command line meant (--method added to the built-ins, or to the --methods given)."""
    if not args.retired_method:
        return
    meant = (args.methods or list(bench_methods.BUILTIN_METHODS)) + args.retired_method
    raise ValueError(f"--method is now part of --methods, one comma list (repeatable) of every method to run: "
                     f"give --methods {','.join(meant)}")


def cmd_run(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    from specwise.api import SpecDecoder
    from specwise.bench.harness import BenchSettings, Harness
    from specwise.bench.machine import command_line, machine_info
    from specwise.bench.provenance import portable, provenance
    from specwise.numerics import DEFAULT_TIE_ULPS, FAILURE
    from specwise.bench.prompts import load_questions, select_questions
    from specwise.bench.report import write_report
    from specwise.config import SpecConfig
    from specwise.store.loading import load_model, resolve_dtype

    _refuse_retired_method(args)
    apply_threads(args.threads)
    hf_logging.set_verbosity_error()  # generate()'s advice on flags would bury the progress bar
    if args.questions_per_task is not None and args.questions_per_task < 1:
        raise ValueError(f"--questions-per-task must be >= 1; got {args.questions_per_task}")
    if args.retakes < 0:
        raise ValueError(f"--retakes must be >= 0; got {args.retakes}")
    if args.warmup_tokens < 0:
        raise ValueError(f"--warmup-tokens must be >= 0; got {args.warmup_tokens}")
    if args.redo_contended and not args.resume:
        raise ValueError("--redo-contended goes with --resume: it reruns questions of an earlier run")
    _check_out_dir(args.out, args.resume)
    sampling, base_spec = sampling_from_args(args), spec_from_args(args)
    tie_ulps = DEFAULT_TIE_ULPS if args.tie_ulps is None else args.tie_ulps
    questions = select_questions(load_questions(args.questions), args.tasks, args.categories,
                                 args.questions_per_task)
    if not questions:
        raise ValueError("no questions selected; check --tasks and --categories")
    names = list(dict.fromkeys(args.methods or bench_methods.BUILTIN_METHODS))
    sweep: dict = {}
    if args.sweep_k:
        names, sweep = bench_methods.sweep_k(names, args.sweep_k, base_spec)

    # Only Hugging Face's assisted generation takes the drafter as a loaded dense model. specwise's methods
    # get it by name, as `specwise generate` does, so that beside a target running its GGUF blocks a GGUF
    # drafter runs its own blocks through the same native pass; a dense drafter of the same dtype is the
    # same loaded model (load_model keeps one per process).
    drafter = (load_model(args.drafter_model, args.dtype, device=base_spec.device)
               if bench_methods.HF_ASSISTED in names else None)
    # By name, so that each format a method asks for (dense for Hugging Face's methods) loads on demand. No
    # prefix cache: every method reads each prompt cold, as the first one does.
    decoder = SpecDecoder(args.target, SpecConfig(drafter="none", target_format=base_spec.target_format,
                                                  device=base_spec.device),
                          drafter_model=args.drafter_model, dtype=args.dtype, prefix_cache_bytes=0)
    models = bench_methods.BenchModels(decoder, drafter)
    methods = [bench_methods.build_method(n, models, base_spec, args.prompt_lookup_tokens, sampling) for n in names]
    label_of = dict(zip(names, (m.label for m in methods)))
    reference = bench_methods.HF_GENERATE if bench_methods.HF_GENERATE in label_of.values() else methods[0].label

    out_dir = Path(args.out or f"results/bench-{_timestamp()}")
    # The target's weights as the methods run them: its GGUF blocks as stored, or the dense dtype.
    target_format = decoder.resolve_format(base_spec.target_format, base_spec.device)
    weights = "gguf" if target_format == "gguf" else str(resolve_dtype(args.dtype)).removeprefix("torch.")
    meta = {
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": command_line(),
        "provenance": provenance(command_line(), [m.yardstick for m in methods if getattr(m, "yardstick", None)]),
        "target_format": target_format,
        "machine": machine_info(weights),
        "target": args.target, "drafter_model": args.drafter_model if _uses_drafter_model(names, base_spec) else None,
        "questions_file": str(args.questions), "questions": len(questions),
        "per_task": args.questions_per_task, "tasks": sorted({q.task for q in questions}),
        "chat": not args.no_chat, "sampling": _sampling_dict(sampling), "warmup_tokens": args.warmup_tokens,
        "warmup_prompt_tokens": BenchSettings.warmup_prompt_tokens, "baseline": reference, "tie_ulps": tie_ulps,
        "methods": [{"label": m.label, "family": m.family, "description": m.description, "name": n}
                    for n, m in zip(names, methods)],
        "sweep": {group: [(k, label_of[name]) for k, name in members] for group, members in sweep.items()},
    }
    kept, done = _resumable(out_dir, meta, questions, [m.label for m in methods], args.resume,
                            args.redo_contended)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_json(out_dir / "run.json", meta)
    settings = BenchSettings(sampling=sampling, chat=not args.no_chat, warmup_tokens=args.warmup_tokens,
                             reference=reference, tie_ulps=tie_ulps, progress=not args.no_progress,
                             retakes=args.retakes)
    print(f"specwise bench: {len(questions)} questions x {len(methods)} methods "
          f"({', '.join(m.label for m in methods)}) -> {out_dir}", file=sys.stderr)
    if done:
        print(f"resuming: {len(done)} of {len(questions)} questions already finished in {out_dir}", file=sys.stderr)
    with (out_dir / "records.jsonl").open("w", encoding="utf-8") as handle:
        def sink(record: dict) -> None:
            handle.write(json.dumps(portable(record)) + "\n")
            handle.flush()
        for record in kept:  # rewritten first: a half-done question's records are dropped
            sink(record)
        harness = Harness(decoder, methods, settings, sink)
        records = kept + harness.run(questions, done)
    meta["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    _write_json(out_dir / "run.json", meta)
    summary = write_report(out_dir, records, meta)
    _print_overall(records, reference)
    mismatches = [r for r in kept if r.get("mismatch")] + harness.mismatches
    failures = [r for r in mismatches if r["check"] == FAILURE]
    if mismatches:
        print(f"\n!!! {len(mismatches)} greedy MISMATCH(ES) vs {reference}, {len(failures)} classified "
              f"FAILURE; see {summary}", file=sys.stderr)
    print(f"wrote {out_dir / 'records.jsonl'}, {summary} and plots", file=sys.stderr)
    return 1 if failures else 0


def _check_out_dir(out: str | None, resume: bool) -> None:
    """Before any model loads: never overwrite an earlier run's records; --resume needs one."""
    if out is None:
        if resume:
            raise ValueError("--resume continues the run in --out; name that directory")
        return
    records, meta = Path(out) / "records.jsonl", Path(out) / "run.json"
    if resume and not meta.is_file():
        raise ValueError(f"--resume: {out} holds no run.json from an earlier `specwise bench run`; "
                         "drop --resume to start a run there")
    if not resume and records.is_file() and records.stat().st_size > 0:
        raise ValueError(f"{out} already holds a run's records; pass --resume to continue it, "
                         "or choose another --out")


def _resumable(out_dir: Path, meta: dict, questions, labels: list[str], resume: bool,
               redo_contended: bool = False) -> tuple[list[dict], set[int]]:
    """(records to keep, finished question ids) from an earlier run in out_dir; refuses to overwrite one."""
    from specwise.bench.resume import check_same_run, finished_questions, read_partial_records

    if not resume:
        return [], set()
    old = json.loads((out_dir / "run.json").read_text(encoding="utf-8"))
    check_same_run(old, meta)
    earlier = read_partial_records(out_dir / "records.jsonl")
    meta["started"] = old.get("started", meta["started"])
    meta["resumed"] = old.get("resumed", []) + [datetime.datetime.now().isoformat(timespec="seconds")]
    return finished_questions(earlier, questions, labels, redo_contended)


def _sampling_dict(sampling) -> dict:
    import dataclasses

    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(sampling).items()}


def _write_json(path: Path, data: dict) -> None:
    """A result file, its paths relative to the repository or $SPECWISE_HOME (bench/provenance.py)."""
    from specwise.bench.provenance import portable

    path.write_text(json.dumps(portable(json.loads(json.dumps(data, default=str))), indent=1), encoding="utf-8")


def _print_overall(records: list[dict], baseline: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from specwise.bench.report import OVERALL, aggregate

    rows = aggregate(records, baseline)
    table = Table(title="overall")
    for column in ("method", "tokens/s", "speedup", "τ", "α", "mismatches"):
        table.add_column(column, justify="left" if column == "method" else "right", overflow="fold")
    for (task, method), row in rows.items():
        if task != OVERALL:
            continue
        bad = row.numerical + row.failures
        table.add_row(method, f"{row.tokens_per_second or 0:.2f}",
                      "–" if row.speedup is None else f"{row.speedup:.3f}",
                      "–" if row.tau is None else f"{row.tau:.2f}" + ("*" if row.tau_kind == "forwards" else ""),
                      "–" if row.alpha is None else f"{row.alpha:.3f}",
                      f"[red]{bad} ({row.failures} FAILURE)[/]" if bad else "0")
    Console(stderr=True).print(table)


# --------------------------------------------------------------------------- cost and report


def cmd_cost(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    import torch

    from specwise.bench import cost
    from specwise.bench.llamacpp import LlamaCppPasses, llamacpp_available
    from specwise.bench.machine import command_line, memory_bandwidth
    from specwise.bench.plots import plot_cost
    from specwise.bench.provenance import provenance
    from specwise.device import resolve_device
    from specwise.store.loading import has_gguf_source, load_model

    thread_counts = list(dict.fromkeys(args.threads)) if args.threads else [torch.get_num_threads()]
    for threads in thread_counts:
        apply_threads(threads)  # refuses a count below 1 before anything loads
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1; got {args.repeats}")

    names = [args.target] + ([args.drafter_model] if args.drafter_model.lower() != "none" else [])
    runners = [r.strip() for r in args.runners.split(",") if r.strip()]
    unknown = [r for r in runners if r not in ("hf", "lean")]
    if unknown or not runners:
        raise ValueError(f"--runners takes hf and/or lean; got {args.runners!r}")
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if not formats or any(f not in ("dense", "gguf") for f in formats):
        raise ValueError(f"--formats takes dense and/or gguf; got {args.formats!r}")
    device = resolve_device(args.device)
    # (model name, format, runner) side by side; the stored blocks run on the lean runner, on the CPU.
    plan = [(name, fmt, runner) for name in names for fmt in formats for runner in runners
            if fmt == "dense" or (runner == "lean" and has_gguf_source(name) and device.type == "cpu")]
    yardstick = [name for name in names if has_gguf_source(name)] if not args.no_llamacpp else []
    if yardstick and not llamacpp_available():
        print("note: llama-cpp-python is not installed, so llama.cpp's T(n) is not measured "
              "(scripts/install.sh --llamacpp)", file=sys.stderr)
        yardstick = []
    per_model = len({1, *args.n}) * len(args.contexts)
    results = []
    total = per_model * (len(plan) + len(yardstick)) * len(thread_counts)
    with tqdm(total=total, disable=args.no_progress, file=sys.stderr, unit="point") as bar:
        for name in names:  # a model's runners side by side, taking turns repeat by repeat
            loaded = {}
            for threads in thread_counts:  # the same weights at each thread count
                apply_threads(threads)
                timers, labels = [], []
                for fmt, runner in [(fmt, runner) for model, fmt, runner in plan if model == name]:
                    if fmt not in loaded:  # one copy of the weights for both runners
                        bar.set_postfix_str(f"loading {name}, {fmt}")
                        loaded[fmt] = load_model(name, args.dtype, format=fmt, device=device)
                    timers.append(cost.RunnerPasses(loaded[fmt], runner))
                    labels.append(f"{runner} {fmt}")
                if name in yardstick:
                    timers.append(LlamaCppPasses(name, threads, max(args.contexts) + max({1, *args.n})))
                    labels.append("llama.cpp")
                if timers:
                    bar.set_postfix_str(f"{name}, {threads} threads: {', '.join(labels)}")
                    results += cost.measure_side_by_side(timers, args.contexts, args.n, args.repeats,
                                                         progress=bar.update)
                del timers
            del loaded  # this model's weights, before the next model's
    bandwidth = {}
    for threads in thread_counts:  # bandwidth need not grow with the cores as they do: one figure per count
        apply_threads(threads)
        bandwidth[threads] = round(memory_bandwidth(), 1)
    for result in results:
        threads = result["threads"]  # every table's count is one of thread_counts
        result["machine"].update(read_bandwidth_gb_s=bandwidth[threads], read_bandwidth_threads=threads)
    cost.print_table(results)
    out_dir = Path(args.out or f"results/cost-{_timestamp()}")
    out_dir.mkdir(parents=True, exist_ok=True)
    yardsticks = [r["yardstick"] for r in results if r.get("yardstick")]
    _write_json(out_dir / "cost.json", {"provenance": provenance(command_line(), list(
        {json.dumps(y, sort_keys=True): y for y in yardsticks}.values()), bandwidth=False), "results": results})
    plot_cost(out_dir / "cost.png", results)
    written = [out_dir / "cost.json", out_dir / "cost.png"]
    if not args.no_save_home:  # specwise's own tables, for the adaptive tuner
        written += [cost.save(r, cost.cost_path(r["model"], r["dtype"], r["threads"], r["runner"]))
                    for r in results if r["runner"] in ("hf", "lean")]
    print("wrote " + ", ".join(map(str, written)), file=sys.stderr)
    return 0


def cmd_project(args: argparse.Namespace) -> int:
    from specwise.bench import projection
    from specwise.bench.machine import command_line
    from specwise.bench.provenance import provenance

    if any(not 0.0 <= alpha < 1.0 for alpha in args.alphas):
        raise ValueError(f"--alphas must lie in [0, 1); got {args.alphas}")
    if args.max_rows < 2:
        raise ValueError(f"--max-rows must be >= 2; got {args.max_rows}")
    tables, pass_bytes, model_name, context = projection.select(
        projection.read_results(args.table), args.model, args.runner, context=args.context)
    saturation = None if args.bandwidth is None else args.bandwidth * 1e9
    model, rows = projection.project(tables, pass_bytes, args.cores, args.alphas, saturation, args.max_rows,
                                     args.k_max)
    text = projection.markdown(model, rows, tables, model_name, context, args.max_rows)
    print(text, end="")
    if args.out is not None:
        out_dir = Path(args.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "projection.md").write_text(text, encoding="utf-8")
        _write_json(out_dir / "projection.json",
                    {"provenance": provenance(command_line(), bandwidth=False)}
                    | projection.as_json(model, rows, tables, model_name, context, args.max_rows))
        print(f"wrote {out_dir / 'projection.md'}, {out_dir / 'projection.json'}", file=sys.stderr)
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    from specwise.bench import table

    rows = table.read_rows(Path(args.rows))
    tables = {form: table.render(rows, form) for form in table.FORMATS}
    if not args.write and not args.check:
        print(tables[args.format], end="")
    for doc in args.write:
        path = Path(doc)
        text = path.read_text(encoding="utf-8")
        updated = table.replace_tables(text, tables, str(path))
        if updated != text:
            path.write_text(updated, encoding="utf-8")
        print(f"{path}: {'updated' if updated != text else 'unchanged'}", file=sys.stderr)
    stale = []
    for doc in args.check:
        text = Path(doc).read_text(encoding="utf-8")
        if table.replace_tables(text, tables, doc) != text:
            stale.append(doc)
    if stale:
        print(f"error: the results tables in {', '.join(stale)} differ from their files; regenerate them: "
              f"specwise bench table {args.rows} --write {' '.join(stale)}", file=sys.stderr)
        return 1
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from specwise.bench.report import read_meta, read_records, write_report

    directories = [Path(d) for d in args.directory]
    for directory in directories:
        if not (directory / "records.jsonl").is_file():
            raise ValueError(f"{directory} has no records.jsonl; give a directory written by `specwise bench run`")
    if len(directories) > 1 and args.out is None:
        raise ValueError("merging several runs needs --out DIR for the merged report")
    metas = []
    for directory in directories:
        meta_path = directory / "run.json"
        metas.append(read_meta(meta_path) if meta_path.is_file() else {})
    records = [r for d in directories for r in read_records(d / "records.jsonl")]
    meta = merge_meta(metas, directories) if len(directories) > 1 else metas[0]
    if args.methods is not None:
        records, meta = _only_methods(records, meta, args.methods)
        if args.out is None:
            raise ValueError("--methods writes a separate report: give --out DIR")
    out_dir = Path(args.out) if args.out else directories[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    if len(directories) > 1 or args.methods is not None:
        _write_json(out_dir / "run.json", meta)
        with (out_dir / "records.jsonl").open("w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in records)
    print(f"wrote {write_report(out_dir, records, meta)}", file=sys.stderr)
    return 0


def _only_methods(records: list[dict], meta: dict, labels: list[str]) -> tuple[list[dict], dict]:
    present = {r["method"] for r in records}
    missing = [label for label in labels if label not in present]
    if missing:
        raise ValueError(f"no records of {', '.join(missing)}; the runs have {', '.join(sorted(present))}")
    baseline = meta.get("baseline")
    if baseline and baseline not in labels:
        raise ValueError(f"--methods must include the baseline {baseline!r}: speedups are relative to it")
    keep = set(labels)
    meta = {**meta, "methods": [m for m in meta.get("methods", []) if m["label"] in keep]}
    return [r for r in records if r["method"] in keep], meta


def merge_meta(metas: list[dict], directories: list[Path]) -> dict:
    """One run description for runs made separately (each its own side-by-side comparison)."""
    merged = dict(metas[0])
    baselines = {m.get("baseline") for m in metas}
    if len(baselines) > 1:
        raise ValueError(f"the runs use different baselines ({', '.join(map(str, baselines))}); "
                         "speedups would not be comparable")
    labels: dict[str, dict] = {}
    for meta in metas:
        for method in meta.get("methods", []):
            labels.setdefault(method["label"], method)
    merged["methods"] = list(labels.values())
    merged["tasks"] = sorted({t for m in metas for t in m.get("tasks", [])})
    merged["questions"] = sum(m.get("questions", 0) for m in metas)
    merged["merged_from"] = [{"directory": str(d), "command": m.get("command"), "started": m.get("started"),
                              "finished": m.get("finished"), "tasks": m.get("tasks")}
                             for d, m in zip(directories, metas)]
    return merged
