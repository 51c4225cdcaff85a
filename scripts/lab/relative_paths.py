"""Rewrite the absolute paths of the machine a result was measured on, in every text file of a folder.

A result folder copied from a measuring machine names that machine's files: the checkout
(`/work/main/specwise/data/...`), the model cache (`/root/.cache/specwise/gguf/...`), a scratch
output folder (`/tmp/bench7/qa`). This rewrites each such path in place, so the files say what ran,
not where one machine kept it:

- a path in the specwise cache (`.../.cache/specwise/X`) becomes `$SPECWISE_HOME/X`;
- a path inside a checkout (`/work/main/specwise/...`, `/home/me/repo/scripts/...`: a folder whose
  next name is one of the repository's top-level names, or `results`, `.venv`) becomes relative to
  the repository root (`specwise/...`);
- a scratch folder under `/tmp/X` becomes `results/X`, the output folder the docs' commands use;
- anything else under a home folder (`/root/X`, `/home/me/X`, `/Users/me/X`) becomes `~/X`, and under
  `/work/NAME/X` becomes `X`.

`--map OLD=NEW` (repeatable, tried first, longest first) names where a folder now lives when that is
known, e.g. `--map /tmp/byo-zen5=docs/results/byo-gguf-zen5`.

    python scripts/lab/relative_paths.py docs/results/NEW-RUN [--map OLD=NEW ...] [--dry-run]

Prints how many files it changed (and each file with --verbose). New runs write such paths
relative already (specwise.bench.provenance.portable); this is for folders written before that
or by other tools.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
# An absolute path of a machine: /root/, /home/<user>/, /Users/<user>/, /work/, /tmp/, not inside
# another path or a URL, up to whitespace or a quote, bracket or backtick.
ABSOLUTE = re.compile(r"(?<![\w.~$/:-])/(?:root|home|Users|work|tmp)/[^\s\"'`<>|()\[\]{},;]*")
CACHE = "/.cache/specwise"
TEXT_SUFFIXES = {".json", ".jsonl", ".md", ".txt", ".log", ".csv", ".tsv", ".yaml", ".yml", ""}


def top_level_names(root: Path = REPOSITORY) -> set[str]:
    names = {p.name for p in root.iterdir()} if root.is_dir() else set()
    return (names | {"results", ".venv", "specwise", "scripts", "docs", "tests"}) - {".git"}


def rewrite(path: str, maps: list[tuple[str, str]], top: set[str]) -> str:
    """One absolute path, rewritten (unchanged where no rule applies)."""
    for old, new in maps:
        if path == old or path.startswith(old.rstrip("/") + "/"):
            return new.rstrip("/") + path[len(old.rstrip("/")):]
    if CACHE + "/" in path or path.endswith(CACHE):
        return "$SPECWISE_HOME" + path.split(CACHE, 1)[1]
    parts = path.split("/")  # ['', 'work', 'main', 'specwise', ...]
    first = 3 if parts[1] in ("home", "Users") else 2  # the index of the checkout's folder
    for i in range(first, len(parts) - 1):
        if parts[i + 1] in top and i <= first + 2:
            return "/".join(parts[i + 1:])
    rest = "/".join(parts[first:])
    if parts[1] == "tmp":
        return "results/" + "/".join(parts[2:]) if len(parts) > 2 and parts[2] else "results"
    if parts[1] in ("root", "home", "Users"):
        return "~/" + rest if rest else "~"
    return rest or "."


def rewrite_text(text: str, maps: list[tuple[str, str]], top: set[str]) -> str:
    return ABSOLUTE.sub(lambda m: rewrite(m.group(0), maps, top), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--map", action="append", default=[], metavar="OLD=NEW",
                        help="rewrite paths under OLD as under NEW (tried before the rules)")
    parser.add_argument("--dry-run", action="store_true", help="count, change nothing")
    parser.add_argument("--verbose", action="store_true", help="name each file changed")
    args = parser.parse_args(argv)
    maps = []
    for item in args.map:
        old, sep, new = item.partition("=")
        if not sep or not old.startswith("/"):
            parser.error(f"--map wants /OLD=NEW, got {item!r}")
        maps.append((old, new))
    maps.sort(key=lambda pair: -len(pair[0]))
    top = top_level_names()
    files = sorted(p for p in args.folder.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    changed = 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new = rewrite_text(text, maps, top)
        if new != text:
            changed += 1
            if args.verbose:
                print(path)
            if not args.dry_run:
                path.write_text(new, encoding="utf-8")
    print(f"{'would change' if args.dry_run else 'changed'} {changed} of {len(files)} files under {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
